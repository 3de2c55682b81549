"""CompilerGym server: runs in the Python 3.10 interpreter of ``.venv-compilergym``.

compiler_gym 0.2.5 cannot be installed in the project's Python 3.11, so ``envs/compiler_gym.py``
starts this file as a subprocess and talks to it with one JSON object per line: requests on
stdin, answers on the original stdout (CompilerGym's own prints are sent to stderr so they
never corrupt the protocol). It imports nothing from the project.

Requests ``{"cmd": ...}`` and answers (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``):
  hello                           -> pass flags of the LLVM action space
  reset  benchmark, ir            -> (a CompilerGym URI or file:///path.c|.cpp|.bc) program counts (-O0, -Oz), Autophase, IR text if ``ir``
  step   actions, ir              -> applies the pass indices in order; the observation after them
  dataset_uris  name, limit       -> the first ``limit`` benchmark URIs of a named dataset (online)
  fork                            -> keeps a fork of the current state (restored by ``restore``)
  restore                         -> the env returns to the forked state
  close                           -> closes the env and exits
"""
import json
import os
import sys
import traceback


def _observe(env, ir):
    obs = {
        "ir_count": int(env.observation["IrInstructionCount"]),
        "autophase": [int(x) for x in env.observation["Autophase"]],
    }
    if ir:
        obs["ir"] = env.observation["Ir"]
    return obs


class Server:
    def __init__(self):
        import compiler_gym  # noqa: F401  (registers the llvm-v0 env)
        import gym

        self.env = gym.make("llvm-v0", benchmark="generator://csmith-v0/0")
        self.saved = None
        self.user_benchmarks = {}

    def hello(self, req):
        return {"flags": list(self.env.action_space.flags), "pid": os.getpid(),
                "service_pid": _service_pid(self.env)}

    def reset(self, req):
        self._drop_fork()
        self.env.reset(benchmark=self._benchmark(req["benchmark"]))
        obs = _observe(self.env, req.get("ir", False))
        obs["o0_count"] = int(self.env.observation["IrInstructionCountO0"])
        obs["oz_count"] = int(self.env.observation["IrInstructionCountOz"])
        obs["service_pid"] = _service_pid(self.env)
        return obs

    def step(self, req):
        done = False
        for action in req["actions"]:
            _, _, done, info = self.env.step(int(action))
            if done:
                # The service ended the episode (e.g. a pass crashed it); say why.
                return {"done": True, "error": str(info.get("error_details", info)), **_observe(self.env, False)}
        return {"done": done, **_observe(self.env, req.get("ir", False))}

    def dataset_uris(self, req):
        import itertools

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

    def _benchmark(self, uri):
        """``file:///path.c`` (or .cpp/.bc/.ll): the user's program, compiled once; else a CompilerGym URI."""
        if not uri.startswith("file://"):
            return uri
        if uri not in self.user_benchmarks:
            self.user_benchmarks[uri] = self.env.make_benchmark(uri[len("file://"):])
        return self.user_benchmarks[uri]

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
