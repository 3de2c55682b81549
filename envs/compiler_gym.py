"""CompilerGym LLVM pass ordering (Passformer RL training, after CompilerDream), driven through a Python 3.10 server process.

compiler_gym 0.2.5 runs only on Python 3.9/3.10, so each env starts ``envs/_compiler_gym_server.py``
in ``.venv-compilergym`` (built by ``scripts/setup_compilergym.sh``) and talks to it over a pipe,
one JSON line per call, each with a timeout. A dead or silent server (or a dead CompilerGym
service) raises ``CompilerGymServerError`` naming what happened; the env then starts a new server
and ends the episode, so a rollout worker never hangs on it.

Two action modes:
  ``per_step``  one pass per env step (Categorical over the pass flags), ``max_steps`` (default 45)
                per episode;
  ``sequence``  one env step per episode: the action is a padded sequence of token ids of
                ``obs_spec["action_vocab"]`` (specials, then one token per pass flag), applied
                pass by pass; unknown tokens are skipped and counted.

Programs: ``generator://csmith-v0/<seed>`` over disjoint seed ranges for training and evaluation,
or every .c/.cpp/.bc file of ``benchmark_dir``, or named CompilerGym datasets (online only).
Programs that fail to build or whose -Oz count exceeds their -O0 count are skipped and counted.

Reward: reduction r = (c0 - c) / (c0 - c_oz) (``reward_baseline: oz``,
1.0 = as good as -Oz, so every program weighs the same whatever its size) or (c0 - c) / c0
(``initial``); the -Oz denominator is at least ``oz_floor * c0`` (programs that -Oz barely
shrinks would otherwise give huge rewards); above ``baseline_thre`` it grows with slope
``leakiness``; minus ``step_penalty`` per pass and, per step, ``noop_penalty`` per pass that left the
instruction count unchanged (a pass spent for nothing). Per-step rewards are the increments of that
shaped value, so an episode's return equals the reward of its whole sequence.

Observation: a dict with the raw values (``autophase``, ``ir_count``, ``o0_count``, ``oz_count``,
``step``, ``ir_tokens`` if asked) and ``features``, the float32 vector the policies read
(``obs_spec["feature_dim"]`` long, layout in ``observation_features``): Autophase divided by the
program's -O0 instruction count, its size, how far it has shrunk, the steps remaining, and the
action history (how often each pass ran, and the last pass). With ``mask_noops`` (per step) also
``action_mask`` (bool per pass, True = allowed): the passes run since the instruction count last
changed did nothing to this program, and LLVM passes are deterministic, so running one of them
again would do nothing either (up to passes that rewrote the IR without changing its count); the
policy gives them probability 0, in training and in every search with the policy alike.

Episode ends: reaching ``max_steps`` ends the task (``time_limit: terminal``, the default): the
budget of passes is part of the problem and the observation shows the steps left, so nothing
follows the last pass and its value is 0. ``time_limit: truncate`` reports a time limit instead
(``truncated``: the worker bootstraps from V of the state after the last pass). With the steps
left observed that state is never trained on, and gamma = 1 carries whatever V extrapolates
there into every return: measured, V(unchanged program, 0 steps left) grew to 2.2 -Oz reductions
within 2.5 minutes, so 45 passes that change nothing scored more than 45 good ones and the
greedy policy became a no-op (benchmarks/RESULTS.md, issue 17). A pass the service fails on, a
crashed server and an out-of-range pass index are terminal (``terminated``) with
``info["end_reason"]`` and the error logged on stderr and counted in ``counters()``. A crashed
compilation leaves no optimised program: its step's reward takes the episode's return back to that
of the unchanged program.
"""
from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence

import numpy as np

from async_rl.errors import ConfigError
from async_rl.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from envs import register_env
from envs.base import StartUnavailable

