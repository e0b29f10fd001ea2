"""The run directory: checkpoints written whole or not at all, ``latest`` moved only after a complete
checkpoint, nothing left behind by an interrupted save, one process at a time (the format itself is described in
:mod:`multihead.app.runs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import multihead.app.runs as runs
import multihead.io as mio
from app.support import SMALL_FLAGS, damaged_run, snapshot, subprocess_env, tiny, undamaged
from multihead.app.console import UserError
from multihead.app.runs import RunError, latest_checkpoint, read_checkpoint
from multihead.app.training import train
from multihead.decoding import Generation


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
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "history.json", "history.png", "latest",
                                                     "train.jsonl"]  # fmt: skip


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


def test_run_error_is_a_user_error_and_no_value_error() -> None:
    """A damaged run is the user's to fix (one line, exit status 2); a library's ``ValueError`` is not."""
    assert issubclass(RunError, UserError)
    assert not issubclass(RunError, ValueError)


# --- one process at a time ------------------------------------------------------------------------------------

TRAIN_TINY = ["train", "--task", "reverse", *SMALL_FLAGS, "--batch-size", "4", "--warmup", "5", "--eval-every", "1000"]


def _multihead(*args: object) -> subprocess.Popen:
    command = [sys.executable, "-m", "multihead", *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())


def test_two_trainings_of_one_run_directory_never_run_at_once(tmp_path: Path) -> None:
    """The first takes the run's lock; the second, started while the first trains, is refused in one line naming
    the first's process, and the run the first writes is whole."""
    out = tmp_path / "run"
    first = _multihead(*TRAIN_TINY, "--out", out, "--steps", "400", "--checkpoint-every", "100")
    deadline = time.monotonic() + 120
    while not ((out / runs.LOCK).is_file() and (out / runs.LOCK).read_text().strip()):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first training never took the lock"
        time.sleep(0.05)
    second = _multihead(*TRAIN_TINY, "--out", out, "--steps", "3", "--resume")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2, err
    assert [line for line in err.splitlines() if line.strip()] == [
        f"multihead: error: {str(out)!r} is in use by another multihead process (pid {first.pid}); wait for it to "
        "end, or choose another --out"
    ]
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert latest_checkpoint(out).name == "step-0000400"
    assert read_checkpoint(latest_checkpoint(out)).step == 400
    assert not (out / runs.LOCK).exists()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    train(tiny(out, steps=3))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / runs.LOCK).write_text(ended.stdout)  # as a training killed with SIGKILL leaves it
    capsys.readouterr()
    train(tiny(out, steps=6, resume=True))
    assert latest_checkpoint(out).name == "step-0000006"
    assert (
        f"warning: {str(out)!r} was locked by process {ended.stdout.strip()}, which ended without unlocking it: "
        "taking it over"
    ) in capsys.readouterr().err.splitlines()
    assert not (out / runs.LOCK).exists()


def test_a_refused_training_leaves_the_lock_to_its_holder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(tiny(out, steps=3))
    holder = runs.RunLock(out)
    holder.acquire()
    try:
        with pytest.raises(RunError, match=rf"is in use by another multihead process \(pid {os.getpid()}\)"):
            train(tiny(out, steps=6, resume=True))
        assert (out / runs.LOCK).read_text().strip() == str(os.getpid())
    finally:
        holder.release()
    assert latest_checkpoint(out).name == "step-0000003"


def test_a_checkpoint_an_older_version_wrote_reads_with_its_bans(short_run: Path, tmp_path: Path) -> None:
    """Older versions kept no ``generation.json`` and wrote ``decoder_start_id`` and ``banned_ids`` into every
    ``config.json``: such a checkpoint translates with its tokenizer's ids and never chooses what its config banned
    (here a token the model chooses unbanned)."""
    from multihead.app.translate import Translator, translate_ids

    def translated(translator: Translator) -> list[list[int]]:
        ids = [translator.source.encode(text)[0] for text in ("abc", "cab", "bca", "aabbcc")]
        return translate_ids(translator.generate(), ids, limit=translator.limit, generation=translator.generation)

    eos = Translator(short_run).specials.eos
    banned = next(token for tokens in translated(Translator(short_run)) for token in tokens if token != eos)

    def older(checkpoint: Path) -> None:
        (checkpoint / "generation.json").unlink()
        config = json.loads((checkpoint / "config.json").read_text())
        config.update(decoder_start_id=None, banned_ids=[banned])
        (checkpoint / "config.json").write_text(json.dumps(config))

    out = damaged_run(short_run, tmp_path, older)
    found = read_checkpoint(latest_checkpoint(out))
    assert found.generation == Generation(found.target.specials, banned=(banned,))
    assert not any(banned in tokens for tokens in translated(Translator(out)))
