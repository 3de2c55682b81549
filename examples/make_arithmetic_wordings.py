"""Write the example data set: arithmetic questions in several wordings, as JSONL rows {"prompt", "answer"}.

Training rows use some wordings, held-out rows other wordings AND other expressions (the arithmetic env's
hash split), so that a held-out gain is not memorisation of the training questions.

    python examples/make_arithmetic_wordings.py    # -> examples/arithmetic_train.jsonl, arithmetic_heldout.jsonl
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from envs.arithmetic import draw_problem

TRAIN_WORDINGS = ("What is {expr}?", "Compute {expr}.", "Calculate {expr}.", "{expr} = ?", "What do you get for {expr}?")
HELDOUT_WORDINGS = ("Work out {expr}.", "Find the value of {expr}.", "How much is {expr}?", "Evaluate {expr}.")


def rows(n: int, heldout: bool, wordings: tuple, seed: int) -> list[dict]:
    rng, out, seen = np.random.default_rng(seed), [], set()
    while len(out) < n:
        problem = draw_problem(rng, difficulty=1, heldout=heldout)
        wording = wordings[len(out) % len(wordings)]
        prompt = wording.format(expr=problem["expr"])
        if prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": problem["answer"]})
    return out


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for name, data in (("arithmetic_train.jsonl", rows(1000, False, TRAIN_WORDINGS, 1)),
                       ("arithmetic_heldout.jsonl", rows(100, True, HELDOUT_WORDINGS, 2))):
        (here / name).write_text("".join(json.dumps(r) + "\n" for r in data))
        print(f"{here / name}: {len(data)} rows")
