"""One program of a CompilerGym env as the ``Compiler`` the searches use (envs/compilergym/search.py)."""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from envs.compilergym.client import CompilerGymServerError
from envs.compilergym.env import CompilerGymTaskEnv


class EnvCompiler:
    """One program of a ``CompilerGymTaskEnv`` as a search's ``Compiler`` (envs/compilergym/search.py).

    Per-step policies read the observation after every pass (with its action history), so a step
    is ``env.step``; a sequence policy reads only the loaded program, so a step applies the pass
    alone. ``probe`` keeps the current state in the server's fork and restores it (14-33 ms) when
    the state is used again, not before a reset (a beam probes a state, then loads the next one).
    """

    def __init__(self, env: CompilerGymTaskEnv, uri: str) -> None:
        self.env, self.uri = env, uri
        self.num_passes = len(env.ts.flags)
        self.per_step = env.ts.mode == "per_step"
        self.failures = 0  # compilations that failed (the service or a pass); counted, not retried
        self._forked = False
        self._probed = False  # the server holds the state after a probe; the fork holds the state before it

    def reset(self) -> Optional[tuple[Any, int]]:
        self._forked = self._probed = False
        obs = self.env.reset_to(self.uri)
        return None if obs is None else (obs, int(obs["ir_count"]))

    def step(self, pass_index: int) -> Optional[tuple[Any, int]]:
        if self._probed and not self._restore():
            return None
        self._forked = False
        if self.per_step:
            obs, _, _, _, info = self.env.step(np.array([pass_index]))
            if info.get("end_reason") not in (None, "max_steps"):  # the pass or the server failed
                self.failures += 1
                return None
            return obs, int(info["ir_count"])
        count = self._apply(pass_index, restore=False)
        return None if count is None else (None, count)

    def probe(self, pass_index: int) -> Optional[int]:
        return self._apply(pass_index, restore=True)

    def _restore(self) -> bool:
        try:
            self.env.client.call("restore")
        except CompilerGymServerError as exc:
            return self._failed(exc)
        self._probed = False
        return True

    def _failed(self, exc: Exception) -> bool:
        """A failed server call: counted; the next reset_to starts a new server if it died."""
        print(f"[compilergym] search on {self.uri}: {exc}", file=sys.stderr)
        self._forked = self._probed = False
        self.failures += 1
        return False

    def _apply(self, pass_index: int, restore: bool) -> Optional[int]:
        if self._probed and not self._restore():
            return None
        try:
            if restore and not self._forked:
                self.env.client.call("fork")
                self._forked = True
            msg, error = self.env.apply_passes([int(pass_index)])
        except CompilerGymServerError as exc:
            self._failed(exc)
            return None
        self._probed = restore
        if error is not None or "ir_count" not in msg:
            self.failures += 1
            return None
        return int(msg["ir_count"])
