"""Searches at inference time (envs/compilergym/search.py) against a toy compiler: a small pure
Python model of IR counts in which the order of passes matters, so that every search's budget,
bookkeeping and choices are checked exactly, with no CompilerGym; one test runs the real server."""
from contextlib import closing
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from async_rl.errors import ConfigError
from envs.compilergym.client import compilergym_unavailable_reason
from envs.compilergym.options import parse_search
from envs.compilergym.search import (
    ActPolicy,
    Budget,
    Counted,
    ModelPolicy,
    SearchSpec,
    beam,
    best_of,
    greedy,
    random_baseline,
    random_search,
    run_search,
)

UNAVAILABLE = compilergym_unavailable_reason()
# Pass p multiplies the count by SHRINK[p]; right after pass p - 1 it shrinks 10 % more (passes
# enable each other); running the pass just run again changes nothing.
SHRINK = (0.97, 0.92, 1.04, 0.99, 0.95)


def toy_count(start: int, passes) -> int:
    count, last = start, -1
    for p in passes:
        if p != last:
            factor = SHRINK[p] * (0.9 if p == last + 1 and last >= 0 else 1.0)
            count = max(1, int(count * factor))
        last = p
    return count


class ToyCompiler:
    """The ``Compiler`` protocol over ``toy_count``; records every compiled count."""

    num_passes = len(SHRINK)

    def __init__(self, start: int = 1000, fail_after: tuple = ()) -> None:
        self.start, self.fail_after = start, tuple(fail_after)
        self.passes: list[int] = []
        self.compilations, self.seen = 0, []

    def _obs(self):
        return {"count": toy_count(self.start, self.passes), "passes": tuple(self.passes)}

    def reset(self):
        self.passes = []
        return self._obs(), self.start

    def _fails(self, p):
        return bool(self.fail_after) and tuple(self.passes[len(self.passes) + 1 - len(self.fail_after):] + [p]) == self.fail_after

    def step(self, p):
        self.compilations += 1
        if self._fails(p):
            return None
        self.passes.append(p)
        self.seen.append(toy_count(self.start, self.passes))
        return self._obs(), self.seen[-1]

    def probe(self, p):
        self.compilations += 1
        if self._fails(p):
            return None
        self.seen.append(toy_count(self.start, [*self.passes, p]))
        return self.seen[-1]


class ToyPolicy:
    """Prefers the pass after the last one (the enabling chain), else higher pass indices first (so
    its greedy episode starts with pass 4, not with 0, where the best chain starts); sampling draws
    from the softmax of the preferences."""

    def __init__(self, per_step: bool = True, seq_len: int = 6, seed: int = 0) -> None:
        self.per_step, self.seq_len = per_step, seq_len
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def pass_scores(self, obs, prefix):
        passes = obs["passes"] if self.per_step else tuple(prefix)
        last = passes[-1] if passes else -1
        scores = -np.arange(len(SHRINK), dtype=float)[::-1] * 0.1  # a fixed order: higher index first
        if last >= 0:
            scores[(last + 1) % len(SHRINK)] += 1.0
        return scores

    def _choose(self, obs, prefix, deterministic):
        scores = self.pass_scores(obs, prefix)
        if deterministic:
            return int(np.argmax(scores))
        probs = np.exp(scores * 3) / np.exp(scores * 3).sum()
        return int(self.rng.choice(len(SHRINK), p=probs))

    def actions(self, obs, n, deterministic):
        self.calls += 1
        if self.per_step:
            return [[self._choose(obs, (), deterministic)] for _ in range(n)]
        out = []
        for _ in range(n):
            seq = []
            for _ in range(self.seq_len):
                seq.append(self._choose(obs, seq, deterministic))
            out.append(seq)
        return out


def _check(result, compiler, budget):
    """What every search promises: within budget, counted exactly, the smallest count it compiled
    and a sequence that reproduces it."""
    assert result.compilations == compiler.compilations <= budget
    assert result.count == min([compiler.start, *compiler.seen])
    assert toy_count(compiler.start, result.passes) == result.count


