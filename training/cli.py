"""The command line, generated from the config dataclasses and the named presets.

Precedence: dataclass defaults < the preset's values < flags given on the command line. Flags keep
the field names (`--max_steps`, `--block_size`); `DataConfig.paths` is spelled `--data`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Sequence

from training.config import ModelChoice, OptimConfig, RunConfig, TrainConfig
from training.presets import PRESETS, preset_overrides

# Fields whose flag is not the field name.
_FLAG_NAMES = {"paths": "data"}


def _flag(field_name: str) -> str:
    return _FLAG_NAMES.get(field_name, field_name)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _add_fields(group: argparse._ArgumentGroup, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, optional = _unwrap_optional(hints[f.name])
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        )
        help_text = f"{help_text} (default: {default})" if help_text else f"(default: {default})"
        name = f"--{_flag(f.name)}"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if tp is bool:
            group.add_argument(name, action=argparse.BooleanOptionalAction, **kwargs)
        elif typing.get_origin(tp) in (list, Sequence, tuple):
            (item,) = typing.get_args(tp)[:1] or (str,)
            group.add_argument(name, nargs="+", type=item, metavar=f.name.upper(), **kwargs)
        elif tp in (int, float, str):
            group.add_argument(name, type=tp, metavar=tp.__name__.upper(), **kwargs)
        else:
            raise TypeError(f"no command-line form for {cls.__name__}.{f.name}: {tp}")
        del optional  # None is reachable only as the default, never typed on the command line


def _config_classes() -> dict[str, type]:
    from data import (
        DataConfig,  # the data stack (datasets, transformers) is imported only when needed
    )

    return {"model": ModelChoice, "data": DataConfig, "optim": OptimConfig, "run": RunConfig}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train the from-scratch GPT-2 under the strategy of the accelerate launch config "
        "(single process, DDP or FSDP) and record loss, grad norm, memory, time and throughput.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset", default="tiny", choices=sorted(PRESETS),
        help="named set of defaults: " + "; ".join(f"{k}: {v.description}" for k, v in sorted(PRESETS.items())),
    )
    for title, cls in _config_classes().items():
        _add_fields(parser.add_argument_group(title, (cls.__doc__ or "").strip().splitlines()[0]), cls)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse the command line into a validated TrainConfig; argparse exits 2 on malformed flags."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    preset = args.pop("preset")
    values = {**preset_overrides(preset), **args}
    sections: dict[str, Any] = {}
    for section, cls in _config_classes().items():
        names = {f.name for f in dataclasses.fields(cls)}
        sections[section] = cls(**{k: v for k, v in values.items() if k in names})
    return TrainConfig(preset=preset, **sections)
