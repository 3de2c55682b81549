"""The metrics snapshot between epochs must not end a run when an inference actor is gone: its node
may have just died and Ray is re-creating it (the supervision re-sends it the weights). Real actors:
one answers, one is killed; the snapshot reports the live one's figures."""
from types import SimpleNamespace

import ray

from async_rl.actors.stats import StatsActor
from async_rl.orchestration.actor_group import ActorGroup
from async_rl.orchestration.runtime import Runtime


@ray.remote(num_cpus=0)
class InferenceStats:
    def __init__(self, forward_ms: float) -> None:
        self.forward_ms = forward_ms

    def stats(self) -> dict:
        return {"batches": 3, "batch_size": 8.0, "forward_ms": self.forward_ms}


class Counters:
    def counters(self) -> dict:
        return {"added": 0}


def test_a_snapshot_leaves_out_an_inference_actor_that_died(ray_local):
    live, dead = InferenceStats.remote(12.0), InferenceStats.remote(99.0)
    ray.get(dead.stats.remote(), timeout=60)
    ray.kill(dead, no_restart=True)
    runtime = SimpleNamespace(cfg=SimpleNamespace(actor_timeout_s=30.0), stats=StatsActor.options(num_cpus=0).remote(),
                              inference=ActorGroup("inference", {"inference-0": live, "inference-1": dead}, 30.0),
                              replay_supervisor=Counters())
    snap = Runtime.snapshot(runtime)
    assert snap["inference"] == {"batch_size": 8.0, "forward_ms": 12.0}
    assert snap["replay"] == {"added": 0} and isinstance(snap["stats"], dict)
