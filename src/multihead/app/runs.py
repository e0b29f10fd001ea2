"""Run directories and their checkpoints, written so that no crash can leave a checkpoint half-written.

    runs/NAME/
      latest                       the name of the newest complete checkpoint
      checkpoints/step-0000500/    config.json, model.safetensors, tokenizer.json, optimizer.safetensors,
                                   trainer.json

A checkpoint is written into a hidden temporary directory, every file flushed to disk, then renamed into place in
one step (swapped in one step with an earlier checkpoint of the same step); only then does ``latest`` (itself
replaced atomically) point at it. A process killed at any moment leaves the previous checkpoint as the latest one;
leftover temporary directories are never read, and are removed by the next save. Only the newest ``KEEP``
checkpoints are kept; older ones are renamed to temporary directories before they are deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from multihead.files import atomic_write, fsync_directory, replace_directory, umask_mode

CHECKPOINTS = "checkpoints"
LATEST = "latest"
KEEP = 2
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "optimizer.safetensors", "trainer.json")


class RunError(ValueError):
    """A run directory that cannot be used: not ours, damaged, or not writable."""


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
        fsync_directory(staging)
        for written in staging.iterdir():
            os.chmod(written, umask_mode())
        os.chmod(staging, umask_mode(directory=True))
        final = root / f"step-{step:07d}"
        replace_directory(staging, final)  # a checkpoint of the same step is swapped out, whole, to `staging`
        fsync_directory(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    atomic_write(out / LATEST, lambda tmp: Path(tmp).write_text(final.name + "\n", encoding="utf-8"))
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        # Renamed first, so that a kill while deleting leaves a temporary directory, not a partial checkpoint.
        doomed = root / f".tmp-{old.name}-removed"
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return final


def _complete(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in REQUIRED)


def _pointed_at(out: Path) -> Path | None:
    """The checkpoint ``latest`` names, or ``None`` when it names none (missing, not text, not a checkpoint name)."""
    try:
        name = (out / LATEST).read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return out / CHECKPOINTS / name if name.startswith("step-") and Path(name).name == name else None


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a run, or ``None`` if it has none.

    The one ``latest`` names, when it is complete; otherwise (``latest`` damaged, or a kill between a checkpoint's
    rename and the update of ``latest``) the newest complete one by step.
    """
    named = _pointed_at(out)
    if named is not None and _complete(named):
        return named
    candidates = [path for path in sorted((out / CHECKPOINTS).glob("step-*")) if _complete(path)]
    return candidates[-1] if candidates else None


def incomplete_checkpoints(out: Path, newer_than: str = "") -> str:
    """``'step-0000500 lacks model.safetensors; ...'`` for the checkpoint directories (after ``newer_than``) that
    miss a file, or ``''``. Saving never leaves one (it renames whole directories), so these were damaged."""
    return "; ".join(
        f"{path.name} lacks {', '.join(name for name in REQUIRED if not (path / name).is_file())}"
        for path in sorted((out / CHECKPOINTS).glob("step-*"))
        if path.name > newer_than and not _complete(path)
    )


def require_checkpoint(out: Path) -> Path:
    """The newest complete checkpoint of the run ``out``; a :class:`RunError` saying why there is none."""
    if not out.exists():
        raise RunError(f"{str(out)!r} does not exist")
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        damaged = incomplete_checkpoints(out)
        if damaged:
            raise RunError(f"{str(out)!r} holds no complete checkpoint: {damaged}")
        raise RunError(f"{str(out)!r} is not a multihead run: it holds no complete checkpoint")
    return checkpoint


def write_json(values: Any) -> Callable[[Path], None]:
    return lambda path: path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{str(path)!r} is not a readable JSON file of a multihead run ({error})") from None
