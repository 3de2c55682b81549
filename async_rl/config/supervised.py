"""The config keys of supervised fine-tuning (``launch/sft.py``): a section of the run config, so that
SFT reads the same config files as the RL run it prepares (env, policy, LoRA, precision, batch sizes)."""
from __future__ import annotations

from typing import Optional

import pydantic

from async_rl.validation import ConfigSection


class SupervisedSection(ConfigSection):
    """Supervised fine-tuning on demonstrations (launch/sft.py; RL launches ignore it)."""

    demos: Optional[str] = None
    """a demonstrations folder (python -m async_rl.demos record) to train on"""
    sft_epochs: pydantic.PositiveInt = 20
    """passes over the demonstrations"""
    sft_export: Optional[str] = None
    """where the trained policy goes (an RL run's --init-from); null = <log_dir>/policy"""
