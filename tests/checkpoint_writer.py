"""A checkpoint writer for the crash test (tests/checkpoints/test_checkpoint_crash.py), in its own module so
that a forkserver can preload it: it writes checkpoints with the real save functions, forever,
until the test SIGKILLs it. Every file's content is a function of the epoch, so a loader can
tell a complete checkpoint from a torn one."""
from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict

from async_rl import checkpoint as ckpt
from async_rl.actors.replay_buffer import ReplayStorage

ITEMS = 512
KEEP = 2


def model(epoch: int) -> torch.nn.Module:
    """A ~1.1 M-parameter model (a few MB on disk) whose weights are a function of ``epoch``."""
    torch.manual_seed(epoch)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 768))


def items(epoch: int) -> TensorDict:
    rows = torch.arange(ITEMS, dtype=torch.float32).unsqueeze(-1) + 1000.0 * epoch
    return TensorDict({"obs": {"state": rows.expand(ITEMS, 128)},
                       "policy_version": torch.full((ITEMS,), epoch, dtype=torch.int64)}, batch_size=[ITEMS])


def trainer_state(epoch: int) -> dict:
    torch.manual_seed(10_000 + epoch)
    return {"optimizer": {"exp_avg": torch.randn(300_000)}, "global_steps": epoch, "rng": ckpt.rng_state()}


def save(root: Path, epoch: int) -> Path:
    """One checkpoint of ``epoch``, written and committed as a run writes one."""
    staging = ckpt.staging_dir(root, epoch)
    ckpt.save_model(model(epoch), staging)
    store = ReplayStorage(ITEMS, seed=epoch)
    store.add_batch(items(epoch))
    store.save(staging / "replay.safetensors")
    ckpt.save_weights_only(trainer_state(epoch), staging / "trainer-0.pt")
    ckpt.save_tensordict(items(epoch)[:64], staging / "pending-trainer-0-0.safetensors")
    return ckpt.commit(staging, {"format": ckpt.FORMAT, "epoch": epoch, "policy_version": epoch}, keep=KEEP)


def write_forever(root: str, started: object) -> None:
    """Re-save the newest epoch (a resumed run that ends before training an epoch), then go on
    with the next epochs; ``started`` (an Event) is set before the first file is written."""
    torch.set_num_threads(1)
    root = Path(root)
    latest = ckpt.complete_checkpoints(root)[-1]
    epoch = int(ckpt.read_meta(latest)["epoch"])
    started.set()
    while True:
        save(root, epoch)
        epoch += 1


def check_loadable(path: Path) -> int:
    """Load every part of the checkpoint at ``path`` with the real loaders and compare it with
    what ``save`` wrote for its epoch; returns the epoch."""
    epoch = int(ckpt.read_meta(path)["epoch"])
    restored = model(epoch + 1)  # other weights, overwritten by the load
    ckpt.load_model(restored, path)
    for (name, got), want in zip(restored.state_dict().items(), model(epoch).state_dict().values()):
        assert torch.equal(got, want), f"{path.name}: {name} differs from epoch {epoch}'s weights"
    store = ReplayStorage(ITEMS, seed=0)
    store.load(path / "replay.safetensors")
    assert store.size() == ITEMS and store.counters["added"] == ITEMS, path.name
    assert (store.snapshot() == items(epoch)).all(), f"{path.name}: replay items are not epoch {epoch}'s"
    state = ckpt.load_weights_only(path / "trainer-0.pt")
    assert state["global_steps"] == epoch
    assert torch.equal(state["optimizer"]["exp_avg"], trainer_state(epoch)["optimizer"]["exp_avg"])
    assert (ckpt.load_tensordict(path / "pending-trainer-0-0.safetensors") == items(epoch)[:64]).all()
    return epoch
