"""Typed run configuration: defaults < ``--config`` YAML < command-line flags.

Everything is validated before Ray starts; a bad value is one line naming the key and the fix.
The keys, their types and defaults: ``async_rl/config/schema.py``; ``env_kwargs`` and ``policy_kwargs`` are
checked against the chosen env's and policy's options models (``--env.KEY`` / ``--policy.KEY`` set one).
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, Optional

import yaml

import envs
from async_rl.algo import load_clip_config
from async_rl.checkpoint import check_resumable, resolve_resume
from async_rl.config.schema import SECTIONS, RunConfig
from async_rl.config.trl_names import dash_spelling_hint, trl_flag_hint
from async_rl.errors import ConfigError, OneLineArgumentParser, unknown_key_message
from async_rl.plugin_options import describe_options, yaml_inline
from async_rl.policies import available_policies, policy_kwargs_checked, policy_options_model
from async_rl.renamed_keys import renamed_flag
from async_rl.validation import validate_model

# Flags every launch script has besides one flag per config key.
_FILE_FLAGS = ("config", "clip_config", "print_config")
_SECTION_OF = {key: name for name, cls in SECTIONS.items() for key in cls.model_fields}


@dataclass
class ConfigFile:
    """A config file with its ``base:`` chain merged in: flat config keys and the variants it declares."""

    source: str  # how errors name it
    values: dict[str, Any]
    # key -> [(value, overrides, declaring file)]: when the resolved ``key`` equals ``value``, the
    # overrides (a mapping that may name a ``base:``, relative to the declaring file) apply on top.
    variants: dict[str, list[tuple[Any, dict[str, Any], Path]]] = field(default_factory=dict)


def read_config_file(path: str | Path, source: Optional[str] = None) -> ConfigFile:
    """Read a YAML config: keys flat or under section names, ``base: other.yaml`` (relative to this
    file, recursive) below this file's keys, ``variants:`` kept for ``load_config`` to resolve."""
    return _read(Path(path), source or str(path), ())


def _read(path: Path, source: str, chain: tuple[Path, ...]) -> ConfigFile:
    if not path.is_file():
        raise ConfigError(f"{source}: no such file; pass a YAML file from configs/")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    return _resolve(data, path, source, (*chain, path.resolve()))


def _resolve(data: dict[str, Any], path: Path, source: str, chain: tuple[Path, ...]) -> ConfigFile:
    """``data`` (the content of ``path``, or a variant declared there) over its base; ``chain``: the
    files being read (a base among them is a cycle)."""
    data = dict(data)
    base, variants = data.pop("base", None), data.pop("variants", None)
    values = _flatten_sections(data, source)
    if base is None:
        out = ConfigFile(source, {})
    elif not isinstance(base, str):
        raise ConfigError(f"{source}: base must be one file name, got {base!r}")
    else:
        base_path = path.parent / base
        if base_path.resolve() in chain:
            cycle = " -> ".join(p.name for p in (*chain, base_path))
            raise ConfigError(f"{source}: base cycle {cycle}; remove one of these base: keys")
        if not base_path.is_file():
            raise ConfigError(f"{source}: base {base}: no such file ({base_path}); a base is relative to the file naming it")
        out = _read(base_path, str(base_path), chain)
    out.source = source
    out.values.update(values)
    if variants is not None:  # a file's variants replace those of its base
        out.variants = _check_variants(variants, path, source)
    return out


