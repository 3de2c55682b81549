"""get_named: the driver's wait on several actors names who failed or did not answer."""
import asyncio
import threading

import pytest
import ray

from async_rl.errors import ActorFailedError, ActorTimeoutError
from async_rl.orchestration.actor_group import get_named


@ray.remote(num_cpus=0)
class Peer:
    async def fail_after(self, seconds: float):
        await asyncio.sleep(seconds)
        raise RuntimeError("Connection closed by peer")

    async def fail_with(self, seconds: float, message: str):
        await asyncio.sleep(seconds)
        raise RuntimeError(message)

    async def hang(self):
        await asyncio.sleep(3600)

    async def ok(self):
        return 1


@pytest.fixture
def peers(ray_local):
    actors = [Peer.remote(), Peer.remote()]
    ray.get([a.ok.remote() for a in actors], timeout=60)
    yield actors
    for a in actors:
        ray.kill(a)


def test_a_dead_peer_is_named_rather_than_the_rank_that_reported_it(peers):
    reporter, dying = peers
    refs = {"trainer-0": reporter.fail_after.remote(0.2), "trainer-1": dying.hang.remote()}
    killer = threading.Timer(1.0, ray.kill, [dying])  # dies after trainer-0's collective already failed
    killer.start()
    with pytest.raises(ActorFailedError, match=r"^trainer-1 failed during train_epoch 3 \(") as err:
        get_named(refs, 60, "train_epoch 3")
    killer.join()
    assert err.value.actor_name == "trainer-1"


def test_a_peer_that_raised_its_own_error_is_named_rather_than_the_rank_it_cut_off(peers):
    """trainer-1 reported "Connection closed by peer" while trainer-0, alive, had
    closed the connection because its own collective failed a moment later in the report."""
    cut_off, origin = peers
    refs = {"trainer-0": origin.fail_with.remote(1.0, "gloo enforce failed: op.preamble.length <= op.nbytes"),
            "trainer-1": cut_off.fail_with.remote(0.2, "Connection closed by peer [127.0.0.1]:9651")}
    with pytest.raises(ActorFailedError, match=r"^trainer-0 failed during train_epoch 8 \(RuntimeError: gloo enforce"):
        get_named(refs, 60, "train_epoch 8")


def test_the_actor_that_raised_is_named_when_the_others_are_alive(peers):
    refs = {"trainer-0": peers[0].fail_after.remote(0.0), "trainer-1": peers[1].ok.remote()}
    with pytest.raises(ActorFailedError, match=r"^trainer-0 failed during save \(RuntimeError: Connection closed by peer\)"):
        get_named(refs, 60, "save")


def test_a_timeout_names_every_actor_that_did_not_answer(peers):
    refs = {"a": peers[0].ok.remote(), "b": peers[1].hang.remote()}
    with pytest.raises(ActorTimeoutError, match=r"^b did not answer ping within 1 s$"):
        get_named(refs, 1, "ping")


def test_the_supervised_wait_names_the_whole_time_it_gave(peers):
    # The driver's supervised wait polls, then hands get_named only what is left of its deadline: the
    # message must still say how long the actors had (it said "within 0.1 s" after minutes).
    from types import SimpleNamespace

    from async_rl.orchestration.runtime import Runtime

    runtime = SimpleNamespace(check_workers=lambda: None, weight_sync=SimpleNamespace(heal=lambda: False))
    refs = {"trainer-0": peers[0].ok.remote(), "trainer-1": peers[1].hang.remote()}
    with pytest.raises(ActorTimeoutError, match=r"^trainer-1 did not answer train_epoch 2 within 1\.5 s$"):
        Runtime._supervised(runtime, refs, timeout_s=1.5, what="train_epoch 2")
