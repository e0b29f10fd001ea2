"""What the command line says and how it exits: one-line errors with status 2, warnings, progress bars.

User errors (bad arguments, unreadable data, a run that cannot be used) are one line on stderr in the user's own
terms, with exit status 2 and nothing written; ``MULTIHEAD_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr with status 2, like every other user error; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
