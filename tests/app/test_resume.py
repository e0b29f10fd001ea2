"""``--resume``: it takes the corpus again only to continue training
and checks that it is the same (size and hash, wherever it now is); it refuses every option that would change the
model or the data, naming the flag, the run's value and the given value; the options that may change are listed in
``train --help``; a directory that does not exist is refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from app.support import (
    SMALL_FLAGS,
    TRAIN,
    VALID,
    Cli,
    CorpusRun,
    assert_refused,
    snapshot,
    subprocess_env,
    tiny,
    write_corpus,
)
from multihead.app.cli import build_parser
from multihead.app.options import FLAGS, RESUMABLE
from multihead.app.runs import latest_checkpoint, read_log
from multihead.app.training import train

pytestmark = pytest.mark.usefixtures("fast_evaluation")


def trainer_json(run: Path) -> dict:
    return json.loads((latest_checkpoint(run) / "trainer.json").read_text(encoding="utf-8"))


def corpus_again(directory: Path) -> list[str]:
    """The corpus run's --data and --valid, written again (the same bytes) into ``directory``."""
    return ["--data", *write_corpus(directory), "--valid", *write_corpus(directory, VALID, "valid")]


# --- the corpus, again ------------------------------------------------------------------------------------


def test_resume_reads_the_same_corpus_from_another_path(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = corpus_run.copy(tmp_path / "run")
    corpus = corpus_again(tmp_path / "moved")
    result = cli("train", "--resume", "--out", run, *corpus, "--steps", "124", "--no-progress")
    assert result.status == 0, result.err
    trainer = trainer_json(run)
    assert trainer["step"] == 124
    assert [step for step, _ in trainer["losses"]][-5:] == [120, 121, 122, 123, 124]
    assert trainer["options"]["data"] == corpus[1:3]  # where the corpus is now
    assert trainer["options"]["valid"] == corpus[4:6]


@pytest.mark.parametrize("which", ["--data", "--valid"])
@pytest.mark.parametrize("change", ["one-line", "gzipped"])
def test_resume_refuses_a_different_corpus(
    which: str, change: str, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = corpus_run.copy(tmp_path / "run")
    before = snapshot(run)
    corpus = corpus_again(tmp_path / "moved")
    pairs, name, at = (TRAIN, "train", 1) if which == "--data" else (VALID, "valid", 4)
    if change == "one-line":  # same line count, one word changed
        changed = write_corpus(tmp_path / "changed", [pairs[0], ("die Katze läuft.", "the cat runs."), *pairs[2:]])
    else:  # the same text, gzipped: other bytes
        changed = write_corpus(tmp_path / "changed", pairs, name, gz=True)
    corpus[at : at + 2] = changed
    result = cli("train", "--resume", "--out", run, *corpus, "--steps", "124", "--no-progress")
    assert_refused(result, f"{which} {' '.join(changed)} is not the corpus this run trained on")
    assert snapshot(run) == before


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        ([], ["trained on --data", "give --data again"]),
        (["--data", "TRAIN"], ["validated on --valid", "give --valid again"]),
        (["--data", "MISSING", "--valid", "VALID"], ["--data: ", "does not exist"]),
        (["--task", "copy"], ["--task copy would change the run", "trained on --data"]),
    ],
    ids=["no-data", "no-valid", "missing-data", "task"],
)
def test_resume_of_a_corpus_run_needs_its_corpus(
    args: list[str], fragments: list[str], corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = corpus_run.copy(tmp_path / "run")
    before = snapshot(run)
    corpus = corpus_again(tmp_path / "moved")
    paths = {"TRAIN": corpus[1:3], "VALID": corpus[4:6], "MISSING": [str(tmp_path / "absent.de"), corpus[2]]}
    args = [part for arg in args for part in paths.get(arg, [arg])]
    assert_refused(cli("train", "--resume", "--out", run, *args, "--steps", "124", "--no-progress"), *fragments)
    assert snapshot(run) == before


# --- options that would change the run, and those that may change ----------------------------------------


def _train_help_lists() -> tuple[list[str], list[str]]:
    """What ``train --help`` says --resume refuses, and what it says may change."""
    parser = build_parser()
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    text = " ".join(commands.choices["train"].format_help().split())
    refused = re.search(r"options that would change the model or the data \(([^)]*)\)", text).group(1)
    changing = re.search(r"These may change on resume: ([^.]*)\.", text).group(1)
    return refused.split(", "), changing.split(", ")


REFUSED, MAY_CHANGE = _train_help_lists()

# flag: (the value given, as typed; how the message shows the given value and the run's)
CHANGES = {
    "--task": (["--task", "copy"], ["--task copy", "--data"]),
    "--data": (["--data", "OTHER"], ["--data", "is not the corpus this run trained on"]),
    "--valid": (["--valid", "OTHER"], ["--valid", "is not the corpus this run trained on"]),
    "--tokenizer": (["--tokenizer", "word"], ["--tokenizer word", "--tokenizer subword"]),
    "--vocab-size": (["--vocab-size", "100"], ["--vocab-size 100", "--vocab-size 120"]),
    "--vocab-sample": (["--vocab-sample", "5"], ["--vocab-sample 5", "--vocab-sample 1000000"]),
    "--joint-vocab": (["--no-joint-vocab"], ["--no-joint-vocab would change the run, which has --joint-vocab:"]),
    "--vocab-from": (
        ["--vocab-from", "runs/other"],
        ["--vocab-from runs/other would change the run, which has no --vocab-from:"],
    ),
    "--init": (["--init", "runs/other"], ["--init runs/other would change the run, which has no --init:"]),
    "--d-model": (["--d-model", "32"], ["--d-model 32", "--d-model 16"]),
    "--heads": (["--heads", "4"], ["--heads 4", "--heads 2"]),
    "--layers": (["--layers", "2"], ["--layers 2", "--layers 1"]),
    "--d-ff": (["--d-ff", "64"], ["--d-ff 64", "--d-ff 32"]),
    "--dropout": (["--dropout", "0.1"], ["--dropout 0.1", "--dropout 0.0"]),
    "--framework": (["--framework", "keras"], ["--framework keras", "--framework torch"]),
    "--seed": (["--seed", "7"], ["--seed 7", "--seed 0"]),
    "--langs": (["--langs", "fr", "en"], ["--langs fr en", "--langs de en"]),
}


def test_help_says_what_resume_refuses_and_what_may_change() -> None:
    assert set(REFUSED) == set(CHANGES)
    assert [FLAGS[name] for name in RESUMABLE] == MAY_CHANGE
    parser = build_parser()
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    options = {
        flag
        for action in commands.choices["train"]._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag not in ("--no-joint-vocab", "--no-compile")
    }
    per_process = {"--out", "--resume", "--help", "--no-progress", "--threads"}  # never saved
    assert options == {*REFUSED, *MAY_CHANGE, *per_process}


@pytest.mark.parametrize("flag", list(CHANGES))
def test_resume_refuses_options_that_would_change_the_run(
    flag: str, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = corpus_run.copy(tmp_path / "run")
    before = snapshot(run)
    corpus = corpus_again(tmp_path / "moved")
    other = write_corpus(tmp_path / "other", TRAIN[:-1], "other")
    given, fragments = CHANGES[flag]
    given = [part for arg in given for part in (other if arg == "OTHER" else [arg])]
    if flag == "--data":
        corpus[0:3] = []
    elif flag == "--valid":
        corpus[3:6] = []
    elif flag == "--task":
        corpus = []
    result = cli("train", "--resume", "--out", run, *corpus, *given, "--steps", "124", "--no-progress")
    assert_refused(result, *fragments)
    if flag not in ("--data", "--valid", "--task"):
        assert "--resume continues a run as it was built; it may change only " + ", ".join(MAY_CHANGE) in result.err
    assert snapshot(run) == before


def test_resume_takes_the_options_that_may_change(task_run: Path, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    run = tmp_path / "run"
    shutil.copytree(task_run, run)
    changes = {
        "--steps": "6", "--minutes": "10", "--lr": "0.002", "--warmup": "3", "--clip": "0.5",
        "--label-smoothing": "0.2", "--batch-size": "8", "--batch-tokens": "300", "--eval-every": "3",
        "--eval-examples": "5", "--checkpoint-every": "3", "--keep": "3", "--average": "0", "--patience": "4",
        "--device": "cpu", "--precision": "bf16", "--accumulate": "2", "--log-every": "2",
    }  # fmt: skip
    assert {*changes, "--compile"} == set(MAY_CHANGE)  # --compile: its first step takes a minute on the CPU
    same = ["--task", "reverse", "--d-model", "16", "--heads", "2", "--seed", "0", "--framework", "torch"]
    args = [part for flag, value in changes.items() for part in (flag, value)]
    result = cli("train", "--resume", "--out", run, *args, *same, "--no-compile", "--no-progress")
    assert result.status == 0, result.err
    options = trainer_json(run)["options"]
    flags = {flag: name for name, flag in FLAGS.items()}
    for flag, value in changes.items():
        assert options[flags[flag]] == type(options[flags[flag]])(value), flag
    assert options["compile"] is False
    assert trainer_json(run)["step"] == 6
    assert trainer_json(run)["process"]["precision"] == "bf16"


def test_resume_keeps_the_log_interval_of_the_run(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``--log-every`` given to a run holds when it resumes without it, as every option that may change on resume."""
    out = tmp_path / "run"
    train(tiny(out, steps=3, log_every=2))
    result = cli("train", "--resume", "--out", out, "--steps", "6", "--no-progress")
    assert result.status == 0, result.err
    assert [entry["step"] for entry in read_log(out) if entry["event"] == "step"] == [2, 4, 6]
    assert trainer_json(out)["options"]["log_every"] == 2


def test_a_task_run_refuses_another_task_or_a_corpus(task_run: Path, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    before = snapshot(task_run)
    result = cli("train", "--resume", "--out", task_run, "--task", "copy", "--steps", "6", "--no-progress")
    assert_refused(result, "--task copy would change the run, which has --task reverse")
    data = write_corpus(tmp_path)
    result = cli("train", "--resume", "--out", task_run, "--data", *data, "--steps", "6", "--no-progress")
    assert_refused(result, "--data would change the run", "trained task 'reverse'")
    assert snapshot(task_run) == before


# --- a run that is not there -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_resume_of_a_directory_without_a_run_is_refused(where: str, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    out = tmp_path / "typo"
    if where == "empty":
        out.mkdir()
    result = cli("train", "--task", "copy", "--out", out, "--resume", "--steps", "2", *["--no-progress"])
    assert_refused(result, f"--resume: '{out}' {'does not exist' if where == 'missing' else 'holds no run'}")
    assert list(tmp_path.iterdir()) == ([out] if where == "empty" else [])
    if where == "empty":
        assert list(out.iterdir()) == []


# --- the same training, in parts ---------------------------------------------------------------------


def test_resume_follows_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    whole = train(tiny(tmp_path / "whole", dropout=0.1))
    train(tiny(tmp_path / "parts", dropout=0.1, steps=3))
    resumed = train(tiny(tmp_path / "parts", dropout=0.1, resume=True))
    assert [s for s, _ in resumed.losses] == [s for s, _ in whole.losses] == list(range(1, 7))
    np.testing.assert_allclose([x for _, x in resumed.losses], [x for _, x in whole.losses], atol=1e-6, rtol=0)
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, atol=1e-6, rtol=0)


# --- a Keras run on another backend ----------------------------------------------------------------------------


def _keras_train(out: Path, backend: str, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env(KERAS_BACKEND=backend)
    command = [sys.executable, "-m", "multihead", "train", "--framework", "keras", "--task", "reverse", "--out",
               str(out), *SMALL_FLAGS, "--batch-size", "4", "--warmup", "5", "--eval-every", "1000", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def test_a_keras_run_records_its_backend_and_a_change_is_named(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _keras_train(out, "torch", "--steps", "2")
    assert first.returncode == 0, first.stderr
    assert trainer_json(out)["process"]["keras_backend"] == "torch"
    again = _keras_train(out, "tensorflow", "--steps", "3", "--resume")
    assert again.returncode == 0, again.stderr
    assert (
        "warning: this run trained on the Keras backend torch; it goes on with tensorflow (KERAS_BACKEND): the same "
        "model, other numerics"
    ) in again.stderr.splitlines()
    assert trainer_json(out)["process"]["keras_backend"] == "tensorflow"
