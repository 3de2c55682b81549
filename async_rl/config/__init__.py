"""The run configuration: one pydantic schema in sections (``schema``; the supervised stage's section in
``supervised``), and its loader (``loader``): defaults < a YAML file < one flag per key, every bad key or value one
line before Ray starts."""
from async_rl.config.loader import load_config, read_config_file

__all__ = ["load_config", "read_config_file"]
