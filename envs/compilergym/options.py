"""The options of env ``compilergym`` (``env_kwargs``): the programs, the episode, the reward's shaping, the
server's timeouts and the final evaluation's search. Every check that needs no file and no server is here."""
from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Optional

import pydantic

from async_rl.renamed_keys import renamed_env_option_keys
from async_rl.validation import ConfigSection
from envs.compilergym.programs import program_folder
from envs.compilergym.search import SearchSpec

_SPEC = re.compile(r"^(greedy|best-of-(\d+)|beam-(\d+))$")
SEARCH_FORMS = "none, greedy, best-of-K or beam-K (K >= 1, e.g. best-of-16, beam-4)"


def parse_search(spec: Any, allow_none: bool = True) -> Optional[SearchSpec]:
    """``"greedy"``, ``"best-of-16"``, ``"beam-4"`` (or ``"none"`` -> None): the validator of the option type
    ``SearchOrNone`` and of the commands' search flags, which report its ValueError as ``--search 'x' is not a
    search; valid: ...`` (exit code 2)."""
    text = str(spec).strip().lower()
    if allow_none and text in ("none", ""):
        return None
    m = _SPEC.match(text)
    k = int(m.group(2) or m.group(3) or 1) if m else 0
    if not m or k < 1:
        forms = SEARCH_FORMS if allow_none else SEARCH_FORMS.replace("none, ", "")
        raise ValueError(f"not a search; valid: {forms}")
    return SearchSpec("greedy" if text == "greedy" else text.rsplit("-", 1)[0], k)


def _search_or_none(text: str) -> str:
    parse_search(text)
    return text


# A search as an option's value: none or a search, kept as written.
SearchOrNone = Annotated[str, pydantic.AfterValidator(_search_or_none)]
ProgramFolder = Annotated[str, pydantic.AfterValidator(program_folder)]  # a folder holding programs

# (first seed, count) of csmith-generated programs
SeedRange = tuple[pydantic.NonNegativeInt, pydantic.PositiveInt]


class CompilerGymOptions(ConfigSection):
    """LLVM pass ordering on CompilerGym: programs are csmith seeds (train_seeds / eval_seeds), the files of
    benchmark_dir, or named datasets (online only)."""

    # Options of earlier versions: env_kwargs that still use one are refused with the new spelling.
    renamed_keys: ClassVar[dict[str, str]] = renamed_env_option_keys("compilergym")

    mode: Literal["per_step", "sequence"] = "per_step"
    """per_step: one pass per step, max_steps per episode; sequence: one step applies up to seq_len passes"""
    max_steps: pydantic.PositiveInt = 45
    """passes per episode (per_step mode)"""
    seq_len: pydantic.PositiveInt = 16
    """longest pass sequence of one step (sequence mode)"""
    train_seeds: SeedRange = [0, 200]  # type: ignore[assignment]  # a list as a YAML config writes it; pydantic makes the tuple
    """csmith programs trained on: [first seed, count], disjoint from eval_seeds"""
    eval_seeds: SeedRange = [1_000_000, 20]  # type: ignore[assignment]  # (as train_seeds)
    """csmith programs held out: [first seed, count]"""
    benchmark_dir: Optional[ProgramFolder] = None
    """train on the .c/.cpp/.bc files of this folder instead (the first eval_fraction of them held out)"""
    eval_benchmark_dir: Optional[ProgramFolder] = None
    """held-out programs of their own (every file of the folder, e.g. envs/programs), whatever the training ones"""
    eval_search: SearchOrNone = "none"
    """a search the final evaluation adds: none, greedy, best-of-K, beam-K (--eval-search sets it)"""
    eval_search_budget: pydantic.NonNegativeInt = 0
    """the search's compilations per program; 0 = 16 x the episode length"""
    datasets: Optional[list[str]] = None
    """benchmark URIs, or dataset names such as cbench-v1 (their first dataset_limit programs; need the internet)"""
    dataset_limit: pydantic.PositiveInt = 100
    """programs taken from each named dataset"""
    eval_fraction: float = pydantic.Field(0.2, gt=0.0, lt=1.0)
    """the share of benchmark_dir's or the datasets' programs held out"""
    ir_tokens: pydantic.NonNegativeInt = 0
    """IR tokens per observation (0 = no IR; the passformer policy needs some, e.g. 256)"""
    ir_vocab_size: pydantic.PositiveInt = 4096
    """IR words are hashed into this many token ids"""
    leaky_above: float = 1.0
    """the reduction (vs -Oz) above which the reward grows with slope leakiness only"""
    leakiness: float = 1.0
    """the slope of the reward above leaky_above (1.0 = no cap)"""
    step_penalty: float = 0.0
    """subtracted per pass applied"""
    reward_baseline: Literal["oz", "initial"] = "oz"
    """oz: 1.0 = as small as -Oz; initial: the fraction of the -O0 count removed"""
    oz_floor: float = pydantic.Field(0.01, gt=0.0, le=1.0)
    """the reward's -Oz denominator is at least this fraction of the -O0 count"""
    noop_penalty: float = pydantic.Field(0.0, ge=0.0, lt=1.0)
    """per step, subtracted for a pass that leaves the instruction count unchanged"""
    call_timeout_s: pydantic.PositiveFloat = 60.0
    """longest wait for one call to the CompilerGym server"""
    start_timeout_s: pydantic.PositiveFloat = 120.0
    """longest wait for the CompilerGym server to start"""
    episodes_per_program: pydantic.PositiveInt = 1
    """consecutive training episodes on each program (its first reset is slow)"""
    reuse_programs: bool = True
    """the server keeps each program's start state (false: rebuilt at every reset)"""
    time_limit: Literal["terminal", "truncate"] = "terminal"
    """reaching max_steps ends the task (terminal, value 0 after it) or is a time limit bootstrapped from V"""
    mask_noops: bool = False
    """the observation's action_mask rules out the passes run since the instruction count last changed"""
    success_vs_oz: pydantic.PositiveFloat = 1.0
    """an episode succeeds when -Oz count / count >= this; 1.0 = at least as small as -Oz"""

    @pydantic.model_validator(mode="after")
    def _disjoint_seeds(self) -> "CompilerGymOptions":
        (t0, tn), (e0, en) = self.train_seeds, self.eval_seeds
        uses_seeds = self.benchmark_dir is None and not self.datasets
        if uses_seeds and t0 < e0 + en and e0 < t0 + tn:
            raise ValueError(f"compilergym train_seeds {list(self.train_seeds)} and eval_seeds {list(self.eval_seeds)} "
                             "overlap; give disjoint [first seed, count] ranges")
        return self