def _flatten_sections(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Keys under a section name (``scale: {num_trainers: 2}``) become flat keys; flat keys stay."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        # "env" and "policy" are keys and sections: a mapping under them is the section.
        if key in SECTIONS and isinstance(value, dict):
            fields = SECTIONS[key].model_fields
            for sub in value:
                if sub not in fields and sub in _SECTION_OF:
                    raise ConfigError(f"{source}: config key '{sub}' belongs to section '{_SECTION_OF[sub]}', "
                                      f"not '{key}'; move it there (or write it flat)")
                if sub not in fields:
                    raise ConfigError(f"{source}: {unknown_key_message(str(sub), fields, f'{key} config key')}")
            items = list(value.items())
        else:
            items = [(key, value)]
        for sub, sub_value in items:
            if sub in flat:
                raise ConfigError(f"{source}: config key '{sub}' is given twice (flat and in its section); keep one")
            flat[sub] = sub_value
    return flat


def _check_variants(spec: Any, path: Path, source: str) -> dict[str, list[tuple[Any, dict[str, Any], Path]]]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{source}: variants must map a config key to {{value: overrides}}, got {type(spec).__name__}")
    out = {}
    for key, table in spec.items():
        if key not in RunConfig.model_fields:
            raise ConfigError(f"{source}: variants: {unknown_key_message(str(key), RunConfig.model_fields, 'config key')}")
        if not isinstance(table, dict) or not all(isinstance(m, dict) for m in table.values()):
            raise ConfigError(f"{source}: variants.{key} must map values of {key} to mappings of config keys "
                              "(e.g. {passformer: {base: other.yaml}})")
        out[key] = [(value, overrides, path) for value, overrides in table.items()]
    return out


def _apply_variants(cfg_file: ConfigFile, resolved: dict[str, Any]) -> dict[str, Any]:
    """The file's values with the variants chosen by the ``resolved`` keys on top (once: a variant's
    own variants are ignored)."""
    values = dict(cfg_file.values)
    for key, options in cfg_file.variants.items():
        chosen = resolved[key] if key in resolved else RunConfig.model_fields[key].get_default(call_default_factory=True)
        for value, overrides, path in options:
            if value == chosen:
                values.update(_resolve(overrides, path, f"{cfg_file.source}: variants.{key}.{value}", ()).values)
    return values


def build_arg_parser(description: str, defaults: Optional[dict[str, Any]] = None,
                     defaults_from: Optional[str] = None, add_help: bool = True) -> argparse.ArgumentParser:
    """``--config``, ``--clip-config``, ``--print-config`` and one ``--flag`` per config key (values
    are YAML), grouped by section; help shows ``defaults`` (a launch script's YAML) over the built-in ones."""
    defaults = defaults or {}
    epilog = (f"Defaults are those of {defaults_from} and the built-in ones. " if defaults_from else "") + \
        "Flag values are YAML (--env-kwargs '{task: push-v3}', --max-epochs null). --print-config shows the " \
        "config a command line resolves to, by section."
    parser = OneLineArgumentParser(description=description, argument_default=argparse.SUPPRESS, allow_abbrev=False, add_help=add_help,
                                   usage="%(prog)s [-h] [--config FILE] [--print-config] [--KEY VALUE ...]",
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=textwrap.fill(epilog))
    files = parser.add_argument_group("config files")
    files.add_argument("--config", metavar="FILE", help="YAML file of config keys, flat or under section names, "
                       "optionally 'base: other.yaml'; it overrides the launch script's config, flags override it")
    files.add_argument("--clip-config", metavar="FILE", help="YAML/JSON file of clip params for --clip-mode")
    files.add_argument("--print-config", action="store_true", help="print the resolved config (sectioned YAML) and exit")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} section", (cls.__doc__ or "").split("\n")[0])
        for name, info in cls.model_fields.items():
            default = defaults[name] if name in defaults else info.get_default(call_default_factory=True)
            choices = typing.get_args(info.annotation) if typing.get_origin(info.annotation) is Literal else ()
            text = " ".join([*([info.description] if info.description else []),
                             *([f"one of {', '.join(choices)}"] if choices else []), f"(default: {yaml_inline(default)})"])
            text = text.replace("%", "%%")
            flag = "--" + name.replace("_", "-")
            if info.annotation is bool:
                group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, help=text)
            else:
                group.add_argument(flag, dest=name, type=str, metavar=name.upper(), help=text)
    _add_plugin_option_flags(parser)
    return parser


# --env.KEY / --policy.KEY set one key of env_kwargs / policy_kwargs (flag dest "env.KEY").
_PLUGIN_KINDS = {"env": ("env_kwargs", envs.available_envs, envs.env_options_model),
                 "policy": ("policy_kwargs", available_policies, policy_options_model)}


def _add_plugin_option_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--env.KEY`` flag per option of any registered env (``--policy.KEY`` likewise); the chosen env's
    options model checks it with the rest of ``env_kwargs``."""
    for kind, (kwargs_key, names, options_model) in _PLUGIN_KINDS.items():
        takers: dict[str, list[str]] = {}  # option -> the plugins that take it
        for name in names():
            for key in options_model(name).model_fields:
                takers.setdefault(key, []).append(name)
        group = parser.add_argument_group(f"{kind} options", f"one {kwargs_key} key each, over --{kwargs_key.replace('_', '-')}; "
                                          f"--print-config lists the chosen {kind}'s with their types and help")
        for key, plugins in sorted(takers.items()):
            group.add_argument(f"--{kind}.{key.replace('_', '-')}", dest=f"{kind}.{key}", metavar="VALUE", type=str,
                               help=f"{kwargs_key} {key} of {', '.join(plugins)}")


def _with_plugin_option_flags(resolved: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` with each ``--env.KEY`` / ``--policy.KEY`` flag's value set in env_kwargs / policy_kwargs."""
    out = dict(resolved)
    for dest, value in flags.items():
        kind, key = dest.split(".", 1)
        kwargs_key = _PLUGIN_KINDS[kind][0]
        given = out[kwargs_key] if kwargs_key in out else RunConfig.model_fields[kwargs_key].get_default(call_default_factory=True)
        out[kwargs_key] = {**(given if isinstance(given, dict) else {}), key: value}
    return out


