"""What the analysis commands share on the command line."""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_BAD_INPUT = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage block before an error; bad input gets one line, naming where the usage is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")
