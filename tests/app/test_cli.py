"""The `multihead` command line."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import multihead.app.training as training
from app.support import SMALL, SMALL_FLAGS, Cli, assert_refused, no_evaluation, snapshot, write_corpus, write_lines
from multihead import __version__
from multihead.app.cli import DEMO_EXAMPLES, DEMO_TIME, main
from multihead.app.runs import latest_checkpoint
from multihead.app.training import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]


def test_demo_trains_translates_and_plots(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dates"
    assert main(["demo", "--out", str(out), "--steps", "2", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("accuracy: ") and "(exact match on 1000 held-out examples)" in line for line in lines)
    translations = [line for line in lines if " -> " in line]
    assert [line.split(" -> ")[0].strip() for line in translations] == [repr(text) for text in DEMO_EXAMPLES]
    assert (out / "attention.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["demo", "--out", str(out), "--steps", "2", "--no-progress"]) == 0  # a second run resumes


def test_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "multihead.app.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == f"multihead {__version__}"


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def test_bench_options_reach_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []
    monkeypatch.setattr("multihead.app.bench.main", lambda argv: received.append(argv) or 0)
    assert main(["bench", "--out", "somewhere", "--cases", "paper-forward", "--repeats", "1"]) == 0
    assert received == [["--out", "somewhere", "--cases", "paper-forward", "--repeats", "1"]]


def test_bench_help_lists_the_benchmark_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--generation" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["translate", "score", "evaluate", "serve", "demo"])
def test_the_help_of_a_command_that_runs_a_model_speaks_of_that_command(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--threads`` and ``--device`` as they act here: not training's Keras frameworks, torchrun or resume."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "where the model runs: auto, cpu, cuda or cuda:N" in text
    for word in ("torchrun", "on resume", "--framework keras", "--init or --vocab-from", "--data file names"):
        assert word not in text, word


@pytest.mark.parametrize("kind", ["task", "corpus", "task-newest-damaged"])
def test_demo_refuses_a_run_of_something_else(
    kind: str, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "resume" a copy run, translate dates with it and write attention.png into it."""
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(training.Training, "evaluate", no_evaluation)
        what = {"data": write_corpus(tmp_path / "corpus"), "average": 0} if kind == "corpus" else {"task": "copy"}
        train(TrainOptions(out=str(out), steps=2, checkpoint_every=1, batch_size=4, **what, **SMALL))
    if kind == "task-newest-damaged":  # the older checkpoint says what the run is
        (out / "checkpoints" / "step-0000002" / "trainer.json").write_text("{", encoding="utf-8")
    monkeypatch.setattr(training, "make_trainer", lambda *args: pytest.fail("training started"))
    before = snapshot(out)
    result = cli("demo", "--out", out, "--steps", "2", "--no-progress")
    held = "a corpus" if kind == "corpus" else "task 'copy'"
    assert_refused(result, f"--out '{out}' holds a run of {held}, not the demo's dates; choose another --out")
    assert result.out == ""
    assert snapshot(out) == before


