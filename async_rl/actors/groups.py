"""Group rollouts: tickets out, whole groups in (``group_size`` >= 2, the group estimators).

A rollout worker's env slot asks for a **ticket** ``(group_id, task, start)`` at each episode start
and resets its env with ``start`` (same start, same initial state: envs/base.py). The G tickets of
a group go to different workers where it can (at most ``ceil(G / num_workers)`` per worker), so a
slow or dead worker holds few members of any group.

Finished episodes come back whole; the **assembler** keeps a group's episodes until all G are in,
then releases them with the estimator's outcome advantage on every step. A group is dropped (and
counted) when its members' steps span more than ``max_spread`` policy versions, or when it stays
incomplete until the newest policy seen is more than ``max_spread`` versions past its oldest
(a member whose worker died never comes back).

Both live in the replay buffer actor (actors/replay_buffer.py): the assembler feeds its sampling
pool directly, and Ray runs one call at a time there, so tickets and arrivals need no locking and
no second actor to keep consistent. The state is soft: after a restart, episodes of groups the new
ledger never issued are dropped, one ``groups_dropped`` per group.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch
from tensordict import TensorDict

FORGET_AFTER = 100_000  # closed group ids remembered (late members of a dropped group are discarded quietly)
START_RANGE = 2**31  # starts are drawn from [0, START_RANGE)


class Ticket(NamedTuple):
    """What an env slot plays next: a member of ``group_id``, on ``task``, from ``start``."""

    group_id: int
    task: int
    start: int


@dataclass
class _Group:
    ticket: Ticket
    opened_version: int  # newest policy version seen when the group was opened
    issued: dict[str, int] = field(default_factory=dict)  # worker -> tickets handed to it
    episodes: list[TensorDict] = field(default_factory=list)

    @property
    def n_issued(self) -> int:
        return sum(self.issued.values())

    def oldest_version(self) -> int:
        """Of its members' steps; before any came back, the newest version seen when it opened."""
        return min((int(e["policy_version"].min()) for e in self.episodes), default=self.opened_version)


class GroupAssembler:
    """Ticket ledger and group assembler of one run (see the module docstring).

    ``advantages(returns [G]) -> [G]`` is the estimator's outcome advantage of each member."""

    def __init__(self, group_size: int, max_spread: int, num_workers: int,
                 advantages: Callable[[torch.Tensor], torch.Tensor], seed: int = 0) -> None:
        self.group_size, self.max_spread, self.advantages = group_size, max_spread, advantages
        self.per_worker = math.ceil(group_size / max(num_workers, 1))
        self._rng = np.random.default_rng([seed, os.getpid()])
        # Ids of a restarted ledger never meet those of the one before (soft state, module docstring).
        self._next_id = int.from_bytes(os.urandom(3), "little") << 32
        self._groups: "OrderedDict[int, _Group]" = OrderedDict()  # oldest first
        self._closed: "OrderedDict[int, None]" = OrderedDict()
        self.latest_version = 0
        self.counters = {"groups_opened": 0, "groups_completed": 0, "groups_dropped": 0, "groups_dropped_spread": 0,
                         "groups_dropped_incomplete": 0, "groups_dropped_unknown": 0, "group_episodes_discarded": 0}

    # ---- tickets ------------------------------------------------------------------------
    def ticket(self, worker: str, task: int, fill_only: bool = False) -> Optional[Ticket]:
        """The next ticket for an env slot of ``worker``: a member of the oldest group still handing
        out tickets (at most ``per_worker`` of a group each), else a new group on ``task`` (the
        worker's own choice, so its curriculum holds). ``fill_only`` (a worker about to pause):
        only members of groups already open, ignoring the per-worker bound; None if there is none."""
        self.drop_stale()
        for group in self._groups.values():
            if group.n_issued < self.group_size and (fill_only or group.issued.get(worker, 0) < self.per_worker):
                return self._issue(group, worker)
        if fill_only:
            return None
        group_id, self._next_id = self._next_id, self._next_id + 1
        group = _Group(Ticket(group_id, int(task), int(self._rng.integers(START_RANGE))), self.latest_version)
        self._groups[group_id] = group
        self.counters["groups_opened"] += 1
        return self._issue(group, worker)

    @staticmethod
    def _issue(group: _Group, worker: str) -> Ticket:
        group.issued[worker] = group.issued.get(worker, 0) + 1
        return group.ticket

    def open_groups(self) -> int:
        """Groups waiting for tickets to be handed out or episodes to come back."""
        return len(self._groups)

    # ---- episodes -----------------------------------------------------------------------
    def add_episode(self, episode: TensorDict) -> list[TensorDict]:
        """One finished episode (steps ``[T]`` carrying ``group_id``, ``episode_return`` and
        ``policy_version``); returns the groups it completed, each ``[sum T]`` with ``advantage``."""
        group_id = int(episode["group_id"][0])
        self.latest_version = max(self.latest_version, int(episode["policy_version"].max()))
        group = self._groups.get(group_id)
        if group is None:
            if group_id not in self._closed:  # issued by a ledger before a restart
                self._close(group_id, "groups_dropped_unknown")
            self.counters["group_episodes_discarded"] += 1
            return []
        group.episodes.append(episode)
        released = []
        if len(group.episodes) == self.group_size:
            released.append(self._release(group))
        self.drop_stale()
        return [r for r in released if r is not None]

    def _release(self, group: _Group) -> Optional[TensorDict]:
        versions = torch.cat([e["policy_version"] for e in group.episodes])
        if int(versions.max() - versions.min()) > self.max_spread:
            self._close(group.ticket.group_id, "groups_dropped_spread")
            return None
        returns = torch.stack([e["episode_return"][0].float() for e in group.episodes])
        advantages = self.advantages(returns).to(torch.float32)
        for episode, adv in zip(group.episodes, advantages):
            episode["advantage"] = adv.expand(episode.batch_size[0]).clone()
        del self._groups[group.ticket.group_id]
        self._remember(group.ticket.group_id)
        self.counters["groups_completed"] += 1
        return torch.cat(group.episodes)

    def drop_stale(self) -> int:
        """Drop the incomplete groups whose oldest policy version is more than ``max_spread`` behind
        the newest seen (a member still out would straddle too many); returns how many."""
        stale = [gid for gid, g in self._groups.items() if self.latest_version - g.oldest_version() > self.max_spread]
        for gid in stale:
            self._close(gid, "groups_dropped_incomplete")
        return len(stale)

    def abandon(self, group_id: int) -> None:
        """A member of ``group_id`` will never come back (its episode broke): drop the group now."""
        if group_id in self._groups:
            self._close(group_id, "groups_dropped_incomplete")

    def _close(self, group_id: int, why: str) -> None:
        group = self._groups.pop(group_id, None)
        if group is not None:
            self.counters["group_episodes_discarded"] += len(group.episodes)
        self._remember(group_id)
        self.counters[why] += 1
        self.counters["groups_dropped"] += 1

    def _remember(self, group_id: int) -> None:
        self._closed[group_id] = None
        while len(self._closed) > FORGET_AFTER:
            self._closed.popitem(last=False)


def stamp_episode(steps: TensorDict, group_id: int, success: bool) -> TensorDict:
    """A finished episode's steps ``[T]`` with the group fields of the experience record (group,
    the episode's success, its return: the sum of its scaled rewards) on every step."""
    n = steps.batch_size[0]
    steps["group_id"] = torch.full((n,), group_id, dtype=torch.int64)
    steps["success"] = torch.full((n,), bool(success), dtype=torch.bool)
    steps["episode_return"] = steps["reward"].float().sum().expand(n).clone()
    return steps
