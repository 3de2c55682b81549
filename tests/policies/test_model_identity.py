"""An export's base model is named so that a reinstall or another machine still recognises it: a GGUF
file's conversion folder carries a key hashed from the file's modification time, which the identity
leaves out (an export of the same model made before a reinstall once failed as "another base model")."""
from __future__ import annotations

import json

import pytest

from async_rl.errors import ConfigError
from async_rl.policies.initial_weights import FORMAT, META, WEIGHTS, check_init_from, model_identity


def _export(directory, model) -> str:
    directory.mkdir(parents=True)
    (directory / WEIGHTS).write_bytes(b"")
    (directory / META).write_text(json.dumps({"format": FORMAT, "policy": "causal_lm", "env": "lm_arithmetic",
                                              "model": model}))
    return str(directory)


@pytest.fixture
def lm_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "async_rl" / "lm"


def test_a_converted_gguf_is_named_by_its_file_not_its_install(lm_cache, tmp_path):
    before, after = lm_cache / "SmolLM2-135M-Instruct.Q4_1-11fa1eb9a842", lm_cache / "SmolLM2-135M-Instruct.Q4_1-fb2afd734771"
    assert model_identity(str(before)) == model_identity(str(after)) == "SmolLM2-135M-Instruct.Q4_1"
    # a model folder of the user's keeps its whole name, whatever it ends with
    assert model_identity(str(tmp_path / "my-model-0123456789ab")) == "my-model-0123456789ab"
    assert model_identity(None) is None


@pytest.mark.parametrize("recorded", ["SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1-11fa1eb9a842"],
                         ids=["identity", "older-export-with-the-install-key"])
def test_an_export_of_the_same_model_is_accepted_after_a_reinstall(lm_cache, tmp_path, recorded):
    export = _export(tmp_path / "export", recorded)
    now = lm_cache / "SmolLM2-135M-Instruct.Q4_1-fb2afd734771"
    assert check_init_from(export, "causal_lm", "lm_arithmetic", str(now)).endswith("export")


def test_an_export_of_another_model_is_still_refused(lm_cache, tmp_path):
    export = _export(tmp_path / "export", "Qwen2-0.5B.Q4_0-11fa1eb9a842")
    with pytest.raises(ConfigError, match="trained from another base model"):
        check_init_from(export, "causal_lm", "lm_arithmetic", str(lm_cache / "SmolLM2-135M-Instruct.Q4_1-fb2afd734771"))


@pytest.mark.parametrize("policy, env, words", [
    ("vla", "lm_arithmetic", ["was made for policy 'causal_lm', not this run's 'vla'", "--policy causal_lm"]),
    ("causal_lm", "humaneval", ["was made for env 'lm_arithmetic', not this run's 'humaneval'", "--env lm_arithmetic"]),
])
def test_an_export_for_another_policy_or_env_is_one_line(lm_cache, tmp_path, policy, env, words):
    export = _export(tmp_path / "export", None)
    with pytest.raises(ConfigError) as err:
        check_init_from(export, policy, env)
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value)


def test_a_folder_that_is_not_an_export_names_the_missing_files(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / WEIGHTS).write_bytes(b"")  # an unfinished export: policy.json is written last
    with pytest.raises(ConfigError, match=f"init_from .*half: no {META} there; pass a folder written by launch/sft.py"):
        check_init_from(str(tmp_path / "half"), "causal_lm", "lm_arithmetic")
    with pytest.raises(ConfigError, match="init_from .*nowhere: no such directory"):
        check_init_from(str(tmp_path / "nowhere"), "causal_lm", "lm_arithmetic")


@pytest.mark.parametrize("meta, problem", [
    ("{not json", "Invalid JSON"),
    ('{"format": "async_rl.policy/0", "policy": "mlp"}', "Input should be 'async_rl.policy/1'"),
    ('["async_rl.policy/1"]', "Input should be an object"),
])
def test_a_policy_json_of_another_format_is_one_line(tmp_path, meta, problem):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / WEIGHTS).write_bytes(b"")
    (tmp_path / "old" / META).write_text(meta)
    with pytest.raises(ConfigError) as err:
        check_init_from(str(tmp_path / "old"), "mlp", "metaworld")
    assert str(err.value).startswith(f"init_from {tmp_path / 'old'}: {META} is not a policy export's ({problem}")
    assert str(err.value).endswith("; export the policy again") and "\n" not in str(err.value)
