"""Search at inference time for LLVM pass ordering, under a budget of compilations.

A compilation is one pass application. Every search gets a budget of them per program, never
uses more, and says how many it used:

- ``greedy``     the policy's most likely action at every step (per-step policies) or its greedy
                 sequence (sequence policies): one episode;
- ``best-of-K``  K sampled episodes (or sampled sequences), the smallest IR kept;
- ``beam-K``     policy-guided beam: each of the K best partial sequences (by IR count) is
                 extended by its K most likely next passes that change the count (a pass that
                 changes nothing is tried, counted and passed over, down the policy's ranking up to
                 4K tries), the K smallest distinct counts are kept, depth after depth; reaching a
                 partial sequence again costs its passes (the compiler keeps one saved state), so a
                 budget buys depth ``d`` at about ``K * (d + K)`` per level;
- random search  random pass sequences of the policy's episode length, as many compilations as
                 the search it is compared with used.

Each returns the smallest IR count among the states it compiled and the pass sequence reaching
it: any prefix of an applied sequence counts (stopping there is a valid sequence). The searches
see the compiler through ``Compiler`` and the policy through ``SearchPolicy``, so the same code
runs on the CompilerGym server (``envs.compilergym.env_compiler.EnvCompiler``) and on a small
deterministic model of IR counts in the tests. This module imports nothing of the env.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

import numpy as np

from async_rl.tokens import PAD_ID, SPECIAL_TOKENS

if TYPE_CHECKING:
    from envs.compilergym.tokens import PassVocab


# ---- what to run -------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchSpec:
    """A parsed search (``envs.compilergym.options.parse_search``): ``kind`` greedy | best-of | beam, ``k``
    samples or width."""

    kind: str
    k: int = 1

    @property
    def name(self) -> str:
        return "greedy" if self.kind == "greedy" else f"{self.kind}-{self.k}"


class Budget:
    """Compilations left for one program; ``charge`` refuses to go over (a search bug, not input)."""

    def __init__(self, total: int) -> None:
        self.total, self.used = int(total), 0

    @property
    def left(self) -> int:
        return self.total - self.used

    def charge(self, n: int = 1) -> None:
        if n > self.left:
            raise RuntimeError(f"search over budget: {self.used} + {n} > {self.total} compilations")
        self.used += n


# ---- what the searches talk to -----------------------------------------------------------
class Compiler(Protocol):
    """One program in a compiler. ``reset`` is free; ``step`` and ``probe`` are one compilation each."""

    num_passes: int

    def reset(self) -> Optional[tuple[Any, int]]:
        """(observation, IR count) of the program as loaded; None if it cannot be loaded."""
        ...

    def step(self, pass_index: int) -> Optional[tuple[Any, int]]:
        """Apply one pass: (observation, IR count), or None if the compilation failed (reset next)."""
        ...

    def probe(self, pass_index: int) -> Optional[int]:
        """IR count after one more pass, the state left as it was; None if it failed (reset next)."""
        ...


class SearchPolicy(Protocol):
    """The policy as the searches use it."""

    per_step: bool  # True: one pass per observation; False: a whole sequence from the first one

    def actions(self, obs: Any, n: int, deterministic: bool) -> list[list[int]]:
        """``n`` proposals at ``obs``: one pass each (per step) or a pass sequence each."""
        ...

    def pass_scores(self, obs: Any, prefix: Sequence[int]) -> np.ndarray:
        """``[num_passes]`` preference for the next pass after ``prefix`` (higher first; -inf never)."""
        ...


class Counted:
    """A ``Compiler`` whose compilations are charged to ``budget``."""

    def __init__(self, compiler: Compiler, budget: Budget) -> None:
        self.compiler, self.budget = compiler, budget
        self.num_passes = compiler.num_passes

    def reset(self) -> Optional[tuple[Any, int]]:
        return self.compiler.reset()

    def step(self, pass_index: int) -> Optional[tuple[Any, int]]:
        self.budget.charge()
        return self.compiler.step(int(pass_index))

    def probe(self, pass_index: int) -> Optional[int]:
        self.budget.charge()
        return self.compiler.probe(int(pass_index))


@dataclass
class SearchResult:
    """The smallest IR count a search compiled, the passes reaching it and what it cost."""

    count: Optional[int] = None  # None: the program could not even be loaded
    passes: list[int] = field(default_factory=list)
    compilations: int = 0
    seconds: float = 0.0

    def see(self, count: int, passes: Sequence[int]) -> None:
        """Keep ``count`` if it is the smallest so far (the shorter sequence on a tie)."""
        if self.count is None or count < self.count:
            self.count, self.passes = int(count), list(passes)


# ---- the searches ------------------------------------------------------------------------
def _apply(compiler: Counted, obs: Any, count: int, plan: Sequence[int], done: list[int], best: SearchResult,
           policy: Optional[SearchPolicy] = None, deterministic: bool = True, horizon: int = 0) -> Optional[tuple[Any, int]]:
    """Extend the state reached by ``done`` by ``plan`` (or, with ``policy``, by the policy's
    choices up to ``horizon`` passes), pass by pass within the budget; every state goes to
    ``best``. Returns the last (observation, count), None if a compilation failed."""
    todo = list(plan)
    while compiler.budget.left > 0 and (todo or (policy is not None and len(done) < horizon)):
        pass_index = todo.pop(0) if todo else policy.actions(obs, 1, deterministic)[0][0]
        stepped = compiler.step(pass_index)
        if stepped is None:
            return None
        obs, count = stepped
        done.append(int(pass_index))
        best.see(count, done)
    return obs, count


def _episodes(compiler: Counted, policy: SearchPolicy, k: int, deterministic: bool, horizon: int,
              best: SearchResult) -> None:
    """Up to ``k`` episodes of the policy from the loaded program (fewer if the budget ends)."""
    plans: list[list[int]] = []
    for episode in range(k):
        if episode and compiler.budget.left <= 0:  # the first loads the program even with no budget
            return
        start = compiler.reset()
        if start is None:
            return
        best.see(start[1], [])
        if policy.per_step:
            _apply(compiler, *start, [], [], best, policy, deterministic, horizon)
            continue
        if not plans:  # sequence policies: every sequence is written from the loaded program
            plans = policy.actions(start[0], k - episode, deterministic)
        _apply(compiler, *start, plans.pop(0)[:horizon], [], best)


def greedy(compiler: Counted, policy: SearchPolicy, horizon: int) -> SearchResult:
    """One episode of the policy's most likely choices (at most ``horizon`` passes)."""
    return _timed(lambda best: _episodes(compiler, policy, 1, True, horizon, best), compiler)


