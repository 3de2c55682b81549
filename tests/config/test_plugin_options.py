"""Every registered env and policy declares its options: a wrong type and an unknown key are one line naming
the key, before anything is built; --print-config lists every option with its type, default and help."""
import typing

import pydantic
import pytest

import envs
from async_rl.config import load_config
from async_rl.errors import ConfigError
from async_rl.policies import available_policies, policy_kwargs_checked, policy_options_model

ENVS = envs.available_envs()
POLICIES = available_policies()


def _options(kind, name):
    return envs.env_options_model(name) if kind == "env" else policy_options_model(name)


def _check(kind, name, kwargs):
    return envs.env_options(name, kwargs) if kind == "env" else policy_kwargs_checked(name, kwargs)


def _wrong_value(info):
    """A value no option of field ``info``'s type accepts: a number where a mapping is allowed, else a mapping."""
    text = str(info.annotation)
    takes_mapping = "dict" in text or any(isinstance(a, type) and issubclass(a, pydantic.BaseModel)
                                          for a in typing.get_args(info.annotation) + (info.annotation,))
    return 3 if takes_mapping else {"wrong": "type"}


PLUGINS = [("env", n) for n in ENVS] + [("policy", n) for n in POLICIES]


def test_every_plugin_is_registered_with_options():
    assert {"libero", "metaworld", "compilergym", "prompts", "arithmetic", "humaneval", "ctrl_humaneval"} <= set(ENVS)
    assert {"mlp", "categorical_mlp", "passformer", "vla", "vla_discrete", "causal_lm"} <= set(POLICIES)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A path every required option takes: a folder as a saved DatasetDict (the prompts env's data, which is
    checked to exist and to hold held-out rows)."""
    folder = tmp_path_factory.mktemp("stand-in")
    (folder / "dataset_dict.json").write_text("{}")
    return str(folder)


def _required(model, stand_in):
    """Stand-ins for the options a model has no default for (the prompts env's data: a user's file)."""
    return {key: stand_in for key, info in model.model_fields.items() if info.is_required()}


@pytest.mark.parametrize("kind, name", PLUGINS)
def test_a_wrong_type_and_an_unknown_key_are_one_line(kind, name, stand_in):
    model = _options(kind, name)
    with pytest.raises(ConfigError) as err:
        _check(kind, name, {"no_such_option": 1})
    assert str(err.value).startswith(f"unknown {name} {kind} option 'no_such_option'") and "\n" not in str(err.value)
    checked = [key for key, info in model.model_fields.items() if info.annotation is not typing.Any]
    assert checked, f"{name} declares no typed option"
    for key in checked:
        bad = _wrong_value(model.model_fields[key])
        with pytest.raises(ConfigError) as err:
            _check(kind, name, {**_required(model, stand_in), key: bad})
        message = str(err.value)
        assert "\n" not in message and f"{kind} option '{key}" in message, message


@pytest.mark.parametrize("kind, name", PLUGINS)
def test_every_option_has_help_and_its_default_is_valid(kind, name, stand_in):
    model = _options(kind, name)
    for key, info in model.model_fields.items():
        assert info.description, f"{name} {kind} option {key} has no help (a docstring under the field)"
    model(**_required(model, stand_in))  # the defaults pass the model's own checks


@pytest.mark.parametrize("kind, name", [("policy", n) for n in POLICIES])
def test_policy_defaults_are_the_factorys(kind, name):
    """Policies receive the options given; the factory's own defaults fill the rest, so both must agree."""
    import inspect

    from async_rl.policies import POLICIES as REGISTRY

    factory = REGISTRY.get(name)
    target = factory.func if hasattr(factory, "func") else factory
    target = target.__init__ if inspect.isclass(target) else target
    params = inspect.signature(target).parameters
    for key, info in _options(kind, name).model_fields.items():
        if key in params and params[key].default is not inspect.Parameter.empty:
            default = info.get_default(call_default_factory=True)
            assert params[key].default == default or list(params[key].default) == default, (name, key)


