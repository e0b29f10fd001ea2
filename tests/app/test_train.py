"""Training, checkpoints, resume, translation, plots, data-parallel training and the command line's errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

import multihead.app.runs as runs
from multihead.app.cli import main
from multihead.app.runs import latest_checkpoint
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator
from multihead.io import save_weights

TINY = dict(batch_size=16, d_model=16, num_heads=2, layers=1, d_ff=32, eval_every=1000, progress=False, warmup=5)


def tiny(out: Path, **overrides) -> TrainOptions:
    return TrainOptions(out=str(out), **{"task": "reverse", "steps": 6, "checkpoint_every": 3, **TINY, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small dates model trained for a few seconds (it learns some of the task, not all)."""
    out = tmp_path_factory.mktemp("runs") / "dates"
    train(TrainOptions(out=str(out), task="dates", steps=120, checkpoint_every=60, **{**TINY, "d_model": 32}))
    return out


def test_short_run_lowers_the_loss_and_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    result = train(tiny(tmp_path / "run", steps=60, checkpoint_every=30, lr=3e-3))
    first, last = np.mean([x for _, x in result.losses[:5]]), np.mean([x for _, x in result.losses[-5:]])
    assert last < 0.9 * first
    assert 0.0 <= result.accuracy <= 1.0
    assert result.heldout == 1000
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint.name == "step-0000060"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json", "trainer.json",
    ]  # fmt: skip
    assert isinstance(Translator(tmp_path / "run").translate(["abcd"])[0], str)
    assert oct(checkpoint.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"lr": float("nan")}, ValueError, r"--lr must be a positive finite number, received nan"),
        ({"minutes": float("inf")}, ValueError, r"--minutes must be a positive finite number, received inf"),
        ({"seed": -1}, ValueError, r"--seed must be non-negative, received -1"),
        ({"warmup": 0}, ValueError, r"--warmup must be positive, received 0"),
        ({"steps": "6"}, TypeError, r"--steps must be an int, received '6' of type str"),
    ],
    ids=["lr-nan", "minutes-inf", "seed-negative", "warmup-zero", "steps-string"],
)
def test_train_options_are_checked(tmp_path: Path, overrides: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tiny(tmp_path / "run", **overrides)
    assert not (tmp_path / "run").exists()


def test_resume_skips_a_damaged_newer_checkpoint_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train(tiny(out, steps=6, checkpoint_every=3))
    (out / "checkpoints" / "step-0000006" / "model.safetensors").unlink()
    resumed = train(tiny(out, steps=6, checkpoint_every=3, resume=True))
    assert [step for step, _ in resumed.losses] == list(range(1, 7))
    assert "resuming from step-0000003" in capsys.readouterr().err
    assert latest_checkpoint(out).name == "step-0000006"


def test_resume_follows_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    whole = train(tiny(tmp_path / "whole", dropout=0.1))
    train(tiny(tmp_path / "parts", dropout=0.1, steps=3))
    resumed = train(tiny(tmp_path / "parts", dropout=0.1, resume=True))
    assert [s for s, _ in resumed.losses] == [s for s, _ in whole.losses] == list(range(1, 7))
    np.testing.assert_allclose([x for _, x in resumed.losses], [x for _, x in whole.losses], atol=1e-6, rtol=0)
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, atol=1e-6, rtol=0)


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

    monkeypatch.setattr("multihead.app.training.save_checkpoint", dies_while_writing)
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


def test_sigint_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "multihead", "train", "--task", "reverse", "--out", str(out), "--steps", "100000",
               "--checkpoint-every", "5", "--no-progress", "--d-model", "16", "--heads", "2", "--layers", "1",
               "--d-ff", "32", "--batch-size", "8"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while latest_checkpoint(out) is None and time.monotonic() < deadline:  # training is under way
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=max(1, deadline - time.monotonic()))
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "checkpoint saved" in stderr
    checkpoint = latest_checkpoint(out)
    step = json.loads((checkpoint / "trainer.json").read_text())["step"]
    assert step >= 5
    assert checkpoint.name == f"step-{step:07d}"
    assert f"interrupted at step {step}: checkpoint saved" in stderr  # the interrupted step itself was saved


