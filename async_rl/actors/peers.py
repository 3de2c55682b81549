"""How actors that Ray restarts find their peers: by name, never by handle arguments.

Ray keeps a restartable actor's constructor arguments that are object-store objects (large
values, and any argument holding an actor handle) only as long as their owner does, and warns
at every start that a restart may then fail (ray-project/ray#53727). Such actors are given the
names of their peers instead; a large read-only value (a task set) is held by a named
``SharedValue`` actor. Names are unique to a run (``<run tag>:<role>``)."""
from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0)
class SharedValue:
    """Owns one read-only value that restartable actors fetch when they start."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def peer(name: str) -> Any:
    """The handle of the live actor ``name`` (after its restarts too)."""
    return ray.get_actor(name)
