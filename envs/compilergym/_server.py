"""CompilerGym server: runs in the Python 3.10 interpreter of ``.venv-compilergym``.

compiler_gym 0.2.5 cannot be installed in the project's Python 3.11, so ``envs/compilergym/client.py``
starts this file as a subprocess and talks to it with one JSON object per line: requests on
stdin, answers on the original stdout (CompilerGym's own prints are sent to stderr so they
never corrupt the protocol). It imports nothing from the project.

Requests ``{"cmd": ...}`` and answers (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``):
  hello                           -> pass flags of the LLVM action space
  reset  benchmark, ir, reuse     -> (a CompilerGym URI or file:///path.c|.cpp|.bc) program counts (-O0, -Oz), Autophase, IR text if ``ir``
  step   actions, ir              -> applies the pass indices in order (one service call); the observation after them
  dataset_uris  name, limit       -> the first ``limit`` benchmark URIs of a named dataset (online)
  fork                            -> keeps a fork of the current state (restored by ``restore``)
  restore                         -> the env returns to the forked state
  close                           -> closes the env and exits

State reuse (``reuse``, default true): the -O0 start state of a program is built once and kept.
CompilerGym turns a URI into a program on every reset (csmith + clang for generator URIs:
0.15-0.8 s on a 2-core machine), while a reset from a kept ``Benchmark`` object costs 2-8 ms;
the -O0/-Oz counts are fixed per program and kept too. ``reuse: false`` rebuilds each time.
"""
import json
import os
import sys
import traceback
from collections import OrderedDict

PROGRAM_CACHE = 512  # programs whose start state is kept (a bitcode file each, tens of KiB)


def _spaces(ir):
    return ["IrInstructionCount", "Autophase", "Ir"] if ir else ["IrInstructionCount", "Autophase"]


def _pack(values, ir):
    """Observation values in ``_spaces(ir)`` order -> the answer's fields."""
    obs = {"ir_count": int(values[0]), "autophase": [int(x) for x in values[1]]}
    if ir:
        obs["ir"] = values[2]
    return obs


def _observe(env, ir):
    return _pack([env.observation[name] for name in _spaces(ir)], ir)


class Server:
    def __init__(self):
        import compiler_gym  # noqa: F401, PLC0415  (registers the llvm-v0 env)
        import gym  # noqa: PLC0415

        self.env = gym.make("llvm-v0", benchmark="generator://csmith-v0/0")
        self.saved = None
        self.programs = OrderedDict()  # uri -> {"benchmark": Benchmark, "counts": (o0, oz) or None}, LRU

    def hello(self, req):
        return {"flags": list(self.env.action_space.flags), "pid": os.getpid(),
                "service_pid": _service_pid(self.env)}

    def reset(self, req):
        self._drop_fork()
        uri, reuse = req["benchmark"], req.get("reuse", True)
        entry = self._program(uri, reuse)
        self.env.reset(benchmark=entry["benchmark"])
        obs = _observe(self.env, req.get("ir", False))
        if entry["counts"] is None:
            entry["counts"] = (int(self.env.observation["IrInstructionCountO0"]),
                               int(self.env.observation["IrInstructionCountOz"]))
        obs["o0_count"], obs["oz_count"] = entry["counts"]
        obs["service_pid"] = _service_pid(self.env)
        return obs

    def step(self, req):
        ir = req.get("ir", False)
        actions = [int(a) for a in req["actions"]]
        if not actions:
            return {"done": False, **_observe(self.env, ir)}
        # All passes and the observation after them in one call to the service.
        values, _, done, info = self.env.multistep(actions, observation_spaces=_spaces(ir))
        if not done:
            return {"done": False, **_pack(values, ir)}
        # The service ended the episode (e.g. a pass crashed it); say why, with what is left to observe.
        answer = {"done": True, "error": str(info.get("error_details") or info)}
        try:
            answer.update(_observe(self.env, False))
        except Exception as exc:  # noqa: BLE001  (the session may be gone with the crash)
            answer["observe_error"] = f"{type(exc).__name__}: {exc}"
        return answer

    def dataset_uris(self, req):
        import itertools  # noqa: PLC0415

        dataset = self.env.datasets[req["name"]]
        dataset.install()  # named datasets are downloaded: this needs the internet
        return {"uris": [str(u) for u in itertools.islice(dataset.benchmark_uris(), int(req["limit"]))]}

    def fork(self, req):
        self._drop_fork()
        self.saved = self.env.fork()
        return {}

    def restore(self, req):
        if self.saved is None:
            raise RuntimeError("restore without fork")
        self.env.close()
        self.env, self.saved = self.saved, None
        self.saved = self.env.fork()
        return _observe(self.env, req.get("ir", False))

    def _program(self, uri, reuse):
        """The kept start state of ``uri`` (built on first use, or every time without ``reuse``):
        ``file:///path.c`` (or .cpp/.bc/.ll) is the user's program, anything else a CompilerGym URI."""
        if reuse and uri in self.programs:
            self.programs.move_to_end(uri)
            return self.programs[uri]
        if uri.startswith("file://"):
            benchmark = self.env.make_benchmark(uri[len("file://"):])
        else:
            benchmark = self.env.datasets.benchmark(uri)
        entry = {"benchmark": benchmark, "counts": None}
        if reuse:
            self.programs[uri] = entry
            while len(self.programs) > PROGRAM_CACHE:
                self.programs.popitem(last=False)
        return entry

    def _drop_fork(self):
        if self.saved is not None:
            self.saved.close()
            self.saved = None

    def close(self, req=None):
        self._drop_fork()
        self.env.close()
        return {}


def _service_pid(env):
    try:
        return int(env.service.connection.process.pid)
    except Exception:  # noqa: BLE001  (private attribute path; the pid is diagnostic only)
        return None


def main():
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to stderr
    sys.stdout = sys.stderr

    def send(msg):
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    try:
        server = Server()
    except Exception as exc:  # noqa: BLE001
        send({"ok": False, "error": f"CompilerGym failed to start: {type(exc).__name__}: {exc}"})
        return 1
    send({"ok": True, "ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        cmd = req.get("cmd")
        handler = getattr(server, cmd, None) if cmd in ("hello", "reset", "step", "dataset_uris", "fork", "restore",
                                                         "close") else None
        if handler is None:
            send({"ok": False, "error": f"unknown command {cmd!r}"})
            continue
        try:
            send({"ok": True, **handler(req)})
        except Exception as exc:  # noqa: BLE001  (every failure goes back to the client)
            traceback.print_exc(file=sys.stderr)
            send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        if cmd == "close":
            return 0
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
