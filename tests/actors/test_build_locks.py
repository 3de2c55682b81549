"""A JIT build killed midway leaves its `lock` file, and torch waits on it without a timeout: the trainer's
set-up removes such a lock once it is older than any build, and leaves a live build's lock alone."""
import os
import time

from async_rl.process_setup import STALE_BUILD_LOCK_S, clear_stale_build_locks


def test_a_stale_build_lock_goes_and_a_fresh_one_stays(tmp_path):
    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    fresh = tmp_path / "py311_cpu" / "other_op" / "lock"
    flat = tmp_path / "flat_op" / "lock"  # TORCH_EXTENSIONS_DIR pointing at the build folders' parent
    for lock in (stale, fresh, flat):
        lock.parent.mkdir(parents=True)
        lock.touch()
    old = time.time() - STALE_BUILD_LOCK_S - 60
    os.utime(stale, (old, old))
    os.utime(flat, (old, old))
    assert sorted(clear_stale_build_locks(tmp_path)) == sorted([stale, flat])
    assert not stale.exists() and not flat.exists() and fresh.exists()
    assert clear_stale_build_locks(tmp_path / "missing") == []
