"""RolloutWorker (RolloutWorkerActor is its Ray face): an environment and its preprocessing, never model weights.

Loop: preprocess obs -> await the inference actor -> step the env -> hand the step record to the
advantage estimator's segmenter, which returns replay items to push: GAE pieces with advantages
and value targets computed here, or fixed-length segments that the trainer corrects (V-trace).
With GAE the round's K records stay one batch and are cut as columns (actors/columnar_gae.py).
"""
from __future__ import annotations

import asyncio
import gc
import math
import os
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import numpy as np
import ray
import torch
from tensordict import TensorDict

from async_rl.actors.backpressure import GenerationGate, untrained_bound, wait_limit_s
from async_rl.actors.columnar_gae import ColumnarGae
from async_rl.actors.env_slots import EnvGroup, EnvPool, EnvSlot, EnvThread, FailureWeightedTaskSampler, finite_rows
from async_rl.actors.groups import Ticket, stamp_episode
from async_rl.actors.peers import peer
from async_rl.actors.policy_client import PolicyClient
from async_rl.algo import advantage_estimator
from async_rl.experience import STEP_FIELDS, env_steps, step_batch
from async_rl.process_setup import configure_torch, wait_for
from envs.base import StartUnavailable, episode_success, success_rule

if TYPE_CHECKING:
    from async_rl.config.schema import RunConfig

START_TRIES = 100  # group tickets in a row whose start an env slot may fail to play before the worker fails


class WorkerPeers(NamedTuple):
    """Names of the actors a rollout worker talks to (see async_rl/actors/peers.py: a restartable
    actor finds its peers by name)."""

    task_set: str  # a SharedValue holding the task set
    inference: str
    replay: str
    stats: str


