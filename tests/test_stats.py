"""StatsAggregator: running totals, env counters, checkpoint state, and the logged scalar names."""
from async_rl.actors.stats import StatsAggregator
from async_rl.driver import snapshot_scalars


def test_env_counters_add_up_survive_a_checkpoint_and_are_logged_under_env():
    stats = StatsAggregator()
    stats.record_env_counters({"skipped_oz_above_o0": 0, "unknown_passes": 2})
    stats.record_env_counters({"unknown_passes": 3})
    stats.record_episode("compiler_gym", 1.5, 1, True, 0.1)
    snap = stats.snapshot()
    assert snap["env_counters"] == {"skipped_oz_above_o0": 0, "unknown_passes": 5}

    restored = StatsAggregator()
    restored.load_state_dict(stats.state_dict())
    assert restored.env_counters == {"skipped_oz_above_o0": 0, "unknown_passes": 5}
    old_checkpoint = {k: v for k, v in stats.state_dict().items() if k != "env_counters"}
    StatsAggregator().load_state_dict(old_checkpoint)  # checkpoints from before env counters still load

    scalars = snapshot_scalars({"stats": snap, "replay": {"size": 3}, "inference": {}})
    assert scalars["env/unknown_passes"] == 5 and scalars["env/skipped_oz_above_o0"] == 0
    assert scalars["rollout/success_rate"] == 1.0 and scalars["replay/size"] == 3
