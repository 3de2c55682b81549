"""CTRL ("Teaching Language Models to Critic via Reinforcement Learning"): a critic LM is trained with
GRPO so that its critiques of an initial solution make a frozen reviser's revised code pass the tests.

- ``mutations``: seeded AST mutations that turn a correct solution into a wrong one;
- ``cases``: HumanEval problems with initial solutions (correct, mutated, sampled), the JSONL format;
- ``critique``: the critic's and the reviser's prompts, the judgment line and its parser;
- ``reward``: the sandbox result of a revision, behind a cache keyed on AST-normalised code;
- ``reviser``: the frozen reviser model (in-process, or as a Ray actor next to the inference actors);
- ``evaluate``: pass rates with and without critiques, judgment accuracy, regressions;
- ``env``: the training env ``ctrl_humaneval`` (registered with the env registry, which discovers it by name:
  ``envs.DOMAIN_ENV_MODULES``);
- ``critique_sft``, ``revision_sft``, ``demo_files``: the supervised stage's demonstrations; ``headroom``: the
  reviser under fixed critics.
A domain package above ``envs/``: it uses envs, policies, the config and the utilities; nothing below it
imports it. Its commands are ``launch/ds_ctrl_grpo.py`` and ``launch/eval_ctrl.py``, its configs
``configs/ctrl_*.yaml``.
"""