class RolloutWorker:
    """Steps ``envs_per_worker`` environments in lock-step; one inference request per step of all."""

    def __init__(self, index: int, peers: WorkerPeers, preprocessor_factory: Callable[[], Any], cfg: RunConfig) -> None:
        configure_torch(cfg.seed + 1000 * (index + 1), 1)
        inference, inference_name = peer(peers.inference), peers.inference.rsplit(":", 1)[-1]
        replay, stats = peer(peers.replay), peer(peers.stats)
        self.index, self.cfg, self._task_set_holder = index, cfg, peer(peers.task_set)
        self.preprocess = preprocessor_factory()
        self.estimator = advantage_estimator(cfg.advantage)  # what a pushed item is (steps or segments)
        self.grouped = self.estimator.needs_group_rollouts  # episodes are tickets' group members (actors/groups.py)
        self._episodes: list[TensorDict] = []  # finished group members waiting to be pushed
        self._draining = False  # grouped, synchronous mode: the step budget is spent, open groups are filled
        self.task_names: list[str] = []
        self.slots: list[EnvSlot] = []  # made by run(), once the task set has arrived
        self.groups: list[EnvGroup] = []  # the slots in lock-step groups (env_groups), made with them
        self._curriculum: Optional[dict[str, Any]] = None  # a checkpoint's task-sampler state, applied by run()
        # Shared memory with the inference actor when on its node (actors/shared_slab.py), else Ray
        # (a slab slot per group's request in flight, and one for a bootstrap request)
        self.policy = PolicyClient(inference, inference_name, cfg.actor_timeout_s, cfg.shared_memory,
                                   f"worker-{index}", cfg.envs_per_worker, depth=cfg.env_groups + 1)
        self.replay, self.stats = replay, stats
        self._stopped = False
        self._push_ref: Optional[ray.ObjectRef] = None
        self._push_batch: Optional[TensorDict] = None  # what _push_ref carries (pushed again if the buffer died)
        self._push_method = "add_batch"  # the replay method _push_ref called
        # No generation while the buffer holds max_untrained_items undrawn items (actors/backpressure.py)
        self._gate = GenerationGate(untrained_bound(cfg), wait_limit_s(cfg))
        # Each push is named (this process, a count): the buffer stores a name once, so pushing again a
        # batch the dead buffer had already logged does not store it twice.
        self._push_names, self._push_id = (f"worker-{index}/{os.getpid()}-{time.time_ns()}", 0), ""
        self.env_steps = 0
        self._env_thread = EnvThread(f"worker-{index}-env", inline=cfg.inline_env_steps)
        self._resume = asyncio.Event()  # cleared by pause() (synchronous mode)
        self._resume.set()
        self._paused = asyncio.Event()  # set while the loop waits at a step boundary
        self._pause_at: Optional[int] = None  # env step count at which to pause (synchronous mode)
        self._env_counts: dict[int, dict[str, int]] = {}  # per env: its counters() at the last report
        # Reported to the stats actor once per round (_report_collected), not once per push and episode
        self._pushed_steps = 0
        self._ended: list[Any] = []

    async def pause(self) -> int:
        """Stop before the next step (pushes in flight finish); returns env steps so far."""
        self._resume.clear()
        await self._paused.wait()
        return self.env_steps

    async def resume(self, steps: Optional[int] = None) -> None:
        """Collect again; with ``steps``, pause by itself once that many more env steps are taken
        (synchronous mode: each worker collects its share of a super-batch, no more)."""
        self._pause_at = None if steps is None else self.env_steps + steps
        if self._draining:  # the slots that only stepped while groups were filled start real episodes
            self._draining = False
            for slot in self.slots:
                if slot.ticket is None:
                    slot.segmenter.take()
                    self._start_episode(slot)
        self._paused.clear()
        self._resume.set()

    async def wait_paused(self) -> int:
        """Returns (env steps so far) once the worker has paused and pushed what it collected."""
        await self._paused.wait()
        return self.env_steps

    async def pid(self) -> int:
        return os.getpid()

    def _segmenter(self) -> Any:
        return self.estimator.segmenter(self.cfg)

    def _start_episode(self, slot: EnvSlot) -> None:
        """Pick the slot's next task; ``_reset_envs`` makes / resets its env before the next step."""
        slot.task, slot.env, slot.obs, slot.ticket = self.sampler.sample(), None, None, None
        slot.episode_return, slot.episode_length, slot.success, slot.started = 0.0, 0, False, time.monotonic()

    def _reset_in_thread(self, slots: list[EnvSlot]) -> list[EnvSlot]:
        """Reset the slots' envs; returns the slots whose env cannot start from their ticket's start."""
        unavailable = []
        for slot in slots:
            slot.env = slot.envs.get(slot.task)
            try:
                obs = slot.env.reset() if slot.ticket is None else slot.env.reset(start=slot.ticket.start)
            except StartUnavailable:
                unavailable.append(slot)
                continue
            slot.obs = self.preprocess(obs, self.task_names[slot.task])
        return unavailable

    async def _reset_envs(self, slots: Optional[list[EnvSlot]] = None) -> None:
        """Start the episodes ``_start_episode`` picked (in the env thread) among ``slots`` (default
        all); group members first take their tickets. A member that cannot start from its group's
        start drops that group (its other members play another state) and takes another ticket."""
        starting = [slot for slot in (self.slots if slots is None else slots) if slot.obs is None]
        for _ in range(START_TRIES):
            if starting and self.grouped:
                await self._take_tickets(starting)
            if not starting:
                return
            starting = await self._env_thread.call(self._reset_in_thread, starting)
            for slot in starting:
                self.replay.abandon_group.remote(slot.ticket.group_id)
                slot.ticket = None
        raise RuntimeError(f"worker-{self.index}: no start of {START_TRIES} group tickets in a row could be played")

    async def _take_tickets(self, slots: list[EnvSlot]) -> None:
        """A ticket per slot from the replay buffer's ledger (the slot's sampled task is its proposal
        for a new group). While draining only open groups are filled: a slot without a ticket steps
        an episode that is never pushed (``resume`` restarts it)."""
        deadline = time.monotonic() + self.cfg.actor_timeout_s
        while True:  # one call for all the slots
            try:
                found = await wait_for(self.replay.tickets.remote(f"worker-{self.index}", [s.task for s in slots],
                                                                  self._draining),
                                       max(deadline - time.monotonic(), 0.001), "replay buffer", "tickets")
                break
            except ray.exceptions.RayActorError:  # restarting: ask the new buffer
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)
        for slot, ticket in zip(slots, found, strict=True):
            slot.ticket = None if ticket is None else Ticket(*ticket)
            if slot.ticket is not None:
                slot.task = slot.ticket.task

    async def _groups_filled(self) -> bool:
        """Synchronous mode, step budget spent: whether the worker may pause. With group rollouts it
        first hands out the members still missing from open groups and finishes every ticketed
        episode, so no group straddles the pause (and the policy update after it)."""
        if not self.grouped:
            return True
        self._draining = True
        await self._reset_envs()
        return all(slot.ticket is None for slot in self.slots)

    def _step_in_thread(self, slots: list[EnvSlot], env_actions: np.ndarray,
                        versions: Optional[list[int]] = None) -> tuple[list[tuple], list[TensorDict]]:
        # Envs whose rewards read the training step (the prompts env's trainer_state) hear which policy acted.
        for slot, version in zip(slots, versions or ()):
            getattr(slot.env, "set_policy_version", lambda _version: None)(version)
        # Envs that score elsewhere (humaneval: the sandbox pool) start every slot's scoring first: in parallel.
        for slot, a in zip(slots, env_actions):
            getattr(slot.env, "prepare_step", lambda _action: None)(a)
        results = [slot.env.step(a) for slot, a in zip(slots, env_actions)]
        return results, [self.preprocess(r[0], self.task_names[slot.task]) for slot, r in zip(slots, results)]

    def _end_episode(self, slot: EnvSlot) -> None:
        if self.grouped:
            steps = slot.segmenter.take()
            if slot.ticket is not None and steps is not None:
                self._episodes.append(stamp_episode(steps, slot.ticket.group_id, slot.success))
        self.sampler.record(slot.task, slot.success)
        self._ended.append((self.task_names[slot.task], slot.episode_return, slot.episode_length, slot.success,
                            time.monotonic() - slot.started))
        self._report_env_counters(slot.env)
        self._start_episode(slot)

    def _report_env_counters(self, env: Any) -> None:
        """Send what the env counted since the last report (envs with a ``counters()`` method:
        running totals such as CompilerGym's skipped programs); logged as ``env/<name>``."""
        counters = getattr(env, "counters", None)
        if counters is None:
            return
        first = id(env) not in self._env_counts  # report zeros once, so that every counter is logged
        now, last = counters(), self._env_counts.get(id(env), {})
        deltas = {k: n - last.get(k, 0) for k, n in now.items() if first or n != last.get(k, 0)}
        if deltas:
            self._env_counts[id(env)] = now
            self.stats.record_env_counters.remote(deltas)
        components = getattr(env, "reward_components", None)  # text envs: each reward function's values
        values = components() if components is not None else None
        if values:
            self.stats.record_reward_components.remote(values)

    def _drop_episode(self, slot: EnvSlot) -> None:
        slot.segmenter = self._segmenter()
        if slot.ticket is not None:  # its group cannot complete
            self.replay.abandon_group.remote(slot.ticket.group_id)
        self.stats.record_health.remote("dropped_episodes")
        self._start_episode(slot)

    async def stop(self) -> None:
        self._stopped = True
        self._resume.set()

    async def _push(self, batch: Any, method: str = "add_batch") -> None:
        # At most one push in flight: bounds memory and surfaces replay errors here.
        await self._settle_push()
        self._push_method = method
        prefix, count = self._push_names
        self._push_names, self._push_id = (prefix, count + 1), f"{prefix}/{count}"
        self._push_ref, self._push_batch = getattr(self.replay, method).remote(batch, self._push_id), batch

    async def _settle_push(self) -> None:
        """Wait for the push in flight. If the buffer died meanwhile, Ray restarts it as its log left
        it, with or without this batch: push it again under the same id (stored once; for at most
        ``actor_timeout_s``)."""
        deadline = time.monotonic() + self.cfg.actor_timeout_s
        while self._push_ref is not None:
            try:
                answer = await wait_for(self._push_ref, max(deadline - time.monotonic(), 0.001), "replay buffer",
                                        "add_batch")
                # add_batch answers the buffer's size; add_episodes what entered it (the gate then asks)
                self._gate.reported(answer if self._push_method == "add_batch" else None)
                self._push_ref = self._push_batch = None
            except ray.exceptions.RayActorError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)
                self._push_ref = getattr(self.replay, self._push_method).remote(self._push_batch, self._push_id)

    async def _push_and_count(self, batch: TensorDict) -> None:
        """Push to the replay buffer and count its env steps (step records, or the steps of segments)."""
        await self._push(batch)
        self._pushed_steps += env_steps(batch)

    async def _push_episodes(self) -> None:
        """Hand the finished group members to the replay buffer's group assembler."""
        episodes, self._episodes = self._episodes, []
        await self._push(episodes, "add_episodes")
        self._pushed_steps += sum(e.batch_size[0] for e in episodes)

    def _report_collected(self) -> None:
        """One stats call for a round: the env steps it pushed and the episodes that ended in it."""
        if self._pushed_steps or self._ended:
            self.stats.record_collected.remote(f"worker-{self.index}", self._pushed_steps, self._ended)
            self._pushed_steps, self._ended = 0, []
        waits, seconds = self._gate.take_counts()
        if waits:
            self.stats.record_health.remote("backpressure_waits", waits)
            self.stats.record_health.remote("backpressure_wait_ms", round(seconds * 1000))

    async def _make_slots(self) -> None:
        """The task set (awaited: the constructor of an async actor must not block on it) and the envs."""
        cfg, index = self.cfg, self.index
        task_set = await wait_for(self._task_set_holder.get.remote(), cfg.actor_timeout_s, "task-set holder", "get")
        self.task_names = list(task_set.task_names)
        self.success_rule = success_rule(task_set)
        self.sampler = FailureWeightedTaskSampler(len(self.task_names), cfg.task_failure_window,
                                                  np.random.default_rng(cfg.seed + index))
        if self._curriculum is not None:  # from the checkpoint this run resumed
            self.sampler.load_state_dict(self._curriculum)
        self.slots = [
            EnvSlot(EnvPool(task_set, seed=cfg.seed + 100_003 * (index + 1) + 7_777 * k), self._segmenter())
            for k in range(cfg.envs_per_worker)
        ]
        # GAE: each group's steps kept as rounds and cut as columns (the slots' segmenters stay unused)
        size = cfg.envs_per_worker // cfg.env_groups
        self.groups = [EnvGroup(self.slots[g:g + size],
                                ColumnarGae(size, cfg.rollout_steps, cfg.gamma, cfg.gae_lambda)
                                if cfg.advantage == "gae" else None)
                       for g in range(0, cfg.envs_per_worker, size)]

    async def curriculum_state(self) -> Optional[dict[str, Any]]:
        """The task sampler's state (None before the worker has started)."""
        return self.sampler.state_dict() if self.slots else self._curriculum

    async def load_curriculum_state(self, state: Optional[dict[str, Any]]) -> None:
        """Continue a checkpoint's curriculum (called before ``run``)."""
        self._curriculum = state

    async def run(self) -> int:
        """Collect until ``stop``; returns the number of env steps taken."""
        if not self.slots:
            await self._make_slots()
        for slot in self.slots:
            self._start_episode(slot)
        frozen = False  # gc.freeze() once the envs exist (they are built at their first reset)
        try:
            while not self._stopped:
                if not self._resume.is_set():
                    await self._pause_here()
                    continue
                for group in self.groups:  # a request per group in flight (after a start or a pause)
                    if group.request is None:
                        await self._reset_envs(group.slots)
                        await self._gate.before_generation(self._wait_for_room, self._leaving)
                        if self._leaving():
                            break
                        self._ask(group)
                if self._leaving():  # stopped or paused at the gate: the loop's top pauses or ends
                    continue
                if not frozen:
                    # Everything alive now (modules, envs, model) leaves the collector's view: full collections
                    # then scan only what the loop allocates (K = 16, one process: 0.39 -> 0.006 ms per round).
                    gc.freeze()
                    frozen = True
                for group in self.groups:  # the other groups' forward passes run while this one steps
                    await self._step_group(group)
                    # Ended episodes restart now (group members take their tickets: between two steps every
                    # slot holds one), before the pause check, which may hand out the tickets still missing.
                    await self._reset_envs(group.slots)
                    if self._pause_at is not None and self.env_steps >= self._pause_at and await self._groups_filled():
                        self._pause_at = None
                        self._resume.clear()
                    if self._stopped or not self._resume.is_set():
                        break
                    await self._gate.before_generation(self._wait_for_room, self._leaving)
                    if self._leaving():
                        break
                    self._ask(group)
        except BaseException:  # the answers in flight are not waited for: the error ends the run
            for group in self.groups:
                group.cancel_request()
            raise
        for group in self.groups:
            await group.drop_request()
        self._report_collected()
        await self._settle_push()
        for slot in self.slots:
            await self._env_thread.call(slot.envs.close)
        self._env_thread.close()
        self.policy.close()
        return self.env_steps

    def _leaving(self) -> bool:
        """Stopped, or asked to pause (synchronous mode, the final evaluation): a wait at the gate ends."""
        return self._stopped or not self._resume.is_set()

    async def _wait_for_room(self, bound: int, timeout_s: float) -> dict[str, int]:
        """The replay buffer's ``wait_for_room`` (a buffer being restarted: asked again after a pause)."""
        try:
            return await wait_for(self.replay.wait_for_room.remote(bound, timeout_s), timeout_s + self.cfg.actor_timeout_s,
                                  "replay buffer", "wait_for_room")
        except ray.exceptions.RayActorError:
            await asyncio.sleep(0.5)
            return {"size": bound, "sampled": -1}  # unknown: the gate asks again (a restart counts as progress)

    def _ask(self, group: EnvGroup) -> None:
        """Send the group's observations to the inference actor; the answer is awaited by ``_step_group``."""
        group.obs = TensorDict.stack([slot.obs for slot in group.slots])
        group.request = asyncio.ensure_future(self.policy.act(group.obs))

    async def _pause_here(self) -> None:
        """Synchronous mode: hand over what this policy version collected, then wait for ``resume``.
        Requests in flight are dropped: their actions came from the policy before the pause."""
        for group in self.groups:
            await group.drop_request()
        flushed = [piece for group in self.groups for piece in
                   ([group.columns.flush()] if group.columns is not None else
                    [slot.segmenter.flush() for slot in group.slots])]
        pieces = [p for p in flushed if p is not None]
        if pieces:
            await self._push_and_count(TensorDict.cat(pieces))
        self._report_collected()
        await self._settle_push()
        self._paused.set()
        await self._resume.wait()
        self._paused.clear()

    async def _step_group(self, group: EnvGroup) -> None:
        """One lock-step round of a group: its answer, its envs stepped, its pieces and episodes pushed."""
        cfg, obs, slots = self.cfg, group.obs, group.slots
        out = await group.request
        group.request = group.obs = None
        versions = out.get("policy_version", None)
        versions = None if versions is None else [int(v) for v in np.asarray(versions).reshape(-1)]
        results, next_obs = await self._env_thread.call(self._step_in_thread, slots, out["env_action"].numpy(), versions)
        # A non-finite observation or reward ends its episode; what was not pushed yet is dropped.
        stacked_next = TensorDict.stack(next_obs)  # stacked once: the finiteness check and the bootstrap read it
        finite = finite_rows(stacked_next)
        broken = {k for k, r in enumerate(results) if not (math.isfinite(r[1]) and finite[k])}
        # A time limit is not a terminal state: fold the value of the cut-off state into the reward.
        cut = [k for k, r in enumerate(results) if r[3] and not r[2] and k not in broken]
        bootstrap = {}
        if cut:
            values = (await self.policy.act(stacked_next[torch.tensor(cut)]))["value"]
            bootstrap = dict(zip(cut, values.tolist()))
        dones = [bool(r[2] or r[3]) for r in results]
        records = step_batch(obs, out, [r[1] * cfg.reward_scale + cfg.gamma * bootstrap.get(k, 0.0)
                                        for k, r in enumerate(results)], dones)
        if cfg.normalize_advantages_per == "task":
            records["task"] = torch.tensor([slot.task for slot in slots], dtype=STEP_FIELDS["task"].dtype)
        if group.columns is not None:
            pieces = [p for p in (group.columns.add(records, dones, broken),) if p is not None]
            per_env: tuple[Any, ...] = ()
        else:
            pieces, per_env = [], records.unbind(0)
        for k, (slot, (_, reward, terminated, truncated, info)) in enumerate(zip(slots, results)):
            if k in broken:
                self._drop_episode(slot)
                continue
            piece = None if group.columns is not None else slot.segmenter.add(per_env[k], next_obs[k])
            if piece is not None:
                pieces.append(piece)
            slot.episode_return += reward
            slot.episode_length += 1
            slot.success = episode_success(self.success_rule, slot.success, info)
            if dones[k]:
                self._end_episode(slot)
            else:
                slot.obs = next_obs[k]
        self.env_steps += len(slots)
        if pieces:
            await self._push_and_count(TensorDict.cat(pieces))
        if self._episodes:
            await self._push_episodes()
        self._report_collected()


@ray.remote
class RolloutWorkerActor(RolloutWorker):
    """The Ray face of RolloutWorker (environments, never model weights): an actor of its methods; tests may use RolloutWorker in process."""
