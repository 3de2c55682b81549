"""The MetaWorld launch on a real two-node Ray cluster (two network namespaces joined by a veth pair;
needs root) against the same launch on a one-node cluster made the same way: epochs, env steps/s
and the weight broadcast's seconds (trainer rank 0 -> inference actor), across nodes vs on one node.

    sudo .venv/bin/python benchmarks/bench_multinode.py [--epochs 10] [--out results/multinode.json]

Both runs use tests/e2e/test_multinode.py's layout flags (SPREAD; trainers 2 CPUs, inference 2, workers
1). Two nodes: A 3 CPUs, B 5 (rank 1, the inference actor and a worker on B). One node: A 8 CPUs,
B joined with 0 CPUs (nothing placed there).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from common import ROOT, parser, rate, report, scalars, training_steps  # common puts the checkout on sys.path

sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
from multinode_cluster import TwoNodeCluster, namespaces_unavailable  # noqa: E402 (after the path set-up above)
from test_multinode import launch_flags, run_launch  # noqa: E402 (as above)


def one_layout(cpus_a: int, cpus_b: int, epochs: int, work: Path) -> dict[str, float]:
    log_dir = work / f"run-{cpus_a}-{cpus_b}"
    with TwoNodeCluster(cpus_a, cpus_b) as cluster:
        flags = launch_flags(cluster, log_dir)
        flags[flags.index("--max-epochs") + 1] = str(epochs)
        code, _ = run_launch(cluster, flags, work / f"launch-{cpus_a}-{cpus_b}.log")
    if code != 0:
        raise SystemExit(f"the launch failed (exit {code}); see {work}/launch-{cpus_a}-{cpus_b}.log")
    broadcast = [v for _, v in scalars(log_dir, "sync/broadcast_seconds")]
    return {"epochs": len(scalars(log_dir, "train/policy_loss")),
            "env_steps_per_sec": rate(training_steps(log_dir)[0]),  # over the training phase
            "broadcast_ms_mean": 1000 * sum(broadcast) / len(broadcast),
            "broadcast_ms_max": 1000 * max(broadcast)}


def main() -> None:
    ap = parser(__doc__, "3 epochs per layout instead of --epochs")
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    why = namespaces_unavailable()
    if why:
        raise SystemExit(f"cannot make network namespaces here: {why}")
    epochs = 3 if args.quick else args.epochs
    with tempfile.TemporaryDirectory(prefix="bench-multinode-") as tmp:
        figures = {}
        for label, cpus in (("two_nodes", (3, 5)), ("one_node", (8, 0))):
            figures.update({f"{label}/{k}": v for k, v in one_layout(*cpus, epochs, Path(tmp)).items()})
    report(figures, args, headline=sorted(figures))


if __name__ == "__main__":
    main()
