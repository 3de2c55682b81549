"""async_rl: a Ray-based asynchronous distributed RL library.

Set up with ``scripts/setup.sh`` (or ``make setup``): it installs torch==2.13.0 first so
that pip never pulls a CUDA build of torch on a CPU-only machine, then this package.
"""
from setuptools import find_packages, setup

# Versions measured together on the project's machine (Python 3.11, CPU):
# torch 2.13.0+cpu, ray 2.60.0, deepspeed 0.19.8, peft 0.21.2, transformers 5.24.0,
# swanlab 0.10.3, tensordict 0.15.3, pydantic 2.14.3, metaworld 3.1.1 / mujoco 3.3.0.
INSTALL_REQUIRES = [
    # tensordict 0.15 requires torch>=2.11; the set-up script installs torch==2.13.0 first.
    "torch>=2.11,<3",
    "ray[default]==2.60.0",
    "deepspeed==0.19.8",
    "peft>=0.21.2,<1",
    "transformers>=5.24,<6",  # the KV cache is passed as `cache=` (5.24 deprecates past_key_values=)
    "swanlab>=0.10.3,<0.11",
    "tensordict>=0.15.3,<0.16",
    "pydantic>=2.14,<3",
    "pyyaml>=6,<7",
    "tensorboard>=2.21,<3",
    "rich>=13.6",
    "numpy>=2,<3",
    # The end-of-run report's plots (async_rl/report.py, Agg backend).
    "matplotlib>=3.8",
    # Episode videos: SummaryWriter.add_video imports moviepy.editor, which moviepy 2 removed;
    # MP4 files are written by imageio with imageio-ffmpeg's own ffmpeg binary.
    "moviepy>=1.0.3,<2",
    "imageio>=2.30",
    "imageio-ffmpeg>=0.5",
    # Causal-LM policies read GGUF files (the default SmolLM2-135M-Instruct) through transformers.
    "gguf==0.19.0",
    # Text envs on a user's data (envs/prompts.py): `datasets` reads save_to_disk folders (its pyarrow reads
    # Parquet); math-verify is the built-in `math` reward's answer checker (LaTeX, \boxed{}, fractions).
    "datasets==5.2.0",
    "math-verify==0.9.0",
]

EXTRAS_REQUIRE = {
    # gymnasium's mujoco module needs `packaging`; mujoco 3.3.0 is also the version that
    # works with LIBERO's robosuite 1.4.0.
    "metaworld": ["metaworld==3.1.1", "mujoco==3.3.0", "packaging"],
    # LIBERO itself (libero, robosuite 1.4.0, bddl and the asset packages) is installed by
    # scripts/setup.sh with --no-deps: its declared deps pull CUDA torch, mujoco 4, wandb, ...
    # These are the modules they import at run time (found by importing and running an env).
    "libero": [
        "mujoco==3.3.0",  # robosuite 1.4.0 breaks with mujoco 3.17 and 4.x
        "opencv-python-headless>=4.9,<6",  # robosuite wants cv2; headless needs no libGL/X11
        "numba>=0.60",
        "scipy>=1.11",
        "termcolor>=2",
        "easydict>=1.10",
        "future>=1.0",
        "matplotlib>=3.8",
        "gymnasium>=1.0",
        "pillow>=10",
        "packaging",
    ],
    # CompilerGym runs in its own Python 3.10 venv (.venv-compilergym): its pinned deps
    # have no cp311 builds, so nothing is installed into the main venv.
    "compilergym": [],
    "dev": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "matplotlib>=3.8",
        "stable-baselines3>=2.7,<3",
        "py-spy>=0.3",  # benchmarks/profile_actors.py
        # The linter `make test` runs first (pyproject.toml [tool.ruff]); pinned: a new release adds findings.
        "ruff==0.17.6",
        # The type checker `make test` runs after ruff (pyproject.toml [tool.mypy]); pinned for the same reason.
        "mypy==2.4.1",
    ],
}

setup(
    name="async_rl",
    version="0.1.0",
    description="Ray-based asynchronous distributed reinforcement learning",
    python_requires=">=3.10",
    packages=find_packages(include=["async_rl", "async_rl.*", "envs", "envs.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