def best_of(compiler: Counted, policy: SearchPolicy, k: int, horizon: int) -> SearchResult:
    """``k`` sampled episodes (at most ``horizon`` passes each); the smallest IR of any of them."""
    return _timed(lambda best: _episodes(compiler, policy, k, False, horizon, best), compiler)


def beam(compiler: Counted, policy: SearchPolicy, width: int, horizon: int, expand: Optional[int] = None,
         tries: Optional[int] = None) -> SearchResult:
    """Policy-guided beam of ``width`` partial sequences, each extended by its ``expand`` (default
    ``width``) most likely next passes that change the IR count, trying at most ``tries`` (default
    ``4 * expand``) passes per sequence, up to ``horizon`` passes deep. A pass that leaves the count
    as it was would put the same program in the beam again; a weak policy ranks such passes first."""
    expand = expand or width
    tries = tries or 4 * expand

    def run(best: SearchResult) -> None:
        start = compiler.reset()
        if start is None:
            return
        obs0, count0 = start
        best.see(count0, [])
        entries: list[list[int]] = [[]]
        for _depth in range(horizon):
            candidates: list[tuple[int, int, list[int]]] = []  # (count, rank, passes)
            for prefix in entries:
                if compiler.budget.left < len(prefix) + 1:
                    break
                reached = compiler.reset()
                if reached is None:
                    return
                reached = _apply(compiler, *reached, prefix, [], best)
                if reached is None:
                    continue
                scores = policy.pass_scores(reached[0] if policy.per_step else obs0, prefix)
                ranked = [int(p) for p in np.argsort(-scores, kind="stable")[:tries] if np.isfinite(scores[p])]
                kept = 0
                for p in ranked:
                    if compiler.budget.left <= 0 or kept == expand:
                        break
                    count = compiler.probe(p)
                    if count is None:
                        break  # the state is gone with the failed compilation
                    if count != reached[1]:
                        best.see(count, [*prefix, p])
                        candidates.append((count, len(candidates), [*prefix, p]))
                        kept += 1
            distinct: dict[int, list[int]] = {}  # one sequence per count: the same count is most likely the same program
            for count, _, passes in sorted(candidates):
                distinct.setdefault(count, passes)
            entries = list(distinct.values())[:width]
            if not entries:
                return

    return _timed(run, compiler)


