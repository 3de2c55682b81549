"""CTRL ("Teaching Language Models to Critic via Reinforcement Learning"): a critic LM is trained with
GRPO so that its critiques of an initial solution make a frozen reviser's revised code pass the tests.

- ``mutations``: seeded AST mutations that turn a correct solution into a wrong one;
- ``cases``: HumanEval problems with initial solutions (correct, mutated, sampled), the JSONL format;
- ``critique``: the critic's and the reviser's prompts, the judgment line and its parser;
- ``reward``: the sandbox result of a revision, behind a cache keyed on AST-normalised code;
- ``reviser``: the frozen reviser model (in-process, or as a Ray actor next to the inference actors);
- ``evaluate``: pass rates with and without critiques, judgment accuracy, regressions.
The training env is ``envs/ctrl_humaneval.py``; the launch ``launch/ds_ctrl_grpo.py``.
"""