def test_search_specs_parse_and_bad_ones_say_what_is_valid():
    assert parse_search("none") is None and parse_search("greedy") == SearchSpec("greedy", 1)
    assert parse_search("best-of-16") == SearchSpec("best-of", 16) and parse_search("Beam-4").name == "beam-4"
    for bad in ("beam", "best-of-0", "beam-x", "sampled", "best_of_4", "none"):
        with pytest.raises(ValueError) as err:  # a validator's: pydantic and the commands' flags report it
            parse_search(bad, allow_none=False)
        assert str(err.value) == "not a search; valid: greedy, best-of-K or beam-K (K >= 1, e.g. best-of-16, beam-4)"
    with pytest.raises(ValueError, match="^not a search; valid: none, greedy"):
        parse_search("beam-0")


def test_budget_refuses_to_go_over():
    budget = Budget(3)
    budget.charge(2)
    with pytest.raises(RuntimeError, match="over budget"):
        budget.charge(2)
    assert budget.used == 2 and budget.left == 1


@pytest.mark.parametrize("budget", [0, 1, 7, 40, 500])
@pytest.mark.parametrize("spec", ["greedy", "best-of-4", "beam-1", "beam-3"])
@pytest.mark.parametrize("per_step", [True, False])
def test_every_search_honours_and_counts_its_budget(budget, spec, per_step):
    compiler = ToyCompiler()
    result = run_search(parse_search(spec), compiler, ToyPolicy(per_step), budget, horizon=6)
    _check(result, compiler, budget)
    if budget == 0:
        assert result.passes == [] and result.count == compiler.start


def test_random_search_spends_exactly_its_budget():
    for budget in (1, 6, 13):
        compiler = ToyCompiler()
        result = random_baseline(compiler, budget, 6, np.random.default_rng(0))
        _check(result, compiler, budget)
        assert result.compilations == budget
    # Sequences of the horizon's length, each from the loaded program: 13 = 6 + 6 + 1.
    compiler, resets = ToyCompiler(), []
    compiler.reset = lambda original=compiler.reset: resets.append(1) or original()
    random_search(Counted(compiler, Budget(13)), 6, np.random.default_rng(0))
    assert len(resets) == 3


def test_greedy_follows_the_policy_argmax():
    compiler, policy = ToyCompiler(), ToyPolicy()
    result = greedy(Counted(compiler, Budget(100)), policy, horizon=5)
    assert compiler.passes == [4, 0, 1, 2, 3] and result.compilations == 5  # one episode, no more
    assert result.count == min(compiler.seen)
    # A sequence policy is asked once and its greedy sequence is applied pass by pass.
    compiler, policy = ToyCompiler(), ToyPolicy(per_step=False, seq_len=4)
    result = greedy(Counted(compiler, Budget(100)), policy, horizon=4)
    assert policy.calls == 1 and compiler.passes == [4, 0, 1, 2] and result.compilations == 4


def test_best_of_k_keeps_the_smallest_of_k_sampled_episodes():
    compiler, policy = ToyCompiler(), ToyPolicy(seed=3)
    result = best_of(Counted(compiler, Budget(1000)), policy, 5, horizon=4)
    assert result.compilations == 20  # 5 episodes x 4 passes
    _check(result, compiler, 1000)
    # A budget that ends inside the third episode: it is cut there.
    compiler = ToyCompiler()
    result = best_of(Counted(compiler, Budget(10)), ToyPolicy(seed=3), 5, horizon=4)
    assert result.compilations == 10 and len(compiler.passes) == 2
    # Sequence policies write all k sequences in one call.
    policy = ToyPolicy(per_step=False, seq_len=4, seed=1)
    result = best_of(Counted(ToyCompiler(), Budget(1000)), policy, 5, horizon=4)
    assert policy.calls == 1 and result.compilations == 20


def test_beam_of_width_one_walks_the_greedy_path_paying_for_replays():
    found = greedy(Counted(ToyCompiler(), Budget(100)), ToyPolicy(), horizon=5)
    compiler = ToyCompiler()
    result = beam(Counted(compiler, Budget(100)), ToyPolicy(), 1, horizon=5)
    assert result.passes == found.passes and result.count == found.count
    # Depth d replays the d passes of its one entry, then probes one pass: 1 + 2 + ... + 5.
    assert result.compilations == 15


