"""``python -m async_rl.demos``: see async_rl/demos/cli.py."""
import sys

from async_rl.demos.cli import main

sys.exit(main())
