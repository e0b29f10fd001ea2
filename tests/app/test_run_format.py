"""The run directory: checkpoints written whole or not at all, ``latest`` moved only after a complete
checkpoint, nothing left behind by an interrupted save (the format itself is described in :mod:`multihead.app.runs`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import multihead.app.runs as runs
import multihead.io as mio
from app.support import damaged_run, snapshot, tiny, undamaged
from multihead.app.runs import RunError, latest_checkpoint
from multihead.app.training import train


def test_an_interrupted_checkpoint_rename_keeps_the_run_as_it_was(
    short_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = damaged_run(short_run, tmp_path, undamaged)
    before, latest = snapshot(out), latest_checkpoint(out)

    def killed(source: object, target: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.save_checkpoint(out, "step-0000009", {"trainer.json": runs.write_json({"format": 1})})
    monkeypatch.undo()
    assert latest_checkpoint(out) == latest
    assert snapshot(out) == before


def test_an_interrupted_latest_update_keeps_the_previous_latest_and_no_litter(
    short_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = damaged_run(short_run, tmp_path, undamaged)
    latest = latest_checkpoint(out)
    files = {name: (latest / name).read_bytes() for name in runs.REQUIRED}

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    writers = {name: (lambda p, data=data: p.write_bytes(data)) for name, data in files.items()}
    monkeypatch.setattr(mio.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        runs.save_checkpoint(out, "step-0000009", writers)
    monkeypatch.undo()
    assert latest_checkpoint(out) == latest
    assert (out / "latest").read_text().strip() == latest.name
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "history.json", "history.png", "latest"]


def test_an_interrupted_save_is_never_picked_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    train(tiny(out, steps=3))
    before = latest_checkpoint(out)
    original = runs.save_checkpoint

    def dies_while_writing(out_dir, name, writers, **kwargs):
        def broken(path: Path) -> None:
            path.write_bytes(b"half")
            raise KeyboardInterrupt  # as if killed here

        return original(out_dir, name, {**writers, "trainer.json": broken}, **kwargs)

    monkeypatch.setattr("multihead.app.runs.save_checkpoint", dies_while_writing)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(out, steps=6, resume=True))
    assert latest_checkpoint(out) == before
    assert not list((out / "checkpoints").glob(".tmp-*"))
    # What a SIGKILL can leave behind: a staging directory, a checkpoint directory without all its files.
    (out / "checkpoints" / ".tmp-step-0000009-x").mkdir()
    (out / "checkpoints" / "step-0000009").mkdir()
    (out / "checkpoints" / "step-0000009" / "model.safetensors").write_bytes(b"partial")
    (out / "latest").write_text("step-0000009\n")
    assert latest_checkpoint(out) == before


def test_run_error_is_a_value_error() -> None:
    assert issubclass(RunError, ValueError)
