"""Messages in the user's words: flags and values as typed, no names from the program, help
that shows defaults, a clean package namespace, and one error line under torchrun."""

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

import multihead
import multihead.app.options as options_module
import multihead.app.training as training
from app.support import (
    SMALL,
    Cli,
    assert_refused,
    damaged_run,
    garbage_optimizer,
    no_evaluation,
    snapshot,
    subprocess_env,
    trainer_without,
    undamaged,
    write_corpus,
)
from multihead.app.cli import build_parser, main
from multihead.app.console import UserError, framework_notices_filtered
from multihead.app.options import FLAGS, TrainOptions
from multihead.app.training import train

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
    assert result.status == 0, result.err
    assert len(result.out_lines) == 2
    assert re.fullmatch(
        r"warning: text 2: a sentence longer than this model reads \(400 characters, at most \d+\): cut to its "
        r"first \d+",
        result.err_lines[0],
    ), result.err
    assert not PROGRAM_WORDS.search(result.err), result.err


def test_unknown_characters_are_listed_each_on_its_own(reverse_run: Path, cli: Callable[..., Cli]) -> None:
    result = cli("translate", reverse_run, "abc", "ACT!")
    assert result.status == 0, result.err
    unknown = [line for line in result.err_lines if "may have lost or invented" not in line]  # the guard's doubts
    assert unknown == ["warning: text 2: 'A', 'C', 'T', '!' not in the model's vocabulary, read as <unk>"]
    assert len(result.out_lines) == 2


def _help(cli: Callable[..., Cli], *command: str) -> str:
    result = cli(*command, "--help")
    assert result.status == 0
    return " ".join(result.out.split())


def test_train_help_shows_the_defaults(cli: Callable[..., Cli]) -> None:
    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    helps = {flag: action.help for action in commands.choices["train"]._actions for flag in action.option_strings}
    no_default = {"--out", "--data", "--steps", "--minutes", "--resume", "--no-progress"}  # required, switches, or none
    for flag in set(FLAGS.values()) - no_default:
        assert "default" in helps[flag], (flag, helps[flag])
    text = _help(cli, "train")
    assert (
        "--d-model D_MODEL the model's width: embeddings and every layer's output (default: 128 for a built-in task, "
        "256 for --data (512 on a GPU))"
    ) in text
    assert "--task NAME built-in task: dates, numbers, numbers-to-words, copy, reverse, sort (default: dates)" in text
    assert "--lr LR peak learning rate (default: 0.001 for a built-in task, 0.0015 for --data (0.001 on a GPU))" in text
    assert "an optimizer step takes world size x --batch-tokens x --accumulate" in text
    assert "or the paper's base model on a GPU" in text


def test_every_train_option_is_explained(cli: Callable[..., Cli]) -> None:
    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    for action in commands.choices["train"]._actions:
        help_text = re.sub(r"\(?default:[^)]*\)?", "", action.help or "").strip()
        assert help_text, f"{action.option_strings} is not explained"
    text = _help(cli, "train")
    assert "--steps or --minutes is required" in text
    assert "KERAS_BACKEND" in text
    for flag, words in {"--heads": "attention heads", "--d-model": "width", "--d-ff": "feed-forward",
                        "--seed": "random seed", "--label-smoothing": "probability"}.items():  # fmt: skip
        assert re.search(rf"{flag} \S+ [^-]*{words}", text), flag


def test_every_command_says_what_it_does(cli: Callable[..., Cli]) -> None:
    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    for name, parser in commands.choices.items():
        if name != "bench":  # its own parser describes it
            assert len(parser.description or "") > 40, name
    assert "our attention against what users would pick instead" in _help(cli, "bench")


def test_evaluate_help_names_every_key_of_its_json(cli: Callable[..., Cli]) -> None:
    text = _help(cli, "evaluate")
    for key in ("bleu", "bleu_lowercase", "chrf", "signature", "sentences", "seconds", "beam", "checkpoint", "langs"):
        assert re.search(rf"\b{key}\b", text), key


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("demo", ["(default: runs/dates)", "(default: 1500)"]),
        (
            "translate",
            [
                "beam size, 1 to 64 (1: greedy) (default: 1;",
                "an imported model's num_beams",
                "(default: 0.6;",
                "default: best if the run has one",
            ],
        ),
        ("evaluate", ["beam size, 1 to 64 (1: greedy) (default: 1;", "the last line of stdout is a JSON object"]),
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


