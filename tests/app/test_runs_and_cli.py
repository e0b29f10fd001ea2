"""Run directories: damaged checkpoints, fallbacks, atomic checkpoints; the command line's user errors are one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import multihead.app.runs as runs
import multihead.app.training as train_module
import multihead.io as mio
from multihead.app.cli import main
from multihead.app.runs import RunError, latest_checkpoint
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator
from multihead.torch import Transformer

SMALL = dict(d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
TINY_RUN = dict(task="reverse", batch_size=4, d_model=16, num_heads=2, layers=1, d_ff=32, warmup=5, progress=False)


def model(**overrides: object) -> Transformer:
    torch.manual_seed(0)
    return Transformer(10, 12, **{**SMALL, **overrides}).eval()


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in module.state_dict().items()}


def assert_state_equal(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = module.state_dict()
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), f"{name} changed"


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for directories)."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))
    }


def header_of(data: bytes) -> tuple[int, str]:
    size = int.from_bytes(data[:8], "little")
    return size, data[8 : 8 + size].decode("utf-8")


def with_header(data: bytes, edit: Callable[[str], str]) -> bytes:
    """``data`` with its safetensors JSON header edited (the edit must keep the header's length)."""
    size, header = header_of(data)
    edited = edit(header).encode("utf-8")
    assert len(edited) == size
    return data[:8] + edited + data[8 + size :]


def flip(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0xFF
    return bytes(damaged)


# --- run directories: resume and translate from damaged checkpoints ---------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-step run (the held-out evaluation is skipped: only the files matter here)."""
    out = tmp_path_factory.mktemp("runs") / "reverse"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module.Training, "evaluate", lambda self, count: {"accuracy": 0.0, "examples": 0})
        train(TrainOptions(out=str(out), steps=2, checkpoint_every=2, **TINY_RUN))
    return out


@pytest.fixture
def fast_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train_module.Training, "evaluate", lambda self, count: {"accuracy": 0.0, "examples": 0})


def _trainer_without(key: str) -> Callable[[Path], None]:
    def damage(checkpoint: Path) -> None:
        trainer = json.loads((checkpoint / "trainer.json").read_text())
        del trainer[key]
        (checkpoint / "trainer.json").write_text(json.dumps(trainer))

    return damage


def _trainer_with(**changes: object) -> Callable[[Path], None]:
    def damage(checkpoint: Path) -> None:
        trainer = json.loads((checkpoint / "trainer.json").read_text())
        (checkpoint / "trainer.json").write_text(json.dumps({**trainer, **changes}))

    return damage


def _small_tokenizer(checkpoint: Path) -> None:
    tokenizer = {"kind": "char", "symbols": ["a", "b"]}
    (checkpoint / "tokenizer.json").write_text(json.dumps({"source": tokenizer, "target": tokenizer}))


RUN_DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "optimizer-garbage": (lambda c: (c / "optimizer.safetensors").write_bytes(b"not safetensors"), "optimizer"),
    "optimizer-cut": (lambda c: (c / "optimizer.safetensors").write_bytes(b"\x08" + bytes(7)), "optimizer"),
    "optimizer-missing": (lambda c: (c / "optimizer.safetensors").unlink(), "optimizer"),
    "model-cut": (lambda c: (c / "model.safetensors").write_bytes(b"\x08" + bytes(7)), "model.safetensors"),
    "model-missing": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors|checkpoint"),
    "trainer-without-optimizer": (_trainer_without("optimizer"), "trainer.json"),
    "trainer-without-options": (_trainer_without("options"), "trainer.json"),
    "trainer-without-step": (_trainer_without("step"), "trainer.json"),
    "trainer-step-string": (_trainer_with(step="two"), "trainer.json"),
    "tokenizer-not-the-models": (_small_tokenizer, "tokenizer"),
}


def undamaged(checkpoint: Path) -> None:
    """A copy of the run as it is."""


