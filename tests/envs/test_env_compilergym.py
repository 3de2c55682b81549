"""CompilerGym env: reward maths, tokenisation, and the real server (offline, csmith programs)."""
import json
import os
import signal
import time
from contextlib import closing

import numpy as np
import psutil
import pytest

from async_rl.errors import ConfigError
from async_rl.tokens import EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from envs import make_task_set
from envs.compilergym.client import CompilerGymServerError, compilergym_unavailable_reason
from envs.compilergym.evaluation import held_out_evaluation
from envs.compilergym.features import AUTOPHASE_DIM, feature_dim, observation_features
from envs.compilergym.reward import RewardConfig
from envs.compilergym.tokens import PassVocab, tokenize_ir

UNAVAILABLE = compilergym_unavailable_reason()
needs_server = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
SMALL_PROGRAM = "generator://csmith-v0/1000002"  # ~900 instructions at -O0, -Oz below it


# ---- no server ---------------------------------------------------------------------------
def test_reward_maths():
    r = RewardConfig(leaky_above=1.0, leakiness=0.5, step_penalty=0.01, reward_baseline="oz")
    # c0 = 100, c_oz = 60: removing 40 instructions matches -Oz (reduction 1.0).
    assert r.reduction(100, 60, 60) == pytest.approx(1.0)
    assert r.reduction(100, 80, 60) == pytest.approx(0.5)
    assert r.reduction(100, 110, 60) == pytest.approx(-0.25)
    # Below the threshold the reduction passes through; above it grows with slope `leakiness`.
    assert r.shaped(0.5, 0) == pytest.approx(0.5)
    assert r.shaped(1.4, 0) == pytest.approx(1.0 + 0.4 * 0.5)
    assert r.shaped(0.5, 10) == pytest.approx(0.5 - 0.1)
    initial = RewardConfig(reward_baseline="initial")
    assert initial.reduction(200, 150, 10) == pytest.approx(0.25)
    # Every program weighs the same: matching -Oz is 1.0 whether -Oz removes 40 or 4,000 instructions.
    assert r.reduction(10_000, 6_000, 6_000) == r.reduction(100, 60, 60) == 1.0
    # -Oz removing (almost) nothing: the denominator is at least oz_floor * c0, no division by zero.
    assert r.reduction(1000, 990, 1000) == pytest.approx(10 / (0.01 * 1000))
    assert r.reduction(1000, 990, 999) == pytest.approx(1.0)
    assert RewardConfig(oz_floor=0.1).reduction(1000, 990, 999) == pytest.approx(0.1)


def test_observation_features_layout():
    autophase = np.arange(AUTOPHASE_DIM, dtype=np.float32)
    counts = np.array([0, 1, 3, 0], dtype=np.float32)
    f = observation_features(autophase, count=400, o0=1000, oz=300, steps_left=0.25, pass_counts=counts, last_pass=2)
    assert f.dtype == np.float32 and f.shape == (feature_dim(4),) == (AUTOPHASE_DIM + 4 + 8,)
    np.testing.assert_allclose(f[:AUTOPHASE_DIM], autophase / 1000)  # over the -O0 count
    np.testing.assert_allclose(f[AUTOPHASE_DIM:AUTOPHASE_DIM + 4], [np.log1p(1000) / 10, 0.4, 0.3, 0.25], rtol=1e-6)
    np.testing.assert_allclose(f[-8:-4], [0, 0.5, 0.75, 0])  # n / (1 + n) per pass
    np.testing.assert_array_equal(f[-4:], [0, 0, 1, 0])  # the last pass
    first = observation_features(autophase, 1000, 1000, 300, 1.0, np.zeros(4, np.float32), -1)
    assert not first[-8:].any()