ROOT = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = Path(__file__).with_name("_compiler_gym_server.py")
AUTOPHASE_DIM = 56
IR_SPECIAL = 2  # IR token ids 0 (pad) and 1 (truncated/unknown) are reserved
_SETUP_HINT = "run scripts/setup_compilergym.sh (needs Python 3.10, e.g. pyenv install 3.10.13)"
_MODES = ("per_step", "sequence")
# Errors that mean CompilerGym's service (not the program) is in trouble: replace the server.
_SERVICE_TROUBLE = re.compile(r"Service|Session|did not answer|died|exited|pipe broke")
_BASELINES = ("oz", "initial")
_TIME_LIMITS = ("terminal", "truncate")
# Scalars of the feature vector after the Autophase block (see observation_features).
_SCALARS = ("log_size", "size_vs_o0", "oz_vs_o0", "steps_left")


class CompilerGymServerError(RuntimeError):
    """The CompilerGym server process died, timed out or answered with an error."""


def default_python() -> Path:
    return Path(os.environ.get("COMPILER_GYM_PYTHON", ROOT / ".venv-compilergym" / "bin" / "python"))


def default_site_data() -> Path:
    return Path(os.environ.get("COMPILER_GYM_SITE_DATA", ROOT / ".venv-compilergym" / "site-data"))


def compiler_gym_unavailable_reason(python: Optional[Path] = None, site_data: Optional[Path] = None) -> Optional[str]:
    """Why the CompilerGym server cannot run here, or None if it can."""
    python, site_data = python or default_python(), site_data or default_site_data()
    if not python.exists():
        return f"no CompilerGym interpreter at {python}; {_SETUP_HINT}"
    if not (site_data / "llvm-v0" / ".unpacked").exists():
        return f"no offline LLVM data pack under {site_data}; {_SETUP_HINT}"
    return None


# ---- reward ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardConfig:
    """Seed 000's reward shaping of the instruction-count reduction."""

    baseline_thre: float = 1.0
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
        if r > self.baseline_thre:
            r = self.baseline_thre + (r - self.baseline_thre) * self.leakiness
        return r - self.step_penalty * num_passes


# ---- observation features ----------------------------------------------------------------
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


# ---- tokenisation ------------------------------------------------------------------------
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

    def decode(self, ids: Sequence[int]) -> tuple[list[str], int]:
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


