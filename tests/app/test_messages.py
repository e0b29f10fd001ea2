"""Messages in the user's words (issue 16, items 6 and 8): flags and values as typed, no names from the program, help
that shows defaults, a clean package namespace, and one error line under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import multihead
import multihead.app.training as training
from app.support import SMALL, Cli, assert_refused, no_evaluation, snapshot, subprocess_env, write_corpus
from multihead.app.cli import build_parser
from multihead.app.console import framework_notices_filtered
from multihead.app.training import FLAGS, TrainOptions, train

PROGRAM_WORDS = re.compile(r"_positive_int|_count|invalid \w+ value|`|d_model|num_heads|head_dim|max_len|\bsrc\b")


def assert_in_users_words(result: Cli, *fragments: str) -> None:
    assert_refused(result, *fragments)
    assert not PROGRAM_WORDS.search(result.err), result.err


@pytest.fixture(scope="module")
def reverse_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reverse") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(training.Training, "evaluate", no_evaluation)
        train(TrainOptions(out=str(out), task="reverse", steps=1, batch_size=4, **SMALL))
    return out


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "make_trainer", lambda *args: pytest.fail("training started"))


@pytest.mark.usefixtures("no_training")
def test_a_directory_given_as_data_is_called_a_directory(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    (tmp_path / "somedir").mkdir()
    result = cli("train", "--data", f"{tmp_path / 'somedir'}/", "--out", tmp_path / "run", "--steps", "1")
    assert_in_users_words(result, "--data: ", f"'{tmp_path / 'somedir'}' is a directory")
    assert "no such file" not in result.err.lower()


@pytest.mark.usefixtures("no_training")
@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--steps", "abc", "must be a positive whole number, received 'abc'"),
        ("--steps", "0", "must be a positive whole number, received 0"),
        ("--batch-tokens", "1.5", "must be a positive whole number, received '1.5'"),
        ("--patience", "-1", "must be a whole number (0 or more), received -1"),
        ("--seed", "x", "must be a whole number (0 or more), received 'x'"),
        ("--lr", "fast", "must be a number, received 'fast'"),
        ("--framework", "jax", "invalid choice: 'jax'"),
    ],
)
def test_a_bad_value_names_the_flag_and_the_value(
    flag: str, value: str, expected: str, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    result = cli("train", "--task", "copy", "--out", tmp_path / "run", "--steps", "1", flag, value)
    assert_refused(result, f"argument {flag}: {expected}", "(see multihead train --help)")
    assert "_positive_int" not in result.err
    assert "_count" not in result.err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("no_training")
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--d-model", "7", "--heads", "4"],
            ["--d-model must be divisible by --heads, received --d-model 7, --heads 4"],
        ),
        (["--dropout", "1.5"], ["--dropout must be in [0, 1), received 1.5"]),
        (["--label-smoothing", "1"], ["--label-smoothing must be in [0, 1), received 1.0"]),
        (["--lr", "0"], ["--lr must be a positive finite number, received 0.0"]),
        (["--minutes", "nan"], ["--minutes must be a positive finite number, received nan"]),
        (["--valid", "x.tsv"], ["--valid goes with --data"]),
    ],
)
def test_bad_combinations_are_named_by_their_flags(
    args: list[str], fragments: list[str], tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    result = cli("train", "--task", "copy", "--out", tmp_path / "run", "--steps", "1", *args)
    assert_in_users_words(result, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_input_longer_than_the_model_reads_is_counted_in_characters(reverse_run: Path, cli: Callable[..., Cli]) -> None:
    result = cli("translate", reverse_run, "abc", "a" * 400)
    assert_in_users_words(result, "text 2 is too long: 400 characters; this model reads at most ")
    assert result.out == ""


def test_unknown_characters_are_listed_each_on_its_own(reverse_run: Path, cli: Callable[..., Cli]) -> None:
    result = cli("translate", reverse_run, "abc", "ACT!")
    assert result.status == 0, result.err
    assert result.err_lines == ["warning: text 2: 'A', 'C', 'T', '!' not in the training vocabulary, read as <unk>"]
    assert len(result.out_lines) == 2


def _help(cli: Callable[..., Cli], *command: str) -> str:
    result = cli(*command, "--help")
    assert result.status == 0
    return " ".join(result.out.split())


def test_train_help_shows_the_defaults(cli: Callable[..., Cli]) -> None:
    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    helps = {flag: action.help for action in commands.choices["train"]._actions for flag in action.option_strings}
    no_default = {"--out", "--data", "--steps", "--minutes"}  # required, or none unless given
    for flag in set(FLAGS.values()) - no_default:
        assert "default" in helps[flag], (flag, helps[flag])
    text = _help(cli, "train")
    assert "--d-model D_MODEL default: 128 for a built-in task, 256 for --data" in text
    assert "--task NAME built-in task: dates, numbers, numbers-to-words, copy, reverse, sort (default: dates)" in text
    assert "--lr LR peak learning rate (default: 0.001 for a built-in task, 0.0015 for --data)" in text


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("demo", ["(default: runs/dates)", "(default: 1500)"]),
        ("translate", ["beam size (1: greedy) (default: 1)", "(default: 0.6)", "default: best if the run has one"]),
        ("evaluate", ["beam size (1: greedy) (default: 1)", "the last line of stdout is a JSON object"]),
    ],
)
def test_other_helps_show_their_defaults(command: str, shown: list[str], cli: Callable[..., Cli]) -> None:
    text = _help(cli, command)
    for fragment in shown:
        assert fragment in text


def test_bench_help_has_no_restructured_text(cli: Callable[..., Cli]) -> None:
    result = cli("bench", "--help")
    assert result.status == 0
    assert "--generation" in result.out
    assert "``" not in result.out
    assert not re.search(r":(?:class|func|mod|meth):`", result.out)


def test_the_package_namespace_is_clean() -> None:
    names = set(dir(multihead))
    assert {"__version__", "DTypeError"} <= names
    assert not names & {"PackageNotFoundError", "version", "metadata", "importlib"}
    assert multihead.__all__ == ["DTypeError", "__version__"]


# --- the entry points -------------------------------------------------------------------------------------


def test_torchrun_prints_a_user_error_once_and_the_ranks_exit_2(tmp_path: Path) -> None:
    """Rank 0 alone prints the error and exits 2; the other rank waits, and torchrun stops it (before, it could exit
    first and torchrun stopped rank 0 before it printed: no error line at all, about one run in twelve). torchrun
    itself still prints its ChildFailedError traceback and summary (each rank's exit code) and exits with status 1:
    that is torchrun's, and cannot be changed from inside the ranks."""
    out = tmp_path / "run"
    command = ["torchrun", "--nproc-per-node", "2", "-m", "multihead", "train", "--task", "weather", "--out", str(out),
               "--steps", "1", "--no-progress"]  # fmt: skip
    torchrun = Path(__import__("sys").executable).with_name("torchrun")
    result = subprocess.run(
        [str(torchrun), *command[1:]], capture_output=True, text=True, timeout=300, env=subprocess_env(),
        cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if line.startswith("multihead: error: ")]
    assert errors == [
        "multihead: error: --task: unknown task 'weather'; built-in tasks are dates, numbers, numbers-to-words, "
        "copy, reverse, sort (or use --data)"
    ], result.stderr
    assert result.returncode != 0
    root_cause = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", result.stderr, re.DOTALL)
    assert root_cause is not None, result.stderr
    assert root_cause.group(1) == "2", result.stderr
    # The other rank is stopped by torchrun (SIGTERM) while it waits.
    assert set(re.findall(r"exitcode\s*:\s*(-?\d+)", result.stderr)) <= {"2", "-15"}, result.stderr
    assert result.stdout == ""
    assert not out.exists()


@pytest.mark.usefixtures("no_training")
def test_user_errors_are_one_line_and_write_nothing(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    data = write_corpus(tmp_path / "corpus")
    before = snapshot(tmp_path)
    for args in (
        ["train", "--out", tmp_path / "run", "--steps", "1", "--data", *data, "--tokenizer", "subword", "--task", "x"],
        ["train", "--out", tmp_path / "run", "--steps", "1", "--data", *data, "--vocab-size", "0"],
        ["train", "--out", tmp_path / "run", "--data", *data],
    ):
        result = cli(*args)
        assert_refused(result)
        assert result.out == ""
    assert snapshot(tmp_path) == before


def test_framework_start_up_notices_are_filtered_and_nothing_else(capfd: pytest.CaptureFixture[str]) -> None:
    """TensorFlow prints its oneDNN notice from C++ at import, whatever TF_CPP_MIN_LOG_LEVEL says: the import runs
    inside a filter that drops those lines and lets everything else on the stderr file descriptor through."""
    notice = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795569751.816693    2692 port.cc:153] oneDNN custom operations are on. You may see slightly "
        "different numerical results due to floating-point round-off errors from different computation orders.\n"
    )
    with framework_notices_filtered():
        os.write(2, notice.encode())
        os.write(2, b"a real warning\n")
        print("on stdout")
    captured = capfd.readouterr()
    assert captured.err == "a real warning\n"
    assert captured.out == "on stdout\n"