def test_pass_sequence_tokenisation_round_trip():
    vocab = PassVocab(["-mem2reg", "-instcombine", "-simplifycfg"])
    assert vocab.tokens[: len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    ids, unknown = vocab.encode(["-mem2reg", "simplifycfg", "-instcombine"], length=6)
    assert unknown == 0 and ids.tolist()[3:] == [EOS_ID, PAD_ID, PAD_ID]
    names, skipped = vocab.decode(ids)
    assert names == ["-mem2reg", "-simplifycfg", "-instcombine"] and skipped == 0
    # Too long: cut, still ends in <eos>.
    ids, _ = vocab.encode(["-mem2reg"] * 10, length=4)
    assert ids.tolist() == [4, 4, 4, EOS_ID]


def test_unknown_passes_are_skipped_and_counted():
    vocab = PassVocab(["-mem2reg", "-instcombine"])
    ids, unknown = vocab.encode(["-mem2reg", "-no-such-pass", "gvn-hoist-typo", "-instcombine"])
    assert unknown == 2 and vocab.decode(ids) == (["-mem2reg", "-instcombine"], 0)
    # Special tokens inside a sequence and ids outside the vocabulary are skipped and counted.
    names, skipped = vocab.decode([4, UNK_ID, 99, 5, EOS_ID, 4])
    assert names == ["-mem2reg", "-instcombine"] and skipped == 2


def test_ir_tokens_are_deterministic_and_ignore_value_numbering():
    ir_a = "define i32 @f(i32 %0) {\n  %2 = add nsw i32 %0, 1 ; comment\n  ret i32 %2\n}\n!0 = !{}\n"
    ir_b = ir_a.replace("%2", "%7")
    a, b = tokenize_ir(ir_a, 512, 32), tokenize_ir(ir_b, 512, 32)
    assert a.dtype == np.int64 and a.shape == (32,)
    np.testing.assert_array_equal(a, b)
    n = int((a > 0).sum())
    assert 10 < n < 32 and (a[n:] == 0).all() and (a[:n] >= 2).all() and (a < 512).all()
    assert (tokenize_ir(ir_a * 20, 512, 32) > 0).all()  # truncated to the configured length


def test_compilergym_registers_its_final_evaluation():
    from envs import final_evaluation_for

    assert final_evaluation_for("compilergym") is held_out_evaluation
    with pytest.raises(ConfigError, match="unknown environment 'compiler_gim'"):
        final_evaluation_for("compiler_gim")


def test_bad_options_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="overlap"):
        make_task_set("compilergym", train_seeds=[0, 100], eval_seeds=[50, 10])
    with pytest.raises(ConfigError, match="mode"):
        make_task_set("compilergym", mode="whole_program")
    with pytest.raises(ConfigError, match="option 'benchmark_dir' = .*: no such directory"):
        make_task_set("compilergym", benchmark_dir=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="option 'benchmark_dir' = .*: holds no .c/.cpp/.bc files"):
        make_task_set("compilergym", benchmark_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"option 'eval_fraction' = 1.0: Input should be less than 1"):
        make_task_set("compilergym", eval_fraction=1.0)
    with pytest.raises(ConfigError) as exc:  # the option's name before it said what it is
        make_task_set("compilergym", baseline_thre=1.2)
    assert str(exc.value) == "compilergym env option 'baseline_thre' is now 'leaky_above' (same meaning, same value)"


def test_leaky_above_and_leakiness_reach_the_reward():
    reward = make_task_set("compilergym", leaky_above=0.5, leakiness=0.25).reward
    assert (reward.leaky_above, reward.leakiness) == (0.5, 0.25)
    assert reward.shaped(0.9, 0) == pytest.approx(0.5 + 0.4 * 0.25)


# ---- the real server ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def per_step_set():
    return make_task_set("compilergym", mode="per_step", max_steps=3, train_seeds=[1000002, 1],
                         eval_seeds=[0, 1], ir_tokens=64, call_timeout_s=60)