def _parse_cli_value(value: str) -> Any:
    """CLI strings become YAML scalars ("3" -> 3, "null" -> None, "true" -> True)."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _merge(layers: list[dict[str, Any]], clip_file: Optional[dict[str, Any]], flags: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for values in layers:
        merged.update(values)
    if clip_file is not None:
        merged["clip_params"] = {**merged.get("clip_params", {}), **clip_file}
    merged.update(flags)
    return merged


def load_config(argv: Optional[list[str]] = None, default_config: Optional[str] = None, description: str = "") -> RunConfig:
    """Parse the command line into a validated RunConfig (raises ConfigError on bad input).

    Precedence: built-in defaults < ``default_config`` (the launch script's YAML) < ``--config`` <
    ``--clip-config`` < flags. Then the files' ``variants`` chosen by the resolved keys apply on top
    of the file declaring them (below the layers above it). ``--print-config`` prints the result and
    exits 0; ``--help`` prints the flags with the defaults this command line resolves to and exits 0.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_help = any(arg in ("-h", "--help") for arg in argv)
    files = [read_config_file(default_config)] if default_config else []
    parser = build_arg_parser(description, files[0].values if files else None, add_help=False)
    namespace, unknown = parser.parse_known_args([arg for arg in argv if arg not in ("-h", "--help")])
    if unknown:
        _refuse_unknown(unknown, parser)
    args = vars(namespace)
    if "config" in args:
        files.append(read_config_file(args["config"], f"--config {args['config']}"))
    clip_file = load_clip_config(args["clip_config"]) if "clip_config" in args else None
    cli = {key: value if isinstance(value, bool) else _parse_cli_value(value)
           for key, value in args.items() if key not in _FILE_FLAGS}
    option_flags = {key: cli.pop(key) for key in list(cli) if "." in key}
    resolved = _merge([f.values for f in files], clip_file, cli)
    if any(f.variants for f in files):
        resolved = _merge([_apply_variants(f, resolved) for f in files], clip_file, cli)
    resolved = _with_plugin_option_flags(resolved, option_flags)
    if wants_help:  # the defaults the run would use: the files, their chosen variants and the flags given
        build_arg_parser(description, resolved, _defaults_source(files, resolved, bool(cli or option_flags))).print_help()
        raise SystemExit(0)
    cfg = validate_model(RunConfig, resolved, "config key")
    envs.env_options(cfg.env, cfg.env_kwargs)  # the plugins' own options: one line now, before anything starts
    policy_kwargs_checked(cfg.policy, cfg.policy_kwargs)
    if cfg.model_path is not None and "model_path" not in policy_options_model(cfg.policy).model_fields:
        # A policy's options declare whether it loads a model: --model-path would be ignored, unnoticed.
        raise ConfigError(f"policy '{cfg.policy}' loads no model; drop --model-path (or use a policy that does, e.g. vla)")
    _check_paths(cfg)
    if args.get("print_config"):
        print(format_config(cfg), end="")
        raise SystemExit(0)
    return cfg


def _refuse_unknown(unknown: list[str], parser: argparse.ArgumentParser) -> NoReturn:
    """One line for the first argument the parser did not know: a renamed flag's new name, the dash spelling
    of an underscore one, this project's flag for TRL's name, else the nearest flag."""
    flags = [arg for arg in unknown if arg.startswith("--")]
    first = (flags or unknown)[0].split("=")[0]
    renamed = renamed_flag(first)
    if renamed:
        raise ConfigError(f"flag {first} is now {renamed} (same meaning, same value)")
    valid = {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}
    hint = dash_spelling_hint(first, valid) or trl_flag_hint(first)
    raise ConfigError(hint or unknown_key_message(first, valid, "flag"))


def _defaults_source(files: list[ConfigFile], resolved: dict[str, Any], flags_given: bool) -> Optional[str]:
    """How the help's epilog names where its defaults come from: the files, the variants chosen, the flags."""
    parts = [Path(f.source).name if i == 0 else f.source for i, f in enumerate(files)]
    parts += [f"{path.name}'s {key} {value} variant" for f in files for key, options in f.variants.items()
              for value, _, path in options if resolved.get(key) == value]
    parts += ["the flags given"] if flags_given else []
    return ", ".join(parts) or None


def format_config(cfg: RunConfig) -> str:
    """The config as sectioned YAML (loadable again with ``--config``), then, as comments, every option the
    chosen env and policy take (``env_kwargs``, ``policy_kwargs``) with its type, default and help."""
    lines = []
    for section, values in cfg.sectioned().items():
        lines += [f"{section}:", *(f"  {key}: {yaml_inline(value)}" for key, value in values.items())]
    for kind, (kwargs_key, _, options_model) in _PLUGIN_KINDS.items():
        name = getattr(cfg, kind)
        lines += [f"# {kind} {name} takes these {kwargs_key} (name: type = default  help):",
                  *(f"#   {line}" for line in describe_options(options_model(name)))]
    return "\n".join(lines) + "\n"


def _check_paths(cfg: RunConfig) -> None:
    if cfg.resume is not None:
        cfg.resume = str(resolve_resume(cfg.resume))  # pinned: a newer checkpoint written later does not change it
        check_resumable(Path(cfg.resume), cfg)
    log_dir = Path(cfg.log_dir)
    if log_dir.exists() and not log_dir.is_dir():
        raise ConfigError(f"--log-dir {cfg.log_dir} is a file; pass a directory")
    parent = next((p for p in [log_dir, *log_dir.parents] if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--log-dir {cfg.log_dir}: {parent} is not writable; pass a writable directory")
