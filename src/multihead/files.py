"""Writing files so that no crash leaves half of one: atomic replacement of files and whole directories.

Used by the weight format (:mod:`multihead.io`) and by the application's run directories. Each new file is written
under a temporary name in the same directory, flushed to disk and renamed over the target in one step; a directory
is replaced by swapping a fully written sibling into its place.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

PathLike = str | os.PathLike[str]

__all__ = [
    "atomic_write", "check_file_target", "fsync_directory", "replace_directory", "staging_directory", "umask_mode",
    "write_directory",
]  # fmt: skip


def umask_mode(directory: bool = False) -> int:
    """The mode a plain ``open()``/``mkdir()`` would give: temporary files start private (0600/0700)."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def check_file_target(path: PathLike, name: str = "path") -> Path:
    """``path`` can become a file: its directory exists and it is not itself a directory (else a ``ValueError``), and
    the system lets this process write into that directory (else an ``OSError`` naming ``path``, not a file of ours),
    as a command checks before the work whose result it writes there."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"`{name}` must be in an existing directory, received {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"`{name}` must name a file, received {str(path)!r}, which is a directory")
    try:
        with tempfile.TemporaryFile(dir=path.parent):  # a nameless file where the system has them (O_TMPFILE)
            pass
    except OSError as error:
        raise OSError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    return path


def atomic_write(path: PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(temporary_path)``, then move the result onto ``path`` in one step.

    A crash or kill at any moment leaves either the previous file or the new one, never part of one.
    """
    path = check_file_target(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_directory(target: Path, write: Callable[[Path], None], *, prefix: str) -> None:
    """Call ``write(staging)`` on a new temporary directory beside ``target`` (named ``prefix...``), make its files
    durable with the modes a plain ``open()`` gives, then swap it into ``target``'s place in one step (a previous
    ``target`` is removed). A failure or a crash leaves ``target`` as it was; the staging directory is removed."""
    staging = staging_directory(target, prefix)
    try:
        write(staging)
        for written in staging.iterdir():
            with open(written, "rb") as handle:
                os.fsync(handle.fileno())
            os.chmod(written, umask_mode())
        fsync_directory(staging)
        os.chmod(staging, umask_mode(directory=True))
        replace_directory(staging, target)  # a previous target is swapped out, whole, to `staging`
        fsync_directory(target.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def staging_directory(target: Path, prefix: str) -> Path:
    """A new temporary directory beside ``target`` (named ``prefix...``), where ``target`` is written before it is
    moved into place; one that cannot be made is an ``OSError`` naming ``target``, the directory asked for, not the
    made-up name."""
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    except OSError as error:
        raise OSError(f"cannot write {str(target)!r}: {error.strerror or error}") from None


def fsync_directory(path: Path) -> None:
    """Make a directory's entries (a rename into it, a new file) survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_directory(staging: Path, target: Path) -> None:
    """Move directory ``staging`` to ``target`` in one step; a previous ``target`` ends up at ``staging``."""
    if not target.exists():
        os.rename(staging, target)
    elif not _exchange(staging, target):
        # No atomic swap here: for the instant between the two renames, the previous model is at `previous`.
        previous = staging.with_name(staging.name + ".previous")
        os.rename(target, previous)
        os.rename(staging, target)
        os.rename(previous, staging)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # a C library older than glibc 2.28
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # kernel or file system without the swap
        return False
    raise OSError(code, os.strerror(code), str(second))
