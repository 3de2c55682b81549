"""``python -m async_rl.sandbox CODE_FILE TESTS_FILE [--timeout S] [--sandbox-mode strict|weak]``: one candidate
scored in the sandbox, its result as one JSON line (the package's ``_main``)."""
import sys

from async_rl.sandbox import _main

sys.exit(_main())
