"""Group rollouts: tickets out, whole groups in (the group estimators; naive also with ``group_size`` 1).

A rollout worker's env slot asks for a **ticket** ``(group_id, task, start)`` at each episode start
and resets its env with ``start`` (same start, same initial state: envs/base.py). The G tickets of
a group go to different workers where it can (at most ``ceil(G / num_workers)`` per worker), so a
slow or dead worker holds few members of any group.

Finished episodes come back whole; the **assembler** keeps a group's episodes until all G are in,
then releases them with the estimator's outcome advantage on every step. Staleness is judged by
the policy version at which each member **started** (its first step), not by all its steps: a
MetaWorld episode is 500 steps and one episode alone can span more versions than ``max_spread``,
so the old rule (span of all steps) dropped long groups whose members were in fact played by
the same policies. Members sharing a start version compare like with like (the group baseline),
and the ratio correction handles the within-episode drift as for any other episode.

A group is dropped (and counted, by reason) when
- ``groups_dropped_spread``: its members' start versions span more than ``max_spread`` versions;
- ``groups_dropped_incomplete``: it is still incomplete when the newest policy seen is more than
  ``max_spread + episode_span`` versions past the newest version at which it handed out a ticket,
  ``episode_span`` being the largest version span of the last ``SPAN_WINDOW`` episodes that came
  back (how many versions an episode takes now). Every member started at or after that version,
  so by then a live member would have come back; one that did not is dead (its worker died)
  or too slow to use. Also when a member's episode broke (``abandon``).

Both live in the replay buffer actor (actors/replay_buffer.py): the assembler feeds its sampling
pool directly, and each call runs there uninterrupted, so tickets and arrivals need no locking and
no second actor to keep consistent. The assembler is deterministic (its starts and group ids come
from the run seed, not from the process), so the buffer's log of tickets, episodes and abandons
(actors/replay_log.py) replayed over a saved ``state_dict`` rebuilds it exactly after a restart:
an episode the buffer answered for is durable while its group waits for the other members.
"""
from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import numpy as np
import ray
import torch
from tensordict import TensorDict

if TYPE_CHECKING:  # the estimators load where a group is assembled, not where this module is imported
    from async_rl.algo.estimators import AdvantageOptions

FORGET_AFTER = 100_000  # closed group ids remembered (late members of a dropped group are discarded quietly)
START_RANGE = 2**31  # starts are drawn from [0, START_RANGE)
SPAN_WINDOW = 64  # recent episodes whose version span bounds how long an incomplete group is waited for


class Ticket(NamedTuple):
    """What an env slot plays next: a member of ``group_id``, on ``task``, from ``start``."""

    group_id: int
    task: int
    start: int


@dataclass
class _Group:
    ticket: Ticket
    issued_version: int  # newest policy version seen when the group last handed out a ticket
    issued: dict[str, int] = field(default_factory=dict)  # worker -> tickets handed to it
    episodes: list[TensorDict] = field(default_factory=list)

    @property
    def n_issued(self) -> int:
        return sum(self.issued.values())

    def start_versions(self) -> list[int]:
        """The policy version of each returned member's first step (the version it started with)."""
        return [int(e["policy_version"][0]) for e in self.episodes]