# ---- the server process ------------------------------------------------------------------
class CompilerGymClient:
    """One server subprocess; every call has a timeout and names the failure."""

    def __init__(self, python: Path, site_data: Path, timeout_s: float, start_timeout_s: float) -> None:
        self.timeout_s = timeout_s
        env = dict(os.environ, COMPILER_GYM_SITE_DATA=str(site_data))
        env.setdefault("COMPILER_GYM_CACHE", str(site_data.parent / "cache"))
        Path(env["COMPILER_GYM_CACHE"]).mkdir(parents=True, exist_ok=True)
        # -I (isolated): the script's folder envs/ must not shadow the compiler_gym package.
        self.proc = subprocess.Popen(
            [str(python), "-I", "-u", str(SERVER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            # Errors come back in the answers; COMPILER_GYM_SERVER_STDERR=1 also shows the server's log.
            stderr=None if os.environ.get("COMPILER_GYM_SERVER_STDERR") == "1" else subprocess.DEVNULL,
            env=env, text=True, bufsize=1, cwd=env["COMPILER_GYM_CACHE"],  # csmith writes platform.info in its cwd
            # Its own process group, shared with the CompilerGym service it starts: kill() ends both.
            start_new_session=True,
        )
        self._read(start_timeout_s, "start-up")
        self.flags: list[str] = self.call("hello")["flags"]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, cmd: str, timeout_s: Optional[float] = None, **kwargs: Any) -> dict[str, Any]:
        if not self.alive:
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) exited with code "
                                         f"{self.proc.returncode} before '{cmd}'")
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) pipe broke on '{cmd}': {exc}") from None
        return self._read(timeout_s or self.timeout_s, cmd)

    def _read(self, timeout_s: float, what: str) -> dict[str, Any]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.kill()
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) did not answer '{what}' "
                                         f"within {timeout_s:g} s; killed it")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=5)
            raise CompilerGymServerError(f"CompilerGym server (pid {self.proc.pid}) died during '{what}' (exit code {code})")
        msg = json.loads(line)
        if not msg.get("ok"):
            raise CompilerGymServerError(f"CompilerGym '{what}' failed: {msg.get('error')}")
        return msg

    def kill(self) -> None:
        """Kill the server's process group: the server and CompilerGym's service, which would
        otherwise outlive a killed (or crashed) server."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # nothing left in the group
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.alive:
            try:
                self.call("close", timeout_s=10)
            except CompilerGymServerError:
                pass
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


# ---- programs ----------------------------------------------------------------------------
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
    reuse_programs: bool = True  # keep each program's start state in the server (see _compiler_gym_server.py)
    eval_search: str = "none"  # search in the final evaluation (envs/compiler_gym_search.py): none, greedy, best-of-K, beam-K
    eval_search_budget: int = 0  # its compilations (pass applications) per program; 0 = 16 x the episode length
    mask_noops: bool = False  # per step: obs["action_mask"] rules out the passes run since the count last changed
    time_limit: str = "terminal"  # max_steps ends the task ("terminal") or is a cut bootstrapped from V ("truncate")
    success_vs_oz: float = 1.0  # a step counts as success when -Oz count / count reaches this (PACS's label)
    task_names: list[str] = field(default_factory=lambda: ["compiler_gym"])
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

    task_name = "compiler_gym"

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
        print(f"[compiler_gym] {why}; starting a new server", file=sys.stderr)
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
        obs = {"autophase": self._autophase, "ir_count": np.float32(count), "o0_count": np.float32(p["o0_count"]),
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
                return self._skip(uri, exc)  # the server answered: this program does not build
            # A dead service (or server) needs a fresh server; a program that does not build fails there too.
            self._restart(exc)
            try:
                msg = self._call_reset(uri)
            except CompilerGymServerError as again:
                if not self.client.alive:
                    raise
                return self._skip(uri, again)
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
        print(f"[compiler_gym] skipping {uri}: {why}", file=sys.stderr)
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
        print(f"[compiler_gym] episode on {self.program['uri']} ended at step {self._t}: {reason}: {error}",
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


# ---- the factory -------------------------------------------------------------------------
def _csmith(start: int, count: int) -> list[str]:
    return [f"generator://csmith-v0/{s}" for s in range(start, start + count)]


def _split_dir(files: list[str], eval_fraction: float) -> tuple[list[str], list[str]]:
    """(train, held out): the first ``eval_fraction`` of ``files`` (at least one) are held out. A
    single program is both (tuning one program is a use of its own), and that is said."""
    if len(files) == 1:
        print(f"compiler_gym: one program ({files[0]}): it is trained on and evaluated on, "
              "so the evaluation is not held out", file=sys.stderr)
        return files, files
    n_eval = max(1, int(round(len(files) * eval_fraction)))
    return files[n_eval:], files[:n_eval]


# Registered as "compiler_gym", with its final evaluation, at the end of this module.
def compiler_gym_task_set(
    mode: str = "per_step",
    max_steps: int = 45,
    seq_len: int = 16,
    train_seeds: Sequence[int] = (0, 200),
    eval_seeds: Sequence[int] = (1_000_000, 20),
    benchmark_dir: Optional[str] = None,
    eval_benchmark_dir: Optional[str] = None,
    eval_search: str = "none",
    eval_search_budget: int = 0,
    datasets: Optional[list[str]] = None,
    dataset_limit: int = 100,
    eval_fraction: float = 0.2,
    ir_tokens: int = 0,
    ir_vocab_size: int = 4096,
    baseline_thre: float = 1.0,
    leakiness: float = 1.0,
    step_penalty: float = 0.0,
    reward_baseline: str = "oz",
    oz_floor: float = 0.01,
    noop_penalty: float = 0.0,
    call_timeout_s: float = 60.0,
    start_timeout_s: float = 120.0,
    episodes_per_program: int = 1,
    reuse_programs: bool = True,
    time_limit: str = "terminal",
    mask_noops: bool = False,
    success_vs_oz: float = 1.0,
) -> CompilerGymTaskSet:
    """Build the CompilerGym TaskSet.

    mode: ``per_step`` (one pass per step, ``max_steps`` per episode) or ``sequence`` (one step
    applies a whole sequence of up to ``seq_len`` passes). Programs: csmith seeds
    ``train_seeds``/``eval_seeds`` = (first seed, count), disjoint; or ``benchmark_dir`` (its
    .c/.cpp/.bc files, the first ``eval_fraction`` of them held out); or ``datasets`` (benchmark
    URIs, or dataset names such as cbench-v1 whose first ``dataset_limit`` programs are used;
    named datasets need the internet). ir_tokens: IR tokens per observation (0 = no IR).
    episodes_per_program: consecutive training episodes on each program (its first reset is slow).
    oz_floor: the reward's -Oz denominator is at least this fraction of the -O0 count.
    noop_penalty: per step, subtracted for a pass that leaves the instruction count unchanged.
    reuse_programs: the server keeps each program's start state (false: rebuilt at every reset).
    eval_benchmark_dir: held-out programs of their own (every file of the folder, e.g. envs/programs),
    whatever the training programs are (csmith seeds, or all of ``benchmark_dir``). eval_search: a
    search the final evaluation adds (none, greedy, best-of-K, beam-K) with ``eval_search_budget``
    compilations per program (0: 16 x the episode length). time_limit: reaching ``max_steps`` ends the
    task (``terminal``, value 0 after it) or is a time limit bootstrapped from V (``truncate``).
    mask_noops: per step, the observation's ``action_mask`` rules out the passes run since the
    instruction count last changed (they would do nothing again). success_vs_oz: ``info["success"]``
    (the episode label that success rates and PACS read) is -Oz count / count >= this; 1.0 = at least as
    small as -Oz, lower values make a success reachable for an untrained policy.
    """
    if mode not in _MODES:
        raise ConfigError(f"compiler_gym mode '{mode}' is unknown; valid: {', '.join(_MODES)}")
    if reward_baseline not in _BASELINES:
        raise ConfigError(f"compiler_gym reward_baseline '{reward_baseline}' is unknown; valid: {', '.join(_BASELINES)}")
    if not float(success_vs_oz) > 0:
        raise ConfigError(f"compiler_gym success_vs_oz must be > 0 (1.0: as small as -Oz), not {success_vs_oz}")
    if time_limit not in _TIME_LIMITS:
        raise ConfigError(f"compiler_gym time_limit '{time_limit}' is unknown; valid: {', '.join(_TIME_LIMITS)}")
    for name, value in (("max_steps", max_steps), ("seq_len", seq_len), ("episodes_per_program", episodes_per_program)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"compiler_gym {name} must be a positive integer, got {value!r}")
    if isinstance(noop_penalty, bool) or not isinstance(noop_penalty, (int, float)) or not 0.0 <= noop_penalty < 1.0:
        raise ConfigError(f"compiler_gym noop_penalty must be a number in [0, 1) (e.g. 0.01), got {noop_penalty!r}")
    if not 0.0 < float(oz_floor) <= 1.0:
        raise ConfigError(f"compiler_gym oz_floor must be in (0, 1], got {oz_floor!r}")
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ConfigError(f"compiler_gym eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction!r}")
    _check_eval_search(eval_search, eval_search_budget)
    held_out = program_uris(eval_benchmark_dir, "compiler_gym eval_benchmark_dir") if eval_benchmark_dir else None
    if benchmark_dir is not None:
        files = program_uris(benchmark_dir, "compiler_gym benchmark_dir")
        train, evaluation = (files, held_out) if held_out else _split_dir(files, eval_fraction)
    elif datasets:
        train, evaluation = [], []  # filled from the probe server below (named datasets need the internet)
    else:
        (t0, tn), (e0, en) = (tuple(int(x) for x in train_seeds), tuple(int(x) for x in eval_seeds))
        if tn < 1 or en < 1:
            raise ConfigError("compiler_gym train_seeds/eval_seeds are (first seed, count) with count >= 1")
        if t0 < e0 + en and e0 < t0 + tn:
            raise ConfigError(f"compiler_gym train_seeds {list(train_seeds)} and eval_seeds {list(eval_seeds)} overlap; "
                              "give disjoint (first seed, count) ranges")
        train, evaluation = _csmith(t0, tn), _csmith(e0, en)

    python, site_data = default_python(), default_site_data()
    reason = compiler_gym_unavailable_reason(python, site_data)
    if reason:
        raise ConfigError(reason)
    # One short-lived server tells the pass flags (and proves the set-up works) before Ray starts.
    try:
        client = CompilerGymClient(python, site_data, call_timeout_s, start_timeout_s)
    except CompilerGymServerError as exc:
        raise ConfigError(f"{exc}; {_SETUP_HINT}") from None
    try:
        flags = client.flags
        if datasets:
            uris = []
            for name in datasets:
                if "://" in name:
                    uris.append(str(name))
                    continue
                try:
                    uris += client.call("dataset_uris", timeout_s=600, name=str(name), limit=int(dataset_limit))["uris"]
                except CompilerGymServerError as exc:
                    raise ConfigError(f"compiler_gym dataset '{name}' is unavailable ({exc}); named datasets need "
                                      "the internet: use csmith seeds or benchmark_dir offline") from None
            if not uris:
                raise ConfigError(f"compiler_gym datasets {list(datasets)} hold no programs; check the names and dataset_limit")
            train, evaluation = _split_dir(uris, eval_fraction)
    finally:
        client.close()
    evaluation = held_out or evaluation
    return CompilerGymTaskSet(
        train_benchmarks=train, eval_benchmarks=evaluation, flags=flags, mode=mode, max_steps=max_steps,
        seq_len=seq_len, ir_tokens=int(ir_tokens), ir_vocab_size=int(ir_vocab_size),
        reward=RewardConfig(float(baseline_thre), float(leakiness), float(step_penalty), reward_baseline, float(oz_floor),
                            float(noop_penalty)),
        python=str(python), site_data=str(site_data), call_timeout_s=float(call_timeout_s),
        start_timeout_s=float(start_timeout_s), episodes_per_program=episodes_per_program,
        reuse_programs=bool(reuse_programs), eval_search=str(eval_search), eval_search_budget=int(eval_search_budget),
        time_limit=str(time_limit), mask_noops=bool(mask_noops), success_vs_oz=float(success_vs_oz),
    )


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive values (nan for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def random_search(env: CompilerGymTaskEnv, uri: str, length: int, trials: int, rng: np.random.Generator) -> Optional[int]:
    """Best final IR count over ``trials`` random sequences of ``length`` passes on ``uri``
    (``trials * length`` env steps); None if the program is skipped."""
    if env.reset_to(uri) is None:
        return None
    # Every trial starts from the program as reset: restoring a fork took 14-33 ms here, a reset
    # (csmith + clang + the -O0/-Oz counts) 0.26-1.6 s.
    env.client.call("fork")
    best = None
    for trial in range(trials):
        if trial:
            try:
                env.client.call("restore")
            except CompilerGymServerError:  # the last trial's passes took the service down
                if env.reset_to(uri) is None:
                    return best
                env.client.call("fork")
        passes = [int(a) for a in rng.integers(len(env.ts.flags), size=length)]
        try:
            msg, error = env.apply_passes(passes)
        except CompilerGymServerError:  # the server died: the next trial's restore fails and resets
            msg, error = {}, "server_error"
        # A failed pass ends the trial as it ends a policy's episode (_end_early): the compilation did not
        # finish, so the program is left unchanged. A pass that killed the session has no count at all.
        count = env.program["o0_count"] if error is not None or "ir_count" not in msg else msg["ir_count"]
        best = count if best is None else min(best, count)
    return best


# ---- held-out evaluation -----------------------------------------------------------------
def program_uris(folder: str, what: str) -> list[str]:
    """``file://`` URIs of the .c/.cpp/.cc/.bc/.ll files under ``folder`` (sorted); ConfigError
    naming ``what`` (the option that gave it) if it is missing or holds none."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(f"{what} {folder}: no such directory; pass a folder of .c/.cpp/.bc/.ll files")
    files = sorted(str(p.resolve()) for p in root.rglob("*") if p.suffix in PROGRAM_SUFFIXES)
    if not files:
        raise ConfigError(f"{what} {folder} holds no .c/.cpp/.bc files (nor .cc/.ll)")
    return [f"file://{f}" for f in files]