@needs_server
def test_server_starts_offline_and_steps_a_csmith_program(per_step_set):
    ts = per_step_set
    assert len(ts.flags) == 124 and "-mem2reg" in ts.flags and ts.obs_spec["num_actions"] == 124
    n = len(ts.flags)
    assert ts.obs_spec["feature_dim"] == feature_dim(n) == AUTOPHASE_DIM + 4 + 2 * n
    with closing(ts.make_env(0, seed=0)) as env:
        obs = env.reset()
        assert env.program["uri"] == SMALL_PROGRAM
        assert obs["autophase"].shape == (56,) and obs["ir_tokens"].shape == (64,)
        c0, oz = env.program["o0_count"], env.program["oz_count"]
        assert obs["ir_count"] == c0 and 0 < oz < c0
        assert obs["features"].shape == (feature_dim(n),) and not obs["features"][-2 * n:].any()  # no history yet
        total, count = 0.0, c0
        mem2reg = ts.flags.index("-mem2reg")
        for t, flag in enumerate(["-mem2reg", "-instcombine", "-mem2reg"]):
            obs, reward, terminated, truncated, info = env.step(np.array([ts.flags.index(flag)]))
            total += reward
            # Each step's reward is its instruction-count reduction over -Oz's reduction.
            assert reward == pytest.approx((count - info["ir_count"]) / (c0 - oz))
            count = info["ir_count"]
            assert terminated == (t == 2) and not truncated  # the pass budget ends the task (time_limit terminal)
            # Steps left and the action history (n / (1 + n) per pass, the last pass one-hot).
            features = obs["features"]
            assert features[AUTOPHASE_DIM + 3] == pytest.approx((3 - t - 1) / 3)
            assert features[AUTOPHASE_DIM + 1] == pytest.approx(info["ir_count"] / c0)
            assert np.argmax(features[-n:]) == ts.flags.index(flag) and features[-n:].sum() == 1
        history = obs["features"][-2 * n:-n]
        assert history[mem2reg] == pytest.approx(2 / 3) and history[ts.flags.index("-instcombine")] == 0.5
        assert np.count_nonzero(history) == 2 and info["end_reason"] == "max_steps"
        assert info["ir_count"] < c0  # mem2reg + instcombine shrink -O0 code
        # The episode's return is the reward config applied to the whole sequence's reduction.
        assert total == pytest.approx(ts.reward.shaped(ts.reward.reduction(c0, info["ir_count"], oz), 3))
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.array([0]))


@needs_server
def test_sequence_mode_skips_unknown_tokens(per_step_set):
    ts = make_task_set("compilergym", mode="sequence", seq_len=6, train_seeds=[1000002, 1], eval_seeds=[0, 1])
    vocab = ts.action_vocab
    with closing(ts.make_env(0, seed=0)) as env:
        env.reset()
        ids, _ = vocab.encode(["-mem2reg", "-instcombine"], length=6)
        ids = np.insert(ids, 1, [UNK_ID, len(vocab) + 5])[:6]  # two unknown tokens inside the sequence
        _, reward, terminated, truncated, info = env.step(ids)
        assert terminated and not truncated  # one step is the whole episode
        assert info["unknown_passes"] == 2 and info["num_passes"] == 2 and env.unknown_passes == 2
        assert reward == pytest.approx(info["reduction"]) and reward > 0


@needs_server
def test_fork_and_restore(per_step_set):
    with closing(per_step_set.make_env(0, seed=0)) as env:
        c0 = env.reset()["ir_count"]
        env.client.call("fork")
        assert env.client.call("step", actions=[per_step_set.flags.index("-mem2reg")])["ir_count"] < c0
        assert env.client.call("restore")["ir_count"] == c0