class GroupAssembler:
    """Ticket ledger and group assembler of one run (see the module docstring).

    ``advantages(returns [G]) -> [G]`` is the estimator's outcome advantage of each member."""

    def __init__(self, group_size: int, max_spread: int, num_workers: int,
                 advantages: Callable[[torch.Tensor], torch.Tensor], seed: int = 0, id_base: int = 0) -> None:
        self.group_size, self.max_spread, self.advantages = group_size, max_spread, advantages
        self.per_worker = math.ceil(group_size / max(num_workers, 1))
        # From the run seed alone: the same run hands out the same starts, and a replay of the
        # buffer's log rebuilds the same ledger. ``id_base`` keeps a ledger that could not be rebuilt
        # (a restart without a log) apart from the ids its predecessor handed out.
        self._rng = np.random.default_rng(seed)
        self._next_id = id_base
        self._groups: "OrderedDict[int, _Group]" = OrderedDict()  # oldest first
        self._closed: "OrderedDict[int, None]" = OrderedDict()
        self.latest_version = 0
        self._spans: "deque[int]" = deque(maxlen=SPAN_WINDOW)  # version span of recent episodes
        self.counters = {"groups_opened": 0, "groups_completed": 0, "groups_dropped": 0, "groups_dropped_spread": 0,
                         "groups_dropped_incomplete": 0, "groups_dropped_unknown": 0, "group_episodes_discarded": 0,
                         "group_steps_discarded": 0}

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

    def _issue(self, group: _Group, worker: str) -> Ticket:
        group.issued[worker] = group.issued.get(worker, 0) + 1
        group.issued_version = self.latest_version
        return group.ticket

    def open_groups(self) -> int:
        """Groups waiting for tickets to be handed out or episodes to come back."""
        return len(self._groups)

    # ---- episodes -----------------------------------------------------------------------
    def add_episode(self, episode: TensorDict) -> list[TensorDict]:
        """One finished episode (steps ``[T]`` carrying ``group_id``, ``episode_return`` and
        ``policy_version``); returns the groups it completed, each ``[sum T]`` with ``advantage``."""
        group_id = int(episode["group_id"][0])
        versions = episode["policy_version"]
        self.latest_version = max(self.latest_version, int(versions.max()))
        self._spans.append(int(versions.max() - versions.min()))
        group = self._groups.get(group_id)
        if group is None:
            if group_id not in self._closed:  # issued by a ledger before a restart
                self._close(group_id, "groups_dropped_unknown")
            self.counters["group_episodes_discarded"] += 1
            self.counters["group_steps_discarded"] += episode.batch_size[0]
            return []
        group.episodes.append(episode)
        released = []
        if len(group.episodes) == self.group_size:
            released.append(self._release(group))
        self.drop_stale()
        return [r for r in released if r is not None]

    def _release(self, group: _Group) -> Optional[TensorDict]:
        starts = group.start_versions()
        if max(starts) - min(starts) > self.max_spread:
            self._close(group.ticket.group_id, "groups_dropped_spread")
            return None
        returns = torch.stack([e["episode_return"][0].float() for e in group.episodes])
        advantages = self.advantages(returns).to(torch.float32)
        for member, (episode, adv) in enumerate(zip(group.episodes, advantages)):
            episode["advantage"] = adv.expand(episode.batch_size[0]).clone()
            # Which member each step belongs to, for group-stratified sampling (stratified_group_slots).
            episode["group_member"] = torch.full((episode.batch_size[0],), member, dtype=torch.int64)
        del self._groups[group.ticket.group_id]
        self._remember(group.ticket.group_id)
        self.counters["groups_completed"] += 1
        return TensorDict.cat(group.episodes)

    def episode_span(self) -> int:
        """How many policy versions an episode spans now (the largest of the last ``SPAN_WINDOW``)."""
        return max(self._spans, default=0)

    def drop_stale(self) -> int:
        """Drop the incomplete groups whose last ticket went out more than ``max_spread +
        episode_span()`` versions before the newest seen (a member still out is dead or too slow
        to use, module docstring); returns how many."""
        wait = self.max_spread + self.episode_span()
        stale = [gid for gid, g in self._groups.items() if self.latest_version - g.issued_version > wait]
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
            self.counters["group_steps_discarded"] += sum(e.batch_size[0] for e in group.episodes)
        self._remember(group_id)
        self.counters[why] += 1
        self.counters["groups_dropped"] += 1

    def _remember(self, group_id: int) -> None:
        self._closed[group_id] = None
        while len(self._closed) > FORGET_AFTER:
            self._closed.popitem(last=False)

    def held_steps(self) -> int:
        """Steps of the episodes waiting in incomplete groups."""
        return sum(e.batch_size[0] for g in self._groups.values() for e in g.episodes)

    # ---- state (the replay buffer's checkpoints and log snapshots) ------------------------
    def state_dict(self) -> tuple[dict[str, Any], list[TensorDict]]:
        """The ledger as JSON-able data, and the held episodes (in the order of ``groups``)."""
        groups = [{"ticket": list(g.ticket), "issued_version": g.issued_version, "issued": g.issued,
                   "episodes": len(g.episodes)} for g in self._groups.values()]
        state = {"groups": groups, "closed": list(self._closed), "latest_version": self.latest_version,
                 "spans": list(self._spans), "next_id": self._next_id, "rng": self._rng.bit_generator.state,
                 "counters": dict(self.counters)}
        return state, [e for g in self._groups.values() for e in g.episodes]

    def load_state_dict(self, state: dict[str, Any], episodes: list[TensorDict]) -> None:
        self._groups.clear()
        held = iter(episodes)
        for g in state["groups"]:
            group = _Group(Ticket(*g["ticket"]), g["issued_version"], dict(g["issued"]),
                           [next(held) for _ in range(g["episodes"])])
            self._groups[group.ticket.group_id] = group
        self._closed = OrderedDict.fromkeys(state["closed"])
        self.latest_version, self._next_id = state["latest_version"], state["next_id"]
        self._spans = deque(state["spans"], maxlen=SPAN_WINDOW)
        self._rng.bit_generator.state = state["rng"]
        self.counters.update(state["counters"])


