"""HeldDraws: the replay buffer's last consuming draw of each requester, handed out again to a retry.

Under ``replay_sampling: consume`` a draw leaves the buffer once its log record is durable, and
only then is it answered. If the answer never reaches the trainer (the buffer died between the
record and the reply, or the call timed out), the trainer asks again; without more, a restarted
buffer replays the record, treats the items as consumed and hands out others: the first ones are
never trained. So a trainer's ask carries a request: its requester name (one stream of asks that
asks one at a time, e.g. ``trainer-0/prefetch``) and a request id that the requester advances
only once an answer arrived, behind a nonce of its process (``prefetch.RequestIds``; a restarted
trainer's ids never equal its predecessor's). The buffer logs the request with the draw and
keeps the drawn items here: the same id again gets the same items (no new consumption), from
memory or, after a restart, rebuilt from the log or its snapshot; a new id from that requester
means the last answer arrived, and its draw replaces the held one. Memory: one draw per
requester (each trainer has two: its prefetch and its stale-row refill).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from tensordict import TensorDict

from async_rl.actors.replay_log import pack, unpack


def draws_file(replay_path: Path) -> Path:
    """Beside a saved replay state: the items of the held draws (when there are any)."""
    return Path(str(replay_path) + ".draws.safetensors")


class HeldDraws:
    def __init__(self) -> None:
        self._held: dict[str, tuple[str, TensorDict]] = {}  # requester -> (request id, items drawn)

    def again(self, request: Sequence[str], n: int) -> Optional[TensorDict]:
        """The items drawn for ``request`` if it is the requester's held draw (a retry), else None."""
        requester, request_id = request
        held = self._held.get(requester)
        if held is None or held[0] != request_id:
            return None
        if held[1].batch_size[0] != n:  # a requester that reuses an id for another ask has a bug
            raise ValueError(f"request {request_id!r} of {requester} drew {held[1].batch_size[0]} items, "
                             f"asked again for {n}")
        return held[1]

    def hold(self, request: Sequence[str], items: TensorDict) -> None:
        """``items`` were drawn for ``request``: they replace the requester's previous draw (answered)."""
        requester, request_id = request
        self._held[requester] = (request_id, items)

    # ---- saved state (checkpoints and log snapshots) --------------------------------------
    def state(self) -> list[tuple[str, str, TensorDict]]:
        """(requester, request id, items) of every held draw (the items are never changed in place)."""
        return [(requester, request_id, items) for requester, (request_id, items) in self._held.items()]

    @staticmethod
    def write(path: Path, state: list[tuple[str, str, TensorDict]], extras: dict[str, Any]) -> None:
        """Write ``state`` beside the replay state at ``path``; what names it goes into ``extras``."""
        if not state:
            return
        blob, sizes = pack([items for _, _, items in state])
        draws_file(path).write_bytes(blob)
        extras["draws"] = [[requester, request_id] for requester, request_id, _ in state]
        extras["draws_sizes"] = sizes

    def load(self, path: Path, extras: dict[str, Any]) -> None:
        """Hold the draws written beside the replay state at ``path`` (none: hold nothing)."""
        self._held = {}
        if extras.get("draws"):
            items = unpack(draws_file(path).read_bytes(), extras["draws_sizes"])
            for (requester, request_id), batch in zip(extras["draws"], items, strict=True):
                self._held[requester] = (request_id, batch)