PROGRAM_SUFFIXES = (".c", ".cpp", ".cc", ".bc", ".ll")
BUNDLED_PROGRAMS = Path(__file__).with_name("programs")  # real C programs written here (not csmith)


def program_name(uri: str) -> str:
    """A short name for tables and TensorBoard tags: ``csmith-v0_1000001``, ``crc32``."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):]).stem
    return re.sub(r"[^\w.-]+", "_", uri.split("://", 1)[-1]).strip("_")


def _check_eval_search(search: Any, budget: Any) -> None:
    """ConfigError for a bad ``eval_search`` / ``eval_search_budget`` (before any server starts)."""
    from envs.compiler_gym_search import parse_search  # noqa: PLC0415

    parse_search(search, what="compiler_gym eval_search")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"compiler_gym eval_search_budget must be a non-negative integer (0: 16 x the episode "
                          f"length), got {budget!r}")


class EnvCompiler:
    """One program of a ``CompilerGymTaskEnv`` as a search's ``Compiler`` (envs/compiler_gym_search.py).

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
        print(f"[compiler_gym] search on {self.uri}: {exc}", file=sys.stderr)
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


def search_horizon(task_set: CompilerGymTaskSet) -> int:
    """Passes a policy writes per program: an episode (per step) or a sequence."""
    return task_set.max_steps if task_set.mode == "per_step" else task_set.seq_len


