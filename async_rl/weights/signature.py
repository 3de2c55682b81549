"""Weight signatures: (name, shape, dtype) per tensor, in order, compared between the members of
a weight-sync group before the first broadcast, so that a model mismatch is one error naming the
tensor rather than a broadcast that hangs or fills the wrong tensors."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

from async_rl.errors import ConfigError

Signature = list[tuple[str, tuple[int, ...], str]]


def tensor_signature(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Signature:
    """(name, shape, dtype string) per tensor, in order, e.g. ("w", (4, 3), "torch.float32")."""
    return [(str(name), tuple(int(d) for d in t.shape), str(t.dtype)) for name, t in named_tensors]


def normalise_signature(sig: Iterable[Sequence[Any]]) -> Signature:
    """The signature with tuples and plain types again (JSON turns tuples into lists)."""
    return [(str(n), tuple(int(d) for d in shape), str(dt)) for n, shape, dt in sig]


def first_signature_difference(ours: Iterable[Sequence[Any]], theirs: Iterable[Sequence[Any]]) -> str | None:
    """None if the signatures are equal, else a one-line description of the first difference."""
    ours, theirs = normalise_signature(ours), normalise_signature(theirs)
    for i, ((n1, s1, d1), (n2, s2, d2)) in enumerate(zip(ours, theirs)):
        if n1 != n2:
            return f"tensor #{i}: name '{n1}' (ours) vs '{n2}' (theirs)"
        if s1 != s2:
            return f"tensor #{i} '{n1}': shape {s1} (ours) vs {s2} (theirs)"
        if d1 != d2:
            return f"tensor #{i} '{n1}': dtype {d1} (ours) vs {d2} (theirs)"
    if len(ours) > len(theirs):
        i = len(theirs)
        return (f"tensor #{i} '{ours[i][0]}' is missing on their side "
                f"({len(ours)} tensors ours, {len(theirs)} theirs)")
    if len(theirs) > len(ours):
        i = len(ours)
        return (f"extra tensor #{i} '{theirs[i][0]}' on their side "
                f"({len(ours)} tensors ours, {len(theirs)} theirs)")
    return None


def check_signature(ours: Iterable[Sequence[Any]], theirs: Iterable[Sequence[Any]], peer_name: str) -> None:
    """Raise ConfigError naming the peer and the first difference if the signatures differ."""
    difference = first_signature_difference(ours, theirs)
    if difference is not None:
        raise ConfigError(f"weight signature mismatch with {peer_name}: {difference}")
