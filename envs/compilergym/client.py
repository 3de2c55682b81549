"""The CompilerGym server process and how to reach it.

compiler_gym 0.2.5 runs only on Python 3.9/3.10, so each env starts ``envs/compilergym/_server.py``
in ``.venv-compilergym`` (built by ``scripts/setup_compilergym.sh``) and talks to it over a pipe,
one JSON line per call, each with a timeout. A dead or silent server (or a dead CompilerGym
service) raises ``CompilerGymServerError`` naming what happened.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
SERVER_SCRIPT = Path(__file__).with_name("_server.py")
SETUP_HINT = "run scripts/setup_compilergym.sh (needs Python 3.10, e.g. pyenv install 3.10.13)"


class CompilerGymServerError(RuntimeError):
    """The CompilerGym server process died, timed out or answered with an error."""


def default_python() -> Path:
    return Path(os.environ.get("COMPILERGYM_PYTHON", ROOT / ".venv-compilergym" / "bin" / "python"))


def default_site_data() -> Path:
    return Path(os.environ.get("COMPILER_GYM_SITE_DATA", ROOT / ".venv-compilergym" / "site-data"))


def compilergym_unavailable_reason(python: Optional[Path] = None, site_data: Optional[Path] = None) -> Optional[str]:
    """Why the CompilerGym server cannot run here, or None if it can."""
    python, site_data = python or default_python(), site_data or default_site_data()
    if not python.exists():
        return f"no CompilerGym interpreter at {python}; {SETUP_HINT}"
    if not (site_data / "llvm-v0" / ".unpacked").exists():
        return f"no offline LLVM data pack under {site_data}; {SETUP_HINT}"
    return None


class CompilerGymClient:
    """One server subprocess; every call has a timeout and names the failure."""

    def __init__(self, python: Path, site_data: Path, timeout_s: float, start_timeout_s: float) -> None:
        self.timeout_s = timeout_s
        env = dict(os.environ, COMPILER_GYM_SITE_DATA=str(site_data))
        env.setdefault("COMPILER_GYM_CACHE", str(site_data.parent / "cache"))
        Path(env["COMPILER_GYM_CACHE"]).mkdir(parents=True, exist_ok=True)
        # -I (isolated): nothing of this project's Python 3.11 path (PYTHONPATH, user site) reaches the 3.10 server.
        self.proc = subprocess.Popen(
            [str(python), "-I", "-u", str(SERVER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            # Errors come back in the answers; COMPILERGYM_SERVER_STDERR=1 also shows the server's log.
            stderr=None if os.environ.get("COMPILERGYM_SERVER_STDERR") == "1" else subprocess.DEVNULL,
            env=env, text=True, bufsize=1, cwd=env["COMPILER_GYM_CACHE"],  # csmith writes platform.info in its cwd
            # Its own process group, shared with the CompilerGym service it starts: kill() ends both.
            start_new_session=True,
        )
        self._read(start_timeout_s, "start-up")
        self.flags: list[str] = self.call("hello")["flags"]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, cmd: str, timeout_s: Optional[float] = None, **kwargs: Any) -> dict[str, Any]:
        if not self.alive:
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) exited with code "
                                         f"{self.proc.returncode} before '{cmd}'")
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) pipe broke on '{cmd}': {exc}") from None
        return self._read(timeout_s or self.timeout_s, cmd)

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.kill()
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) did not answer '{what}' "
                                         f"within {timeout_s:g} s; killed it")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=5)
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) died during '{what}' (exit code {code})")
        msg = json.loads(line)
        if not msg.get("ok"):
            raise CompilerGymServerError(f"CompilerGym '{what}' failed: {msg.get('error')}")
        return msg

    def kill(self) -> None:
        """Kill the server's process group: the server and CompilerGym's service, which would
        otherwise outlive a killed (or crashed) server."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # nothing left in the group
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.alive:
            try:
                self.call("close", timeout_s=10)
            except CompilerGymServerError:
                pass
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
