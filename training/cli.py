"""The command line, generated from the config dataclasses and the named presets.

Precedence: dataclass defaults < the preset's values < flags given on the command line. Flags keep
the field names (`--max_steps`, `--block_size`); `DataConfig.paths` is spelled `--data`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from training.config import ModelChoice, OptimConfig, RunConfig, SpeedConfig, TrainConfig
from training.presets import PRESETS, preset_overrides

EXIT_BAD_INPUT = 2


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Exit with main()'s status, as a Unix tool does when its reader goes away: `... | head -1` ends quietly with
    status 0 instead of a BrokenPipeError traceback (the recipe of Python's signal module documentation)."""
    try:
        status = main()
        sys.stdout.flush()  # a late broken pipe surfaces here, not in the interpreter's own exit flush
    except BrokenPipeError:
        # Python flushes stdout once more at exit; pointing it at /dev/null keeps that flush from failing too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 0
    sys.exit(status)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage block before an error; bad input gets one line, naming where the usage is.

    The parser of train.py's command line (below), the planner's, analysis's and `python -m training.sample`'s.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Shows a flag's default once, and only when it says something.

    argparse's ArgumentDefaultsHelpFormatter appends "(default: ...)" to every flag: a second default
    after a help text that already names one ("the preset's"), and "(default: None)" on required flags
    and on flags whose absence means "the preset's" or "off".
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # By identity: a default of 0 equals False and must still show.
        says_nothing = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "(default" in text or action.required or says_nothing or action.default == [] or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".lstrip()


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


def _add_fields(group: argparse._ArgumentGroup, cls: type, preset_values: dict[str, Any], preset: str) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, optional = _unwrap_optional(hints[f.name])
        help_text = f.metadata.get("help", "")
        if f.name in preset_values:
            shown = f"{preset_values[f.name]}, from --preset {preset}"
        else:
            shown = (
                f.default
                if f.default is not dataclasses.MISSING
                else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
                )
            )
        if shown is None or shown == []:
            # Help texts of optional fields say what "none" means; a "(default: none)" would repeat it.
            if "none" not in help_text:
                help_text = f"{help_text} (default: none)"
        else:
            help_text = f"{help_text} (default: {shown})"
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

    return {"model": ModelChoice, "data": DataConfig, "optim": OptimConfig, "run": RunConfig, "speed": SpeedConfig}


DEFAULT_PRESET = "tiny"


def _add_preset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        choices=sorted(PRESETS),
        help="named set of defaults, shown below for the preset given (default: %(default)s): "
        + "; ".join(f"{k}: {v.description}" for k, v in sorted(PRESETS.items())),
    )


def chosen_preset(argv: Sequence[str] | None) -> str:
    """The --preset of the command line, read before the full parser exists (its help shows its values)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--preset", default=DEFAULT_PRESET)
    preset = early.parse_known_args(argv)[0].preset
    return preset if preset in PRESETS else DEFAULT_PRESET  # the full parser reports an unknown one


def build_parser(preset: str = DEFAULT_PRESET) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="train.py",
        description="Train the from-scratch GPT-2 under the strategy of the accelerate launch config "
        "(single process, DDP or FSDP) and record loss, grad norm, memory, time and throughput.",
    )
    _add_preset(parser)
    preset_values = preset_overrides(preset)
    for title, cls in _config_classes().items():
        group = parser.add_argument_group(title, (cls.__doc__ or "").strip().splitlines()[0])
        _add_fields(group, cls, preset_values, preset)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse the command line into a validated TrainConfig; a malformed flag exits 2 with one line."""
    parser = build_parser(chosen_preset(argv))
    args = vars(parser.parse_args(argv))
    preset = args.pop("preset")
    preset_values = preset_overrides(preset)
    if "epochs" in args and "max_steps" not in args:
        # A preset's step budget must not silently override --epochs given on the command line.
        preset_values.pop("max_steps", None)
    values = {**preset_values, **args}
    sections: dict[str, Any] = {}
    for section, cls in _config_classes().items():
        names = {f.name for f in dataclasses.fields(cls)}
        sections[section] = cls(**{k: v for k, v in values.items() if k in names})
    return TrainConfig(preset=preset, **sections)
