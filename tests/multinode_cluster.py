"""A real two-node Ray cluster on one machine: two network namespaces joined by a veth pair, a Ray
head in the first and a worker node in the second (`ray start`, token authentication on, as on a
user's cluster). Needs root (CI has it). Every loop is bounded; teardown kills only the processes
inside the namespaces this module made, by pid, then deletes the namespaces."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
RAY = ROOT / ".venv" / "bin" / "ray"
PYTHON = ROOT / ".venv" / "bin" / "python"
RAY_PORT = 6379
JOIN_TIMEOUT_S = 60.0


def _run(*cmd: str, timeout: float = 30.0, check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {out.returncode}: {(out.stderr or out.stdout)[-2000:]}")
    return out


def namespaces_unavailable() -> Optional[str]:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"arlprobe{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class TwoNodeCluster:
    """``with TwoNodeCluster(cpus_a, cpus_b) as c:`` -> ``c.address`` (head IP:port), ``c.exec_a``."""

    def __init__(self, cpus_a: int, cpus_b: int) -> None:
        tag = os.getpid() % 10_000
        self.ns = (f"arl{tag}a", f"arl{tag}b")
        self.veth = (f"varl{tag}a", f"varl{tag}b")
        subnet = 10 + os.getpid() % 200  # our own test subnet 10.213.N.0/24
        self.ips = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
        self.cpus = (cpus_a, cpus_b)
        self.address = f"{self.ips[0]}:{RAY_PORT}"
        # A local run earlier in this process may have left Ray's "no multi-node" switch behind.
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        # The cluster's own token, handed to every process by environment: `ray start --head` with
        # token mode refuses to start when none exists, and ~/.ray/auth_token exists only after some
        # earlier local ray.init made one (a fresh clone running this test first had none).
        env = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH"}
        self.env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}

    # ---- set-up -------------------------------------------------------------------------
    def __enter__(self) -> "TwoNodeCluster":
        try:
            self._network()
            self._ray_nodes()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _network(self) -> None:
        for ns in self.ns:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", self.veth[0], "type", "veth", "peer", "name", self.veth[1])
        for ns, veth, ip in zip(self.ns, self.veth, self.ips):
            _run("ip", "link", "set", veth, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", veth)
            _run("ip", "-n", ns, "link", "set", veth, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def exec_cmd(self, node: int, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[node], *cmd]

    def _ray_nodes(self) -> None:
        common = ["--num-gpus=0", "--object-store-memory=200000000", "--disable-usage-stats"]
        _run(*self.exec_cmd(0, str(RAY), "start", "--head", f"--node-ip-address={self.ips[0]}", f"--port={RAY_PORT}",
                            f"--num-cpus={self.cpus[0]}", "--include-dashboard=false", *common), timeout=120, env=self.env)
        for attempt in range(2):
            try:
                _run(*self.exec_cmd(1, str(RAY), "start", f"--address={self.address}", f"--node-ip-address={self.ips[1]}",
                                    f"--num-cpus={self.cpus[1]}", *common), timeout=120, env=self.env)
                break
            except RuntimeError as exc:
                # Ray 2.60 gives a joining raylet a fixed 30 s to register with the GCS; a loaded machine
                # took longer once. Start node B afresh (its half-started processes killed) one more time.
                if attempt or "registration may not be complete" not in str(exc):
                    raise
                self.kill_node(1, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while self.pids(1) and time.monotonic() < deadline:
                    time.sleep(0.5)
        self._wait_for_nodes(2)

    def _wait_for_nodes(self, count: int) -> None:
        script = ("import ray; ray.init(address='%s', logging_level='ERROR'); "
                  "print(sum(1 for n in ray.nodes() if n['Alive']))" % self.address)
        deadline, seen = time.monotonic() + JOIN_TIMEOUT_S, ""
        while time.monotonic() < deadline:
            out = subprocess.run(self.exec_cmd(0, str(PYTHON), "-c", script), capture_output=True, text=True,
                                 timeout=JOIN_TIMEOUT_S, env=self.env)
            seen = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
            if seen == str(count):
                return
            time.sleep(1.0)
        raise TimeoutError(f"the Ray cluster did not reach {count} alive nodes within {JOIN_TIMEOUT_S:g} s: {seen}")

    # ---- inspection ---------------------------------------------------------------------
    def pids(self, node: int) -> list[int]:
        out = _run("ip", "netns", "pids", self.ns[node], check=False)
        return [int(p) for p in out.stdout.split()]

    def process_titles(self, node: int) -> list[str]:
        """Command lines of the processes inside namespace ``node`` (Ray names actor processes
        ``ray::ClassName...``)."""
        titles = []
        for pid in self.pids(node):
            try:
                titles.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass  # exited meanwhile
        return titles

    def kill_node(self, node: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to every process of namespace ``node``; returns how many there were."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return len(pids)

    # ---- teardown -----------------------------------------------------------------------
    def teardown(self) -> None:
        """SIGTERM, then SIGKILL, every process inside our namespaces (each wait bounded), then
        delete the namespaces (which removes the veth pair)."""
        for node in range(2):
            self.kill_node(node, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(self.pids(n) for n in range(2)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for _ in range(5):
            if not any(self.pids(n) for n in range(2)):
                break
            for node in range(2):
                self.kill_node(node, signal.SIGKILL)
            time.sleep(0.5)
        for ns in self.ns:
            _run("ip", "netns", "del", ns, check=False)
