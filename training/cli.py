"""Command lines: what every command of the project shares, and train.py's.

Shared: `run_main` (exit with main's status; a reader that goes away ends the command quietly), `OneLineParser`
(bad input is one `error:` line, exit 2), `DefaultsHelpFormatter`, and a command line generated from a frozen
config dataclass (`flag`, `add_flags`, `config_from`, `command_line`), which the planner's `PlanRequest` and the
experiment driver's `ExperimentSpec` are.

train.py's (`build_parser`, `parse_config`): generated from the config dataclasses and the named presets.
Precedence: dataclass defaults < the preset's values < flags given on the command line. Flags keep the field
names (`--max_steps`, `--block_size`); `DataConfig.paths` is spelled `--data`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from training.config import PRESETS, ModelChoice, OptimConfig, RunConfig, SpeedConfig, TrainConfig, preset_overrides

EXIT_BAD_INPUT = 2
C = TypeVar("C")


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
        says_nothing = any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
        empty = action.default in ([], (), "")
        if "(default" in text or action.required or says_nothing or empty or not action.option_strings:
            return text
        shown = action.default
        if isinstance(shown, (list, tuple)):
            shown = " ".join(map(str, shown))  # as it is typed: single ddp fsdp, not ('single', 'ddp', 'fsdp')
        return f"{text} (default: {str(shown).replace('%', '%%')})".lstrip()


# ---------------------------------------------------------------------------------------------------
# A command line generated from a frozen config dataclass: one flag per field, named after it, in its order.
# The planner (planner/request.py) and the experiment driver (analysis/experiment.py) are built this way, so code
# that runs them without a command line builds the same object the command line does, checked alike.


def flag(
    help: str,
    default: Any = None,
    *,
    choices: Sequence[str] | None = None,
    group: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    rest: bool = False,
) -> Any:
    """A dataclass field that is also a flag. `default=dataclasses.MISSING`: a required flag. `group`: the name of a
    group of `add_flags`'s `groups` (mutually exclusive or titled). `parse`: reads the value in place of the field's
    type (argparse passes a default that is a string through it too, so it must take its own output). `rest`: a
    tuple field that takes everything after the flag, as it is (it must come last in a command)."""
    metadata = {"help": help, "choices": choices, "group": group, "metavar": metavar, "parse": parse, "rest": rest}
    return dataclasses.field(default=default, metadata=metadata)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_sequence(tp: Any) -> bool:
    return typing.get_origin(tp) in (list, Sequence, tuple)


def kind_options(hint: Any, negatable: bool) -> dict[str, Any]:
    """How a field of type `hint` is spelled on a command line: argparse's action, or its nargs and type.
    `negatable`: a bool gets --no-NAME too, to turn off what a default or a preset turns on."""
    kind, _ = _unwrap_optional(hint)
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction if negatable else "store_true"}
    if _is_sequence(kind):
        (item,) = typing.get_args(kind)[:1] or (str,)
        return {"nargs": "+", "type": item}
    if kind in (int, float, str, Path):
        return {"type": kind}
    raise TypeError(f"no command-line form for {hint}")


def _add_flag(target: Any, f: dataclasses.Field[Any], hint: Any) -> None:
    meta = f.metadata
    # A bool that is off unless given is a switch; one that may be None (unsaid) or is on by default gets --no-NAME.
    options = kind_options(hint, negatable=f.default is not False)
    options.update({k: meta[k] for k in ("help", "choices", "metavar") if meta[k] is not None})
    if meta["parse"] is not None:
        options["type"] = meta["parse"]
    if meta["rest"]:
        options.update(nargs=argparse.REMAINDER, type=None)
    if f.default is dataclasses.MISSING:
        options["required"] = True
    else:
        options["default"] = f.default
    target.add_argument(f"--{f.name}", **options)


def add_flags(parser: argparse.ArgumentParser, cls: type, groups: Mapping[str, Any] | None = None) -> None:
    """One flag per field of `cls` made with `flag`, in field order; a field whose metadata names a group goes into
    `groups[name]` (an argument group or a mutually exclusive group the caller made)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        _add_flag((groups or {}).get(f.metadata["group"], parser), f, hints[f.name])


def config_from(cls: type[C], namespace: argparse.Namespace) -> C:
    """The parsed flags as `cls`; its own checks (`__post_init__`) run, and what they raise is the caller's."""
    hints = typing.get_type_hints(cls)
    values = vars(namespace)
    for f in dataclasses.fields(cls):
        kind, _ = _unwrap_optional(hints[f.name])
        if typing.get_origin(kind) is tuple and isinstance(values.get(f.name), list):
            values[f.name] = tuple(values[f.name])
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


def command_line(config: Any) -> list[str]:
    """The flags that give `config` back when parsed (`add_flags`, `config_from`): its required fields and those
    that differ from their defaults, a `rest` field last."""
    words: list[str] = []
    last: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if isinstance(value, bool):
            words.append(f"--{f.name}" if value else f"--no-{f.name}")
        elif isinstance(value, (tuple, list)):
            (last if f.metadata["rest"] else words).extend([f"--{f.name}", *map(str, value)])
        elif value is not None:
            words += [f"--{f.name}", str(value)]
    return words + last


# Fields whose flag is not the field name.
_FLAG_NAMES = {"paths": "data"}


def _flag(field_name: str) -> str:
    return _FLAG_NAMES.get(field_name, field_name)


def _help_with_default(f: dataclasses.Field[Any], preset_values: dict[str, Any], preset: str) -> str:
    help_text = f.metadata.get("help", "")
    if f.name in preset_values:
        shown = f"{preset_values[f.name]}, from --preset {preset}"
    elif f.default is not dataclasses.MISSING:
        shown = f.default
    else:
        shown = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
    if shown is None or shown == []:
        # Help texts of optional fields say what "none" means; a "(default: none)" would repeat it.
        return help_text if "none" in help_text else f"{help_text} (default: none)"
    return f"{help_text} (default: {shown})"


def _add_fields(group: argparse._ArgumentGroup, cls: type, preset_values: dict[str, Any], preset: str) -> None:
    """train.py's flags of one config section. Unlike `add_flags`, a flag absent from the command line is absent
    from the result (the preset's value then applies), its help shows the preset's value, and every bool has a
    --no- form (to turn off what a preset turns on)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        try:
            options = kind_options(hints[f.name], negatable=True)
        except TypeError as err:
            raise TypeError(f"{cls.__name__}.{f.name}: {err}") from None
        if "type" in options:
            options["metavar"] = f.name.upper() if "nargs" in options else options["type"].__name__.upper()
        help_text = _help_with_default(f, preset_values, preset)
        group.add_argument(f"--{_flag(f.name)}", dest=f.name, default=argparse.SUPPRESS, help=help_text, **options)


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