def test_print_config_lists_the_env_and_policy_options(capsys):
    with pytest.raises(SystemExit) as done:
        load_config(["--env", "metaworld", "--policy", "mlp", "--env-kwargs", "{task: push-v3}", "--print-config"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "# env metaworld takes these env_kwargs" in out and "# policy mlp takes these policy_kwargs" in out
    for line in ("max_episode_steps: int (> 0) = 500  episodes are truncated", "hidden_sizes: list[int (> 0)] = [256, 256]"):
        assert line in out


def test_the_loader_refuses_a_bad_env_or_policy_option_before_anything_starts():
    with pytest.raises(ConfigError, match=r"^metaworld env option 'max_episode_steps' = 0: Input should be greater than 0$"):
        load_config(["--env", "metaworld", "--env-kwargs", "{max_episode_steps: 0}"])
    with pytest.raises(ConfigError, match=r"^unknown mlp policy option 'hiden_sizes' \(did you mean 'hidden_sizes'\?\)"):
        load_config(["--policy", "mlp", "--policy-kwargs", "{hiden_sizes: [8]}"])


@pytest.mark.parametrize("env, env_kwargs, line", [
    ("arithmetic", "{difficulty: 1, heldout_size: 600}",
     "arithmetic heldout_size 600: difficulty 1 has only 497 distinct held-out problems; set heldout_size <= 497 or "
     "raise the difficulty"),
    ("prompts", "{data: train.jsonl}", "--data train.jsonl: no held-out rows; pass --heldout-data FILE (prompts never "
     "seen in training), or a datasets folder with a held-out split"),
    ("prompts", "{data: train.jsonl, heldout_data: train.jsonl, rewards: [math, 'my_rewards:exact=2'], "
     "success_reward: format}",
     "success_reward 'format' is not one of the rewards (math, exact); name one of them (an import path by its "
     "function) or leave it null for the first"),
    ("libero", "{tasks: [2, 2]}", "libero env option 'tasks' = [2, 2]: tasks names a task twice: [2, 2]; list each once"),
])
def test_a_relation_between_a_plugins_options_is_one_line_at_load(env, env_kwargs, line, tmp_path, monkeypatch):
    """What the options alone decide is refused by the options model when the config loads, not by the factory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1 + 1?", "answer": 2}\n')  # the prompts env's data exists
    with pytest.raises(ConfigError) as err:
        load_config(["--env", env, "--env-kwargs", env_kwargs])
    assert str(err.value) == line


@pytest.mark.parametrize("policy, policy_kwargs, line", [
    ("mlp", "{min_log_std: 2}", "min_log_std 2.0 > max_log_std 1.0; the log-std is clamped to [min_log_std, "
                                "max_log_std]: set min_log_std at most max_log_std"),
    ("vla", "{max_log_std: -6}", "min_log_std -5.0 > max_log_std -6.0; the log-std is clamped to [min_log_std, "
                                 "max_log_std]: set min_log_std at most max_log_std"),
    ("vla", "{cameras: [wrist, agentview, wrist]}", "vla policy option 'cameras' = ['wrist', 'agentview', 'wrist']: "
                                                    "cameras ['wrist', 'agentview', 'wrist'] name a camera twice; list each once"),
    ("causal_lm", "{min_new_tokens: 65}", "min_new_tokens 65 > max_new_tokens 64; set min_new_tokens at most "
                                          "max_new_tokens"),
    ("passformer", "{d_model: 66}", "d_model 66 is not a multiple of heads 4; each attention head takes d_model / "
                                    "heads dimensions: pick a multiple (e.g. d_model 64, heads 4)"),
])
def test_a_relation_between_a_policys_options_is_one_line_at_load(policy, policy_kwargs, line):
    with pytest.raises(ConfigError) as err:
        load_config(["--policy", policy, "--policy-kwargs", policy_kwargs])
    assert str(err.value) == line


def test_env_and_policy_flags_set_one_key_each():
    cfg = load_config(["--env", "metaworld", "--env-kwargs", "{task: push-v3}", "--env.max-episode-steps", "40",
                       "--policy.hidden-sizes", "[8]"])
    assert cfg.env_kwargs == {"task": "push-v3", "max_episode_steps": 40} and cfg.policy_kwargs == {"hidden_sizes": [8]}
    with pytest.raises(ConfigError, match=r"^unknown metaworld env option 'image_size'"):  # another env's option
        load_config(["--env", "metaworld", "--env.image-size", "64"])
