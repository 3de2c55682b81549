"""The CompilerGym env: a task set (picklable: programs, flags, options) and its env, one
server process each, which plays one program per episode.

Two action modes:
  ``per_step``  one pass per env step (Categorical over the pass flags), ``max_steps`` (default 45)
                per episode;
  ``sequence``  one env step per episode: the action is a padded sequence of token ids of
                ``obs_spec["action_vocab"]`` (specials, then one token per pass flag), applied
                pass by pass; unknown tokens are skipped and counted.

Programs that fail to build or whose -Oz count exceeds their -O0 count are skipped and counted. A
dead server is replaced and its episode ended, so a rollout worker never hangs on it.

Observation: a dict with the raw values (``autophase``, ``ir_count``, ``o0_count``, ``oz_count``,
``step``, ``ir_tokens`` if asked) and ``features``, the float32 vector the policies read
(``obs_spec["feature_dim"]`` long, envs/compilergym/features.py). With ``mask_noops`` (per step)
also ``action_mask`` (bool per pass, True = allowed): the passes run since the instruction count
last changed did nothing to this program, and LLVM passes are deterministic, so running one of
them again would do nothing either (up to passes that rewrote the IR without changing its count);
the policy gives them probability 0, in training and in every search with the policy alike.

Episode ends: reaching ``max_steps`` ends the task (``time_limit: terminal``, the default): the
budget of passes is part of the problem and the observation shows the steps left, so nothing
follows the last pass and its value is 0. ``time_limit: truncate`` reports a time limit instead
(``truncated``: the worker bootstraps from V of the state after the last pass). With the steps
left observed that state is never trained on, and gamma = 1 carries whatever V extrapolates
there into every return: measured, V(unchanged program, 0 steps left) grew to 2.2 -Oz reductions
within 2.5 minutes, so 45 passes that change nothing scored more than 45 good ones and the
greedy policy became a no-op (benchmarks/RESULTS.md). A pass the service fails on, a crashed
server and an out-of-range pass index are terminal (``terminated``) with ``info["end_reason"]``
and the error logged on stderr and counted in ``counters()``. A crashed compilation leaves no
optimised program: its step's reward takes the episode's return back to that of the unchanged
program.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np

from async_rl.tokens import SPECIAL_TOKENS
from envs.base import StartUnavailable
from envs.compilergym.client import CompilerGymClient, CompilerGymServerError
from envs.compilergym.features import AUTOPHASE_DIM, feature_dim, observation_features
from envs.compilergym.reward import RewardConfig
from envs.compilergym.tokens import PassVocab, tokenize_ir

# Errors that mean CompilerGym's service (not the program) is in trouble: replace the server.
_SERVICE_TROUBLE = re.compile(r"Service|Session|did not answer|died|exited|pipe broke")


@dataclass
class CompilerGymTaskSet:
    """Picklable description of the programs and observations of a CompilerGym run."""

    train_benchmarks: list[str]
    eval_benchmarks: list[str]
    flags: list[str]
    mode: str = "per_step"
    max_steps: int = 45
    seq_len: int = 16
    ir_tokens: int = 0
    ir_vocab_size: int = 4096
    reward: RewardConfig = field(default_factory=RewardConfig)
    python: str = ""
    site_data: str = ""
    call_timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    episodes_per_program: int = 1
    reuse_programs: bool = True  # keep each program's start state in the server (see envs/compilergym/_server.py)
    eval_search: str = "none"  # search in the final evaluation (envs/compilergym/search.py): none, greedy, best-of-K, beam-K
    eval_search_budget: int = 0  # its compilations (pass applications) per program; 0 = 16 x the episode length
    mask_noops: bool = False  # per step: obs["action_mask"] rules out the passes run since the count last changed
    time_limit: str = "terminal"  # max_steps ends the task ("terminal") or is a cut bootstrapped from V ("truncate")
    success_vs_oz: float = 1.0  # a step counts as success when -Oz count / count reaches this (PACS's label)
    task_names: list[str] = field(default_factory=lambda: ["compilergym"])
    # The program the episode ends with is what is judged: one that reached -Oz and then grew, or whose
    # compilation failed (an early end clears the label), is no success.
    success_rule: ClassVar[str] = "final"

    @property
    def action_vocab(self) -> PassVocab:
        return PassVocab(self.flags)

    @property
    def action_dim(self) -> int:
        return 1 if self.mode == "per_step" else self.seq_len

    @property
    def max_episode_steps(self) -> int:
        return self.max_steps if self.mode == "per_step" else 1

    @property
    def obs_dim(self) -> int:
        return feature_dim(len(self.flags))

    @property
    def obs_spec(self) -> dict[str, Any]:
        spec = {"autophase_dim": AUTOPHASE_DIM, "num_passes": len(self.flags), "mode": self.mode,
                "feature_dim": feature_dim(len(self.flags)), "ir_tokens": self.ir_tokens,
                "ir_vocab_size": self.ir_vocab_size,
                "action_vocab": self.action_vocab.tokens, "seq_len": self.seq_len, "max_steps": self.max_steps}
        if self.mode == "per_step":
            spec["num_actions"] = len(self.flags)  # a discrete action: the pass index
            spec["action_mask"] = bool(self.mask_noops)  # obs["action_mask"]: passes the policy may pick
        return spec

    def make_env(self, task_index: int, seed: int, benchmarks: Optional[list[str]] = None) -> "CompilerGymTaskEnv":
        if task_index != 0:
            raise IndexError(f"CompilerGym has one task, got task_index {task_index}")
        return CompilerGymTaskEnv(self, benchmarks or self.train_benchmarks, seed)


class CompilerGymTaskEnv:
    """One server process; each reset takes the next program (shuffled) of its list."""

    task_name = "compilergym"

    def __init__(self, task_set: CompilerGymTaskSet, benchmarks: list[str], seed: int) -> None:
        self.ts = task_set
        self.benchmarks = list(benchmarks)
        self.vocab = task_set.action_vocab
        self._rng = np.random.default_rng(seed)
        self._order: list[int] = []
        self.client: Optional[CompilerGymClient] = None
        self.skipped: dict[str, int] = {"build_failed": 0, "oz_above_o0": 0}
        self.skipped_uris: set[str] = set()
        self.server_restarts = 0
        self.unknown_passes = 0
        # Episodes ended early, by reason (see step): a pass failed, the server died, a bad pass index.
        self.errors: dict[str, int] = {"pass_error": 0, "server_error": 0, "invalid_action": 0}
        self.program: Optional[dict[str, Any]] = None
        self._needs_reset = True
        self._pass_counts = np.zeros(len(task_set.flags), dtype=np.float32)
        self._stale = np.zeros(len(task_set.flags), dtype=bool)  # passes run since the count last changed
        self._last_pass = -1
        self._autophase = np.zeros(AUTOPHASE_DIM, dtype=np.float32)
        self._start()

    # -- server life cycle --
    def _start(self) -> None:
        self.client = CompilerGymClient(Path(self.ts.python), Path(self.ts.site_data), self.ts.call_timeout_s,
                                        self.ts.start_timeout_s)

    def _restart(self, why: Exception) -> None:
        print(f"[compilergym] {why}; starting a new server", file=sys.stderr)
        if self.client is not None:
            self.client.close()
        self.server_restarts += 1
        self._start()

    # -- observations --
    def _obs(self, msg: dict[str, Any]) -> dict[str, np.ndarray]:
        """The observation after a server answer; an answer without one (the compilation crashed)
        repeats the last Autophase and count."""
        p = self.program
        if "autophase" in msg:
            self._autophase = np.asarray(msg["autophase"], dtype=np.float32)
        count = msg.get("ir_count", self._count)
        steps_left = max(self.ts.max_steps - self._t, 0) / self.ts.max_steps if self.ts.mode == "per_step" else 1.0
        obs: dict[str, Any] = {"autophase": self._autophase, "ir_count": np.float32(count), "o0_count": np.float32(p["o0_count"]),
               "oz_count": np.float32(p["oz_count"]), "step": np.float32(self._t),
               "features": observation_features(self._autophase, count, p["o0_count"], p["oz_count"], steps_left,
                                                self._pass_counts, self._last_pass)}
        if self.ts.mask_noops and self.ts.mode == "per_step":
            allowed = ~self._stale
            obs["action_mask"] = allowed if allowed.any() else np.ones_like(allowed)
        if self.ts.ir_tokens:
            obs["ir_tokens"] = tokenize_ir(msg.get("ir", ""), self.ts.ir_vocab_size, self.ts.ir_tokens)
        return obs

    def _next_benchmark(self) -> str:
        # Each program serves episodes_per_program episodes in a row: its first reset builds it
        # and its -O0/-Oz baselines (0.3-3.5 s), a repeated reset costs milliseconds.
        if not self._order:
            self._order = [int(i) for i in self._rng.permutation(len(self.benchmarks))
                           for _ in range(self.ts.episodes_per_program)]
        return self.benchmarks[self._order.pop()]

    def reset_to(self, uri: str) -> Optional[dict[str, np.ndarray]]:
        """Start an episode on program ``uri``; None if the program is skipped (counted)."""
        try:
            msg = self._call_reset(uri)
        except CompilerGymServerError as exc:
            if self.client.alive and not _SERVICE_TROUBLE.search(str(exc)):
                self._skip(uri, exc)  # the server answered: this program does not build
                return None
            # A dead service (or server) needs a fresh server; a program that does not build fails there too.
            self._restart(exc)
            try:
                msg = self._call_reset(uri)
            except CompilerGymServerError as again:
                if not self.client.alive:
                    raise
                self._skip(uri, again)
                return None
        if msg["oz_count"] > msg["o0_count"]:
            self.skipped["oz_above_o0"] += 1
            self.skipped_uris.add(uri)
            return None
        self.program = {"uri": uri, "o0_count": msg["o0_count"], "oz_count": msg["oz_count"]}
        self._t, self._count, self._needs_reset = 0, msg["ir_count"], False
        self._pass_counts[:] = 0.0
        self._stale[:] = False
        self._last_pass = -1
        self._shaped = self.ts.reward.shaped(0.0, 0)
        self._noops = 0  # passes this episode that left the count unchanged (noop_penalty)
        return self._obs(msg)

    def _call_reset(self, uri: str) -> dict[str, Any]:
        return self.client.call("reset", benchmark=uri, ir=bool(self.ts.ir_tokens), reuse=self.ts.reuse_programs)

    def _skip(self, uri: str, why: Exception) -> None:
        print(f"[compilergym] skipping {uri}: {why}", file=sys.stderr)
        self.skipped["build_failed"] += 1
        self.skipped_uris.add(uri)

    def reset(self, start: Optional[int] = None) -> dict[str, np.ndarray]:
        """The next program; with ``start`` (group rollouts) program ``start`` modulo their number,
        for every member alike: built again even if this env skipped it before (a failure can be
        transient: another member may build it), and ``StartUnavailable`` if it does not build here,
        never the next program (a member on another program would break its group's comparison)."""
        if start is not None:
            uri = self.benchmarks[start % len(self.benchmarks)]
            obs = self.reset_to(uri)
            if obs is None:
                raise StartUnavailable(f"CompilerGym: program {uri} (start {start}) cannot be played here")
            return obs
        for _ in range(max(10 * len(self.benchmarks), 10)):
            uri = self._next_benchmark()
            if uri in self.skipped_uris:
                continue
            obs = self.reset_to(uri)
            if obs is not None:
                return obs
        raise RuntimeError(f"CompilerGym: every program was skipped ({self.skipped}); check the benchmarks")

    def apply_passes(self, passes: list[int]) -> tuple[dict[str, Any], Optional[str]]:
        """Run pass indices on the current program; (server answer, error or None). A pass that
        took the compiler's session down (the answer has no observation) also replaces the server."""
        msg = self.client.call("step", actions=passes, ir=bool(self.ts.ir_tokens))
        if msg.get("done") and "observe_error" in msg:
            self._restart(CompilerGymServerError(f"the session is gone after a failed pass: {msg['observe_error']}"))
        return msg, (msg.get("error") if msg.get("done") else None)

    def counters(self) -> dict[str, int]:
        """Running totals the rollout workers log (``env/<name>``)."""
        return {"skipped_build_failed": self.skipped["build_failed"], "skipped_oz_above_o0": self.skipped["oz_above_o0"],
                "unknown_passes": self.unknown_passes, "server_restarts": self.server_restarts,
                **{f"ended_by_{reason}": n for reason, n in self.errors.items()}}

    def _end_early(self, reason: str, error: str, info: dict[str, Any], msg: dict[str, Any]) -> tuple:
        """A terminal step that says why (``info["end_reason"]``, stderr, ``counters()``). The
        compilation did not finish, so nothing optimised is left: the step's reward takes the
        episode's return back to that of the unchanged program."""
        self.errors[reason] += 1
        self._needs_reset = True
        print(f"[compilergym] episode on {self.program['uri']} ended at step {self._t}: {reason}: {error}",
              file=sys.stderr)
        unchanged = self.ts.reward.shaped(0.0, 0)
        reward, self._shaped = unchanged - self._shaped, unchanged
        p = self.program
        info.update({"end_reason": reason, reason: error, "success": False, "reduction": 0.0,
                     "ir_count": p["o0_count"], "oz_count": p["oz_count"], "o0_count": p["o0_count"]})
        return self._obs(msg), float(reward), True, False, info

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("CompilerGym env: call reset() before step() (episode ended)")
        action = np.asarray(action).reshape(-1)
        if self.ts.mode == "per_step":
            passes, unknown = [int(action[0])], 0
        else:
            names, unknown = self.vocab.decode(action)
            passes = [self.vocab.ids[n] - len(SPECIAL_TOKENS) for n in names]
        self.unknown_passes += unknown
        info: dict[str, Any] = {"unknown_passes": unknown, "benchmark": self.program["uri"], "num_passes": len(passes)}
        bad = [i for i in passes if not 0 <= i < len(self.ts.flags)]
        if bad:
            return self._end_early("invalid_action", f"pass index {bad[0]} outside [0, {len(self.ts.flags)})", info, {})
        info["passes"] = [self.ts.flags[i] for i in passes]
        try:
            msg, error = self.apply_passes(passes)  # no passes: the unchanged program's observation
        except CompilerGymServerError as exc:
            # The server or its service died mid-episode; the next reset uses a new server.
            self._restart(exc)
            return self._end_early("server_error", str(exc), info, {})
        self._t += max(len(passes), 1) if self.ts.mode == "per_step" else 1
        self._record(passes)
        if error is not None:  # the service failed on a pass and ended its session
            return self._end_early("pass_error", error, info, msg)
        noop = self.ts.mode == "per_step" and msg["ir_count"] == self._count
        self._noops += noop
        if noop:
            self._stale[passes] = True
        else:
            self._stale[:] = False
        self._count = msg["ir_count"]
        p = self.program
        reduction = self.ts.reward.reduction(p["o0_count"], self._count, p["oz_count"])
        shaped = self.ts.reward.shaped(reduction, self._t if self.ts.mode == "per_step" else len(passes))
        shaped -= self.ts.reward.noop_penalty * self._noops
        reward, self._shaped = shaped - self._shaped, shaped
        # Sequence mode: one step is the whole episode, and it is terminal (nothing to bootstrap).
        # Per step: the pass budget ends the task (terminal, value 0; see the module docstring),
        # or with time_limit "truncate" it is a cut the worker bootstraps from V.
        at_limit = self.ts.mode == "per_step" and self._t >= self.ts.max_steps
        terminated = self.ts.mode == "sequence" or (at_limit and self.ts.time_limit == "terminal")
        truncated = at_limit and not terminated
        self._needs_reset = terminated or truncated
        info.update(reduction=reduction, noop=noop, ir_count=self._count, oz_count=p["oz_count"], o0_count=p["o0_count"],
                    success=p["oz_count"] >= self.ts.success_vs_oz * self._count)
        if terminated or truncated:
            info["end_reason"] = "max_steps" if at_limit else "sequence_applied"
        return self._obs(msg), float(reward), terminated, truncated, info

    def _record(self, passes: list[int]) -> None:
        """Add ``passes`` to the action history the features show."""
        for i in passes:
            self._pass_counts[i] += 1.0
        if passes:
            self._last_pass = passes[-1]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
