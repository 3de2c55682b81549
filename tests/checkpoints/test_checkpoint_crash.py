"""A checkpoint writer SIGKILLed at seeded random points (mid-file, mid-commit, mid-prune, while
re-saving an epoch) never leaves a broken checkpoint behind, nor loses the previous one: what is
left loads with the real loaders and holds exactly what was saved for its epoch."""
import multiprocessing
import multiprocessing.forkserver
import random
import time

import checkpoint_writer as writer
import pytest
from conftest import TESTS, child_pythonpath

from async_rl import checkpoint as ckpt

KILLS = 30


@pytest.fixture(scope="module")
def forkserver():
    """Children forked from a server that imported torch and the writer once (a fresh Python per
    kill would spend seconds importing; forking the test process could inherit torch threads)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["checkpoint_writer"])
    with child_pythonpath(TESTS):  # Python 3.11's forkserver ignores the parent's sys.path
        multiprocessing.forkserver.ensure_running()
    return ctx


def test_a_writer_killed_at_random_points_leaves_the_previous_checkpoint_loadable(tmp_path, forkserver):
    root = ckpt.checkpoint_root(str(tmp_path))
    writer.save(root, 1)
    rng = random.Random(14)
    latest_epoch, committed = 1, 0
    for kill in range(KILLS):
        started = forkserver.Event()
        child = forkserver.Process(target=writer.write_forever, args=(str(root), started), daemon=True)
        child.start()
        assert started.wait(60), "the writer did not start"
        time.sleep(rng.uniform(0.0, 0.5))
        child.kill()  # SIGKILL: no clean-up of any kind
        child.join(30)
        found = ckpt.complete_checkpoints(root)
        assert found, f"kill {kill}: no checkpoint left"
        epochs = [writer.check_loadable(path) for path in found]  # every listed checkpoint loads, not only the newest
        assert epochs == sorted(epochs) and len(found) <= writer.KEEP + 1, [p.name for p in found]
        latest = ckpt.latest_checkpoint(str(tmp_path))
        assert latest == found[-1]
        assert epochs[-1] >= latest_epoch, f"kill {kill}: the newest checkpoint went back from {latest_epoch} to {epochs[-1]}"
        committed += epochs[-1] - latest_epoch
        latest_epoch = epochs[-1]
    assert committed >= 3, "the kills should fall across several saves, not all before the first commit"
    ckpt.discard_staging(root)  # what a run does at its start and end: leftovers of killed saves go
    assert all(p.name.startswith(ckpt.PREFIX) for p in root.iterdir()), sorted(p.name for p in root.iterdir())