def search_programs(task_set: CompilerGymTaskSet, policy: Any, benchmarks: list[str], search: Any, budget: int,
                    seed: int = 0) -> dict[str, Any]:
    """``search`` (``greedy``, ``best-of-K``, ``beam-K``) with ``budget`` compilations on every
    program of ``benchmarks``, next to -Oz and to random search with as many compilations as the
    search used. ``policy`` is a ``SearchPolicy`` (``ModelPolicy`` in process, ``ActPolicy``
    behind an inference actor). Returns the rows and the geometric means over programs of
    -Oz count / count (> 1 beats -Oz): ``geomean_vs_oz`` and ``random_search_geomean_vs_oz``."""
    from envs.compiler_gym_search import parse_search, random_baseline, run_search  # noqa: PLC0415

    spec = parse_search(search, allow_none=False) if isinstance(search, str) else search
    horizon = search_horizon(task_set)
    env = task_set.make_env(0, seed=seed, benchmarks=benchmarks)
    rng = np.random.default_rng(seed)
    rows = []
    try:
        for uri in env.benchmarks:
            if env.reset_to(uri) is None:  # skipped and counted
                continue
            oz, o0 = env.program["oz_count"], env.program["o0_count"]
            compiler = EnvCompiler(env, uri)
            found = run_search(spec, compiler, policy, budget, horizon)
            rand = random_baseline(compiler, max(found.compilations, 1), horizon, rng)
            if found.count is None or rand.count is None:
                continue
            rows.append({"program": program_name(uri), "benchmark": uri, "o0_count": o0, "oz_count": oz,
                         "count": found.count, "vs_oz": oz / max(found.count, 1), "compilations": found.compilations,
                         "passes": [task_set.flags[i] for i in found.passes], "seconds": found.seconds,
                         "random_count": rand.count, "random_vs_oz": oz / max(rand.count, 1),
                         "random_compilations": rand.compilations, "failed_compilations": compiler.failures})
    finally:
        env.close()
    return {"search": spec.name, "budget": int(budget), "horizon": horizon, "rows": rows, "skipped": dict(env.skipped),
            "geomean_vs_oz": geomean([r["vs_oz"] for r in rows]),
            "random_search_geomean_vs_oz": geomean([r["random_vs_oz"] for r in rows])}


