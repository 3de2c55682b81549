"""Which optimiser steps a trainer rank applied, which it skipped and why, and when a run stops for it.

An optimiser step is skipped for one of three reasons (its *origin*):

* ``ratio_guard``: every minibatch of the accumulation window, on every rank, tripped the ratio guard
  (``ratio_threshold``); the trainer fills the gradients with NaN so that DeepSpeed skips the step;
* ``nonfinite_loss``: the same, with at least one of this rank's minibatches skipped for a non-finite loss;
* ``gradient_overflow``: some rank trained on a minibatch of the window, and DeepSpeed's overflow check found
  the reduced gradients non-finite (the loss was finite: the backward made NaN or inf, e.g. masked attention
  kernels over fully masked rows). ``engine.was_step_applied()`` says so after the step at an accumulation
  boundary (ZeRO-1/2 read their optimiser's ``overflow``, in bf16 and fp32 as in fp16);
* ``loss_scale``: the same in fp16, where an overflow is how dynamic loss scaling finds its scale (it halves the
  scale and skips the step; DeepSpeed itself stops once the scale is at its minimum). Counted, shown, and not a
  reason to stop.

A run whose every step is skipped learns nothing while its logs look alive: ``max_skipped_updates_in_a_row``
steps skipped one after another stop it (``check_skipped_updates``), with one line naming the origins.
"""
from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import Iterator, Mapping, Optional

import torch

from async_rl.logger import NONFINITE

ORIGINS = ("ratio_guard", "nonfinite_loss", "gradient_overflow", "loss_scale")
# What each origin means, and what to look at, for the line that stops a run.
ORIGIN_TEXT = {
    "ratio_guard": "the ratio guard (every minibatch's mean ratio above ratio_threshold)",
    "nonfinite_loss": "a non-finite loss in every minibatch",
    "gradient_overflow": "DeepSpeed's overflow check (finite loss, non-finite gradients)",
    "loss_scale": "fp16 loss scaling (an overflow lowered the scale)",
}
STREAK_KEY = "skipped_updates_in_a_row"


class StepHealth:
    """One rank's account of its optimiser steps: ``minibatch(skip)`` for each minibatch, ``step_done`` after the
    step that closes an accumulation window. Skip decisions are the same on every rank (the window's use is
    OR-ed over ranks, DeepSpeed's overflow all-reduced), so every rank counts the same steps skipped; a guard's
    reason is this rank's own."""

    def __init__(self) -> None:
        self.window: list[Optional[str]] = []  # this window's minibatches: None (used) or the skip reason
        self.skipped = Counter({origin: 0 for origin in ORIGINS})  # steps skipped since set-up, by origin
        self.streak = Counter({origin: 0 for origin in ORIGINS})  # the same, of the skips since the last applied step

    def new_epoch(self) -> None:
        self.window.clear()

    def minibatch(self, skip: Optional[str]) -> None:
        self.window.append(skip)

    def window_used(self) -> bool:
        """Whether this rank trained on a minibatch of the current window."""
        return any(reason is None for reason in self.window)

    def step_done(self, applied: bool, used_by_a_rank: bool, loss_scaling: bool = False) -> None:
        """The window's optimiser step ran: ``applied`` (DeepSpeed's ``was_step_applied``); ``used_by_a_rank``:
        some rank trained on a minibatch of it (else the trainer itself made DeepSpeed skip it); ``loss_scaling``:
        fp16's dynamic loss scale is on (an overflow then moves the scale; it neither extends nor ends a run of
        skipped steps)."""
        if applied:
            self.streak = Counter({origin: 0 for origin in ORIGINS})
        else:
            origin = ("nonfinite_loss" if "nonfinite_loss" in self.window else "ratio_guard") if not used_by_a_rank \
                else "loss_scale" if loss_scaling else "gradient_overflow"
            self.skipped[origin] += 1
            self.streak[origin] += origin != "loss_scale"
        self.window.clear()

    def metrics(self) -> dict[str, float]:
        """Skipped steps by origin since set-up (``skipped_updates_<origin>``), the current run of skipped steps
        (``skipped_updates_in_a_row``) and its origins (``skipped_in_a_row_<origin>``)."""
        out = {f"skipped_updates_{origin}": float(n) for origin, n in self.skipped.items()}
        out.update({f"skipped_in_a_row_{origin}": float(n) for origin, n in self.streak.items() if origin != "loss_scale"})
        out[STREAK_KEY] = float(sum(self.streak.values()))
        return out


@contextlib.contextmanager
def gradients_replaced(module: torch.nn.Module, value: float) -> Iterator[None]:
    """Every trainable parameter's gradient from a backward inside the block is ``value``: 0 for a minibatch left
    out (this rank adds nothing to the step), NaN to make DeepSpeed skip a step no rank used. A leaf hook runs
    before the gradient is accumulated, hence before ZeRO-2's own hook reads it; NaN or inf inside a skipped
    minibatch's graph never reaches it."""
    handles = [p.register_hook(functools.partial(torch.full_like, fill_value=value))
               for p in module.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class SkipNotes:
    """The console's line for an epoch that skipped optimiser steps or whose metrics held non-finite values (what
    TensorBoard shows as ``health/skipped_updates_<origin>`` and ``health/nonfinite/<key>``)."""

    def __init__(self) -> None:
        self.seen = dict.fromkeys(ORIGINS, 0.0)  # skipped steps by origin at the last epoch

    def line(self, metrics: Mapping[str, float], epoch: int) -> Optional[str]:
        totals = {o: metrics.get(f"skipped_updates_{o}", self.seen[o]) for o in ORIGINS}
        new = {o: totals[o] - self.seen[o] for o in ORIGINS}
        self.seen = totals
        nonfinite = {k[len(NONFINITE):]: v for k, v in metrics.items() if k.startswith(NONFINITE) and v > 0}
        parts = [f"{n:g} optimiser step(s) skipped by {ORIGIN_TEXT[o]}" for o, n in new.items() if n > 0]
        if nonfinite:
            parts.append("non-finite values: " + ", ".join(f"{k} x{v:g}" for k, v in sorted(nonfinite.items())))
        return f"epoch {epoch}: " + "; ".join(parts) if parts else None


class SkippedUpdatesError(RuntimeError):
    """A run skipped ``max_skipped_updates_in_a_row`` optimiser steps in a row; the message is one line."""


def skipped_updates_line(metrics: Mapping[str, float], limit: int) -> Optional[str]:
    """The line that stops a run whose last ``limit`` (or more) optimiser steps were all skipped, from a trainer
    epoch's metrics (``StepHealth.metrics``, mean over ranks); None while it may go on (``limit`` 0: never stops)."""
    streak = int(round(metrics.get(STREAK_KEY, 0.0)))
    if limit <= 0 or streak < limit:
        return None
    origins = [f"{metrics[f'skipped_in_a_row_{o}']:g} by {ORIGIN_TEXT[o]}" for o in ORIGINS
               if metrics.get(f"skipped_in_a_row_{o}", 0.0) > 0]
    return (f"the last {streak} optimiser steps were all skipped, {'; '.join(origins) or 'origin unknown'}: the "
            f"policy is not learning; stopped at max_skipped_updates_in_a_row={limit} "
            f"(--max-skipped-updates-in-a-row, 0: never stop)")


def check_skipped_updates(metrics: Mapping[str, float], limit: int) -> None:
    """Raises ``SkippedUpdatesError`` when ``skipped_updates_line`` says the run must stop."""
    line = skipped_updates_line(metrics, limit)
    if line is not None:
        raise SkippedUpdatesError(line)