def test_translate_prints_and_plots(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "attention.png"
    assert main(["translate", str(trained), "21 November 2026", "4 July 1976", "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["translate", str(trained), "21 November 2026", "--beam", "3"]) == 0


def test_translation_exposes_every_layer_and_head(trained: Path) -> None:
    translation = Translator(trained).attention("21 Nov 2026")
    assert len(translation.cross_attention) == 1  # one decoder layer
    heads, rows, columns = translation.cross_attention[0].shape
    assert (heads, columns) == (2, len("21 Nov 2026"))
    assert rows == len(translation.target_tokens)
    np.testing.assert_allclose(translation.cross_attention[0].sum(-1), 1.0, atol=1e-5)


def test_unknown_characters_warn(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", str(trained), "21 Novémber 2026"]) == 0
    assert "warning: text 1: 'é' not in the training vocabulary, read as <unk>" in capsys.readouterr().err


# --- data-parallel ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str, weights: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_default_dtype(torch.float64)  # so that only the order of summation differs, at 1e-16
    result = train(TrainOptions(out=out, task="reverse", steps=4, checkpoint_every=4, **TINY))
    save_weights(result.model, weights)
    torch.distributed.destroy_process_group()


def test_two_processes_equal_one_on_the_same_global_batch(tmp_path: Path) -> None:
    weights = [str(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    context = torch.multiprocessing.get_context("spawn")
    port = _free_port()
    workers = [context.Process(target=_rank, args=(r, 2, port, str(tmp_path / "ddp"), weights[r])) for r in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    torch.set_default_dtype(torch.float64)
    try:
        single = train(TrainOptions(out=str(tmp_path / "single"), task="reverse", steps=4, checkpoint_every=4, **TINY))
    finally:
        torch.set_default_dtype(torch.float32)
    expected = {name: value.numpy() for name, value in single.model.state_dict().items()}
    ranks = [safetensors.numpy.load_file(path) for path in weights]
    for name, value in expected.items():
        assert ranks[0][name].dtype == np.float64
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
        np.testing.assert_allclose(ranks[0][name], value, atol=1e-9, rtol=0)
    assert latest_checkpoint(tmp_path / "ddp").name == "step-0000004"


# --- the command line's errors ---------------------------------------------------------------------------


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multihead", *args], capture_output=True, text=True, timeout=120)


def _damage(run: Path, tmp_path: Path, what: str) -> Path:
    """A copy of ``run`` with every checkpoint damaged (one damaged checkpoint would be skipped for an older one)."""
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for checkpoint in (copy / "checkpoints").glob("step-*"):
        if what == "shape":
            config = json.loads((checkpoint / "config.json").read_text())
            (checkpoint / "config.json").write_text(json.dumps({**config, "d_ff": 48}))
        else:
            (checkpoint / "model.safetensors").write_bytes(b"\x80\x04not ours")
    return copy


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unknown-task", "unknown task 'weather'"),
        ("missing-tsv", "does not exist"),
        ("malformed-tsv", "line 2: expected 'source<TAB>target'"),
        ("unwritable-out", "cannot write to output directory"),
        ("existing-run", "already holds a run; pass --resume"),
        ("not-a-run", "is not a multihead run"),
        ("wrong-shape", "has shape"),
        ("not-ours", "is not a readable safetensors weights file"),
    ],
)
def test_user_errors_are_one_line_with_status_2(case: str, message: str, trained: Path, tmp_path: Path) -> None:
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("a\tb\nno tab\n", encoding="utf-8")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    train_args = ["train", "--steps", "1", "--no-progress"]
    args = {
        "unknown-task": lambda: [*train_args, "--task", "weather", "--out", str(tmp_path / "x")],
        "missing-tsv": lambda: [*train_args, "--data", str(tmp_path / "absent.tsv"), "--out", str(tmp_path / "x")],
        "malformed-tsv": lambda: [*train_args, "--data", str(tsv), "--out", str(tmp_path / "x")],
        "unwritable-out": lambda: [*train_args, "--task", "copy", "--out", str(blocker / "run")],
        "existing-run": lambda: [*train_args, "--task", "dates", "--out", str(trained)],
        "not-a-run": lambda: ["translate", str(tmp_path), "21 May 2020"],
        "wrong-shape": lambda: ["translate", str(_damage(trained, tmp_path, "shape")), "21 May 2020"],
        "not-ours": lambda: ["translate", str(_damage(trained, tmp_path, "weights")), "21 May 2020"],
    }[case]()
    result = _run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("multihead: error: ")
    assert message in lines[0]