def evaluate_programs(task_set: CompilerGymTaskSet, policy: Any, preprocess: Any, random_trials: int = 1,
                      seed: int = 0, benchmarks: Optional[list[str]] = None) -> dict[str, Any]:
    """The policy, greedy and sampled, and random search on every held-out program.

    ``policy(obs_batch, deterministic) -> env actions [B, action_dim]`` takes preprocessed
    observations. Per program: -Oz count / count after the policy's greedy passes (> 1 beats -Oz),
    the same for one sampled sequence (a per-step policy decoded greedily can repeat one pass that
    no longer changes the program; sampling is how it was trained), and for the best of
    ``random_trials`` random sequences, each as many passes as the greedy policy applied
    (``random_trials=1``: the same number of env steps). Returns the per-program rows and the
    geometric means ``geomean_reduction_vs_oz`` (greedy), ``sampled_geomean_reduction_vs_oz`` and
    ``random_search_geomean_vs_oz``.
    """
    import torch  # noqa: PLC0415

    env = task_set.make_env(0, seed=seed, benchmarks=benchmarks or task_set.eval_benchmarks)
    rng = np.random.default_rng(seed)

    def rollout(obs: dict[str, np.ndarray], deterministic: bool) -> Optional[dict[str, Any]]:
        """One episode from the reset program ``obs``; None if the server failed in it."""
        started, passes, names, done, info = time.monotonic(), 0, [], False, {}
        while not done:
            action = policy(torch.stack([preprocess(obs, env.task_name)]), deterministic)[0]
            obs, _, terminated, truncated, info = env.step(np.asarray(action))
            passes += int(info.get("num_passes", 1))
            names += info.get("passes", [])
            done = terminated or truncated
        if "server_error" in info:
            return None
        return {"count": int(info["ir_count"]), "passes": passes, "names": names, "seconds": time.monotonic() - started}

    rows = []
    try:
        for uri in env.benchmarks:
            obs = env.reset_to(uri)
            greedy = rollout(obs, True) if obs is not None else None
            obs = env.reset_to(uri) if greedy is not None else None
            sampled = rollout(obs, False) if obs is not None else None
            if sampled is None:
                continue
            oz, o0 = env.program["oz_count"], env.program["o0_count"]
            random_count = random_search(env, uri, max(greedy["passes"], 1), random_trials, rng)
            rows.append({"benchmark": uri, "o0_count": o0, "oz_count": oz, "policy_count": greedy["count"],
                         "policy_passes": greedy["passes"], "policy_sequence": greedy["names"],
                         "sampled_count": sampled["count"], "sampled_sequence": sampled["names"],
                         "random_count": random_count, "policy_vs_oz": oz / max(greedy["count"], 1),
                         "sampled_vs_oz": oz / max(sampled["count"], 1), "random_vs_oz": oz / max(random_count, 1),
                         "policy_seconds": greedy["seconds"]})
    finally:
        env.close()
    return {"rows": rows, "skipped": dict(env.skipped), "random_trials": random_trials,
            "geomean_reduction_vs_oz": geomean([r["policy_vs_oz"] for r in rows]),
            "sampled_geomean_reduction_vs_oz": geomean([r["sampled_vs_oz"] for r in rows]),
            "random_search_geomean_vs_oz": geomean([r["random_vs_oz"] for r in rows])}


