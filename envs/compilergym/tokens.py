"""Token ids of CompilerGym observations and actions: LLVM IR text hashed into a vocabulary
(``tokenize_ir``), and pass sequences as ids of the special tokens then one per pass flag (``PassVocab``)."""
from __future__ import annotations

import re
import zlib
from typing import Iterable, Optional, Sequence

import numpy as np

from async_rl.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

IR_SPECIAL = 2  # IR token ids 0 (pad) and 1 (truncated/unknown) are reserved
_IR_TOKEN = re.compile(r"[%@][-\w.$]+|\w+|[^\s\w]")
_NUMBERED = re.compile(r"^([%@])(\d+)$")


def tokenize_ir(ir: str, vocab_size: int, max_tokens: int) -> np.ndarray:
    """LLVM IR text -> int64 ids ``[max_tokens]`` (0-padded): words hashed (crc32) into
    ``vocab_size`` buckets; numbered values (%12, @3) share one token per sigil so the ids
    describe the code rather than its numbering. Comments and metadata lines are dropped."""
    ids: list[int] = []
    span = vocab_size - IR_SPECIAL
    for line in ir.splitlines():
        line = line.split(";", 1)[0].strip()
        if not line or line.startswith(("!", "source_filename", "target ", "attributes #")):
            continue
        for tok in _IR_TOKEN.findall(line):
            m = _NUMBERED.match(tok)
            tok = f"{m.group(1)}<n>" if m else tok
            ids.append(IR_SPECIAL + zlib.crc32(tok.encode()) % span)
            if len(ids) >= max_tokens:
                break
        if len(ids) >= max_tokens:
            break
    out = np.zeros(max_tokens, dtype=np.int64)
    out[: len(ids)] = ids
    return out


class PassVocab:
    """Token ids of pass sequences: the special tokens, then one token per pass flag."""

    def __init__(self, flags: Sequence[str]) -> None:
        self.tokens = [*SPECIAL_TOKENS, *flags]
        self.ids = {tok: i for i, tok in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, names: Sequence[str], length: Optional[int] = None) -> tuple[np.ndarray, int]:
        """Pass names (with or without the leading '-') -> ids ending in <eos>, padded to
        ``length``; returns (ids, number of unknown names skipped)."""
        ids, unknown = [], 0
        for name in names:
            flag = name if name.startswith("-") else f"-{name}"
            if flag in self.ids and self.ids[flag] >= len(SPECIAL_TOKENS):
                ids.append(self.ids[flag])
            else:
                unknown += 1
        ids.append(EOS_ID)
        if length is not None:
            ids = ids[: length - 1] + [EOS_ID] if len(ids) > length else ids + [PAD_ID] * (length - len(ids))
        return np.asarray(ids, dtype=np.int64), unknown

    def decode(self, ids: Iterable[int]) -> tuple[list[str], int]:
        """Ids -> pass flags up to the first <eos>/<pad>; skips <bos>, <unk> and out-of-range
        ids and returns how many were skipped."""
        names, unknown = [], 0
        for i in map(int, ids):
            if i in (EOS_ID, PAD_ID):
                break
            if i == BOS_ID:
                continue
            if len(SPECIAL_TOKENS) <= i < len(self.tokens):
                names.append(self.tokens[i])
            else:
                unknown += 1
        return names, unknown
