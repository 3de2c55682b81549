"""The vLLM engine's process (``vllm_server.py``) and how to reach it, from the main venv, which never imports vllm.

``scripts/setup_vllm.sh`` installs vLLM's CPU build into ``.venv-vllm/site-packages``. The server runs with this
process's interpreter and that folder first on its path (-P: the script's own folder is not on it). vLLM logs to
stdout and stderr, which go to a nameless file (written out where an error names it); the protocol has a socket
pair of its own (one JSON line per call each way, every call with a timeout). The server ends with the process that
started it (it watches its parent), its engine core in the same process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), in
a process group of its own that ``kill`` ends. A dead, silent or failing engine raises ``VLLMEngineError`` naming
what happened and the end of the engine's log.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
SERVER_SCRIPT = Path(__file__).with_name("vllm_server.py")
SETUP_HINT = "run bash scripts/setup_vllm.sh (make setup does)"
LOG_TAIL_CHARS = 2000  # of the engine's log, quoted in an error


class VLLMEngineError(RuntimeError):
    """The vLLM engine process died, timed out or answered with an error."""


def as_engine_error(exc: Exception) -> VLLMEngineError:
    """An error of the engine's start as a VLLMEngineError: its own as it is, an unforeseen one (a full disk, a broken
    install) named with its type."""
    if isinstance(exc, VLLMEngineError):
        return exc
    return VLLMEngineError(f"the vLLM engine did not start: {type(exc).__name__}: {exc}")


def vllm_site() -> Path:
    """Where the engine's packages are (``ASYNC_RL_VLLM_SITE`` overrides it; a test points it at nothing)."""
    return Path(os.environ.get("ASYNC_RL_VLLM_SITE", ROOT / ".venv-vllm" / "site-packages"))


def vllm_unavailable_reason() -> Optional[str]:
    """Why the vLLM engine cannot start here, or None where its packages are installed."""
    site = vllm_site()
    if not (site / "vllm" / "__init__.py").exists():
        return f"vLLM is not installed in {site}; {SETUP_HINT}"
    return None


class VLLMEngineClient:
    """One engine process; every call has a timeout and names the failure."""

    def __init__(self, spec: dict[str, Any], start_timeout_s: float, timeout_s: float, threads: int = 1) -> None:
        reason = vllm_unavailable_reason()
        if reason:
            raise VLLMEngineError(reason)
        self.timeout_s = timeout_s
        self.log = tempfile.TemporaryFile()  # nameless: gone with this process, however it ends
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(vllm_site()), os.environ.get("PYTHONPATH", "")]),
                   # The engine's threads: as many as the inference actor's torch (its own OpenMP binding would
                   # pin every core of a machine it shares). KV cache in GiB: small, these prompts are short.
                   VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(threads),
                   VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   # The engine core in this process too: one process to start (and kill), not three.
                   VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-u", str(SERVER_SCRIPT), str(theirs.fileno()), json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(theirs.fileno(),), start_new_session=True)  # its own group: kill() ends the engine core too
        self._socket = ours
        self._reader = ours.makefile("r", encoding="utf-8")
        self.pid = self.proc.pid
        self._read(start_timeout_s, "start-up")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, cmd: str, timeout_s: Optional[float] = None, **kwargs: Any) -> dict[str, Any]:
        if not self.alive:
            raise VLLMEngineError(f"the vLLM engine (pid {self.pid}) exited with code {self.proc.returncode} before "
                                  f"'{cmd}'{self._log_tail()}")
        try:
            self._socket.sendall((json.dumps({"cmd": cmd, **kwargs}) + "\n").encode())
        except OSError as exc:
            raise VLLMEngineError(f"the vLLM engine (pid {self.pid}) is unreachable on '{cmd}': {exc}") from None
        return self._read(timeout_s or self.timeout_s, cmd)

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        # One answer per call: nothing is left in the reader's buffer between calls, so the socket tells.
        if not select.select([self._socket], [], [], timeout_s)[0]:
            self.kill()
            raise VLLMEngineError(f"the vLLM engine (pid {self.pid}) did not answer '{what}' within {timeout_s:g} s; "
                                  f"killed it{self._log_tail()}")
        try:
            line = self._reader.readline()
        except OSError:  # reset by a peer that died mid-answer
            line = ""
        if not line:
            self.kill()
            raise VLLMEngineError(f"the vLLM engine (pid {self.pid}) died during '{what}' (exit code "
                                  f"{self.proc.returncode}){self._log_tail()}")
        msg = json.loads(line)
        if not msg.get("ok"):
            raise VLLMEngineError(f"the vLLM engine's '{what}' failed: {msg.get('error')}{self._log_tail()}")
        return msg

    def _log_tail(self) -> str:
        """The end of the engine's log for an error message, the whole of it kept in a file the message names."""
        try:
            self.log.seek(0)
            text = self.log.read().decode(errors="replace")
        except (OSError, ValueError):  # closed
            return ""
        if not text:
            return ""
        kept = Path(tempfile.gettempdir()) / f"vllm-engine-{self.pid}.log"
        kept.write_text(text)
        return f"; the end of its log (all of it: {kept}):\n{text[-LOG_TAIL_CHARS:]}"

    def kill(self) -> None:
        """Kill the engine's process group: the server and vLLM's engine core process."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
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
            except VLLMEngineError:
                pass
        self.kill()
        for stream in (self._reader, self._socket, self.log):
            try:
                stream.close()
            except OSError:
                pass