@needs_server
def test_random_baseline_starts_every_sequence_from_the_reset_program(per_step_set):
    from envs.compilergym.env_compiler import EnvCompiler
    from envs.compilergym.search import random_baseline

    uri = "generator://csmith-v0/1000002"
    with closing(per_step_set.make_env(0, seed=0, benchmarks=[uri])) as env:
        best = random_baseline(EnvCompiler(env, uri), 9, 3, np.random.default_rng(7), every_prefix=False)
        rng, counts = np.random.default_rng(7), []  # the same three sequences, each after a reset
        for _ in range(3):
            env.reset_to(uri)
            counts.append(env.apply_passes([int(a) for a in rng.integers(len(per_step_set.flags), size=3)])[0]["ir_count"])
    assert best.count == min(counts) and best.compilations == 9


@needs_server
def test_killed_server_is_detected_and_replaced(per_step_set):
    with closing(per_step_set.make_env(0, seed=0)) as env:
        env.reset()
        old_pid, old_service = env.client.proc.pid, env.client.call("hello")["service_pid"]
        os.kill(old_pid, signal.SIGKILL)
        started = time.monotonic()
        obs, reward, terminated, truncated, info = env.step(np.array([0]))
        # A terminal (nothing to bootstrap from) with the error named; a new server is already up,
        # and the dead server's CompilerGym service is gone with it (not left running).
        assert terminated and not truncated and f"pid {old_pid}" in info["server_error"]
        assert not psutil.pid_exists(old_service) or psutil.Process(old_service).status() == psutil.STATUS_ZOMBIE
        assert info["end_reason"] == "server_error" and env.counters()["ended_by_server_error"] == 1
        assert env.server_restarts == 1 and env.client.alive and env.client.proc.pid != old_pid
        assert time.monotonic() - started < 60
        assert env.reset()["ir_count"] > 0

        # CompilerGym's own service dying after a pass that shrank the program: the compilation did
        # not finish, so the episode's return goes back to 0; the server is replaced, the next reset works.
        _, first, *_ = env.step(np.array([per_step_set.flags.index("-mem2reg")]))
        service_pid = env.client.call("hello")["service_pid"]
        assert service_pid and first > 0
        os.kill(service_pid, signal.SIGKILL)
        _, reward, terminated, truncated, info = env.step(np.array([per_step_set.flags.index("-instcombine")]))
        assert terminated and not truncated and info["end_reason"] in ("pass_error", "server_error")
        assert reward == pytest.approx(-first) and info[info["end_reason"]] and env.server_restarts == 2
        assert env.reset()["ir_count"] > 0


@needs_server
def test_an_out_of_range_pass_ends_the_episode_and_is_counted(per_step_set):
    with closing(per_step_set.make_env(0, seed=0)) as env:
        env.reset()
        _, reward, terminated, truncated, info = env.step(np.array([len(per_step_set.flags) + 3]))
        assert terminated and not truncated and reward == 0.0
        assert info["end_reason"] == "invalid_action" and "outside [0, 124)" in info["invalid_action"]
        assert env.counters()["ended_by_invalid_action"] == 1 and env.server_restarts == 0
        with pytest.raises(RuntimeError, match="reset"):
            env.step(np.array([0]))


@needs_server
def test_kept_start_states_give_the_same_programs(per_step_set):
    """A reset from the kept start state (reuse) observes what a rebuilt program does."""
    other = "generator://csmith-v0/1000004"
    flags = [per_step_set.flags.index(f) for f in ("-mem2reg", "-instcombine")]
    with closing(per_step_set.make_env(0, seed=0)) as env:
        seen = []
        for uri, reuse in ((SMALL_PROGRAM, False), (other, True), (SMALL_PROGRAM, True), (SMALL_PROGRAM, True)):
            answer = env.client.call("reset", benchmark=uri, reuse=reuse, ir=True)
            after = env.client.call("step", actions=flags, ir=False)
            seen.append((answer["o0_count"], answer["oz_count"], answer["ir"], answer["autophase"], after["ir_count"]))
        assert seen[0] == seen[2] == seen[3] and seen[1] != seen[0]


