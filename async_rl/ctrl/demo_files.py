"""What the two supervised stages of CTRL share: the command line, the run config's training cases, the JSONL.

``critique_sft`` (the critic's format stage) and ``revision_sft`` (a reviser that acts on critiques) each turn
the training cases of a CTRL config into ``{"prompt", "response"}`` pairs for ``launch/sft.py``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from async_rl.errors import ConfigError, OneLineArgumentParser

ROOT = Path(__file__).resolve().parents[2]


def demonstrations_main(prog: str, doc: str, make: Callable[[Any, int], Sequence[dict[str, str]]],
                        argv: Optional[list[str]] = None) -> tuple[int, Optional[list[dict[str, str]]]]:
    """Parse ``--config --out --seed``, build the config's task set (a bad config: one line, exit 2), write
    ``make(task_set, seed)`` to ``--out``. Returns (exit code, the pairs written or None)."""
    ap = OneLineArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "ctrl_humaneval.yaml"),
                    help="the CTRL run config whose training cases are used")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--seed", type=int, default=0, help="which cases balance the set")
    args = ap.parse_args(argv)
    import envs  # noqa: PLC0415 (after the flags: --help answers before the envs load)
    from async_rl.config import load_config  # noqa: PLC0415 (and before the config loads torch)

    try:
        cfg = load_config(["--config", args.config, "--swanlab-mode", "disabled"], args.config)
        if cfg.env != "ctrl_humaneval":
            raise ConfigError(f"--config {args.config} trains env '{cfg.env}'; pass a ctrl_humaneval config")
        task_set = envs.make_task_set(cfg.env, **cfg.env_kwargs)  # the cases the run trains on
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, None
    pairs = list(make(task_set, args.seed))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    tmp.replace(out)
    print(f"{len(pairs)} pairs of {len(task_set.train)} training cases written to {out}")  # type: ignore[attr-defined]  # a CTRL task set (checked above)
    return 0, pairs