class GroupSpec(NamedTuple):
    """What the replay buffer's group assembler needs of the run config."""

    advantage: str
    group_size: int
    max_spread: int
    num_workers: int
    stats_name: Optional[str]  # the stats actor, told groups_completed / groups_dropped (health/)
    cfg: AdvantageOptions  # what the estimator's episode_advantages reads
    whole_group_draws: bool  # draw batches by whole groups (a loss comparing members: algo.draws_whole_groups)


class GroupPool:
    """The assembler of a replay buffer actor and the health counts it sends to the stats actor."""

    REPORTED = ("groups_completed", "groups_dropped")

    def __init__(self, spec: GroupSpec, seed: int, id_base: int = 0) -> None:
        from async_rl.algo.estimators import GroupEstimator, advantage_estimator  # noqa: PLC0415 (a replay actor loads them only for group runs)

        estimator = advantage_estimator(spec.advantage)
        assert isinstance(estimator, GroupEstimator)  # GroupSpec: only a group estimator's run has one
        self.assembler = GroupAssembler(spec.group_size, spec.max_spread, spec.num_workers,
                                        lambda returns: estimator.episode_advantages(returns, spec.cfg), seed,
                                        id_base)
        self.whole_group_draws = spec.whole_group_draws
        self.stats_name = spec.stats_name
        self._stats: Optional[Any] = None  # the stats actor, looked up on first use
        self._reported = dict.fromkeys(self.REPORTED, 0)

    def reported_all(self) -> None:
        """A rebuilt assembler's counts were reported by its predecessor: report only what comes next."""
        self._reported = {key: self.assembler.counters[key] for key in self.REPORTED}

    def report(self) -> None:
        """Send what changed since the last report (fire and forget: a lost count is not worth a wait)."""
        if self.stats_name is None:
            return
        for key in self.REPORTED:
            delta = self.assembler.counters[key] - self._reported[key]
            if delta:
                self._stats = self._stats or ray.get_actor(self.stats_name)
                self._stats.record_health.remote(key, delta)
                self._reported[key] += delta


def stamp_episode(steps: TensorDict, group_id: int, success: bool) -> TensorDict:
    """A finished episode's steps ``[T]`` with the group fields of the experience record (group,
    the episode's success, its return: the sum of its scaled rewards) on every step."""
    n = steps.batch_size[0]
    steps["group_id"] = torch.full((n,), group_id, dtype=torch.int64)
    steps["success"] = torch.full((n,), bool(success), dtype=torch.bool)
    steps["episode_return"] = steps["reward"].float().sum().expand(n).clone()
    return steps


