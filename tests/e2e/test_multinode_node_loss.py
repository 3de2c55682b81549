"""Node loss on a real two-node cluster (network namespaces, as tests/e2e/test_multinode.py): every
process of node B is killed mid-run.

- B held trainer rank 1: the run stops within the configured timeouts, exit code 1, one line naming
  the lost rank, its node and the last complete checkpoint (which stays resumable).
- B held only the inference actor and a rollout worker: both are re-created on node A and the run
  reaches its last epoch.
"""
import subprocess
import time
from pathlib import Path

import pytest
from multinode_cluster import PYTHON, ROOT, TwoNodeCluster, namespaces_unavailable
from test_multinode import ACTOR_TITLE, launch_flags

from async_rl import checkpoint as ckpt

WHY_NOT = namespaces_unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"node-loss test: {WHY_NOT}")

WAIT_S = 200.0


def _flag(flags: list[str], name: str, value: str) -> list[str]:
    if name in flags:
        flags[flags.index(name) + 1] = value
    else:
        flags += [name, value]
    return flags


def _actors(cluster: TwoNodeCluster, node: int) -> list[str]:
    return [m.group(1) for t in cluster.process_titles(node) if (m := ACTOR_TITLE.search(t))]


def _wait(predicate, what: str, proc: subprocess.Popen, log: Path, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached (launch exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def _checkpoints(log_dir: Path) -> list[Path]:
    root = log_dir / "checkpoints"
    return sorted(root.glob("epoch-*")) if root.is_dir() else []


def _start(cluster: TwoNodeCluster, flags: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cluster.exec_cmd(0, str(PYTHON), "launch/ds_metaworld_ppo_mlp.py", *flags), cwd=ROOT,
                            env=cluster.env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def test_losing_a_trainer_node_stops_the_run_naming_rank_node_and_checkpoint(tmp_path):
    log_dir, log = tmp_path / "run", tmp_path / "launch.log"
    with TwoNodeCluster(3, 5) as cluster:
        flags = launch_flags(cluster, log_dir)
        for name, value in (("--max-epochs", "1000"), ("--checkpoint-interval-epochs", "1"),
                            ("--collective-timeout-s", "30"), ("--actor-timeout-s", "30")):
            _flag(flags, name, value)
        proc = _start(cluster, flags, log)
        try:
            _wait(lambda: len(_checkpoints(log_dir)) >= 2, "two checkpoints", proc, log)
            assert "TrainerActor" in _actors(cluster, 1)
            killed_at = time.monotonic()
            assert cluster.kill_node(1) > 0
            proc.wait(timeout=WAIT_S)
            stopped_in = time.monotonic() - killed_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    output = log.read_text()
    assert proc.returncode == 1, output[-4000:]
    stopped = [line for line in output.splitlines() if line.startswith("run stopped:")]
    assert len(stopped) == 1, output[-4000:]
    line = stopped[0]
    assert f"trainer-1 on node {cluster.ips[1]}" in line, line
    last = ckpt.latest_checkpoint(str(log_dir))
    assert last is not None and f"last complete checkpoint: {last}" in line, line
    assert int(ckpt.read_meta(last)["epoch"]) >= 2
    # Bounded: the broken collective (30 s), Ray's notice of the lost node, shut-down (30 s waits).
    assert stopped_in < WAIT_S, stopped_in
    print(f"trainer node lost: the run stopped {stopped_in:.0f} s later: {line}")


BLOCKER = """
import sys, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], logging_level="ERROR")
group = placement_group([{"CPU": float(sys.argv[2]), "node:" + sys.argv[3]: 0.001}], strategy="STRICT_PACK")
ray.get(group.ready(), timeout=60)
print("held", flush=True)
sys.stdin.readline()  # held until the test closes our stdin
"""


def test_losing_a_rollout_node_recreates_its_actors_on_the_survivor(tmp_path):
    """Trainers (2 x 2 CPUs, PACK) fill node A while a blocker holds A's other 3 CPUs, so the
    inference actor and the worker go to B; the blocker lets go, then node B dies."""
    log_dir, log = tmp_path / "run", tmp_path / "launch.log"
    with TwoNodeCluster(7, 3) as cluster:
        held = tmp_path / "blocker.out"
        blocker = subprocess.Popen(cluster.exec_cmd(0, str(PYTHON), "-c", BLOCKER, cluster.address, "3", cluster.ips[0]),
                                   env=cluster.env, stdin=subprocess.PIPE, stdout=open(held, "w"),
                                   stderr=subprocess.STDOUT, text=True)
        proc = None
        try:
            _wait(lambda: "held" in held.read_text(), "the blocker holds 3 CPUs of node A", blocker, held, 90)
            flags = launch_flags(cluster, log_dir)
            for name, value in (("--placement-strategy", "PACK"), ("--num-rollout-workers", "1"),
                                ("--max-epochs", "14"), ("--checkpoint-interval-epochs", "1"),
                                ("--actor-timeout-s", "120")):
                _flag(flags, name, value)
            proc = _start(cluster, flags, log)
            _wait(lambda: "RolloutWorkerActor" in _actors(cluster, 1), "a rollout worker on node B", proc, log)
            blocker.stdin.close()  # its job ends: A's 3 CPUs are free again
            blocker.wait(timeout=60)
            _wait(lambda: len(_checkpoints(log_dir)) >= 3, "three checkpoints", proc, log)
            output = log.read_text()
            assert f"trainer-0@{cluster.ips[0]}, trainer-1@{cluster.ips[0]}, inference-0@{cluster.ips[1]}" in output
            assert cluster.kill_node(1) > 0
            _wait(lambda: {"InferenceActor", "RolloutWorkerActor"} <= set(_actors(cluster, 0)),
                  "the inference actor and the rollout worker re-created on node A", proc, log)
            proc.wait(timeout=WAIT_S)
        finally:
            for p in (blocker, proc):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    assert "inference-0 failed" in output or "rebuilding the weight-sync group" in output, output[-4000:]
    assert "worker-0 failed" in output, output[-4000:]
    meta = ckpt.read_meta(ckpt.latest_checkpoint(str(log_dir)))
    assert int(meta["epoch"]) == 14
    print(f"rollout node lost: inference-0 and worker-0 re-created on node A; the run went on to epoch {meta['epoch']}")
