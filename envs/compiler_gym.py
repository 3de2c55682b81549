"""CompilerGym LLVM pass ordering (seed 000), driven through a Python 3.10 server process.

compiler_gym 0.2.5 runs only on Python 3.9/3.10, so each env starts ``envs/_compiler_gym_server.py``
in ``.venv-compilergym`` (built by ``scripts/setup_compilergym.sh``) and talks to it over a pipe,
one JSON line per call, each with a timeout. A dead or silent server (or a dead CompilerGym
service) raises ``CompilerGymServerError`` naming what happened; the env then starts a new server
and ends the episode, so a rollout worker never hangs on it.

Two action modes:
  ``per_step``  one pass per env step (Categorical over the pass flags), ``max_steps`` per episode;
  ``sequence``  one env step per episode: the action is a padded sequence of token ids of
                ``obs_spec["action_vocab"]`` (specials, then one token per pass flag), applied
                pass by pass; unknown tokens are skipped and counted.

Programs: ``generator://csmith-v0/<seed>`` over disjoint seed ranges for training and evaluation,
or every .c/.cpp/.bc file of ``benchmark_dir``, or named CompilerGym datasets (online only).
Programs that fail to build or whose -Oz count exceeds their -O0 count are skipped and counted.

Reward (seed 000 section 3.1): reduction r = (c0 - c) / (c0 - c_oz) (``reward_baseline: oz``,
1.0 = as good as -Oz) or (c0 - c) / c0 (``initial``); above ``baseline_thre`` it grows with slope
``leakiness``; minus ``step_penalty`` per pass. Per-step rewards are the increments of that
shaped value, so an episode's return equals the reward of its whole sequence.
"""
from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from async_rl.errors import ConfigError
from async_rl.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from envs import register_env