def stratified_group_slots(group_ids: torch.Tensor, members: torch.Tensor, n: int, group_size: int,
                           generator: Optional[torch.Generator] = None) -> Optional[torch.Tensor]:
    """Indices of ``n`` items drawn by whole groups: groups are picked at random among those with
    steps of all ``group_size`` members present, and each picked group gives the same number of
    steps from every member (``n // (groups * group_size)`` each, ``groups`` as few as fit), so a
    group in the batch is always represented by all its members (a group baseline over the batch
    sees the whole group). None when the whole groups present cannot supply ``n`` items."""
    if n % group_size:
        raise ValueError(f"a group-stratified draw of {n} items needs a multiple of group_size {group_size}")
    per_group_members: dict[int, dict[int, torch.Tensor]] = {}
    for gid in group_ids.unique().tolist():
        rows = (group_ids == gid).nonzero().squeeze(-1)
        by_member = {int(m): rows[members[rows] == m] for m in members[rows].unique().tolist()}
        if len(by_member) == group_size:
            per_group_members[gid] = by_member
    if not per_group_members:
        return None
    order = torch.randperm(len(per_group_members), generator=generator).tolist()
    whole = [list(per_group_members.values())[i] for i in order]
    per_member = n // group_size  # steps per member slot, spread over the picked groups
    picked: list[torch.Tensor] = []
    for by_member in whole:
        take = min(min(len(r) for r in by_member.values()), per_member)
        if take == 0:
            continue
        for rows in by_member.values():
            picked.append(rows[torch.randperm(len(rows), generator=generator)[:take]])
        per_member -= take
        if per_member == 0:
            return torch.cat(picked)
    return None


def keep_whole_groups(keep: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``keep`` narrowed so that a dropped row takes its whole group with it. A batch drawn by
    ``stratified_group_slots`` holds as many rows of each member of a group, so the rows dropped,
    and drawn again, are then a multiple of the group size: the refill is a whole-group draw too."""
    return keep & ~torch.isin(group_ids, group_ids[~keep])


def group_minibatch_order(group_ids: torch.Tensor, members: torch.Tensor,
                          generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A random order of a batch's rows that keeps each group's rows together, its members taking
    turns (m0, m1, ..., m0, m1, ...). Cut into minibatches of a multiple of the group size, a batch
    drawn by ``stratified_group_slots`` then gives every minibatch each of its groups' members in
    equal numbers, so a group baseline over a minibatch sees the whole group."""
    group_ids, members = group_ids.cpu(), members.cpu()
    width = int(members.max()) + 1
    groups = group_ids.unique()
    order = []
    for g in torch.randperm(len(groups), generator=generator).tolist():
        rows = (group_ids == groups[g]).nonzero().squeeze(-1)
        rows = rows[torch.randperm(len(rows), generator=generator)]
        turn = torch.empty_like(rows)  # the row's place among its member's rows
        for m in members[rows].unique():
            mine = members[rows] == m
            turn[mine] = torch.arange(int(mine.sum()))
        order.append(rows[torch.argsort(turn * width + members[rows])])
    return torch.cat(order)


def group_contiguous_order(group_ids: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A random order of a batch's rows that keeps each group's rows together (groups in random order, rows in
    random order within each). Minibatches cut from it hold as few groups, hence as few distinct prompts, as their
    size allows: the causal LM's training forward computes each distinct prompt once (``lm_shared_prompt``)."""
    group_ids = group_ids.cpu()
    groups = group_ids.unique()
    order = []
    for g in torch.randperm(len(groups), generator=generator).tolist():
        rows = (group_ids == groups[g]).nonzero().squeeze(-1)
        order.append(rows[torch.randperm(len(rows), generator=generator)])
    return torch.cat(order)
