"""What the analysis commands share on the command line: the one-line parser every command uses,
defined in training/cli.py beside train.py's so that commands below analysis/ can use it too."""

from training.cli import EXIT_BAD_INPUT, OneLineParser

__all__ = ["EXIT_BAD_INPUT", "OneLineParser"]
