"""Build (or reuse) the packed dataset cache ahead of training and print what it holds.

    python -m data.prepare --data path/to/articles*.csv --block_size 1024

Flags are DataConfig's fields (`paths` is spelled `--data`). A problem with the input data prints one
line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Sequence

from data.config import DataConfig
from data.errors import DataError
from data.pipeline import build_datasets

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    hints = typing.get_type_hints(DataConfig)
    for f in dataclasses.fields(DataConfig):
        flag = "--data" if f.name == "paths" else f"--{f.name}"
        kwargs: dict[str, typing.Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": f.metadata["help"]}
        scalar = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif f.name == "paths":
            parser.add_argument(flag, nargs="+", metavar="PATH", **kwargs)
        else:
            parser.add_argument(flag, type=scalar[0], metavar=scalar[0].__name__.upper(), **kwargs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    try:
        config = DataConfig(**args)
        data = build_datasets(config)
    except (DataError, ValueError) as exc:
        # ValueError here comes from DataConfig's checks on the flags; both are the user's to fix.
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(data.stats.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