def damaged_run(run_dir: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    damage(latest_checkpoint(copy))
    return copy


@pytest.mark.usefixtures("fast_training")
@pytest.mark.parametrize("damage", list(RUN_DAMAGES))
def test_resume_from_a_damaged_checkpoint_is_refused_and_changes_nothing(
    run_dir: Path, tmp_path: Path, damage: str
) -> None:
    apply, message = RUN_DAMAGES[damage]
    out = damaged_run(run_dir, tmp_path, apply)
    before = snapshot(out)
    with pytest.raises(ValueError, match=message):  # RunError is a ValueError
        train(TrainOptions(out=str(out), steps=3, checkpoint_every=3, resume=True, **TINY_RUN))
    assert snapshot(out) == before


@pytest.mark.parametrize("damage", ["trainer-without-options", "tokenizer-not-the-models", "model-cut"])
def test_translate_from_a_damaged_checkpoint_is_refused(run_dir: Path, tmp_path: Path, damage: str) -> None:
    apply, message = RUN_DAMAGES[damage]
    out = damaged_run(run_dir, tmp_path, apply)
    with pytest.raises(ValueError, match=message):
        Translator(out).translate(["abc"])


def test_translate_needs_no_optimizer_state(run_dir: Path, tmp_path: Path) -> None:
    out = damaged_run(run_dir, tmp_path, RUN_DAMAGES["optimizer-garbage"][0])
    assert isinstance(Translator(out).translate(["abc"])[0], str)


def test_a_damaged_latest_pointer_falls_back_or_is_refused_by_name(run_dir: Path, tmp_path: Path) -> None:
    out = damaged_run(run_dir, tmp_path, undamaged)
    (out / "latest").write_bytes(b"\xff\xfe\x00step")
    try:
        translator = Translator(out)
    except ValueError as error:
        refusal = str(error)
    else:
        refusal = None
        assert isinstance(translator.translate(["abc"])[0], str)
    assert refusal is None or "latest" in refusal, refusal


def test_an_interrupted_checkpoint_rename_keeps_the_run_as_it_was(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = damaged_run(run_dir, tmp_path, undamaged)
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
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = damaged_run(run_dir, tmp_path, undamaged)
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


# --- the command line -------------------------------------------------------------------------------------


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Exit status and the non-empty stderr lines of ``multihead ARGS`` run in this process."""
    try:
        status = main(args)
    except SystemExit as exit_:
        status = exit_.code
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def assert_usage_error(status: int, lines: list[str], option: str) -> None:
    """argparse's refusal: exactly one ``error:`` line naming the option (``--help`` shows the usage)."""
    assert status == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("multihead"), lines
    assert "error:" in lines[0], lines
    assert "Traceback" not in lines[0]
    assert option in lines[0], lines[0]


def assert_one_line_error(status: int, lines: list[str], fragment: str) -> None:
    assert status == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("multihead: error: "), lines
    assert "Traceback" not in lines[0]
    assert re.search(fragment, lines[0]), lines[0]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["train", "--steps", "1"], "--out"),
        (["train", "--out", "OUT", "--steps", "0"], "--steps"),
        (["train", "--out", "OUT", "--steps", "-3"], "--steps"),
        (["train", "--out", "OUT", "--steps", "many"], "--steps"),
        (["train", "--out", "OUT", "--steps", "1", "--batch-size", "0"], "--batch-size"),
        (["train", "--out", "OUT", "--steps", "1", "--framework", "jax"], "--framework"),
        (["train", "--out", "OUT", "--steps", "1", "--tokenizer", "byte"], "--tokenizer"),
        (["train", "--out", "OUT", "--steps", "1", "--warmup", "0"], "--warmup"),
        (["train", "--out", "OUT", "--steps", "1", "--minutes", "soon"], "--minutes"),
        (["train", "--out", "OUT", "--steps", "1", "--task", "copy", "--data", "x.tsv"], "--data"),
        (["translate", "RUN"], "text"),
        (["translate", "RUN", "abc", "--beam", "0"], "--beam"),
        (["demo", "--steps", "0"], "--steps"),
    ],
    ids=[
        "no-out", "steps-zero", "steps-negative", "steps-word", "batch-size-zero", "framework-jax", "tokenizer-byte",
        "warmup-zero", "minutes-word", "task-and-data", "translate-no-text", "beam-zero", "demo-steps-zero",
    ],
)  # fmt: skip
def test_cli_usage_errors(
    args: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(train_module, "make_trainer", lambda options: pytest.fail("training started"))
    args = [str(tmp_path / a) if a in ("OUT", "RUN") else a for a in args]
    assert_usage_error(*run_main(args, capsys), option)
    assert list(tmp_path.iterdir()) == []


def test_cli_minutes_not_a_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--minutes nan`` would never reach its deadline: training without end."""
    monkeypatch.setattr(train_module, "make_trainer", lambda options: pytest.fail("training started with minutes=nan"))
    status, lines = run_main(["train", "--out", str(tmp_path / "run"), "--minutes", "nan", "--no-progress"], capsys)
    assert_one_line_error(status, lines, r"--minutes")


@pytest.mark.usefixtures("fast_training")
@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--lr", "-1"], r"--lr|learning rate"),
        (["--dropout", "1.5"], r"dropout"),
        (["--d-model", "16", "--heads", "3"], r"num_heads|--heads"),
        (["--minutes", "-1"], r"--minutes"),
    ],
    ids=["negative-lr", "dropout-above-one", "heads-do-not-divide", "negative-minutes"],
)
def test_cli_bad_hyperparameters_are_one_line_and_leave_no_run(
    options: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["train", "--task", "reverse", "--out", str(out), "--steps", "1", "--no-progress", *options]
    assert_one_line_error(*run_main(args, capsys), fragment)
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


USER_ERRORS = {  # case: what the one line must say
    "translate-missing-run": r"does not exist",
    "translate-run-is-a-file": r"is not a multihead run",
    "translate-empty-text": r"nothing to translate",
    "translate-plot-missing-directory": r"must be in an existing directory",
    "translate-plot-is-a-directory": r"plot|directory",
    "translate-damaged-trainer": r"trainer.json",
    "resume-damaged-optimizer": r"optimizer",
    "resume-other-task": r"--task copy would change the run, which has --task reverse",  # issue 16, item 3
    "data-is-a-directory": r"data|no such file",
    "data-one-source": r"at least two different source lines",
}


@pytest.mark.usefixtures("fast_training")
@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_cli_user_errors_are_one_line(
    case: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one.tsv").write_text("a\tb\na\tc\n")
    (tmp_path / "a-file").write_text("")
    steps = ["--steps", "1"]
    small = [*steps, "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--batch-size", "4"]
    resume = ["train", "--task", "reverse", "--resume", *small[2:], "--no-progress", "--steps", "3"]
    args = {
        "translate-missing-run": lambda: ["translate", str(tmp_path / "absent"), "abc"],
        "translate-run-is-a-file": lambda: ["translate", str(tmp_path / "a-file"), "abc"],
        "translate-empty-text": lambda: ["translate", str(run_dir), ""],
        "translate-plot-missing-directory": lambda: ["translate", str(run_dir), "abc", "--plot", str(tmp_path / "x/y")],
        "translate-plot-is-a-directory": lambda: ["translate", str(run_dir), "abc", "--plot", str(tmp_path)],
        "translate-damaged-trainer": lambda: [
            "translate", str(damaged_run(run_dir, tmp_path, _trainer_without("options"))), "abc",
        ],
        "resume-damaged-optimizer": lambda: [
            *resume, "--out", str(damaged_run(run_dir, tmp_path, RUN_DAMAGES["optimizer-garbage"][0])),
        ],
        "resume-other-task": lambda: [
            *resume[:2], "copy", *resume[3:], "--out", str(damaged_run(run_dir, tmp_path, undamaged)),
        ],
        "data-is-a-directory": lambda: ["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), *steps],
        "data-one-source": lambda: ["train", "--data", str(tmp_path / "one.tsv"), "--out", str(tmp_path / "r"), *steps],
    }[case]()  # fmt: skip
    assert_one_line_error(*run_main(args, capsys), USER_ERRORS[case])


def _entry_point(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("MULTIHEAD_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "multihead", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture
def entry_point_cases(run_dir: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "usage-error": ["train", "--out", str(tmp_path / "new"), "--steps", "0"],
        "missing-run": ["translate", str(tmp_path / "absent"), "abc"],
        "damaged-trainer": ["translate", str(damaged_run(run_dir, tmp_path, _trainer_without("options"))), "abc"],
    }


@pytest.mark.parametrize("case", ["usage-error", "missing-run", "damaged-trainer"])
def test_the_real_entry_point_reports_user_errors_without_a_traceback(
    case: str, entry_point_cases: dict[str, list[str]]
) -> None:
    result = _entry_point(*entry_point_cases[case])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    if case == "usage-error":
        assert_usage_error(result.returncode, lines, "--steps")
    else:
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("multihead: error: "), result.stderr
    assert result.stdout == ""


def test_run_error_is_a_value_error() -> None:
    assert issubclass(RunError, ValueError)
