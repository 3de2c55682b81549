"""The heads a VLA policy puts on its backbone's last prompt hidden state.

- Value head: a small tanh MLP -> one value, returned in float32.
- Continuous head: a linear layer giving a Gaussian mean and log-std per action dimension
  (``action = tanh(u)``), and ``ActionNormalizer``, OpenVLA's q01/q99 un-normalisation (and
  its LIBERO gripper convention) from the trained-on action to the env's action.
- Discrete head: OpenVLA's action tokens, 256 bins per dimension coded as the last 256 ids of
  the tokenizer's base vocabulary; logits over those ids, and the bins <-> actions conversion.

Every statistic leaves here in float32, whatever the backbone's dtype (see ``nets``).
"""
from __future__ import annotations

from typing import Literal, Optional, Sequence

import torch
from torch import nn

NUM_BINS = 256  # OpenVLA: 256 bins per action dimension, the last 256 ids of the vocabulary


# ---- value head ------------------------------------------------------------------------------
def value_head(hidden: int, value_hidden: int) -> nn.Sequential:
    """hidden -> tanh MLP -> 1 (orthogonal output layer with gain 1, zero bias)."""
    out = nn.Linear(value_hidden, 1)
    head = nn.Sequential(nn.Linear(hidden, value_hidden), nn.Tanh(), out)
    with torch.no_grad():
        nn.init.orthogonal_(out.weight, gain=1.0)
        out.bias.zero_()
    return head


# ---- continuous head -------------------------------------------------------------------------
def gaussian_head(hidden: int, action_dim: int, init_log_std: float) -> nn.Linear:
    """hidden -> [mean, log-std] per dimension: near-zero means, every log-std at ``init_log_std``."""
    head = nn.Linear(hidden, 2 * action_dim)
    with torch.no_grad():
        nn.init.orthogonal_(head.weight, gain=0.01)
        head.bias.zero_()
        head.bias[action_dim:] = init_log_std
    return head


def gaussian_params(head_out: torch.Tensor, min_log_std: float, max_log_std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, clamped log-std), float32, from ``gaussian_head``'s output."""
    mu, log_std = head_out.float().chunk(2, dim=-1)
    return mu, log_std.clamp(min_log_std, max_log_std)


class ActionNormalizer:
    """OpenVLA's action (un)normalisation: per-dimension q01/q99 bounds and a mask.

    Dimensions with ``mask`` true map [-1, 1] linearly onto [q01, q99]; the others (the
    gripper) pass through. ``gripper: openvla_libero`` then does what OpenVLA's LIBERO
    evaluation does with the last dimension: [0, 1] -> [-1, 1], binarise with sign, and
    invert (LIBERO's -1 is open, the training data's 0 is closed).
    """

    def __init__(self, q01: Sequence[float], q99: Sequence[float], mask: Optional[Sequence[bool]] = None,
                 gripper: Literal["openvla_libero", "none"] = "openvla_libero") -> None:
        self.q01 = torch.as_tensor(q01, dtype=torch.float32)
        self.q99 = torch.as_tensor(q99, dtype=torch.float32)
        self.mask = torch.ones_like(self.q01, dtype=torch.bool) if mask is None else torch.as_tensor(mask, dtype=torch.bool)
        if not (self.q01.shape == self.q99.shape == self.mask.shape) or self.q01.ndim != 1:
            raise ValueError(f"norm stats q01 {tuple(self.q01.shape)}, q99 {tuple(self.q99.shape)} and mask "
                             f"{tuple(self.mask.shape)} must be vectors of one length")
        self.gripper = gripper

    def unnormalize(self, action: torch.Tensor) -> torch.Tensor:
        """[-1, 1] -> the dataset's scale (before gripper handling)."""
        q01, q99, mask = (t.to(action.device) for t in (self.q01, self.q99, self.mask))
        scaled = 0.5 * (action.float() + 1.0) * (q99 - q01) + q01
        return torch.where(mask, scaled, action.float())

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """Inverse of ``unnormalize`` on [q01, q99] (for tests and data preparation)."""
        q01, q99, mask = (t.to(raw.device) for t in (self.q01, self.q99, self.mask))
        scaled = 2.0 * (raw.float() - q01) / (q99 - q01).clamp_min(1e-8) - 1.0
        return torch.where(mask, scaled, raw.float())

    def from_env(self, env_action: torch.Tensor) -> torch.Tensor:
        """Inverse of ``to_env`` in the dataset's scale (demonstration labels): with ``openvla_libero``
        the env's gripper -1 (open) is 1 and +1 (closed) is 0, as in OpenVLA's training data."""
        out = env_action.float()
        if self.gripper == "openvla_libero":
            out = torch.cat([out[..., :-1], (1.0 - out[..., -1:].sign()) / 2.0], dim=-1)
        return out

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """The action the environment receives."""
        out = self.unnormalize(action)
        if self.gripper == "openvla_libero":
            g = torch.sign(2.0 * out[..., -1] - 1.0)  # normalize_gripper_action(binarize=True)
            g = torch.where(g == 0, torch.ones_like(g), g)
            out = torch.cat([out[..., :-1], -g.unsqueeze(-1)], dim=-1)  # invert_gripper_action
        return out


# ---- discrete head ---------------------------------------------------------------------------
def action_token_logits(logits: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """The language model's logits restricted to the action tokens ``[..., NUM_BINS]``, float32."""
    return logits[..., vocab_end - NUM_BINS : vocab_end].float()


def action_token_log_prob(action_logits: torch.Tensor, tokens: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """Log-prob of each action token id under ``action_token_logits`` ``[B, D]``."""
    index = (tokens - (vocab_end - NUM_BINS)).unsqueeze(-1)
    return torch.log_softmax(action_logits, -1).gather(-1, index).squeeze(-1)


def bin_centers() -> torch.Tensor:
    """OpenVLA's 255 bin centres in [-1, 1]."""
    bins = torch.linspace(-1.0, 1.0, NUM_BINS, dtype=torch.float64)
    return ((bins[:-1] + bins[1:]) / 2.0).float()


def tokens_to_normalized(tokens: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """Action token ids -> normalised actions, exactly as OpenVLA's ``predict_action`` decodes."""
    centers = bin_centers().to(tokens.device)
    index = (vocab_end - tokens - 1).clamp(0, centers.numel() - 1)
    return centers[index]


def normalized_to_tokens(action: torch.Tensor, vocab_end: int) -> torch.Tensor:
    """Normalised actions -> token ids, as OpenVLA's ``ActionTokenizer`` encodes."""
    bins = torch.linspace(-1.0, 1.0, NUM_BINS, dtype=torch.float64).to(action.device)
    return vocab_end - torch.bucketize(action.double().clamp(-1.0, 1.0), bins, right=True).clamp(1, NUM_BINS)
