"""Group-stratified draws (actors/groups.stratified_group_slots) and the PACS group baseline."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from async_rl.actors.groups import group_contiguous_order, group_minibatch_order, stratified_group_slots
from async_rl.actors.replay_buffer import ReplayStorage


def test_every_group_in_a_stratified_draw_has_all_its_members_in_equal_numbers():
    g = torch.Generator().manual_seed(0)
    # Three whole groups of 4 members (varying episode lengths) and one group missing member 3.
    group_ids, members = [], []
    for gid, lengths in {10: [5, 7, 6, 9], 11: [8, 3, 4, 5], 12: [6, 6, 6, 6], 13: [9, 9, 9]}.items():
        for m, length in enumerate(lengths):
            group_ids += [gid] * length
            members += [m] * length
    group_ids, members = torch.tensor(group_ids), torch.tensor(members)
    for _ in range(20):
        slots = stratified_group_slots(group_ids, members, 16, 4, g)
        assert slots is not None and len(slots) == 16 and slots.unique().numel() == 16
        for gid in group_ids[slots].unique().tolist():
            assert gid != 13  # incomplete groups are never drawn
            counts = torch.bincount(members[slots][group_ids[slots] == gid], minlength=4)
            assert counts.min() == counts.max() > 0  # all G members, equally
    assert stratified_group_slots(group_ids, members, 400, 4, g) is None  # more than whole groups hold


def _stored_groups(lengths_by_group: dict[int, list[int]]) -> TensorDict:
    """Step rows of groups as the group assembler releases them (group_id, group_member, a step index)."""
    group_ids, members = [], []
    for gid, lengths in lengths_by_group.items():
        for m, length in enumerate(lengths):
            group_ids += [gid] * length
            members += [m] * length
    n = len(group_ids)
    return TensorDict({"group_id": torch.tensor(group_ids), "group_member": torch.tensor(members),
                       "row": torch.arange(n)}, batch_size=[n])


def test_replay_storage_draws_whole_groups_and_consumes_them():
    store = ReplayStorage(capacity=256, seed=0)
    store.add_batch(_stored_groups({1: [10, 12, 9, 11], 2: [8, 8, 8, 8], 3: [20, 20, 20]}))  # group 3 lacks a member
    batch = store.sample_groups(32, 4, consume=True)
    assert batch is not None and batch.batch_size[0] == 32 and batch["row"].unique().numel() == 32
    assert 3 not in batch["group_id"].tolist()
    for gid in batch["group_id"].unique().tolist():
        counts = torch.bincount(batch["group_member"][batch["group_id"] == gid], minlength=4)
        assert counts.min() == counts.max() > 0
    assert store.size() == 10 + 12 + 9 + 11 + 32 + 60 - 32  # consumed rows left the buffer
    assert store.sample_groups(64, 4) is None  # what is left of whole groups cannot supply 64


def test_minibatches_of_a_group_draw_hold_every_member_of_their_groups_equally():
    g = torch.Generator().manual_seed(1)
    store = ReplayStorage(capacity=512, seed=1)
    store.add_batch(_stored_groups({gid: [10 + gid, 9, 12, 11] for gid in range(6)}))  # 96 rows need 3 groups
    batch = store.sample_groups(96, 4)
    order = group_minibatch_order(batch["group_id"], batch["group_member"], g)
    assert sorted(order.tolist()) == list(range(96))  # a permutation
    assert batch["group_id"].unique().numel() >= 3
    for start in range(0, 96, 16):  # minibatches of a multiple of G rows
        mb = batch[order[start:start + 16]]
        for gid in mb["group_id"].unique().tolist():
            counts = torch.bincount(mb["group_member"][mb["group_id"] == gid], minlength=4)
            assert counts.min() == counts.max() > 0, (start, gid, counts)


def test_a_stale_row_is_refilled_by_whole_groups_so_every_minibatch_keeps_its_groups_whole():
    """A prefetched super-batch aged past max_policy_lag in one row; the trainer's
    refill must not hand PACS a partial group (check_group_minibatch's promise)."""
    import asyncio
    from types import SimpleNamespace

    from async_rl.actors.trainer import TrainerActor

    g, size = 4, 32
    store = ReplayStorage(capacity=1024, seed=0)
    rows = _stored_groups({gid: [12, 12, 12, 12] for gid in range(8)})
    rows["policy_version"] = torch.full((rows.batch_size[0],), 5)
    store.add_batch(rows)
    batch = store.sample_groups(size, g, consume=True)
    batch["policy_version"][0] = 1  # one row too old by the time the epoch starts

    async def sample(n):  # what the replay buffer answers (ReplayBuffer.sample): whole groups for a multiple of G
        return store.sample_groups(n, g, consume=True) if n % g == 0 else store.sample(n, consume=True)

    trainer = SimpleNamespace(cfg=SimpleNamespace(group_size=g), whole_groups=True, _min_version=lambda: 3, _refill=sample,
                              replay=SimpleNamespace(count_dropped_stale=SimpleNamespace(remote=lambda n: None)))
    fresh = asyncio.run(TrainerActor.__ray_metadata__.modified_class._drop_stale(trainer, batch))
    assert fresh.batch_size[0] == size and int(fresh["policy_version"].min()) == 5
    for gid in fresh["group_id"].unique().tolist():
        counts = torch.bincount(fresh["group_member"][fresh["group_id"] == gid], minlength=g)
        assert counts.min() == counts.max() > 0, (gid, counts)  # every group whole, all members alike


def test_only_a_loss_comparing_group_members_draws_whole_groups():
    from async_rl.algo import draws_whole_groups, resolve_clip_mode

    assert draws_whole_groups(resolve_clip_mode("pacs"), 4)
    assert not draws_whole_groups(resolve_clip_mode("pacs"), 1)  # no groups
    assert not any(draws_whole_groups(resolve_clip_mode(mode), 4) for mode in ("clip", "soft_clip", "cispo"))


def test_a_prompt_sharing_policys_minibatches_hold_as_few_groups_as_their_size_allows():
    """``group_contiguous_order`` (the trainer's order for a causal LM that computes each distinct prompt once): a
    permutation of the rows in which every group's rows are together, so minibatches of 16 cut from 4 interleaved
    groups of 8 hold 2 groups each; groups and rows come in a random order."""
    g = torch.Generator().manual_seed(0)
    group_ids = torch.tensor([7, 3, 9, 5] * 8)  # rows of a batch interleaved, as a random draw leaves them
    orders = [group_contiguous_order(group_ids, g) for _ in range(10)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(32))
        for start in (0, 16):
            assert group_ids[order[start:start + 16]].unique().numel() == 2
        assert all(group_ids[order[i:i + 8]].unique().numel() == 1 for i in range(0, 32, 8))
    assert len({tuple(o.tolist()) for o in orders}) == 10
    assert len({tuple(group_ids[o[::8]].tolist()) for o in orders}) > 1  # the groups' order varies