ROOT = Path(__file__).resolve().parents[1]
SERVER_SCRIPT = Path(__file__).with_name("_compiler_gym_server.py")
AUTOPHASE_DIM = 56
IR_SPECIAL = 2  # IR token ids 0 (pad) and 1 (truncated/unknown) are reserved
_SETUP_HINT = "run scripts/setup_compilergym.sh (needs Python 3.10, e.g. pyenv install 3.10.13)"
_MODES = ("per_step", "sequence")
# Errors that mean CompilerGym's service (not the program) is in trouble: replace the server.
_SERVICE_TROUBLE = re.compile(r"Service|Session|did not answer|died|exited|pipe broke")
_BASELINES = ("oz", "initial")


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

    def reduction(self, c0: int, c: int, c_oz: int) -> float:
        denom = max(c0 - c_oz, 1) if self.reward_baseline == "oz" else max(c0, 1)
        return (c0 - c) / denom

    def shaped(self, reduction: float, num_passes: int) -> float:
        r = reduction
        if r > self.baseline_thre:
            r = self.baseline_thre + (r - self.baseline_thre) * self.leakiness
        return r - self.step_penalty * num_passes


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
        if self.alive:
            self.proc.kill()
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
    max_steps: int = 16
    seq_len: int = 16
    ir_tokens: int = 0
    ir_vocab_size: int = 4096
    reward: RewardConfig = field(default_factory=RewardConfig)
    python: str = ""
    site_data: str = ""
    call_timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    episodes_per_program: int = 1
    task_names: list[str] = field(default_factory=lambda: ["compiler_gym"])

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
        return AUTOPHASE_DIM

    @property
    def obs_spec(self) -> dict[str, Any]:
        spec = {"autophase_dim": AUTOPHASE_DIM, "num_passes": len(self.flags), "mode": self.mode,
                "ir_tokens": self.ir_tokens, "ir_vocab_size": self.ir_vocab_size,
                "action_vocab": self.action_vocab.tokens, "seq_len": self.seq_len, "max_steps": self.max_steps}
        if self.mode == "per_step":
            spec["num_actions"] = len(self.flags)  # a discrete action: the pass index
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
        self.program: Optional[dict[str, Any]] = None
        self._needs_reset = True
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
        p = self.program
        obs = {"autophase": np.asarray(msg["autophase"], dtype=np.float32),
               "ir_count": np.float32(msg["ir_count"]), "o0_count": np.float32(p["o0_count"]),
               "oz_count": np.float32(p["oz_count"]), "step": np.float32(self._t)}
        if self.ts.ir_tokens:
            obs["ir_tokens"] = tokenize_ir(msg["ir"], self.ts.ir_vocab_size, self.ts.ir_tokens)
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
            msg = self.client.call("reset", benchmark=uri, ir=bool(self.ts.ir_tokens))
        except CompilerGymServerError as exc:
            if self.client.alive and not _SERVICE_TROUBLE.search(str(exc)):
                return self._skip(uri, exc)  # the server answered: this program does not build
            # A dead service (or server) needs a fresh server; a program that does not build fails there too.
            self._restart(exc)
            try:
                msg = self.client.call("reset", benchmark=uri, ir=bool(self.ts.ir_tokens))
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
        self._shaped = self.ts.reward.shaped(0.0, 0)
        return self._obs(msg)

    def _skip(self, uri: str, why: Exception) -> None:
        print(f"[compiler_gym] skipping {uri}: {why}", file=sys.stderr)
        self.skipped["build_failed"] += 1
        self.skipped_uris.add(uri)

    def reset(self) -> dict[str, np.ndarray]:
        for _ in range(max(10 * len(self.benchmarks), 10)):
            uri = self._next_benchmark()
            if uri in self.skipped_uris:
                continue
            obs = self.reset_to(uri)
            if obs is not None:
                return obs
        raise RuntimeError(f"CompilerGym: every program was skipped ({self.skipped}); check the benchmarks")

    def apply_passes(self, passes: list[int]) -> tuple[dict[str, Any], Optional[str]]:
        """Run pass indices on the current program; (server answer, error or None)."""
        msg = self.client.call("step", actions=passes, ir=bool(self.ts.ir_tokens))
        return msg, (msg.get("error") if msg.get("done") else None)

    def counters(self) -> dict[str, int]:
        """Running totals the rollout workers log (``env/<name>``)."""
        return {"skipped_build_failed": self.skipped["build_failed"], "skipped_oz_above_o0": self.skipped["oz_above_o0"],
                "unknown_passes": self.unknown_passes, "server_restarts": self.server_restarts}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("CompilerGym env: call reset() before step() (episode ended)")
        action = np.asarray(action).reshape(-1)
        if self.ts.mode == "per_step":
            index = int(action[0])
            if not 0 <= index < len(self.ts.flags):
                raise ValueError(f"pass index {index} outside [0, {len(self.ts.flags)})")
            passes, unknown = [index], 0
        else:
            names, unknown = self.vocab.decode(action)
            passes = [self.vocab.ids[n] - len(SPECIAL_TOKENS) for n in names]
        self.unknown_passes += unknown
        info: dict[str, Any] = {"unknown_passes": unknown, "benchmark": self.program["uri"]}
        try:
            msg, error = self.apply_passes(passes)  # no passes: the unchanged program's observation
        except CompilerGymServerError as exc:
            # The server or its service died mid-episode: end the episode; the next reset uses a new server.
            self._restart(exc)
            self._needs_reset = True
            info.update(server_error=str(exc), success=False)
            obs = self._obs({"autophase": np.zeros(AUTOPHASE_DIM), "ir_count": self._count, "ir": ""})
            return obs, 0.0, False, True, info
        self._t += max(len(passes), 1) if self.ts.mode == "per_step" else 1
        self._count = msg["ir_count"]
        p = self.program
        reduction = self.ts.reward.reduction(p["o0_count"], self._count, p["oz_count"])
        shaped = self.ts.reward.shaped(reduction, self._t if self.ts.mode == "per_step" else len(passes))
        reward, self._shaped = shaped - self._shaped, shaped
        done_by_service = error is not None
        truncated = self.ts.mode == "sequence" or self._t >= self.ts.max_steps
        self._needs_reset = truncated or done_by_service
        info.update(reduction=reduction, ir_count=self._count, oz_count=p["oz_count"], o0_count=p["o0_count"],
                    success=self._count <= p["oz_count"], num_passes=len(passes),
                    passes=[self.ts.flags[i] for i in passes])
        if error:
            info["service_error"] = error
        # Sequence mode: one step is the whole episode, and it is terminal (nothing to bootstrap).
        terminated = self.ts.mode == "sequence" or done_by_service
        return self._obs(msg), float(reward), terminated, truncated and not terminated, info

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
    max_steps: int = 16,
    seq_len: int = 16,
    train_seeds: Sequence[int] = (0, 200),
    eval_seeds: Sequence[int] = (1_000_000, 20),
    benchmark_dir: Optional[str] = None,
    datasets: Optional[list[str]] = None,
    dataset_limit: int = 100,
    eval_fraction: float = 0.2,
    ir_tokens: int = 0,
    ir_vocab_size: int = 4096,
    baseline_thre: float = 1.0,
    leakiness: float = 1.0,
    step_penalty: float = 0.0,
    reward_baseline: str = "oz",
    call_timeout_s: float = 60.0,
    start_timeout_s: float = 120.0,
    episodes_per_program: int = 1,
) -> CompilerGymTaskSet:
    """Build the CompilerGym TaskSet.

    mode: ``per_step`` (one pass per step, ``max_steps`` per episode) or ``sequence`` (one step
    applies a whole sequence of up to ``seq_len`` passes). Programs: csmith seeds
    ``train_seeds``/``eval_seeds`` = (first seed, count), disjoint; or ``benchmark_dir`` (its
    .c/.cpp/.bc files, the first ``eval_fraction`` of them held out); or ``datasets`` (benchmark
    URIs, or dataset names such as cbench-v1 whose first ``dataset_limit`` programs are used;
    named datasets need the internet). ir_tokens: IR tokens per observation (0 = no IR).
    episodes_per_program: consecutive training episodes on each program (its first reset is slow).
    """
    if mode not in _MODES:
        raise ConfigError(f"compiler_gym mode '{mode}' is unknown; valid: {', '.join(_MODES)}")
    if reward_baseline not in _BASELINES:
        raise ConfigError(f"compiler_gym reward_baseline '{reward_baseline}' is unknown; valid: {', '.join(_BASELINES)}")
    for name, value in (("max_steps", max_steps), ("seq_len", seq_len), ("episodes_per_program", episodes_per_program)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"compiler_gym {name} must be a positive integer, got {value!r}")
    if not 0.0 < float(eval_fraction) < 1.0:
        raise ConfigError(f"compiler_gym eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction!r}")
    if benchmark_dir is not None:
        root = Path(benchmark_dir)
        if not root.is_dir():
            raise ConfigError(f"compiler_gym benchmark_dir {benchmark_dir}: no such directory; pass a folder of .c/.cpp/.bc files")
        files = sorted(str(p.resolve()) for p in root.rglob("*") if p.suffix in (".c", ".cpp", ".cc", ".bc", ".ll"))
        if not files:
            raise ConfigError(f"compiler_gym benchmark_dir {benchmark_dir} holds no .c/.cpp/.bc files")
        train, evaluation = _split_dir(files, eval_fraction)
        train, evaluation = [f"file://{f}" for f in train], [f"file://{f}" for f in evaluation]
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
    return CompilerGymTaskSet(
        train_benchmarks=train, eval_benchmarks=evaluation, flags=flags, mode=mode, max_steps=max_steps,
        seq_len=seq_len, ir_tokens=int(ir_tokens), ir_vocab_size=int(ir_vocab_size),
        reward=RewardConfig(float(baseline_thre), float(leakiness), float(step_penalty), reward_baseline),
        python=str(python), site_data=str(site_data), call_timeout_s=float(call_timeout_s),
        start_timeout_s=float(start_timeout_s), episodes_per_program=episodes_per_program,
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
        msg, _ = env.apply_passes([int(a) for a in rng.integers(len(env.ts.flags), size=length)])
        best = msg["ir_count"] if best is None else min(best, msg["ir_count"])
    return best


# ---- held-out evaluation -----------------------------------------------------------------
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


def held_out_evaluation(task_set: CompilerGymTaskSet, act: Any, preprocess: Any, seed: int,
                        random_trials: int = 1) -> dict[str, Any]:
    """The env's final evaluation (``envs.final_evaluation_for("compiler_gym")``): ``evaluate_programs``
    with ``act(obs_batch, deterministic) -> env actions``, as a report: ``scalars`` (eval/ geometric
    means), ``text`` (the per-program table), ``files`` (``eval_programs.json``) and the raw result."""
    result = evaluate_programs(task_set, act, preprocess, random_trials, seed)
    scalars = {f"eval/{key}": result[key] for key in
               ("geomean_reduction_vs_oz", "sampled_geomean_reduction_vs_oz", "random_search_geomean_vs_oz")}
    return {**result, "scalars": scalars, "text": format_table(result), "files": {"eval_programs.json": result}}


# Registered here, below the evaluation it names.
register_env("compiler_gym", final_evaluation=held_out_evaluation)(compiler_gym_task_set)
