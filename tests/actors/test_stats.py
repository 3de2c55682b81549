"""StatsAggregator: running totals, env counters, checkpoint state, and the logged scalar names."""
from async_rl.actors.stats import StatsAggregator
from async_rl.logger import mean_metrics
from async_rl.orchestration.metrics import snapshot_scalars


def test_env_counters_add_up_survive_a_checkpoint_and_are_logged_under_env():
    stats = StatsAggregator()
    stats.record_env_counters({"skipped_oz_above_o0": 0, "unknown_passes": 2})
    stats.record_env_counters({"unknown_passes": 3})
    stats.record_episode("compilergym", 1.5, 1, True, 0.1)
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


def test_mean_metrics_counts_the_non_finite_values_it_leaves_out_and_skips_keys_missing_from_a_row():
    rows = [{"loss": 1.0, "ess": float("nan"), "only_a": 5.0}, {"loss": 3.0, "ess": 0.5}, {"loss": float("inf")}]
    assert mean_metrics(rows) == {"loss": 2.0, "ess": 0.5, "only_a": 5.0, "nonfinite/loss": 1.0, "nonfinite/ess": 1.0}
    # nothing finite: no value rather than NaN, and the count says why
    assert mean_metrics([{"loss": float("nan")}, {"loss": float("-inf")}]) == {"nonfinite/loss": 2.0}
    assert mean_metrics([{"loss": 1.0}, {"loss": 2.0}]) == {"loss": 1.5}  # nothing to count: no count key
    # rows that are means themselves (one per trainer rank): their counts add up, a rank's missing value is one more
    ranks = [{"loss": 1.0, "nonfinite/kl": 2.0}, {"nonfinite/kl": 1.0, "nonfinite/loss": 3.0}, {"loss": float("nan")}]
    assert mean_metrics(ranks) == {"loss": 1.0, "nonfinite/kl": 3.0, "nonfinite/loss": 4.0}


def test_a_round_reported_in_one_call_counts_as_its_steps_and_episodes_one_by_one():
    batched, single = StatsAggregator(), StatsAggregator()
    episodes = [("reach", 1.0, 500, True, 2.0), ("reach", 0.5, 500, False, 2.1)]
    batched.record_collected("worker-0", 1024, episodes)
    single.record_steps("worker-0", 1024)
    for episode in episodes:
        single.record_episode(*episode)
    a, b = batched.snapshot(), single.snapshot()
    assert a.pop("env_steps_per_sec") > 0 and b.pop("env_steps_per_sec") > 0
    assert a == b and a["total_env_steps"] == 1024 and a["total_episodes"] == 2


def test_the_status_lines_success_is_the_last_100_episodes_across_snapshots():
    from async_rl.actors.stats import RECENT_EPISODES
    from async_rl.orchestration.metrics import status_line

    stats = StatsAggregator()
    for k in range(RECENT_EPISODES):  # 30 successes among the first 100 episodes
        stats.record_episode("t", 1.0, 10, k % 10 < 3, 0.1)
    first = snapshot_scalars({"stats": stats.snapshot(), "replay": {}, "inference": {}})
    assert first["rollout/success_rate_recent"] == 0.3 and first["rollout/recent_episodes"] == RECENT_EPISODES
    stats.record_episode("t", 0.0, 10, False, 0.1)  # one failure: this snapshot's own rate is 0
    second = snapshot_scalars({"stats": stats.snapshot(), "replay": {}, "inference": {}})
    assert second["rollout/success_rate"] == 0.0
    # The window slid by one: the oldest episode (a success) left it, the failure came in.
    assert second["rollout/success_rate_recent"] == 0.29
    line = status_line({**first, **second})
    assert "success 0.29" in line and "success 0.00" not in line
    assert "rollout/success_rate_recent" not in snapshot_scalars({"stats": StatsAggregator().snapshot(), "replay": {},
                                                          "inference": {}})  # no episode yet: not shown


def test_a_text_env_shows_completions_per_second_and_their_mean_length(monkeypatch):
    import envs._text
    from async_rl.orchestration.metrics import status_line
    from envs._text import TextEnvBase

    class Echo(TextEnvBase):  # one-step episodes; every response scores 1
        task_name = "echo"

        def _problem(self, start):
            return {"prompt": "say"}

        def score(self, text):
            return 1.0, {"reason": "ok"}

    monkeypatch.setattr(envs._text, "response_text", lambda action, *_: "decoded")  # no tokenizer needed
    env, stats = Echo(None, 0), StatsAggregator()
    for ids in ([5, 6, 7, -1], [8, -1, -1, -1], [1, 2, 3, 4, 5, 6, 7, 8]):  # 3, 1 and 8 tokens; -1 pads
        env.reset()
        env.step(ids)
    assert env.counters() == {"echo_ok": 3, "completions": 3, "completion_tokens": 12}
    stats.record_env_counters(env.counters())
    stats.record_steps("worker-0", 3)
    snap = stats.snapshot()
    assert snap["completions_per_sec"] > 0 and snap["completion_tokens"] == 4.0
    scalars = snapshot_scalars({"stats": snap, "replay": {}, "inference": {}})
    assert scalars["rollout/completion_tokens"] == 4.0 and scalars["rollout/completions_per_sec"] > 0
    line = status_line({**scalars, "rollout/completions_per_sec": 0.35})
    assert "0.35 completions/s" in line and "4 tokens" in line and "steps/s" not in line
    # nothing since: 0 completions/s, no mean length; an env with no completion counters keeps steps/s
    assert stats.snapshot()["completions_per_sec"] == 0 and "completion_tokens" not in stats.snapshot()
    other = snapshot_scalars({"stats": StatsAggregator().snapshot(), "replay": {}, "inference": {}})
    assert "rollout/completions_per_sec" not in other and "steps/s" in status_line(other)