def test_beam_passes_over_passes_that_change_nothing_but_counts_them():
    class RepeatFirst(ToyPolicy):  # ranks running the last pass again (a no-op here) first
        def pass_scores(self, obs, prefix):
            scores = super().pass_scores(obs, prefix)
            if obs["passes"]:
                scores[obs["passes"][-1]] += 5.0
            return scores

    compiler = ToyCompiler()
    result = beam(Counted(compiler, Budget(100)), RepeatFirst(), 1, horizon=4)
    _check(result, compiler, 100)
    assert result.passes == [4, 0, 1, 2]  # the greedy chain, no pass run twice in a row
    # Depth 0: one probe; depth d > 0: d passes replayed, the no-op tried, then the next pass.
    assert result.compilations == 1 + (1 + 2) + (2 + 2) + (3 + 2)


def test_a_wide_beam_finds_the_best_sequence_an_exhaustive_search_finds():
    start, horizon = 1000, 3
    best = min(toy_count(start, seq) for n in range(horizon + 1) for seq in product(range(len(SHRINK)), repeat=n))
    compiler = ToyCompiler(start)
    result = beam(Counted(compiler, Budget(10_000)), ToyPolicy(), len(SHRINK) ** 2, horizon, expand=len(SHRINK))
    _check(result, compiler, 10_000)
    assert result.count == best
    # A narrow beam beats greedy here: greedy starts with pass 4, the best chain starts with 0.
    narrow = beam(Counted(ToyCompiler(start), Budget(10_000)), ToyPolicy(), 2, horizon=5)
    assert narrow.count < greedy(Counted(ToyCompiler(start), Budget(100)), ToyPolicy(), horizon=5).count


def test_a_failed_compilation_ends_that_branch_and_is_still_counted():
    compiler = ToyCompiler(fail_after=(4, 0))  # the greedy episode's second pass fails
    result = greedy(Counted(compiler, Budget(100)), ToyPolicy(), horizon=5)
    assert result.compilations == compiler.compilations == 2 and result.passes == [4]
    compiler = ToyCompiler(fail_after=(4, 0))
    result = beam(Counted(compiler, Budget(200)), ToyPolicy(), 2, horizon=4)
    _check(result, compiler, 200)
    assert not any(result.passes[i:i + 2] == [4, 0] for i in range(len(result.passes)))


# ---- the policy adapters over a torch model ------------------------------------------------
class FixedLogits:
    """A per-step actor-critic whose logits depend on the observation's count: enough to check
    that ModelPolicy and ActPolicy rank the passes as the model does."""

    def __init__(self, num_passes: int) -> None:
        import torch

        self.torch = torch
        self.weights = torch.linspace(-1.0, 1.0, num_passes)

    def eval(self):
        return self

    def _logits(self, obs):
        return obs["x"].reshape(-1, 1) * self.weights

    def act(self, obs, deterministic):
        torch = self.torch
        logits = self._logits(obs)
        sample = torch.distributions.Categorical(logits=logits).sample()
        action = torch.where(torch.as_tensor(deterministic).reshape(-1), logits.argmax(-1), sample).unsqueeze(-1)
        return {"env_action": action}

    def evaluate(self, obs, action):
        logp = self.torch.log_softmax(self._logits(obs), -1).gather(-1, action.long().reshape(-1, 1))
        return logp, None, None


def _task_set():
    return SimpleNamespace(mode="per_step", flags=["-a", "-b", "-c", "-d"], seq_len=4, action_vocab=None)


def _preprocess(obs, task_name):
    import torch
    from tensordict import TensorDict

    return TensorDict({"x": torch.tensor(float(obs))}, [])


def test_model_policy_scores_are_the_model_log_probs_and_act_policy_ranks_alike():
    import torch

    model = FixedLogits(4)
    policy = ModelPolicy(model, _preprocess, _task_set())
    scores = policy.pass_scores(2.0, [])
    np.testing.assert_allclose(scores, torch.log_softmax(2.0 * model.weights, -1).numpy(), rtol=1e-6)
    assert policy.actions(2.0, 3, True) == [[3]] * 3
    torch.manual_seed(0)

    def act(obs, deterministic):
        return model.act(obs, torch.full((obs.batch_size[0],), deterministic))["env_action"].numpy()

    estimated = ActPolicy(act, _preprocess, _task_set(), samples=400).pass_scores(2.0, [7, 7])
    assert list(np.argsort(-estimated)) == list(np.argsort(-scores))  # most likely first