# --- usage errors and user errors: one line, status 2, nothing written ----------------------------------


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
        (["translate", "RUN", "abc", "--beam", "0"], "--beam"),
        (["translate", "RUN", "abc", "--beam", "100000"], "--beam"),
        (["translate", "RUN", "abc", "--length-penalty", "-3"], "--length-penalty"),
        (["evaluate", "RUN", "SRC", "REF", "--length-penalty", "nan"], "--length-penalty"),
        (["translate", "RUN", "abc", "--sampling-topk", "-1"], "--sampling-topk"),
        (["translate", "RUN", "abc", "--sampling-topk", "0", "--sampling-topp", "0"], "--sampling-topp"),
        (["translate", "RUN", "abc", "--sampling-topk", "0", "--sampling-topp", "1.5"], "--sampling-topp"),
        (["translate", "RUN", "abc", "--sampling-topk", "0", "--sampling-temperature", "0"], "--sampling-temperature"),
        (["translate", "RUN", "abc", "--sampling-topk", "0", "--sampling-temperature", "inf"], "temperature"),
        (["translate", "RUN", "abc", "--sampling-topk", "5", "--beam", "4"], "--beam"),
        (["evaluate", "RUN", "SRC", "REF", "--sampling-temperature", "0.5"], "--sampling-topk"),
        (["translate", "RUN", "abc", "--seed", "-1"], "--seed"),
        (["translate", "RUN", "abc", "--seed", "3"], "--seed 3 seeds sampling"),
        (["translate", "RUN", "abc", "--max-length", "0"], "--max-length"),
        (["translate", "RUN", "abc", "--min-length", "-1"], "--min-length"),
        (["evaluate", "RUN", "SRC", "REF", "--min-length", "9", "--max-length", "8"], "--min-length 9 is above"),
        (["serve", "RUN", "--beam", "2", "--sampling-topk", "3"], "--sampling-topk"),
        (["demo", "--steps", "0"], "--steps"),
    ],
    ids=[
        "no-out", "steps-zero", "steps-negative", "steps-word", "batch-size-zero", "framework-jax", "tokenizer-byte",
        "warmup-zero", "minutes-word", "task-and-data", "beam-zero", "beam-too-wide",
        "length-penalty-negative", "length-penalty-nan", "topk-negative", "topp-zero", "topp-above-one",
        "temperature-zero", "temperature-inf", "sampling-with-beams", "temperature-without-sampling", "seed-negative",
        "seed-without-sampling",
        "max-length-zero", "min-length-negative", "min-above-max", "serve-sampling-with-beams", "demo-steps-zero",
    ],
)  # fmt: skip
def test_cli_usage_errors(
    args: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training, "make_trainer", lambda options: pytest.fail("training started"))
    args = [str(tmp_path / a) if a in ("OUT", "RUN") else a for a in args]
    assert_usage_error(*run_main(args, capsys), option)
    assert list(tmp_path.iterdir()) == []


