"""LIBERO's installation, its config file and headless rendering, set up before robosuite is imported.

Checks that LIBERO, its data files and assets are installed (a missing piece is a ConfigError in the
driver rather than a crash in a rollout worker); writes LIBERO's config.yaml, without which
``import libero.libero`` asks interactively where its data lives; picks the GL backend
(``MUJOCO_GL``) and switches a render context to the fast settings (MSAA, shadows and reflections
off; ~3x faster in software rendering).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from async_rl.errors import ConfigError
from async_rl.validation import checked_folder

SOFTWARE_GL = ("llvmpipe", "softpipe", "swrast", "software", "osmesa")
INSTALL_HINT = "run: make setup  (or: bash scripts/setup.sh), which installs LIBERO and its assets"
# Modules LIBERO / robosuite import at start-up, checked in the driver so a missing one is a
# ConfigError there instead of a crash in a rollout worker.
REQUIRED_MODULES = ("libero", "robosuite", "bddl", "mujoco", "cv2", "numba", "termcolor", "easydict",
                     "matplotlib", "future", "yaml", "torch")


# ---- installation checks and LIBERO's config file ---------------------------------------
def libero_package_dir() -> Path:
    """``.../site-packages/libero/libero`` (holds bddl_files, init_files, assets), not imported."""
    missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"LIBERO is not installed (missing Python modules: {', '.join(missing)}); {INSTALL_HINT}")
    spec = importlib.util.find_spec("libero")
    root = Path(next(iter(spec.submodule_search_locations))) / "libero"
    return checked_folder(root, f"the installed LIBERO package {root}", INSTALL_HINT,
                          holds=("bddl_files", "init_files", "assets/scenes"))


def _config_dir() -> Path:
    """A project-owned directory for LIBERO's config.yaml: inside the venv if writable, else temp."""
    override = os.environ.get("ASYNC_RL_LIBERO_CONFIG_DIR")
    candidates = [Path(override)] if override else []
    candidates += [Path(sys.prefix) / "async_rl" / "libero",
                   Path(tempfile.gettempdir()) / f"async_rl-libero-{os.getuid()}"]
    for d in candidates:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            return d
    raise ConfigError(f"no writable directory for LIBERO's config (tried {', '.join(map(str, candidates))}); "
                      f"set ASYNC_RL_LIBERO_CONFIG_DIR to one")


def ensure_libero_config() -> Path:
    """Point ``LIBERO_CONFIG_PATH`` at a complete config.yaml so that ``import libero.libero``
    never prompts. A user's own ``LIBERO_CONFIG_PATH`` holding a config.yaml is kept."""
    import yaml

    root = libero_package_dir()
    user_dir = os.environ.get("LIBERO_CONFIG_PATH")
    if user_dir and (Path(user_dir) / "config.yaml").is_file():
        return root
    cfg_dir = _config_dir()
    text = yaml.safe_dump({
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(cfg_dir / "datasets"),
        "assets": str(root / "assets"),
    })
    path = cfg_dir / "config.yaml"
    if not path.is_file() or path.read_text() != text:
        # Several workers may start at once: write a private file, then rename it atomically.
        fd, tmp = tempfile.mkstemp(dir=cfg_dir, prefix=".config-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    os.environ["LIBERO_CONFIG_PATH"] = str(cfg_dir)
    return root


def import_libero(module: str) -> Any:
    """``module`` (of LIBERO or robosuite; ``ensure_libero_config`` first); a failed import (a broken
    installation) is a ConfigError naming the set-up."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"LIBERO failed to import ({exc}); {INSTALL_HINT}") from None


def import_benchmark() -> Any:
    ensure_libero_config()
    return import_libero("libero.libero.benchmark")


# ---- rendering --------------------------------------------------------------------------
def configure_rendering(backend: str) -> str:
    """Set ``MUJOCO_GL`` (and PyOpenGL's platform) before robosuite is imported; returns it."""
    if backend == "auto":
        backend = os.environ.get("MUJOCO_GL") or "egl"
    if "robosuite.utils.binding_utils" in sys.modules:
        # robosuite picked its GL context class at import; a different one can't be swapped in.
        if os.environ.get("MUJOCO_GL") != backend:
            raise RuntimeError(f"robosuite was imported with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r} in this "
                               f"process before the LIBERO env asked for {backend!r}; set MUJOCO_GL={backend} first")
        return backend
    os.environ["MUJOCO_GL"] = backend
    os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    if backend == "egl" and os.environ.get("CUDA_VISIBLE_DEVICES") == "" and "MUJOCO_EGL_DEVICE_ID" not in os.environ:
        # A process given no GPU (e.g. a Ray actor with num_gpus=0) has CUDA_VISIBLE_DEVICES="",
        # which robosuite's EGL device selection cannot parse; take the first EGL device.
        os.environ["MUJOCO_EGL_DEVICE_ID"] = "0"
    return backend


def gl_renderer_name(render_context: Any) -> str:
    """GL_RENDERER of a robosuite render context, e.g. 'llvmpipe (LLVM 15.0.6, 256 bits)' or a GPU's name."""
    from OpenGL import GL

    render_context.gl_ctx.make_current()
    name = GL.glGetString(GL.GL_RENDERER)
    return name.decode() if isinstance(name, bytes) else str(name)


def switch_to_fast_render(sim: Any, render_context: Any) -> None:
    """MSAA off (a new MjrContext reads ``offsamples``), no shadows, no reflections."""
    import mujoco

    render_context.gl_ctx.make_current()
    sim.model._model.vis.quality.offsamples = 0
    render_context.con.free()
    render_context._set_mujoco_context_and_buffers()  # robosuite's own (re)creation of the MjrContext
    render_context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
    render_context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


def fast_render_settings(sim: Any, render_context: Any) -> dict[str, Any]:
    """The live values that ``switch_to_fast_render`` changes."""
    import mujoco

    return {
        "offsamples": int(sim.model._model.vis.quality.offsamples),
        "context_samples": int(render_context.con.offSamples),
        "shadows": bool(render_context.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW]),
        "reflections": bool(render_context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION]),
    }
