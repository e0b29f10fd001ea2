"""``--threads N`` on every command that runs a model: the process computes with N threads; a bad N is refused in
one line; without it, the cores other processes leave free."""

from __future__ import annotations

import importlib.util
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from app.support import SMALL_FLAGS, Cli, assert_refused, write_lines
from multihead.app import devices
from multihead.app.loaded import LoadedRun

DEFAULT = devices.default_threads  # the tests' package patches it away: these tests put it back

COMMANDS = ["train", "translate", "evaluate", "score", "serve"]


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The threads as the tests have them (one) before and after, none following the free cores after; TensorFlow's
    settings left as they were."""
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "_following", None)
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
    last = (1000 + round(100 * cores_taken), 5200)
    times = itertools.chain([(1000, 5000)], itertools.repeat(last))  # (busy, all) ticks of both cores
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


class Machine:
    """A 2-core machine as the threads' follower sees it: its clock, the cores' CPU time and this process's.
    ``run(seconds, ours, others)``: time passes while this process computes on ``ours`` cores, others on ``others``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now, self.own, self.busy, self.total = 100.0, 0.0, 0, 0
        monkeypatch.setattr(devices.os, "cpu_count", lambda: 2)
        monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        monkeypatch.setattr(devices, "_cpu_times", lambda: (self.busy, self.total))
        monkeypatch.setattr(devices.time, "process_time", lambda: self.own)
        monkeypatch.setattr(devices.time, "monotonic", lambda: self.now)

    def run(self, seconds: float, ours: float, others: float) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        self.now += seconds
        self.own += seconds * ours
        self.busy += round(seconds * (ours + others) * ticks)
        self.total += round(seconds * 2 * ticks)


@pytest.mark.usefixtures("threads")
def test_the_threads_follow_the_cores_a_neighbour_leaves_free_while_a_command_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = Machine(monkeypatch)
    torch.set_num_threads(2)
    follower = devices.FreeCores()
    seen = []
    for seconds, ours, others in [
        (0.5, 2.0, 0.0),  # quiet: no look before FOLLOW_EVERY, none needed after
        (0.6, 2.0, 0.0),
        (1.0, 1.85, 0.15),  # a light neighbour (0.3 of a core it would take alone): still a core each
        (1.0, 1.5, 0.5),  # a busy one arrives: it gets half the core it shares with one of our threads
        (1.0, 1.0, 1.0),  # with a thread fewer, its whole core
        (1.0, 1.0, 0.3),  # it rests for most of its core: not enough to take a thread back
        (1.0, 1.0, 0.2),  # it leaves more than three quarters of its core
        (1.0, 2.0, 0.0),
    ]:
        machine.run(seconds, ours, others)
        follower.fit()
        seen.append(torch.get_num_threads())
    assert seen == [2, 2, 2, 1, 1, 1, 2, 2]


@pytest.mark.usefixtures("threads")
def test_only_the_default_follows_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--threads N`` keeps N whatever the neighbours do; the default follows them; so does a resumed run's
    threads, but not a rank of several (they share the cores out among themselves)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "default_threads", lambda: 2)
    machine = Machine(monkeypatch)
    for given, world, after in [(2, "1", 2), (None, "2", 2), (None, "1", 1)]:
        monkeypatch.setenv("WORLD_SIZE", world)
        devices.choose_threads(given)
        assert torch.get_num_threads() == 2
        machine.run(1.0, 1.0, 1.0)
        devices.fit_threads()
        assert torch.get_num_threads() == after, (given, world)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("command", ["train", "translate", "evaluate", "score"])
def test_a_command_that_follows_the_free_cores_looks_between_its_batches_or_steps(
    command: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "default_threads", lambda: 2)
    looks: list[int] = []
    monkeypatch.setattr(devices.FreeCores, "fit", lambda self: looks.append(torch.get_num_threads()))
    lines = write_lines(tmp_path / "many.txt", [f"abc{'d' * (index % 7)}" for index in range(40)])
    monkeypatch.setattr(LoadedRun, "batch_tokens", property(lambda self: 16))  # batches of two or three lines
    argv = {"translate": ["translate", task_run, "--input", lines],
            "evaluate": ["evaluate", task_run, lines, lines],
            "score": ["score", task_run, lines, lines]}  # fmt: skip
    result = cli(*argv.get(command, arguments(command, task_run, tmp_path)))
    assert result.status in (0, None), result.err
    assert len(looks) >= (1 if command == "train" else 10)
    assert set(looks) == {2}  # each in the computing thread


def test_the_service_looks_at_the_free_cores_before_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from multihead.app.serve import worker
    from multihead.app.serve.jobs import Stop

    log: list[str] = []

    class Steps:
        count = 3

        def __len__(self) -> int:
            return self.count

        def step(self) -> None:
            self.count -= 1
            log.append("step")

        def waiting(self) -> bool:
            return False

        def shrink(self, pinned: object) -> None:
            pass

        def to_load(self, pinned: object) -> list[object]:
            return []

    monkeypatch.setattr(worker, "fit_threads", lambda: log.append("fit"))
    working = worker.Worker(Steps(), thread=False)  # type: ignore[arg-type]
    working.jobs.put(Stop())
    working.work()
    assert log == ["fit", "step"] * 3
