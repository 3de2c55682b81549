"""``python -m async_rl.demos record | evaluate-expert``: argument parsing and the checks that turn
bad input into one line (what is wrong and how to fix it) and exit status 2, before anything is written."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from async_rl.errors import ConfigError, OneLineArgumentParser

BAD_INPUT = 2


class BadInput(Exception):
    """A problem with the command line, said in one line that names the fix."""


def _task(text: str) -> Any:
    return int(text) if text.isdigit() else text


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="libero", choices=["libero"], help="the environment (LIBERO only for now)")
    parser.add_argument("--suite", default="libero_spatial", help="LIBERO suite, e.g. libero_spatial")
    parser.add_argument("--tasks", nargs="+", type=_task, default=[0, 1], help="task indices or names of the suite")
    parser.add_argument("--noise", type=float, default=0.0, help="std of the Gaussian noise on the executed position command")
    parser.add_argument("--seed", type=int, default=0, help="seeds the expert's noise (per episode) and the envs")
    parser.add_argument("--workers", type=int, default=1, help="processes running episodes in parallel")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="python -m async_rl.demos",
                                   description="Scripted-expert demonstrations for LIBERO (see async_rl/demos/__init__.py).")
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record successful expert episodes")
    _common_arguments(rec)
    rec.add_argument("--episodes", type=int, required=True, help="successful episodes per task")
    rec.add_argument("--init-states", default="all", help='initial states to start from, e.g. "0-39" (episode k uses the k-th, cycling)')
    rec.add_argument("--image-size", type=int, default=64)
    rec.add_argument("--cameras", nargs="+", default=["agentview"])
    rec.add_argument("--max-attempts", type=int, default=5, help="noise seeds tried per episode before giving it up")
    rec.add_argument("--out", type=Path, required=True, help="an empty or new folder")
    rec.add_argument("--overwrite", action="store_true", help="replace an earlier recording in --out")
    ev = sub.add_parser("evaluate-expert", help="the expert's success rate per task (physics only)")
    _common_arguments(ev)
    ev.add_argument("--init-states", default="all", help='initial states to evaluate on, e.g. "0-49"')
    ev.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser


def _check_common(args: argparse.Namespace) -> None:
    if not 0.0 <= args.noise <= 1.0:
        raise BadInput(f"--noise {args.noise} is outside 0..1 (a std in action units); give e.g. --noise 0.3")
    if args.workers < 1:
        raise BadInput(f"--workers {args.workers} must be at least 1; give --workers 1 or more")


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file; give a folder (new or empty)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise BadInput(f"--out {out} is not empty; give a new folder, or add --overwrite to replace the recording there")


def _env_kwargs(args: argparse.Namespace, cameras: list[str], image_size: Optional[int]) -> dict[str, Any]:
    """What the task set is built from (and what the manifest records), checked by building it."""
    import envs  # noqa: PLC0415 (after the flags: --help and bad input answer before the envs load)

    kwargs: dict[str, Any] = {"suite": args.suite, "tasks": list(args.tasks), "cameras": cameras,
                              "init_states": args.init_states}
    if image_size is not None:
        kwargs["image_size"] = image_size
    try:
        envs.make_task_set(args.env, **kwargs)
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    return kwargs


def _record(args: argparse.Namespace) -> int:
    from async_rl.demos.recording import clear_recording, record_demos  # noqa: PLC0415 (as in _env_kwargs)

    _check_common(args)
    if args.episodes < 1:
        raise BadInput(f"--episodes {args.episodes} must be at least 1; give the number of successful episodes per task")
    if args.max_attempts < 1:
        raise BadInput(f"--max-attempts {args.max_attempts} must be at least 1")
    if not args.cameras:
        raise BadInput("--cameras is empty; demonstrations need images: give e.g. --cameras agentview")
    _check_out_dir(args.out, args.overwrite)
    env_kwargs = _env_kwargs(args, list(args.cameras), args.image_size)
    if args.overwrite and args.out.is_dir():
        clear_recording(args.out)
    start = time.monotonic()
    result = record_demos(env_kwargs, args.episodes, args.noise, args.seed, args.out, workers=args.workers,
                          max_attempts=args.max_attempts, quiet=args.quiet)
    wanted = args.episodes * len(args.tasks)
    print(f"recorded {len(result['episodes'])} of {wanted} episodes ({result['attempts']} attempts) in "
          f"{time.monotonic() - start:.0f} s -> {args.out}")
    for miss in result["failed"]:
        print(f"  no success in {miss['attempts']} attempts: task {miss['task_index']} episode {miss['episode']} "
              f"(init state {miss['init_state']})")
    return 0 if not result["failed"] else 1


def _evaluate(args: argparse.Namespace) -> int:
    from async_rl.demos.recording import evaluate_expert  # noqa: PLC0415 (as in _env_kwargs)

    _check_common(args)
    if args.json is not None and args.json.is_dir():
        raise BadInput(f"--json {args.json} is a folder; give a file name")
    env_kwargs = _env_kwargs(args, [], None)
    start = time.monotonic()
    report = evaluate_expert(env_kwargs, args.noise, args.seed, workers=args.workers, quiet=args.quiet)
    report["wall_s"] = round(time.monotonic() - start, 1)
    for name, rate in report["per_task"].items():
        print(f"{rate:.2f}  {name}  (failed init states: {report['failed_init_states'][name] or 'none'})")
    print(f"success_rate {report['success_rate']:.3f} over {sum(report['episodes_per_task'].values())} episodes, "
          f"noise {args.noise}, {report['wall_s']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _record(args) if args.command == "record" else _evaluate(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_INPUT
