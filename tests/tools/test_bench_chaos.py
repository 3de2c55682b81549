"""The chaos benchmark's kill schedule and trend helper (the run itself is a benchmark, not a test)."""
import random

from benchmarks.bench_chaos import ROLES, _third, schedule


def test_schedule_is_seeded_spaced_and_kills_every_role_before_any_twice():
    plan = schedule(random.Random(3), 8, start=100.0, end=400.0, min_gap=15.0)
    assert plan == schedule(random.Random(3), 8, start=100.0, end=400.0, min_gap=15.0)
    times = [t for t, _ in plan]
    assert times[0] >= 100.0 and times[-1] <= 400.0
    assert all(b - a >= 15.0 - 1e-9 for a, b in zip(times, times[1:]))
    roles = [r for _, r in plan]
    assert sorted(roles[:4]) == sorted(ROLES) and sorted(roles[4:]) == sorted(ROLES)


def test_schedule_with_no_room_still_keeps_the_gap():
    plan = schedule(random.Random(0), 3, start=0.0, end=10.0, min_gap=12.0)
    assert [t for t, _ in plan] == [0.0, 12.0, 24.0]


def test_third_means_of_first_and_last_part():
    points = [(float(i), float(i)) for i in range(9)]
    assert _third(points, 0) == 1.0 and _third(points, 2) == 7.0
    assert _third(points[:2], 0) != _third(points[:2], 0)  # nan: too few points


def test_a_counter_rolled_back_by_a_restart_still_totals_what_every_life_counted():
    from benchmarks.bench_chaos import total_over_lives

    # 0 -> 30 before the kill, the restart restores 10 (a checkpoint's value), then 10 -> 25.
    assert total_over_lives([(1.0, 10.0), (2.0, 30.0), (3.0, 10.0), (4.0, 25.0)]) == 45.0
    assert total_over_lives([(1.0, 5.0), (2.0, 5.0), (3.0, 9.0)]) == 9.0


def test_duplicates_are_what_was_trained_beyond_what_could_be_drawn_once():
    from benchmarks.bench_chaos import duplicated_transitions

    # 1,000 added, 100 evicted, 50 left at the end: at most 850 can be trained once each.
    assert duplicated_transitions(trained=850, added=1000, left_otherwise=100, size_end=50) == 0
    assert duplicated_transitions(trained=768, added=1000, left_otherwise=100, size_end=50) == 0  # some still prefetched
    # A restart brought back 256 consumed items and they were trained again.
    assert duplicated_transitions(trained=1106, added=1000, left_otherwise=100, size_end=50) == 256


def test_replay_counters_after_a_kill_are_compared_with_the_last_ones_read_before_it():
    from benchmarks.bench_chaos import counter_rollbacks

    kill = 10.0
    kept = {"added": [(9.0, 500.0), (9.8, 520.0), (12.0, 520.0), (13.0, 600.0)],
            "sampled": [(9.8, 256.0), (13.0, 512.0)]}
    assert counter_rollbacks([kill], kept) == 0
    rolled = {"added": [(9.0, 500.0), (9.8, 520.0), (12.0, 384.0), (13.0, 600.0)],  # back to a checkpoint's 384
              "sampled": [(9.8, 256.0), (12.0, 128.0)]}
    assert counter_rollbacks([kill], rolled) == 2
    assert counter_rollbacks([], rolled) == 0


def test_draws_never_trained_are_what_was_drawn_beyond_the_trained_and_the_prefetched():
    from benchmarks.bench_chaos import drawn_untrained_transitions

    # Two ranks of super-batch 128, one prefetched each: 103 epochs train 26,368 items.
    assert drawn_untrained_transitions(sampled=26_624, trained=26_368, prefetched_at_most=256) == 0
    assert drawn_untrained_transitions(sampled=26_496, trained=26_368, prefetched_at_most=256) == 0  # one not refilled
    # A draw logged whose reply died with the buffer, then a retry that consumed other items.
    assert drawn_untrained_transitions(sampled=26_752, trained=26_368, prefetched_at_most=256) == 128