def test_cli_minutes_not_a_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--minutes nan`` would never reach its deadline: training without end."""
    monkeypatch.setattr(training, "make_trainer", lambda options: pytest.fail("training started with minutes=nan"))
    status, lines = run_main(["train", "--out", str(tmp_path / "run"), "--minutes", "nan", "--no-progress"], capsys)
    assert_one_line_error(status, lines, r"--minutes")


@pytest.mark.usefixtures("fast_evaluation")
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
    "resume-other-task": r"--task copy would change the run, which has --task reverse",
    "data-is-a-directory": r"data|no such file",
    "data-one-pair": r"at least two different sentence pairs",
}


@pytest.mark.usefixtures("fast_evaluation")
@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_cli_user_errors_are_one_line(
    case: str, short_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one.tsv").write_text("a\tb\na\tb\n")
    (tmp_path / "a-file").write_text("")
    steps = ["--steps", "1"]
    small = [*steps, "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--batch-size", "4"]
    resume = ["train", "--task", "reverse", "--resume", *small[2:], "--no-progress", "--steps", "3"]
    args = {
        "translate-missing-run": lambda: ["translate", str(tmp_path / "absent"), "abc"],
        "translate-run-is-a-file": lambda: ["translate", str(tmp_path / "a-file"), "abc"],
        "translate-empty-text": lambda: ["translate", str(short_run), ""],
        "translate-plot-missing-directory": lambda: [
            "translate", str(short_run), "abc", "--plot", str(tmp_path / "x/y"),
        ],
        "translate-plot-is-a-directory": lambda: ["translate", str(short_run), "abc", "--plot", str(tmp_path)],
        "translate-damaged-trainer": lambda: [
            "translate", str(damaged_run(short_run, tmp_path, trainer_without("options"))), "abc",
        ],
        "resume-damaged-optimizer": lambda: [
            *resume, "--out", str(damaged_run(short_run, tmp_path, garbage_optimizer)),
        ],
        "resume-other-task": lambda: [
            *resume[:2], "copy", *resume[3:], "--out", str(damaged_run(short_run, tmp_path, undamaged)),
        ],
        "data-is-a-directory": lambda: ["train", "--data", str(tmp_path), "--out", str(tmp_path / "r"), *steps],
        "data-one-pair": lambda: ["train", "--data", str(tmp_path / "one.tsv"), "--out", str(tmp_path / "r"), *steps],
    }[case]()  # fmt: skip
    assert_one_line_error(*run_main(args, capsys), USER_ERRORS[case])


def _entry_point(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("MULTIHEAD_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "multihead", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture
def entry_point_cases(short_run: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "usage-error": ["train", "--out", str(tmp_path / "new"), "--steps", "0"],
        "missing-run": ["translate", str(tmp_path / "absent"), "abc"],
        "damaged-trainer": ["translate", str(damaged_run(short_run, tmp_path, trainer_without("options"))), "abc"],
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


def run_cli(*args: str) -> subprocess.CompletedProcess:
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
def test_user_errors_are_one_line_with_status_2(case: str, message: str, dates_run: Path, tmp_path: Path) -> None:
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
        "existing-run": lambda: [*train_args, "--task", "dates", "--out", str(dates_run)],
        "not-a-run": lambda: ["translate", str(tmp_path), "21 May 2020"],
        "wrong-shape": lambda: ["translate", str(_damage(dates_run, tmp_path, "shape")), "21 May 2020"],
        "not-ours": lambda: ["translate", str(_damage(dates_run, tmp_path, "weights")), "21 May 2020"],
    }[case]()
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("multihead: error: ")
    assert message in lines[0]


def test_an_unknown_keras_backend_is_named_before_anything_is_written(tmp_path: Path) -> None:
    env = {**os.environ, "KERAS_BACKEND": "nonsense"}
    env.pop("MULTIHEAD_DEBUG", None)
    command = [sys.executable, "-m", "multihead", "train", "--framework", "keras", "--task", "dates", "--steps", "1",
               "--out", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "multihead: error: KERAS_BACKEND='nonsense' is not a backend --framework keras trains on: set it to "
        "tensorflow, jax or torch (unset: Keras' default, tensorflow)"
    ]
    assert not (tmp_path / "run").exists()


# --- a bug of ours is not the user's error ----------------------------------------------------------------


def test_an_internal_error_exits_1_and_says_it_is_a_bug(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A library ``ValueError`` reaching the command line (here forced: the options' reader fails) is reported as an
    internal error in one line, exit status 1, never as the user's (status 2); ``MULTIHEAD_DEBUG=1`` shows the
    traceback instead."""
    monkeypatch.delenv("MULTIHEAD_DEBUG", raising=False)

    def broken(*args: object) -> None:
        raise ValueError("an invariant of ours broke")

    monkeypatch.setattr(options_module, "search_options", broken)
    status, lines = run_main(["translate", str(tmp_path / "run"), "abc"], capsys)
    assert status == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("multihead: internal error"), lines
    assert "ValueError: an invariant of ours broke" in lines[0]
    assert "MULTIHEAD_DEBUG=1" in lines[0]
    assert "Traceback" not in lines[0]
    monkeypatch.setenv("MULTIHEAD_DEBUG", "1")
    with pytest.raises(ValueError, match="an invariant of ours broke"):
        main(["translate", str(tmp_path / "run"), "abc"])


def test_a_user_error_is_no_value_error() -> None:
    assert not issubclass(UserError, ValueError)


def test_a_closed_pipe_ends_quietly(dates_run: Path) -> None:
    """``multihead translate RUN ... | head``: the reader has gone before the output is written; no error message,
    the status of a tool killed by SIGPIPE."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("MULTIHEAD_DEBUG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "multihead", "translate", str(dates_run), *["21 November 2026"] * 50],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    process.stdout.close()  # the reader goes away at once
    _, err = process.communicate(timeout=120)
    assert err.decode() == ""
    assert process.returncode == 141
