"""An example of a reward function of your own (TRL's convention), used as --reward my_rewards:brevity with
examples/ as the working directory or on PYTHONPATH:

    PYTHONPATH=examples python launch/ds_lm_grpo.py --data examples/arithmetic_train.jsonl \\
        --heldout-data examples/arithmetic_heldout.jsonl --reward math --reward my_rewards:brevity=0.2
"""


def brevity(prompts, completions, answer, **kwargs):
    """1.0 for an answer that is just the number, falling to 0 as the completion grows past 40 characters
    (it needs the ``answer`` column: the run refuses data without one)."""
    out = []
    for completion, expected in zip(completions, answer):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        out.append(1.0 if text.strip() == str(expected) else max(0.0, 1.0 - len(text) / 40))
    return out