def format_table(result: dict[str, Any]) -> str:
    """The per-program table and the geometric means (greedy, sampled, random search), as text."""
    lines = [f"{'program':<34}{'-O0':>8}{'-Oz':>8}{'greedy':>8}{'passes':>7}{'sampled':>8}{'random':>8}"
             f"{'grd/Oz':>8}{'smp/Oz':>8}{'rnd/Oz':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['benchmark'][-34:]:<34}{r['o0_count']:>8}{r['oz_count']:>8}{r['policy_count']:>8}"
                     f"{r['policy_passes']:>7}{r['sampled_count']:>8}{r['random_count']:>8}{r['policy_vs_oz']:>8.3f}"
                     f"{r['sampled_vs_oz']:>8.3f}{r['random_vs_oz']:>8.3f}")
    lines.append(f"geomean (-Oz count / count), >1 beats -Oz: policy greedy {result['geomean_reduction_vs_oz']:.3f}, "
                 f"sampled {result['sampled_geomean_reduction_vs_oz']:.3f}, random search ({result['random_trials']} x "
                 f"same passes) {result['random_search_geomean_vs_oz']:.3f}; {len(result['rows'])} programs, "
                 f"skipped {result['skipped']}")
    return "\n".join(lines)


def format_search_table(result: dict[str, Any]) -> str:
    """``search_programs``'s rows and geometric means, as text."""
    name = result["search"]
    lines = [f"{'program':<26}{'-O0':>7}{'-Oz':>7}{name:>12}{'compiles':>9}{'random':>8}{'srch/Oz':>8}{'rnd/Oz':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['program'][-26:]:<26}{r['o0_count']:>7}{r['oz_count']:>7}{r['count']:>12}"
                     f"{r['compilations']:>9}{r['random_count']:>8}{r['vs_oz']:>8.3f}{r['random_vs_oz']:>8.3f}")
    lines.append(f"geomean (-Oz count / count), >1 beats -Oz: {name} {result['geomean_vs_oz']:.3f}, random search "
                 f"(same compilations) {result['random_search_geomean_vs_oz']:.3f}; budget {result['budget']} "
                 f"compilations per program, {len(result['rows'])} programs, skipped {result['skipped']}")
    return "\n".join(lines)


