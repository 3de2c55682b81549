"""`make coverage` only (tests/README.md, Coverage): this folder is on PYTHONPATH, so every Python process the
suite starts imports this module at start-up; Ray's workers inherit PYTHONPATH from the raylet. It does
nothing unless coverage.py's own start-up hook (a1_coverage.pth, COVERAGE_PROCESS_START) started
measuring this process, and never raises.

Why: `ray.kill` ends an actor's process at once (no atexit, no signal handler), so what coverage holds in
memory is lost. Here the measured data goes to the data file after every call of a (synchronous) actor method,
and every FLUSH_S seconds from a daemon thread (async methods, threads, long calls). Lines that ran in the
last moments before a force-kill outside a finished sync method call may still be lost."""
import os
import threading

FLUSH_S = float(os.environ.get("ASYNC_RL_COVERAGE_FLUSH_S", "1.0"))


def _install() -> None:
    try:
        import coverage
    except ImportError:  # another venv on the same PYTHONPATH (.venv-compilergym): not measured
        return
    if getattr(coverage.process_startup, "coverage", None) is None:
        return
    locks = [threading.Lock()]  # a new one after a fork: the parent's may have been held at the fork

    def flush() -> None:
        """What the tracer holds goes to this process's data file (its SQLite file: written at once). The
        collector's flush (~0.4 ms after a call, ~30 us when nothing ran) instead of Coverage.save (~5 ms:
        it also walks the sources); the process's own save at exit still does the rest."""
        try:
            cov = coverage.Coverage.current()  # a forked child's own (patch = fork) after a fork
            collector = getattr(cov, "_collector", None)
            if collector is None:
                return
            with locks[0]:
                collector.flush_data()
        except Exception:  # noqa: BLE001  measurement must never change what the process does
            pass

    def loop() -> None:
        import time
        while True:
            time.sleep(FLUSH_S)
            flush()

    def start_thread() -> None:
        locks[0] = threading.Lock()
        threading.Thread(target=loop, name="coverage-flush", daemon=True).start()

    start_thread()
    os.register_at_fork(after_in_child=start_thread)  # threads do not survive a fork
    _hook_ray_actor_methods(flush)


def _hook_ray_actor_methods(flush) -> None:
    """Wrap each plain (sync) actor method so that its lines are saved when it returns. Installed when Ray's
    function manager is first imported (a meta-path finder), so processes without Ray pay nothing."""
    import importlib.abc
    import importlib.util
    import sys

    target = "ray._private.function_manager"

    def patch(module) -> None:
        import functools
        import inspect
        manager = module.FunctionActorManager
        original = manager._make_actor_method_executor

        def make(self, method_name, method):
            if inspect.isfunction(method) and not (inspect.iscoroutinefunction(method) or inspect.isgeneratorfunction(method)
                                                   or inspect.isasyncgenfunction(method)):
                inner = method

                @functools.wraps(inner)
                def method(*args, **kwargs):
                    try:
                        return inner(*args, **kwargs)
                    finally:
                        flush()
            return original(self, method_name, method)

        manager._make_actor_method_executor = make

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target_=None):
            if name != target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                try:
                    patch(module)
                except Exception:  # noqa: BLE001
                    pass

            loader.exec_module = exec_and_patch
            return spec

    if target in sys.modules:
        patch(sys.modules[target])
    else:
        sys.meta_path.insert(0, Finder())


try:
    _install()
except Exception:  # noqa: BLE001
    pass
