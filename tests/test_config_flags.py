"""training/cli.py's command line generated from a config dataclass: each kind of field becomes the flag it
should, and `command_line` writes the flags that give the object back."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from training.cli import OneLineParser, add_flags, command_line, config_from, flag


@dataclass(frozen=True)
class Example:
    name: str = flag("required", dataclasses.MISSING)
    count: int = flag("an int with a default", 3)
    paths: tuple[Path, ...] = flag("one or more paths", ())
    ratio: float | None = flag("optional", group="either")
    scale: float | None = flag("the other of a mutually exclusive pair", group="either")
    switch: bool = flag("off unless given", False)
    on: bool = flag("on unless turned off", True)
    maybe: bool | None = flag("on, off or unsaid")
    word: str = flag("read by a function of its own", "A", parse=str.upper)
    rest: tuple[str, ...] = flag("everything after it", (), rest=True)


def _parse(argv: list[str]) -> Example:
    parser = OneLineParser(prog="example")
    add_flags(parser, Example, {"either": parser.add_mutually_exclusive_group()})
    return config_from(Example, parser.parse_args(argv))


def test_each_kind_of_field_is_its_flag() -> None:
    assert _parse(["--name", "n"]) == Example(name="n")  # the flags' defaults are the fields'
    parsed = _parse(["--name", "n", "--paths", "a", "b", "--no-on", "--maybe", "--word", "x", "--rest", "--count", "9"])
    assert parsed == Example(
        name="n", paths=(Path("a"), Path("b")), on=False, maybe=True, word="X", rest=("--count", "9")
    )
    assert _parse(["--name", "n", "--no-maybe", "--switch"]).maybe is False


@pytest.mark.parametrize(
    "argv",
    [[], ["--name", "n", "--ratio", "1", "--scale", "2"], ["--name", "n", "--no-switch"], ["--name", "n", "--count"]],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        _parse(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")


def test_command_line_gives_the_object_back() -> None:
    changed = Example(
        name="n", count=4, paths=(Path("a b"),), scale=0.5, switch=True, on=False, maybe=False, word="W", rest=("-x",)
    )
    assert command_line(Example(name="n")) == ["--name", "n"]  # defaults left out
    assert command_line(changed)[-2:] == ["--rest", "-x"]  # everything after --rest is its own: last
    assert _parse(command_line(changed)) == changed


@pytest.mark.parametrize(
    "argv",
    [
        ["--strategy", "ddp", "--arm", "fsdp"],  # another strategy's name: the report would compare the wrong thing
        ["--strategy", "ddp", "--arm", "ddp#1"],  # ddp#1 is ddp itself
        ["--strategy", "ddp", "--arm", "ddp"],
        ["--strategy", "ddp", "--arm", "fsdp#2"],
    ],
)
def test_an_arm_that_is_not_a_label_of_the_strategy_is_one_line_and_exit_2(argv: list[str], capsys) -> None:
    from train import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --arm")


def test_an_arm_of_the_strategy_is_accepted() -> None:
    from training.cli import parse_config

    assert parse_config(["--strategy", "ddp", "--arm", "ddp#10"]).run.arm == "ddp#10"
