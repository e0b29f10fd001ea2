"""Run directories and their checkpoints, written so that no crash can leave a checkpoint half-written.

    runs/NAME/
      latest                       the name of the newest complete checkpoint
      checkpoints/step-0000500/    config.json, model.safetensors, tokenizer.json, optimizer.safetensors,
                                   trainer.json

A checkpoint is written into a hidden temporary directory, every file flushed to disk, then renamed into place in
one step; only then does ``latest`` (itself replaced atomically) point at it. A process killed at any moment
leaves the previous checkpoint as the latest one; leftover temporary directories are never read, and are removed
by the next save. Only the newest ``KEEP`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from multihead.io import atomic_write, umask_mode

CHECKPOINTS = "checkpoints"
LATEST = "latest"
KEEP = 2
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "trainer.json")


class RunError(ValueError):
    """A run directory that cannot be used: not ours, damaged, or not writable."""


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(out: Path) -> None:
    try:
        (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as error:
        raise RunError(f"cannot write to output directory {str(out)!r}: {error.strerror or error}") from None


def save_checkpoint(out: Path, step: int, writers: Mapping[str, Callable[[Path], None]]) -> Path:
    """Write one checkpoint: ``writers`` maps each file name to a function writing that file at the given path."""
    root = out / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-step-{step:07d}-", dir=root))
    try:
        for name, write in writers.items():
            write(staging / name)
            with open(staging / name, "rb") as written:
                os.fsync(written.fileno())
        _fsync_directory(staging)
        for written in staging.iterdir():
            os.chmod(written, umask_mode())
        os.chmod(staging, umask_mode(directory=True))
        final = root / f"step-{step:07d}"
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
        _fsync_directory(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    atomic_write(out / LATEST, lambda tmp: Path(tmp).write_text(final.name + "\n", encoding="utf-8"))
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _complete(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None`` if it has none."""
    pointer = out / LATEST
    if pointer.is_file():
        named = out / CHECKPOINTS / pointer.read_text(encoding="utf-8").strip()
        if _complete(named):
            return named
    candidates = [path for path in sorted((out / CHECKPOINTS).glob("step-*")) if _complete(path)]
    return candidates[-1] if candidates else None


def require_checkpoint(out: Path) -> Path:
    if not out.exists():
        raise RunError(f"{str(out)!r} does not exist")
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise RunError(f"{str(out)!r} is not a multihead run: it holds no complete checkpoint")
    return checkpoint


def write_json(values: Any) -> Callable[[Path], None]:
    return lambda path: path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{str(path)!r} is not a readable JSON file of a multihead run ({error})") from None