def random_search(compiler: Counted, horizon: int, rng: np.random.Generator, every_prefix: bool = True) -> SearchResult:
    """Random sequences of ``horizon`` passes from the loaded program until the budget is spent
    (the last one cut short): exactly ``budget.total`` compilations unless a program fails to load.

    ``every_prefix``: every state compiled counts, as in the searches. False: only the state each
    sequence ends in, and a sequence whose compilation failed as the unchanged program (nothing
    optimised is left), as a policy's episode is judged; the baseline for a policy's own episodes."""

    def run(best: SearchResult) -> None:
        start = compiler.reset()  # loaded even with no budget: the unchanged program is a result
        while start is not None:
            if every_prefix:
                best.see(start[1], [])
            if compiler.budget.left <= 0:
                return
            plan = [int(p) for p in rng.integers(compiler.num_passes, size=min(horizon, compiler.budget.left))]
            done: list[int] = []
            reached = _apply(compiler, *start, plan, done, best if every_prefix else SearchResult())
            if not every_prefix:
                best.see(start[1], []) if reached is None else best.see(reached[1], done)
            start = compiler.reset() if compiler.budget.left > 0 else None

    return _timed(run, compiler)


def _timed(run: Callable[[SearchResult], None], compiler: Counted) -> SearchResult:
    best, started, used = SearchResult(), time.monotonic(), compiler.budget.used
    run(best)
    best.compilations, best.seconds = compiler.budget.used - used, time.monotonic() - started
    return best


def run_search(spec: SearchSpec, compiler: Compiler, policy: SearchPolicy, budget: int, horizon: int) -> SearchResult:
    """``spec`` on one program with ``budget`` compilations."""
    counted = Counted(compiler, Budget(budget))
    if spec.kind == "greedy":
        return greedy(counted, policy, horizon)
    if spec.kind == "best-of":
        return best_of(counted, policy, spec.k, horizon)
    return beam(counted, policy, spec.k, horizon)


def random_baseline(compiler: Compiler, budget: int, horizon: int, rng: np.random.Generator,
                    every_prefix: bool = True) -> SearchResult:
    """Random search with ``budget`` compilations on one program."""
    return random_search(Counted(compiler, Budget(budget)), horizon, rng, every_prefix)


# ---- policies ------------------------------------------------------------------------------
class PassTaskSet(Protocol):
    """The task set as the policy adapters read it (``envs.compilergym.env.CompilerGymTaskSet`` is one)."""

    flags: list[str]  # the pass flags; a pass's index is its place here
    mode: str  # "per_step" (an action is one pass index) or "sequence" (an action is a pass sequence's tokens)
    seq_len: int  # a sequence action's length in tokens

    @property
    def action_vocab(self) -> PassVocab:
        """The token ids of pass sequences (sequence mode)."""
        ...


