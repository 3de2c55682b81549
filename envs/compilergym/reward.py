"""The reward of CompilerGym pass ordering.

Reduction r = (c0 - c) / (c0 - c_oz) (``reward_baseline: oz``, 1.0 = as good as -Oz, so every
program weighs the same whatever its size) or (c0 - c) / c0 (``initial``); the -Oz denominator is
at least ``oz_floor * c0`` (programs that -Oz barely shrinks would otherwise give huge rewards);
above ``leaky_above`` it grows with slope ``leakiness``; minus ``step_penalty`` per pass and, per
step, ``noop_penalty`` per pass that left the instruction count unchanged (a pass spent for
nothing). The env's per-step rewards are the increments of that shaped value, so an episode's
return equals the reward of its whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardConfig:
    """Shaping of the instruction-count reduction (see the module docstring)."""

    leaky_above: float = 1.0
    leakiness: float = 1.0
    step_penalty: float = 0.0
    reward_baseline: str = "oz"  # "oz": 1.0 = matches -Oz; "initial": fraction of the -O0 count removed
    oz_floor: float = 0.01  # "oz": the denominator c0 - c_oz is at least this fraction of c0
    noop_penalty: float = 0.0  # per step: minus this for a pass that leaves the instruction count as it was

    def reduction(self, c0: int, c: int, c_oz: int) -> float:
        """(c0 - c) over -Oz's reduction (or over c0 for ``initial``)."""
        if self.reward_baseline == "oz":
            denom = max(c0 - c_oz, self.oz_floor * c0, 1)
        else:
            denom = max(c0, 1)
        return (c0 - c) / denom

    def shaped(self, reduction: float, num_passes: int) -> float:
        r = reduction
        if r > self.leaky_above:
            r = self.leaky_above + (r - self.leaky_above) * self.leakiness
        return r - self.step_penalty * num_passes