@needs_server
def test_a_silent_server_times_out_with_a_clear_error(per_step_set):
    with closing(per_step_set.make_env(0, seed=0)) as env:
        with pytest.raises(CompilerGymServerError, match="did not answer 'reset' within"):
            env.client.call("reset", timeout_s=0.001, benchmark="generator://csmith-v0/4242")
        assert not env.client.alive  # killed, never left hanging


@needs_server
def test_benchmark_dir_of_user_programs(tmp_path):
    (tmp_path / "a.c").write_text("int f(int x){int y=0; for(int i=0;i<x;i++) y+=i*2; return y;}\n"
                                  "int main(){return f(10);}\n")
    (tmp_path / "b.c").write_text("int g(int *p, int n){int s=0; for(int i=0;i<n;i++) s+=p[i]; return s;}\n")
    (tmp_path / "broken.c").write_text("int this is not C;\n")
    ts = make_task_set("compilergym", benchmark_dir=str(tmp_path), eval_fraction=0.34)
    assert len(ts.train_benchmarks) == 2 and len(ts.eval_benchmarks) == 1
    with closing(ts.make_env(0, seed=0, benchmarks=ts.train_benchmarks + ts.eval_benchmarks)) as env:
        seen = {env.reset() is not None and env.program["uri"] for _ in range(4)}
        assert all(u.endswith(("a.c", "b.c")) for u in seen)
        assert env.skipped["build_failed"] == 1  # broken.c: skipped and counted


@needs_server
def test_named_datasets_need_the_internet_and_say_so():
    # This machine is offline: a named dataset is a clear ConfigError, not a hang.
    try:
        ts = make_task_set("compilergym", datasets=["cbench-v1"], dataset_limit=3, call_timeout_s=60)
    except ConfigError as exc:
        assert "cbench-v1" in str(exc) and "internet" in str(exc)
    else:  # online: the dataset's programs are split into training and held-out ones
        assert ts.train_benchmarks and ts.eval_benchmarks


@needs_server
def test_a_program_that_fails_to_parse_is_skipped_and_counted(per_step_set):
    with closing(per_step_set.make_env(0, seed=0)) as env:
        assert env.reset_to("generator://csmith-v0/30") is None  # clang-14 output LLVM 10 cannot parse
        assert env.skipped["build_failed"] == 1 and env.server_restarts == 0
        assert env.reset()["ir_count"] > 0  # the next program is fine, on the same server


def test_benchmark_dir_split_holds_out_a_fraction_and_says_when_it_cannot(capsys):
    from envs.compilergym.programs import split_held_out

    files = [f"p{i}.c" for i in range(10)]
    train, held_out = split_held_out(files, 0.2)
    assert held_out == ["p0.c", "p1.c"] and train == files[2:]
    assert split_held_out(files[:2], 0.1) == (["p1.c"], ["p0.c"])  # at least one held out
    assert capsys.readouterr().err == ""
    assert split_held_out(["only.c"], 0.2) == (["only.c"], ["only.c"])
    assert "not held out" in capsys.readouterr().err