class _Proposals:
    """What both policy adapters share: batches of one observation, actions -> pass indices."""

    def __init__(self, preprocess: Callable[[Any, str], Any], task_set: PassTaskSet,
                 task_name: str = "compilergym") -> None:
        self.preprocess, self.task_name = preprocess, task_name
        self.per_step = task_set.mode == "per_step"
        self.num_passes = len(task_set.flags)
        self.vocab = task_set.action_vocab
        self.seq_len = int(task_set.seq_len)

    def _batch(self, obs: Any, n: int) -> Any:
        import torch  # noqa: PLC0415  (torch only where a policy runs)

        return torch.stack([self.preprocess(obs, self.task_name)] * n)

    def passes_of(self, env_action: Any) -> list[int]:
        """An env action -> pass indices (per step: the index; sequence: the decoded token ids)."""
        action = np.asarray(env_action).reshape(-1)
        if self.per_step:
            return [int(action[0])]
        names, _ = self.vocab.decode(action)
        return [self.vocab.ids[n] - len(SPECIAL_TOKENS) for n in names]


class ModelPolicy(_Proposals):
    """An actor-critic in this process: its own sampling, and exact next-pass log-probs from
    ``evaluate`` (per step: every pass at ``obs``; sequence: ``prefix`` + every pass, whose
    log-probs differ by the next token's only)."""

    def __init__(self, model: Any, preprocess: Callable[[Any, str], Any], task_set: PassTaskSet,
                 task_name: str = "compilergym") -> None:
        super().__init__(preprocess, task_set, task_name)
        self.model = model.eval()

    def actions(self, obs: Any, n: int, deterministic: bool) -> list[list[int]]:
        import torch  # noqa: PLC0415

        with torch.no_grad():
            out = self.model.act(self._batch(obs, n), torch.full((n,), bool(deterministic)))
        return [self.passes_of(a) for a in out["env_action"].cpu().numpy()]

    def pass_scores(self, obs: Any, prefix: Sequence[int]) -> np.ndarray:
        import torch  # noqa: PLC0415

        p = self.num_passes
        if self.per_step:
            candidates = torch.arange(p).reshape(p, 1)
        else:
            if len(prefix) >= self.seq_len:  # the policy writes no longer sequences
                return np.full(p, -np.inf)
            candidates = torch.full((p, self.seq_len), PAD_ID, dtype=torch.long)
            candidates[:, : len(prefix)] = torch.as_tensor([len(SPECIAL_TOKENS) + i for i in prefix], dtype=torch.long)
            candidates[:, len(prefix)] = len(SPECIAL_TOKENS) + torch.arange(p)
        with torch.no_grad():
            logp, _, _ = self.model.evaluate(self._batch(obs, p), candidates)
        return logp.float().reshape(p, -1).sum(-1).cpu().numpy()


class ActPolicy(_Proposals):
    """The policy behind ``act(obs_batch, deterministic) -> env actions`` (e.g. an inference
    actor, which answers actions only): next-pass preferences are estimated from ``samples``
    sampled actions (how often each pass comes next after ``prefix``; the greedy choice first)."""

    def __init__(self, act: Callable[[Any, bool], Any], preprocess: Callable[[Any, str], Any],
                 task_set: PassTaskSet, samples: int = 32, task_name: str = "compilergym") -> None:
        super().__init__(preprocess, task_set, task_name)
        self.act, self.samples = act, int(samples)

    def actions(self, obs: Any, n: int, deterministic: bool) -> list[list[int]]:
        return [self.passes_of(a) for a in np.asarray(self.act(self._batch(obs, n), deterministic))]

    def pass_scores(self, obs: Any, prefix: Sequence[int]) -> np.ndarray:
        d, prefix = (0, []) if self.per_step else (len(prefix), list(prefix))  # per step: the pass at obs
        counts = np.zeros(self.num_passes)
        greedy = self.actions(obs, 1, True)[0]
        sampled = self.actions(obs, self.samples, False)
        # Per step every proposal is a next pass; a sequence's counts where it continues ``prefix``
        # (or, if none does, the passes sampled at that position).
        following = [s for s in sampled if len(s) > d and s[:d] == prefix] or [s for s in sampled if len(s) > d]
        for s in following:
            counts[s[d]] += 1.0
        if len(greedy) > d and greedy[:d] == prefix:
            counts[greedy[d]] += 0.5  # ahead of passes sampled as often
        with np.errstate(divide="ignore"):
            return np.log(counts)
