"""The columnar GAE of a worker's K envs (actors/columnar_gae.py) against the per-env reference
segmenter (algo/estimators.py GaeSegmenter): same pieces, same order, same values, on streams with
done steps at different rounds per env, dropped (non-finite) episodes and pauses."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from async_rl.actors.columnar_gae import ColumnarGae
from async_rl.algo.estimators import GaeSegmenter
from async_rl.experience import step_batch

K, LOCAL_BUF, GAMMA, LAM = 5, 4, 0.99, 0.95


def _round(rng: np.random.Generator, done_p: float) -> tuple[TensorDict, list[bool]]:
    obs = TensorDict({"state": torch.randn(K, 3)}, batch_size=[K])
    out = TensorDict({"action": torch.randn(K, 2), "env_action": torch.randn(K, 2), "log_prob": torch.randn(K),
                      "value": torch.randn(K), "policy_version": torch.zeros(K, dtype=torch.int64)}, batch_size=[K])
    dones = [bool(d) for d in rng.random(K) < done_p]
    return step_batch(obs, out, rng.normal(size=K).tolist(), dones), dones


def _assert_same(new: TensorDict | None, old: list[TensorDict]) -> None:
    if not old:
        assert new is None
        return
    ref = torch.cat(old)
    assert new is not None and new.batch_size == ref.batch_size
    assert set(new.keys(True, True)) == set(ref.keys(True, True))
    for key in ref.keys(True, True):
        assert torch.equal(new[key], ref[key]), key


def _compare(rounds: int, done_p: float, drop_p: float, pause_every: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    columns = ColumnarGae(K, LOCAL_BUF, GAMMA, LAM)
    segmenters = [GaeSegmenter(LOCAL_BUF, GAMMA, LAM) for _ in range(K)]
    pushed = 0
    for r in range(rounds):
        records, dones = _round(rng, done_p)
        dropped = {k for k in range(K) if rng.random() < drop_p}
        old = []
        for k, record in enumerate(records.unbind(0)):
            if k in dropped:  # the worker's _drop_episode: a fresh segmenter
                segmenters[k] = GaeSegmenter(LOCAL_BUF, GAMMA, LAM)
                continue
            piece = segmenters[k].add(record, None)
            if piece is not None:
                old.append(piece)
        new = columns.add(records, dones, dropped)
        _assert_same(new, old)
        pushed += 0 if new is None else new.numel()
        if pause_every and r % pause_every == pause_every - 1:
            old = [p for p in (s.flush() for s in segmenters) if p is not None]
            _assert_same(columns.flush(), old)
        assert len(columns.rounds) <= LOCAL_BUF + 2  # rounds no piece reaches are forgotten
    return pushed


def test_lock_step_pieces_match_the_reference():
    assert _compare(rounds=60, done_p=0.0, drop_p=0.0, pause_every=0, seed=0) > 0


def test_uneven_dones_drops_and_pauses_match_the_reference():
    for seed in range(4):
        assert _compare(rounds=120, done_p=0.1, drop_p=0.03, pause_every=7, seed=seed) > 0


def test_all_envs_done_in_the_same_round():
    assert _compare(rounds=40, done_p=0.5, drop_p=0.0, pause_every=0, seed=9) > 0