@needs_server
def test_held_out_evaluation_reports_greedy_sampled_and_random_search():
    import torch
    from tensordict import TensorDict

    ts = make_task_set("compilergym", mode="per_step", max_steps=3, train_seeds=[0, 1], eval_seeds=[1000002, 1])
    greedy, sampled = ts.flags.index("-mem2reg"), ts.flags.index("-instcombine")
    calls = []

    def act(obs, deterministic):  # a fixed pass per mode; the evaluation hands it a preprocessed batch
        calls.append((tuple(obs.batch_size), obs["autophase"].shape[-1], deterministic))
        return np.full((obs.batch_size[0], 1), greedy if deterministic else sampled)

    def preprocess(obs, task_name):
        assert task_name == "compilergym"
        return TensorDict({"autophase": torch.as_tensor(obs["autophase"])}, [])

    report = held_out_evaluation(ts, act, preprocess, seed=0)
    [row] = report["rows"]
    assert row["benchmark"] == SMALL_PROGRAM and calls == [((1,), 56, True)] * 3 + [((1,), 56, False)] * 3
    assert row["policy_sequence"] == ["-mem2reg"] * 3 and row["sampled_sequence"] == ["-instcombine"] * 3
    assert row["policy_passes"] == 3 and 0 < row["policy_count"] < row["o0_count"]  # mem2reg shrinks -O0 code
    assert row["policy_vs_oz"] == pytest.approx(row["oz_count"] / row["policy_count"])
    assert row["random_vs_oz"] == pytest.approx(row["oz_count"] / row["random_count"])
    assert report["scalars"] == {"eval/geomean_reduction_vs_oz": pytest.approx(row["policy_vs_oz"]),
                                 "eval/sampled_geomean_reduction_vs_oz": pytest.approx(row["sampled_vs_oz"]),
                                 "eval/random_search_geomean_vs_oz": pytest.approx(row["random_vs_oz"]),
                                 "eval/compilergym/csmith-v0_1000002/vs_oz": pytest.approx(row["policy_vs_oz"])}
    assert SMALL_PROGRAM[-20:] in report["text"] and "geomean" in report["text"]
    written = json.loads(json.dumps(report["files"]["eval_programs.json"]))  # what the driver writes
    assert written["rows"][0]["policy_sequence"] == row["policy_sequence"] and written["skipped"] == report["skipped"]


class ScriptedCompiler:
    """A ``Compiler`` of a program of 100 instructions whose every pass gets the next of ``answers``:
    an IR count, or None (the compilation failed)."""

    num_passes = 3

    def __init__(self, answers):
        self.answers, self.resets = list(answers), 0

    def reset(self):
        self.resets += 1
        return {}, 100

    def step(self, pass_index):
        answer = self.answers.pop(0)
        return None if answer is None else ({}, answer)


def test_random_baseline_for_episodes_judges_each_sequence_by_its_end_and_a_failed_one_as_unchanged():
    # A policy's episode is judged by the program it ends with, and one whose compilation failed
    # leaves nothing optimised; the random baseline beside it is judged alike (every_prefix=False).
    from envs.compilergym.search import random_baseline

    answers = [95, 90, 97, 80, None, 99]  # ends at 97; passes 80, then fails; cut short at 99
    compiler = ScriptedCompiler(answers)
    result = random_baseline(compiler, 6, 3, np.random.default_rng(0), every_prefix=False)
    assert result.count == 97 and result.compilations == 6 and compiler.resets == 3 and not compiler.answers
    assert random_baseline(ScriptedCompiler(answers), 6, 3, np.random.default_rng(0)).count == 80  # as the searches
    assert random_baseline(ScriptedCompiler([None, None]), 2, 3, np.random.default_rng(0),
                           every_prefix=False).count == 100


@needs_server
def test_random_baseline_goes_on_after_a_sequence_kills_the_compiler_service(per_step_set):
    # The real server's answer when a sequence takes CompilerGym's service down (no count, or the call fails).
    from envs.compilergym.env_compiler import EnvCompiler
    from envs.compilergym.search import random_baseline

    with closing(per_step_set.make_env(0, seed=0, benchmarks=[SMALL_PROGRAM])) as env:
        real, answers = env.apply_passes, []

        def apply_passes(passes):
            if len(answers) == 3:  # the second sequence's first pass: its service dies under it
                os.kill(env.client.call("hello")["service_pid"], signal.SIGKILL)
            try:
                answers.append(real(passes))
            except CompilerGymServerError as exc:
                answers.append(exc)
                raise
            return answers[-1]

        env.apply_passes = apply_passes
        best = random_baseline(EnvCompiler(env, SMALL_PROGRAM), 9, 3, np.random.default_rng(7), every_prefix=False)
        assert isinstance(answers[3], CompilerGymServerError) or answers[3][1] is not None
        assert best.compilations == 9 and env.server_restarts == 1
        assert best.count is not None and 0 < best.count <= env.program["o0_count"]
