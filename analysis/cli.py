"""What the analysis commands share on the command line: the one-line parser, defined in training/cli.py
beside train.py's (a command below analysis/, `python -m training.sample`, uses it too)."""

from training.cli import EXIT_BAD_INPUT, OneLineParser

__all__ = ["EXIT_BAD_INPUT", "OneLineParser"]
