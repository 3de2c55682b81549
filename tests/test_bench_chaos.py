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