def test_model_policy_scores_a_sequence_policy_next_token_after_the_prefix():
    """Passformer: log-prob of prefix + pass (padding ends the sequence, not <eos>) ranks the
    passes as the decoder's next-token distribution does."""
    import torch
    from tensordict import TensorDict

    from async_rl.policies.passformer import PassformerActorCritic
    from async_rl.tokens import BOS_ID, SPECIAL_TOKENS

    flags = ["-a", "-b", "-c", "-d", "-e"]
    spec = {"action_vocab": [*SPECIAL_TOKENS, *flags], "ir_tokens": 8, "ir_vocab_size": 32, "autophase_dim": 4,
            "feature_dim": 6, "num_passes": 5, "max_steps": 6}
    torch.manual_seed(0)
    try:
        model = PassformerActorCritic(spec, 6, d_model=16, layers=1, heads=2, ffn_dim=32)
    except (KeyError, TypeError) as exc:  # the policy's observation spec changed: say so rather than pass
        pytest.fail(f"PassformerActorCritic no longer builds from this spec: {exc!r}")
    feature_len = model.feature_proj.in_features

    from envs.compilergym.tokens import PassVocab

    task_set = SimpleNamespace(mode="sequence", flags=flags, seq_len=6, action_vocab=PassVocab(flags))

    def preprocess(obs, task_name):
        return TensorDict({"features": torch.linspace(0, 1, feature_len), "ir_tokens": torch.arange(2, 10)}, [])

    policy = ModelPolicy(model, preprocess, task_set)
    prefix = [3, 1]
    scores = policy.pass_scores(None, prefix)
    with torch.no_grad():
        obs = torch.stack([preprocess(None, "")])
        states, mask = model.encode(obs)
        ids = torch.tensor([[BOS_ID, *(len(SPECIAL_TOKENS) + p for p in prefix)]])
        logits = model._decode(states, mask, ids)[0][0, -1].float()
    next_logp = torch.log_softmax(logits, -1)[len(SPECIAL_TOKENS):len(SPECIAL_TOKENS) + 5].numpy()
    np.testing.assert_allclose(scores - scores.max(), next_logp - next_logp.max(), atol=1e-4)
    assert np.isneginf(policy.pass_scores(None, [0] * 6)).all()  # no room for another pass


# ---- the real server -----------------------------------------------------------------------
@pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
def test_searches_on_the_real_compiler_honour_the_budget():
    """Beam and best-of on a bundled C program through the real server: counts agree with a replay
    of the sequence each reports, and the budget is exact."""
    from envs import make_task_set
    from envs.compilergym.env_compiler import EnvCompiler
    from envs.compilergym.evaluation import search_programs
    from envs.compilergym.programs import BUNDLED_PROGRAMS

    ts = make_task_set("compilergym", mode="per_step", max_steps=4, eval_benchmark_dir=str(BUNDLED_PROGRAMS),
                       train_seeds=[0, 1])
    uri = next(u for u in ts.eval_benchmarks if u.endswith("/gcd_lcm.c"))

    class FirstPasses:  # a deterministic per-step "policy": prefers low pass indices, mem2reg first
        per_step = True
        mem2reg = ts.flags.index("-mem2reg")

        def actions(self, obs, n, deterministic):
            return [[self.mem2reg if obs["step"] == 0 else int(obs["step"])] for _ in range(n)]

        def pass_scores(self, obs, prefix):
            scores = -np.arange(len(ts.flags), dtype=float)
            scores[self.mem2reg] = 1.0
            return scores

    result = search_programs(ts, FirstPasses(), [uri], "beam-2", budget=12, seed=0)
    [row] = result["rows"]
    assert row["compilations"] <= 12 and row["random_compilations"] == row["compilations"]
    assert row["passes"][0] == "-mem2reg" and row["count"] < row["o0_count"]
    assert row["vs_oz"] == pytest.approx(row["oz_count"] / row["count"]) and result["geomean_vs_oz"] == row["vs_oz"]
    with closing(ts.make_env(0, seed=0, benchmarks=[uri])) as env:  # the reported sequence gives the count
        env.reset_to(uri)
        msg, _ = env.apply_passes([ts.flags.index(f) for f in row["passes"]])
        assert msg["ir_count"] == row["count"]
        compiler = EnvCompiler(env, uri)
        obs, count = compiler.reset()
        probed = compiler.probe(FirstPasses.mem2reg)
        assert compiler.probe(FirstPasses.mem2reg) == probed < count  # a probe leaves the state as it was
        assert compiler.step(FirstPasses.mem2reg)[1] == probed

    # The final evaluation with eval_search: the policy behind act() (an inference actor's answer).
    import dataclasses

    import torch
    from tensordict import TensorDict

    from envs.compilergym.evaluation import held_out_evaluation

    def act(obs, deterministic):
        return np.full((obs.batch_size[0], 1), FirstPasses.mem2reg)

    def preprocess(obs, task_name):
        return TensorDict({"count": torch.tensor(float(obs["ir_count"]))}, [])

    ts = dataclasses.replace(ts, eval_benchmarks=[uri], eval_search="best-of-2", eval_search_budget=6)
    report = held_out_evaluation(ts, act, preprocess, seed=0)
    [row] = report["search"]["rows"]
    assert row["compilations"] == 6 and row["passes"][0] == "-mem2reg"
    assert report["scalars"]["eval/compilergym/gcd_lcm/best_of_2_vs_oz"] == pytest.approx(row["vs_oz"])
    assert report["scalars"]["eval/compilergym/best_of_2_geomean_vs_oz"] == pytest.approx(row["vs_oz"])
    assert report["scalars"]["eval/compilergym/gcd_lcm/vs_oz"] == pytest.approx(report["rows"][0]["policy_vs_oz"])
    assert "best-of-2" in report["text"] and report["files"]["eval_programs.json"]["search"]["search"] == "best-of-2"


