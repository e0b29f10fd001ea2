"""``multihead average RUN --last N | --checkpoints NAME... --out OUT``: a new run directory whose one checkpoint is
the mean of the chosen checkpoints' weights, read as any run; bad choices and an existing OUT refused in one line,
nothing written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import safetensors.numpy

from app.support import Cli, assert_refused, snapshot, write_lines
from multihead.app.translate import Translator

TEXTS = ["abc", "hello", "xyz"]


def test_average_writes_a_new_run_of_the_mean_weights_that_translates(
    task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    out = tmp_path / "averaged" / "run"  # its parent made too
    result = cli("average", task_run, "--last", "2", "--out", out)
    assert result.status == 0, result.err
    assert "step-0000002, step-0000004" in result.out
    steps = [safetensors.numpy.load_file(task_run / "checkpoints" / name / "model.safetensors")
             for name in ("step-0000002", "step-0000004")]  # fmt: skip
    averaged = safetensors.numpy.load_file(out / "checkpoints" / "average" / "model.safetensors")
    assert averaged.keys() == steps[0].keys()
    changed = 0
    for name, value in averaged.items():
        assert value.dtype == steps[0][name].dtype
        np.testing.assert_allclose(
            value, (steps[0][name].astype(np.float64) + steps[1][name]) / 2, rtol=1e-6, atol=1e-7
        )
        changed += not np.array_equal(steps[0][name], steps[1][name])
    assert changed  # the two checkpoints differ: the mean is neither
    assert (out / "latest").read_text(encoding="utf-8").strip() == "average"
    assert sorted(path.name for path in out.iterdir()) == ["checkpoints", "latest"]  # no temporary directory left
    assert not (out / "checkpoints" / "average" / "optimizer.safetensors").exists()
    trainer = json.loads((out / "checkpoints" / "average" / "trainer.json").read_text(encoding="utf-8"))
    assert trainer["averaged"] == {"run": str(task_run.resolve()), "checkpoints": ["step-0000002", "step-0000004"]}
    assert trainer["step"] == 4
    # A run like any other: translate, evaluate and score read it, by default and by name.
    translator = Translator(out)
    assert translator.checkpoint.path.name == "average"
    translated = cli("translate", out, *TEXTS)
    assert translated.status == 0, translated.err
    assert translated.out_lines == translator.translate(TEXTS) == Translator(out, "average").translate(TEXTS)
    src = write_lines(tmp_path / "src.txt", TEXTS)
    assert cli("evaluate", out, src, src).json()["checkpoint"] == "average"
    assert cli("score", out, src, src).status == 0
    # Named checkpoints give the same average.
    named = tmp_path / "named"
    assert cli("average", task_run, "--checkpoints", "4", "step-0000002", "--out", named).status == 0
    again = safetensors.numpy.load_file(named / "checkpoints" / "average" / "model.safetensors")
    assert all(np.array_equal(again[name], value) for name, value in averaged.items())


def test_average_refuses_bad_choices_and_an_existing_out_in_one_line(
    task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    for args, fragments in [
        (["--last", "1"], ["--last 1", "2 or more"]),
        (["--last", "3"], ["--last 3", "keeps 2", "step-0000002, step-0000004"]),
        (["--last", "0"], ["--last"]),
        (["--checkpoints", "step-2"], ["two or more"]),
        (["--checkpoints", "step-2", "step-3"], ["no checkpoint step-0000003", "step-0000002, step-0000004"]),
        (["--checkpoints", "2", "best"], ["step-N", "'best'"]),
        (["--checkpoints", "2", "step-0000002"], ["step-0000002 twice"]),
        (["--last", "2", "--checkpoints", "2", "4"], ["not allowed with"]),
        ([], ["--last", "--checkpoints", "required"]),
    ]:
        assert_refused(cli("average", task_run, *args, "--out", out), *fragments)
    assert_refused(cli("average", tmp_path / "nothing", "--last", "2", "--out", out), "does not exist")
    assert snapshot(tmp_path) == before  # nothing written
    # An existing OUT, a run or not, is never overwritten.
    for existing in (task_run, tmp_path):
        kept = snapshot(existing)
        assert_refused(cli("average", task_run, "--last", "2", "--out", existing), "exists", "--out")
        assert snapshot(existing) == kept


def test_training_says_how_many_checkpoints_it_averaged(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``--average 5`` with four step checkpoints kept: the average of those four, and said so."""
    from app.support import CORPUS_FLAGS, write_corpus

    data = write_corpus(tmp_path / "corpus")
    result = cli("train", "--data", *data, "--out", tmp_path / "run", "--steps", "4", *CORPUS_FLAGS, "--eval-every",
                 "4", "--checkpoint-every", "1", "--keep", "5", "--average", "5", "--no-progress")  # fmt: skip
    assert result.status == 0, result.err
    assert any(line.startswith("average of the last 4 checkpoints: BLEU") for line in result.out_lines), result.out
