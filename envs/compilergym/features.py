"""The observation vector a policy reads from the CompilerGym env (layout in ``observation_features``)."""
from __future__ import annotations

import math

import numpy as np

AUTOPHASE_DIM = 56
# Scalars of the feature vector after the Autophase block (see observation_features).
_SCALARS = ("log_size", "size_vs_o0", "oz_vs_o0", "steps_left")


def feature_dim(num_passes: int) -> int:
    """Length of ``observation_features`` for ``num_passes`` pass flags."""
    return AUTOPHASE_DIM + len(_SCALARS) + 2 * num_passes


def observation_features(autophase: np.ndarray, count: float, o0: float, oz: float, steps_left: float,
                         pass_counts: np.ndarray, last_pass: int) -> np.ndarray:
    """The vector a policy reads, float32 ``[feature_dim(P)]``, every entry about unit scale:

    - Autophase / c0 (56): divided by the program's -O0 count, not the current one, so programs of
      200 and 20,000 instructions look alike and a feature's fall during the episode is the share of
      the original code of that kind the passes removed (over the current count, a program halved
      evenly would look unchanged); log scaling was the alternative but keeps the size in every entry;
    - log1p(c0) / 10 (the size itself), c / c0, c_oz / c0 (how far -Oz gets), steps left / max_steps;
    - per pass n / (1 + n), n its applications so far (0, 0.5, 0.67, ...: whether it ran at all
      matters most), then the last pass one-hot (re-running it at once rarely changes anything).
    """
    c0 = max(float(o0), 1.0)
    last = np.zeros(len(pass_counts), dtype=np.float32)
    if last_pass >= 0:
        last[last_pass] = 1.0
    scalars = [math.log1p(c0) / 10.0, float(count) / c0, float(oz) / c0, float(steps_left)]
    return np.concatenate([np.asarray(autophase, dtype=np.float32) / c0, np.asarray(scalars, dtype=np.float32),
                           (pass_counts / (1.0 + pass_counts)).astype(np.float32), last])
