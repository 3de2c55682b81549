"""--ray-address that cannot be joined: an unreachable address, a cluster with token authentication
joined without a token or with another one, another Ray version. Each is one line naming the fix and
exit code 2, within seconds and before Ray starts in this process (not ray.init's 20 s of retries)."""
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from multinode_cluster import PYTHON, RAY, _run, namespaces_unavailable

from async_rl.cluster_probe import probe_cluster, version_mismatch
from async_rl.process_setup import pythonpath_with
from async_rl.weights.rendezvous import find_free_port

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "ds_metaworld_ppo_mlp.py"
HEAD_PORT = 6379  # inside the test's own network namespace


def _launch(tmp_path, address, prefix=(), env_drop=(), env_add=None):
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    env.update({"PYTHONPATH": pythonpath_with(ROOT), **(env_add or {})})
    started = time.monotonic()
    proc = subprocess.run([*prefix, str(PYTHON), str(LAUNCH), "--ray-address", address, "--log-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode, lines, time.monotonic() - started


def _assert_one_line(code, lines, seconds, tmp_path, *needles):
    assert code == 2, lines[-20:]
    assert len(lines) == 1, lines[-20:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert seconds < 100, f"{seconds:.0f} s (imports included on a busy machine): the probe should answer within seconds"
    assert not (tmp_path / "run" / "ray_session.txt").exists(), "Ray was started"


def test_unreachable_address_is_one_line_naming_ray_start(tmp_path):
    port = find_free_port("127.0.0.1")  # nothing listens on it
    code, lines, seconds = _launch(tmp_path, f"127.0.0.1:{port}")
    _assert_one_line(code, lines, seconds, tmp_path, "error: --ray-address", "no Ray cluster answers", "ray start --head")


def test_malformed_address_is_one_line():
    assert "expected HOST:PORT" in probe_cluster("headnode")


def test_version_mismatch_names_both_versions_and_matching_versions_pass():
    import ray
    from ray._private.utils import compute_version_info

    ours, python = compute_version_info()
    assert version_mismatch("h:1", {"ray_version": ours, "python_version": python}) is None
    line = version_mismatch("h:1", {"ray_version": "2.0.0", "python_version": python})
    assert "\n" not in line and "the cluster runs Ray 2.0.0" in line and f"this process Ray {ray.__version__}" in line
    assert "cluster's Ray" in line


@pytest.fixture(scope="module")
def token_head():
    """A one-node Ray cluster with token authentication on 127.0.0.1 inside a network namespace of
    this test's own (no address outside it is dialled); yields (namespace, token). Torn down by pid."""
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    ns, token = f"arlprobe{os.getpid() % 10_000}", secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    _run("ip", "netns", "add", ns)
    try:
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={HEAD_PORT}",
             "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false", "--object-store-memory=100000000",
             "--disable-usage-stats", timeout=120, env=env)
        yield ns, token
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while _run("ip", "netns", "pids", ns, check=False).stdout.split() and time.monotonic() < deadline:
                time.sleep(0.2)
        _run("ip", "netns", "del", ns, check=False)


def test_token_cluster_from_a_shell_without_token_mode_is_one_line(token_head, tmp_path):
    ns, _ = token_head
    code, lines, seconds = _launch(tmp_path, f"127.0.0.1:{HEAD_PORT}", prefix=("ip", "netns", "exec", ns),
                                   env_drop=("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"))
    _assert_one_line(code, lines, seconds, tmp_path, "token authentication", "RAY_AUTH_MODE=token")


def test_refused_token_is_one_line(token_head, tmp_path):
    ns, _ = token_head
    code, lines, seconds = _launch(tmp_path, f"127.0.0.1:{HEAD_PORT}", prefix=("ip", "netns", "exec", ns),
                                   env_add={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    _assert_one_line(code, lines, seconds, tmp_path, "refused this process's token", "RAY_AUTH_TOKEN")


def test_the_cluster_token_passes_the_probe(token_head):
    ns, token = token_head
    env = {**os.environ, "PYTHONPATH": pythonpath_with(ROOT), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    script = f"from async_rl.cluster_probe import probe_cluster; print(repr(probe_cluster('127.0.0.1:{HEAD_PORT}')))"
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.stdout.strip().splitlines()[-1:] == ["None"], out.stderr[-2000:]