def test_eval_search_options_are_checked_before_any_server_starts(tmp_path):
    from envs import make_task_set

    with pytest.raises(ConfigError) as err:
        make_task_set("compilergym", eval_search="beam")
    assert str(err.value) == ("compilergym env option 'eval_search' = 'beam': not a search; valid: none, greedy, "
                              "best-of-K or beam-K (K >= 1, e.g. best-of-16, beam-4)")
    with pytest.raises(ConfigError, match=r"option 'eval_search_budget' = -5: Input should be greater than or equal to 0"):
        make_task_set("compilergym", eval_search="greedy", eval_search_budget=-5)
    with pytest.raises(ConfigError, match="compilergym env option 'eval_benchmark_dir' = '.*missing': no such directory; pass a folder of .c/"):
        make_task_set("compilergym", eval_benchmark_dir=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"option 'eval_benchmark_dir' = .*: holds no .c/.cpp/.bc files \(nor .cc/.ll\); pass a folder of them"):
        make_task_set("compilergym", eval_benchmark_dir=str(tmp_path))


def test_bundled_programs_are_real_c_programs_with_names_for_tables():
    from envs.compilergym.programs import BUNDLED_PROGRAMS, program_name, program_uris

    uris = program_uris(str(BUNDLED_PROGRAMS))
    assert 10 <= len(uris) <= 15 and all(u.startswith("file://") and u.endswith(".c") for u in uris)
    assert program_name(uris[0]) == Path(uris[0]).stem and program_name("generator://csmith-v0/7") == "csmith-v0_7"
    for uri in uris:  # each one a whole program: it has a main and includes nothing
        text = Path(uri[len("file://"):]).read_text()
        assert "int main(void)" in text and "#include" not in text


def test_eval_search_flags_reach_the_env_factory_before_ray_starts():
    from async_rl.config import load_config
    from async_rl.driver import prepare

    config = str(Path(__file__).resolve().parents[2] / "configs" / "compilergym_mlp.yaml")
    with pytest.raises(ConfigError, match="^compilergym env option 'eval_search' = 'beam': not a search; valid: none"):
        prepare(load_config(["--eval-search", "beam", "--swanlab-mode", "disabled"], config))
    with pytest.raises(ConfigError, match=r"compilergym env option 'eval_search_budget' = -1: Input should be greater than or equal to 0"):
        prepare(load_config(["--eval-search", "greedy", "--swanlab-mode", "disabled",
                             "--env-kwargs", "{eval_search_budget: -1}"], config))
    # An env without a final-evaluation search says so.
    with pytest.raises(ConfigError, match="unknown metaworld env option 'eval_search'"):
        prepare(load_config(["--eval-search", "greedy", "--env", "metaworld", "--env-kwargs", "{}"], None))
