"""What the command line says and how it exits: one-line errors, warnings, progress bars.

A user error (a bad argument, unreadable data, a run that cannot be used, a file the system refuses to read or
write) is a :class:`UserError` (or an ``OSError``): one line on stderr in the user's own terms (the flags they typed),
exit status 2, nothing written. Anything else is a bug of ours: one line that says so and names the error, exit
status 1. ``MULTIHEAD_DEBUG=1`` shows the traceback of either instead. Under ``torchrun`` only rank 0 speaks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any, NoReturn, TextIO

EXIT_INTERNAL, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141  # 141: killed by SIGPIPE, as tools


class UserError(Exception):
    """Something the user can fix: reported as one line, exit status 2. Not a ``ValueError``: a library's own
    ``ValueError`` reaching the command line is a bug (or a user's mistake not yet worded for the user), and is
    reported as one."""


class OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors are one line on stderr with status 2, like every other user error; ``--help`` shows the usage.

    Under ``torchrun`` only rank 0 prints it.
    """

    def error(self, message: str) -> NoReturn:
        report_error(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(EXIT_USAGE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except where there is none to show; lines never break inside a flag
    (``--checkpoint-every`` stays whole on a narrow terminal)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        no_default = action.default in (None, False) or action.default is argparse.SUPPRESS
        if no_default or isinstance(action, argparse._StoreFalseAction):  # a switch that turns something off
            return action.help or ""
        return super()._get_help_string(action) or ""


def rank() -> int:
    """This process's rank under ``torchrun`` (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_rank() -> bool:
    return rank() == 0


def say(message: str, file: TextIO | None = None) -> None:
    """Print on rank 0 only."""
    if is_main_rank():
        print(message, file=file or sys.stdout, flush=True)


RANK_GRACE_S = 15.0
"""How long a rank other than 0 waits before reporting a user error itself (see :func:`report_error`)."""


def report_error(line: str) -> None:
    """Print a user error's one line on stderr, once under ``torchrun``.

    Every rank meets the same error; rank 0 prints it. The other ranks wait first: torchrun stops every rank as soon as
    one has failed, so a rank that exits at once can have rank 0 stopped before it has printed anything. A rank still
    running after the wait (rank 0 has not failed: it is waiting for this one) prints the line itself.
    """
    if not is_main_rank():
        time.sleep(RANK_GRACE_S)
    print(line, file=sys.stderr, flush=True)


def plural(count: int, noun: str) -> str:
    """``1 sentence pair``, ``2 sentence pairs``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def warn(message: str) -> None:
    say(f"warning: {message}", sys.stderr)


def progress_bar(total: int | None, initial: int = 0, enabled: bool = True, unit: str = "step") -> Any:
    """A tqdm bar on stderr, drawn only on a terminal and by rank 0 (in a log file, or from other ranks, a bar is
    only stale lines; the evaluations say how training goes there)."""
    from tqdm import tqdm

    drawn = enabled and is_main_rank() and sys.stderr.isatty()
    return tqdm(
        total=total, initial=initial, disable=not drawn, unit=unit, dynamic_ncols=True, file=sys.stderr,
        mininterval=0.5,
    )  # fmt: skip


def quiet_frameworks() -> None:
    """Keep TensorFlow's and absl's start-up INFO lines (oneDNN notices and the like) out of the user's terminal.

    Must run before TensorFlow is imported; a user's own TF_CPP_MIN_LOG_LEVEL wins.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        import absl.logging
    except ImportError:
        return
    absl.logging.set_verbosity(absl.logging.ERROR)


# TensorFlow (2.21) prints these from C++ while it loads, before absl's logging is set up, so TF_CPP_MIN_LOG_LEVEL
# cannot silence them; on CPUs where it turns oneDNN's custom operations on, every import prints them.
FRAMEWORK_NOTICES = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on\."
)


@contextlib.contextmanager
def framework_notices_filtered() -> Iterator[None]:
    """Import a framework inside this: what it writes to the stderr file descriptor meanwhile comes out afterwards,
    less the start-up notices of ``FRAMEWORK_NOTICES``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not FRAMEWORK_NOTICES.search(line)]  # fmt: skip
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