def search_scalars(result: dict[str, Any], prefix: str = "eval/compilergym") -> dict[str, float]:
    """TensorBoard scalars of ``search_programs``: per program ``<prefix>/<program>/<search>_vs_oz``
    (and random search's), and the geometric means ``<prefix>/<search>_geomean_vs_oz``."""
    name = result["search"].replace("-", "_")
    scalars = {f"{prefix}/{name}_geomean_vs_oz": result["geomean_vs_oz"],
               f"{prefix}/{name}_random_search_geomean_vs_oz": result["random_search_geomean_vs_oz"]}
    for r in result["rows"]:
        scalars[f"{prefix}/{r['program']}/{name}_vs_oz"] = r["vs_oz"]
        scalars[f"{prefix}/{r['program']}/{name}_random_vs_oz"] = r["random_vs_oz"]
    return scalars


def held_out_evaluation(task_set: CompilerGymTaskSet, act: Any, preprocess: Any, seed: int,
                        random_trials: int = 1) -> dict[str, Any]:
    """The env's final evaluation (``envs.final_evaluation_for("compiler_gym")``): ``evaluate_programs``
    with ``act(obs_batch, deterministic) -> env actions``, and with ``eval_search`` set, that search
    (``search_programs``, the policy behind ``act``), as a report: ``scalars`` (eval/ geometric
    means, ``eval/compilergym/<program>/vs_oz`` per program), ``text`` (the tables), ``files``
    (``eval_programs.json``) and the raw result."""
    from envs.compiler_gym_search import ActPolicy, parse_search  # noqa: PLC0415

    result = evaluate_programs(task_set, act, preprocess, random_trials, seed)
    scalars = {f"eval/{key}": result[key] for key in
               ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz")}
    scalars.update({f"eval/compilergym/{program_name(r['benchmark'])}/vs_oz": r["policy_vs_oz"] for r in result["rows"]})
    text = format_table(result)
    spec = parse_search(task_set.eval_search)
    if spec is not None:
        budget = task_set.eval_search_budget or 16 * search_horizon(task_set)
        searched = search_programs(task_set, ActPolicy(act, preprocess, task_set), task_set.eval_benchmarks, spec,
                                   budget, seed)
        result["search"] = searched
        scalars.update(search_scalars(searched))
        text += "\n" + format_search_table(searched)
    return {**result, "scalars": scalars, "text": text, "files": {"eval_programs.json": result}}


# Registered here, below the evaluation it names.
register_env("compiler_gym", final_evaluation=held_out_evaluation)(compiler_gym_task_set)
