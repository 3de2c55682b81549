"""The vLLM engine's process: one ``vllm.LLM`` behind a JSON-line protocol on an inherited socket.

Started by ``vllm_client.VLLMEngineClient`` with the project's interpreter and ``.venv-vllm/site-packages`` first
on its path (vLLM 0.32 needs transformers < 5.20; the main venv keeps the lock's). vLLM writes its log to
stdout and stderr, so the protocol has a socket of its own (its descriptor number is ``argv[1]``): one JSON
object per line each way, the first answer once the engine is built. Nothing of this project is imported here
but this file, so the main venv's packages never meet the engine's.

Requests: ``{"cmd": "load_weights", "path": "...safetensors"}`` (weights under the Hugging Face model's names,
loaded into the engine's model in place; the client removes the file), ``{"cmd": "generate", "requests": [...],
"sampling": {...}}``, ``{"cmd": "close"}``; answers ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
import traceback
from typing import Any

PARENT_POLL_S = 1.0


def exit_with_parent(scratch: str) -> None:
    """End this process (and the engine in it) within a second of the process that started it, removing that
    process's ``scratch`` folder (its weights' files): an inference actor killed by Ray leaves no engine behind. A thread
    polls the parent's pid rather than PR_SET_PDEATHSIG, which fires when the parent's starting *thread* ends (the
    actor generates on a worker thread)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        shutil.rmtree(scratch, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def build_engine(spec: dict[str, Any]) -> Any:
    from vllm import LLM  # inside: the entry point must be guarded, the engine core spawns

    return LLM(model=spec["model"], dtype=spec["dtype"], seed=spec["seed"], max_model_len=spec["max_model_len"],
               max_num_seqs=spec["max_num_seqs"], logprobs_mode="processed_logprobs",
               # Nothing from the model's generation_config.json: the policy declares every sampling field.
               generation_config="vllm", enforce_eager=spec["enforce_eager"],
               # The model runs in this process (no worker process to spawn and import vLLM again: ~20 s each).
               distributed_executor_backend="uni")


def sampling_params(sampling: dict[str, Any], greedy: bool, n: int) -> Any:
    from vllm import SamplingParams

    shared = dict(n=n, max_tokens=sampling["max_new_tokens"], min_tokens=sampling["min_new_tokens"],
                  stop_token_ids=sampling["stop_ids"], logprobs=0, detokenize=False, skip_special_tokens=False,
                  repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    if greedy:
        return SamplingParams(temperature=0.0, **shared)
    return SamplingParams(temperature=sampling["temperature"], top_k=sampling["top_k"], top_p=sampling["top_p"],
                          min_p=sampling["min_p"], **shared)


def load_weights(llm: Any, msg: dict[str, Any]) -> dict[str, Any]:
    """The file's weights into the model, in place (vLLM rebuilds each layer it receives, its CPU kernels' packed
    copies included); the prefix cache, which holds keys and values of the old weights, emptied."""
    from safetensors import safe_open

    with safe_open(msg["path"], framework="pt") as weights:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ((name, weights.get_tensor(name))
                                                                          for name in weights.keys()),
                                                     "is_checkpoint_format": True})
    if not llm.reset_prefix_cache():
        raise RuntimeError("the prefix cache could not be reset after a weight load")
    return {"ok": True}


def generate(llm: Any, msg: dict[str, Any]) -> dict[str, Any]:
    """Every request ``{"prompt": ids, "n": k, "greedy": bool}`` answered with its k completions, each the token
    ids and the log-prob each was sampled with (vLLM's processed log-probs: after temperature, top-k/p, min-p)."""
    from vllm.inputs import TokensPrompt

    requests = msg["requests"]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests],
                           [sampling_params(msg["sampling"], r["greedy"], r["n"]) for r in requests],
                           use_tqdm=False)
    answers = []
    for output in outputs:
        completions = []
        for completion in output.outputs:
            ids = list(completion.token_ids)
            logps = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids)]
            completions.append({"ids": ids, "logp": logps})
        answers.append(completions)
    return {"ok": True, "completions": answers}


COMMANDS = {"load_weights": load_weights, "generate": generate}


def serve(channel: socket.socket, spec: dict[str, Any]) -> None:
    reader, writer = channel.makefile("r", encoding="utf-8"), channel.makefile("w", encoding="utf-8")

    def answer(msg: dict[str, Any]) -> None:
        writer.write(json.dumps(msg) + "\n")
        writer.flush()

    try:
        llm = build_engine(spec)
    except Exception as exc:  # noqa: BLE001 (any failure of the engine is reported to the client, which names it)
        answer({"ok": False, "error": f"the engine did not start: {exc!r}"})
        return
    answer({"ok": True, "pid": os.getpid()})
    for line in reader:  # ends when the client's socket closes (its process gone)
        msg = json.loads(line)
        if msg["cmd"] == "close":
            answer({"ok": True})
            return
        try:
            if msg["cmd"] in COMMANDS:
                answer(COMMANDS[msg["cmd"]](llm, msg))
            else:
                answer({"ok": False, "error": f"unknown command {msg['cmd']!r}"})
        except Exception as exc:  # noqa: BLE001 (one failed call is an answer; the engine stays up for the next)
            traceback.print_exc()
            answer({"ok": False, "error": repr(exc)})


if __name__ == "__main__":  # guarded: a process vLLM spawns (with its multiprocessing on) re-imports __main__
    spec = json.loads(sys.argv[2])
    exit_with_parent(spec["scratch"])
    try:
        serve(socket.socket(fileno=int(sys.argv[1])), spec)
    finally:  # the client's weights' files, however the client ended
        shutil.rmtree(spec["scratch"], ignore_errors=True)