@pytest.mark.usefixtures("fast_evaluation")
@pytest.mark.parametrize("command", ["demo", "train"])
def test_ctrl_c_names_the_command_that_continues_and_it_says_it_resumes(
    command: str, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the first step: the command line it names parses and continues the run (``demo`` resumes its run
    by itself, and has no --resume), saying from which step."""
    out = tmp_path / "run"
    step = training.Training.step

    def step_then_ctrl_c(self: training.Training) -> None:
        step(self)
        if self.step_count == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(training.Training, "step", step_then_ctrl_c)
    flags = ["--task", "reverse", *SMALL_FLAGS, "--batch-size", "8"] if command == "train" else ["--no-progress"]
    interrupted = cli(command, "--out", out, "--steps", "3", *flags)
    assert interrupted.status == 130, interrupted.err
    hint = re.search(r"^interrupted at step 1: checkpoint saved in \S+; to continue, run: (.+)$", interrupted.err, re.M)
    assert hint, interrupted.err
    words = shlex.split(hint.group(1))
    assert words[:2] == ["multihead", command]
    continued = cli(*words[1:])
    assert continued.status == 0, continued.err
    assert f"resuming {out} from step 1 of 3 (step-0000001)" in continued.out_lines
    assert latest_checkpoint(out).name == "step-0000003"


def test_the_demo_takes_as_long_as_its_help_and_both_readmes_say(cli: Callable[..., Cli]) -> None:
    minutes = re.fullmatch(r"about (\d+) minutes on .+", DEMO_TIME)
    assert minutes, DEMO_TIME
    demo_help = cli("demo", "--help")
    assert DEMO_TIME in " ".join(demo_help.out.split())
    assert DEMO_TIME in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"大约 {minutes.group(1)} 分钟" in (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")


def test_options_may_come_before_between_or_after_the_positional_arguments(
    task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    expected = cli("translate", task_run, "abc", "cab").out
    for args in (
        ["translate", task_run, "--beam", "1", "abc", "cab"],
        ["translate", "--checkpoint", "latest", task_run, "abc", "--length-penalty", "0.6", "cab"],
        ["translate", task_run, "abc", "cab", "--beam", "1"],
    ):
        result = cli(*args)
        assert (result.status, result.out) == (0, expected), (args, result.err)
    src = write_lines(tmp_path / "src.txt", ["abc", "cab"])
    ref = write_lines(tmp_path / "ref.txt", ["cba", "bac"])
    result = cli("evaluate", "--beam", "2", task_run, src, "--checkpoint", "latest", ref)
    assert result.status == 0, result.err
    assert result.json()["beam"] == 2


def test_an_unknown_option_is_named_with_the_commands_help(task_run: Path, cli: Callable[..., Cli]) -> None:
    result = cli("translate", task_run, "abc", "--bogus")
    assert result.status == 2
    assert result.err_lines == [
        "multihead translate: error: unrecognized arguments: --bogus (see multihead translate --help)"
    ]


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A directory where this process may make no file: one made read-only, or, where that does not stop it (root),
    /sys (the kernel's, where no file can be made)."""
    directory = tmp_path / "read-only"
    directory.mkdir(mode=0o555)
    try:
        for candidate in (directory, Path("/sys")):
            try:
                tempfile.TemporaryFile(dir=candidate).close()
            except OSError:
                yield candidate
                return
        pytest.skip("no directory here refuses this process a new file")
    finally:
        directory.chmod(0o755)


@pytest.mark.parametrize(
    "args",
    [
        ["translate", "RUN", "abc", "--plot", "OUT/attention.png"],
        ["translate", "RUN", "abc", "--html", "OUT/attention.html"],
        ["translate", "RUN", "--input", "SRC", "--output", "OUT/translations.txt"],
        ["score", "RUN", "SRC", "SRC", "--output", "OUT/scores.txt"],
        ["evaluate", "RUN", "SRC", "SRC", "--output", "OUT/translations.txt"],
    ],
    ids=["translate-plot", "translate-html", "translate-output", "score-output", "evaluate-output"],
)
def test_an_output_in_a_directory_that_cannot_be_written_is_refused_before_the_model_loads(
    args: list[str], task_run: Path, unwritable: Path, tmp_path: Path, cli: Callable[..., Cli],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from multihead.app.translate import Translator

    monkeypatch.setattr(Translator, "__init__", lambda *args, **kwargs: pytest.fail("the model loaded"))
    source = write_lines(tmp_path / "source.txt", ["abc"])
    paths = {"RUN": str(task_run), "SRC": str(source)}
    args = [paths.get(arg, arg.replace("OUT", str(unwritable))) for arg in args]
    flag, target = args[-2:]
    assert_refused(cli(*args), f"{flag}: cannot write {target!r}: ")
