"""``--threads N`` on every command that runs a model: the process computes with N threads; a bad N is refused in
one line; without it, the cores other processes leave free."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from app.support import SMALL_FLAGS, Cli, assert_refused, write_lines
from multihead.app import devices

DEFAULT = devices.default_threads  # the tests' package patches it away: these tests put it back

COMMANDS = ["train", "translate", "evaluate", "score", "serve"]


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The threads as the tests have them (one) before and after; TensorFlow's settings left as they were."""
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def arguments(command: str, run: Path, tmp_path: Path) -> list[object]:
    tmp_path.mkdir(exist_ok=True)
    texts = write_lines(tmp_path / "texts.txt", ["abc", "hello"])
    return {
        "train": ["train", "--task", "copy", "--steps", "1", "--batch-size", "4", "--eval-examples", "2", "--out",
                  tmp_path / "new", *SMALL_FLAGS],
        "translate": ["translate", run, "abc"],
        "evaluate": ["evaluate", run, texts, texts],
        "score": ["score", run, texts, texts],
        "serve": ["serve", run, "--port", "0"],
    }[command]  # fmt: skip


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("command", COMMANDS)
def test_threads_sets_the_threads_the_command_computes_with(
    command: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    if command == "serve":
        if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
            pytest.skip("needs the serve extra")
        import multihead.app.serve

        monkeypatch.setattr(multihead.app.serve, "serve", lambda *args, **kwargs: seen.append(torch.get_num_threads()))
    result = cli(*arguments(command, task_run, tmp_path), "--threads", "2")
    assert result.status in (0, None), result.err
    assert torch.get_num_threads() == 2
    if command == "serve":
        assert seen == [2]  # before it serves
    without = cli(*arguments(command, task_run, tmp_path / "again"), "--threads", "1")
    assert without.status in (0, None), without.err
    assert torch.get_num_threads() == 1


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_thread_count_is_refused_in_one_line(
    command: str, value: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    result = cli(*arguments(command, task_run, tmp_path), f"--threads={value}")
    assert_refused(result, "argument --threads: must be a positive whole number", value)
    assert torch.get_num_threads() == 1
    assert not (tmp_path / "new").exists()


def busy(monkeypatch: pytest.MonkeyPatch, cores_taken: float) -> None:
    """A 2-core machine whose other processes take ``cores_taken`` cores while the default watches."""
    monkeypatch.setattr(devices.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    times = iter([(1000, 5000), (1000 + round(100 * cores_taken), 5200)])  # (busy, all) ticks of both cores
    monkeypatch.setattr(devices, "_cpu_times", lambda: next(times))


@pytest.mark.parametrize(("cores_taken", "free"), [(0.0, 2), (0.05, 2), (0.4, 2), (0.6, 1), (1.0, 1), (2.0, 1)])
def test_the_default_is_the_cores_others_leave_free(
    cores_taken: float, free: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices.time, "sleep", lambda seconds: None)
    busy(monkeypatch, cores_taken)
    assert DEFAULT() == free


def test_the_default_leaves_omp_num_threads_and_unknown_machines_to_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert DEFAULT() is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(devices, "_cpu_times", lambda: None)
    assert DEFAULT() is None


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize(("cores_taken", "free"), [(0.0, 2), (1.0, 1)])
def test_a_command_without_threads_takes_the_free_cores(
    cores_taken: float, free: int, task_run: Path, tmp_path: Path, cli: Callable[..., Cli],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "default_threads", DEFAULT)
    busy(monkeypatch, cores_taken)
    result = cli(*arguments("translate", task_run, tmp_path))
    assert result.status == 0, result.err
    assert torch.get_num_threads() == free


@pytest.mark.usefixtures("threads")
def test_more_threads_than_cores_are_warned_about(task_run: Path, cli: Callable[..., Cli]) -> None:
    import os

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    result = cli("translate", task_run, "abc", "--threads", str(usable + 1))
    assert result.status == 0, result.err
    assert f"warning: --threads {usable + 1}: this process may use {usable} cores" in result.err
    quiet = cli("translate", task_run, "abc", "--threads", str(usable))
    assert "--threads" not in quiet.err


def test_the_demo_takes_the_free_cores(
    tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As every command that runs a model: on a busy machine the demo computes with the cores left free."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "default_threads", DEFAULT)
    busy(monkeypatch, 1.0)
    seen: list[int] = []
    monkeypatch.setattr("multihead.app.cli._demo", lambda args: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cli("demo", "--out", tmp_path / "demo").status == 0
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


@pytest.mark.usefixtures("threads")
def test_a_run_records_its_threads_and_resumes_with_them(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """The CPU threads change the float rounding, so a run's numbers: ``--resume`` takes the run's own again, and
    warns when ``--threads`` chooses others."""
    import json

    out = tmp_path / "run"
    train = ["train", "--task", "copy", "--batch-size", "4", "--eval-examples", "2", "--out", out, *SMALL_FLAGS]
    assert cli(*train, "--steps", "2", "--threads", "1").status == 0
    trainer = json.loads((out / "checkpoints" / "step-0000002" / "trainer.json").read_text())
    assert trainer["process"]["threads"] == 1
    torch.set_num_threads(2)  # what this machine would give it now
    resumed = cli("train", "--resume", "--out", out, "--steps", "3")
    assert resumed.status == 0, resumed.err
    assert "resuming with the 1 CPU thread the run trained with" in resumed.out + resumed.err
    assert torch.get_num_threads() == 1
    other = cli("train", "--resume", "--out", out, "--steps", "4", "--threads", "2")
    assert other.status == 0, other.err
    assert "this run trained with 1 CPU thread; with 2, its sums round otherwise" in other.err
