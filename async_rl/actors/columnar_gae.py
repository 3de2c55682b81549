"""GAE pieces of a worker's K lock-stepped envs, kept as columns: one record batch ``[K]`` per round.

The per-env ``GaeSegmenter`` (async_rl/algo/estimators.py) holds one step record per env and step and
stacks each env's piece on its own: K records split off every round and K stacks per cut (measured
~0.95 ms of bookkeeping per round at K = 16, local_buf 64, against ~0.1 ms here). This keeps the
rounds whole and cuts exactly where the segmenter would, per env: a done step closes the env's piece
with bootstrap 0; ``local_buf + 1`` open steps send the first ``local_buf`` out bootstrapped from the
last one's value, which starts the next piece. Envs whose pieces cover the same rounds (lock-step:
nearly always all of them) are stacked once as ``[L, C]`` columns and get one vectorised GAE call, and
the pieces come out in env order, as the segmenters' concatenation did (same values: the recursion is
elementwise per column).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from tensordict import TensorDict

from async_rl.algo.advantages import gae


class _Cut(NamedTuple):
    env: int
    first: int  # round of the piece's first step
    end: int  # round after its last step: its value is the bootstrap (none after a done step)


class ColumnarGae:
    """Rounds of K envs in, GAE pieces (step records with ``advantage`` and ``value_target``) out."""

    def __init__(self, num_envs: int, local_buf: int, gamma: float, lam: float) -> None:
        self.local_buf, self.gamma, self.lam = local_buf, gamma, lam
        self.rounds: list[TensorDict] = []  # record batches [K], oldest first
        self.offset = 0  # round number of rounds[0]
        self.start = [0] * num_envs  # round number of each env's open piece's first step

    def add(self, records: TensorDict, dones: list[bool], dropped: set[int]) -> Optional[TensorDict]:
        """One round's records ``[K]``. ``dropped`` envs' open pieces are discarded (a non-finite
        step: the episode is dropped, the env's next piece starts next round)."""
        now = self.offset + len(self.rounds)
        self.rounds.append(records)
        cuts = []
        for k in range(len(self.start)):
            if k in dropped:
                self.start[k] = now + 1
            elif dones[k]:
                cuts.append(_Cut(k, self.start[k], now + 1))
                self.start[k] = now + 1
            elif now - self.start[k] == self.local_buf:
                cuts.append(_Cut(k, self.start[k], now))
                self.start[k] = now
        return self._pieces(cuts)

    def flush(self) -> Optional[TensorDict]:
        """Cut every env now (before a pause): all its open steps but the last go out, bootstrapped
        from the last one's value; envs with fewer than two open steps keep them."""
        last = self.offset + len(self.rounds) - 1
        cuts = [_Cut(k, s, last) for k, s in enumerate(self.start) if last - s >= 1]
        for cut in cuts:
            self.start[cut.env] = last
        return self._pieces(cuts)

    def _pieces(self, cuts: list[_Cut]) -> Optional[TensorDict]:
        """The cut pieces in env order, as one batch (None if nothing was cut)."""
        spans: dict[tuple[int, int], list[int]] = {}
        for cut in cuts:
            spans.setdefault((cut.first, cut.end), []).append(cut.env)
        if len(spans) == 1:  # lock-step: one block, already in env order
            ((first, end), envs), = spans.items()
            pieces = self._columns(first, end, envs).reshape(-1)
        elif spans:
            by_env: dict[int, TensorDict] = {}
            for (first, end), envs in spans.items():
                by_env.update(zip(envs, self._columns(first, end, envs).unbind(0)))
            pieces = TensorDict.cat([by_env[k] for k in sorted(by_env)])
        else:
            pieces = None
        self._forget()
        return pieces

    def _columns(self, first: int, end: int, envs: list[int]) -> TensorDict:
        """Rounds ``first .. end - 1`` of ``envs`` as ``[C, L]`` step records with advantages, each env's
        bootstrap the value at round ``end`` (0 where the piece ends with this round's done step)."""
        rows = self.rounds[first - self.offset:end - self.offset]
        index = torch.tensor(envs)
        block = TensorDict.stack(rows, dim=1)  # [K, L]
        if len(envs) < block.batch_size[0]:  # leaf by leaf: TensorDict's own [index] costs ~15 ms here
            block = block.apply(lambda t: t.index_select(0, index), batch_size=[len(envs), end - first])
        value = block["value"]
        following = end - self.offset
        bootstrap = (self.rounds[following]["value"][index] if following < len(self.rounds)
                     else torch.zeros(len(envs), dtype=value.dtype))
        adv, target = gae(block["reward"].T, value.T, block["done"].T, bootstrap, self.gamma, self.lam)
        block["advantage"], block["value_target"] = adv.T.contiguous(), target.T.contiguous()
        return block

    def _forget(self) -> None:
        """Drop the rounds no open piece reaches back to."""
        oldest = min(self.start)
        drop = min(max(oldest - self.offset, 0), len(self.rounds))
        if drop:
            del self.rounds[:drop]
            self.offset += drop
