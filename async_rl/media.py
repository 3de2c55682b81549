"""Episode media: frames of evaluation episodes, written as MP4 files and TensorBoard videos.

An env that renders on request has ``render_frame()`` (MetaWorld); an env whose observation
already holds camera images (LIBERO's ``agentview``) gives its first image.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import numpy as np

FRAME_KEYS = ("agentview", "image", "rgb")  # observation keys tried first, in this order


def frame_of(env: Any, raw_obs: Any) -> Optional[np.ndarray]:
    """One uint8 [H, W, 3] frame of ``env`` after it returned ``raw_obs``; None if it has no picture."""
    render = getattr(env, "render_frame", None)
    if callable(render):
        return np.asarray(render(), dtype=np.uint8)
    if isinstance(raw_obs, dict):
        images = [raw_obs[k] for k in FRAME_KEYS if k in raw_obs] + list(raw_obs.values())
        for image in images:
            if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] == 3:
                return image.copy()
    return None


def write_mp4(path: Path, frames: np.ndarray, fps: int) -> Path:
    """Write uint8 [T, H, W, 3] frames as an H.264 MP4 (imageio-ffmpeg's own ffmpeg binary)."""
    import imageio.v2 as imageio  # noqa: PLC0415  (only runs that record videos need it)

    path.parent.mkdir(parents=True, exist_ok=True)
    # macro_block_size=1: keep small frames (e.g. 64x64) as they are instead of resizing them.
    with imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=1, quality=7) as writer:
        for frame in frames:
            writer.append_data(frame)  # type: ignore[attr-defined]  # the ffmpeg writer's; its declared base lacks it
    return path


def log_videos(tb: Any, videos: dict[str, np.ndarray], step: int, log_dir: str, fps: int) -> list[Path]:
    """Each episode as a TensorBoard video ``eval_video/<name>`` and ``<log_dir>/videos/epoch-NNNNNN-<name>.mp4``."""
    written = []
    for name, frames in videos.items():
        name = re.sub(r"[^\w.-]+", "_", name)
        # add_video takes [N, T, C, H, W]; it encodes an animated GIF (moviepy) for TensorBoard's image tab.
        tb.add_video(f"eval_video/{name}", np.ascontiguousarray(frames.transpose(0, 3, 1, 2)[None]), step, fps=fps)
        written.append(write_mp4(Path(log_dir, "videos", f"epoch-{step:06d}-{name}.mp4"), frames, fps))
    return written
