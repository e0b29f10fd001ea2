"""Batch translation on Ray Data (``translate --ray``, :mod:`multihead.app.raydata`): on a local cluster of 2 CPU
actors, every shard's output is what ``translate --input SHARD`` prints, line for line; an actor killed while it
writes and a driver killed between shards both end with that output, no line lost or written twice; a user's own
pipeline gets :meth:`Translator.translate`'s translations; a shard ``translate`` would refuse is refused before any
work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray

from app.support import VALID, Cli, CorpusRun, assert_refused, beam, subprocess_env, write_lines
from multihead.app import raydata
from multihead.app.raydata import MANIFEST, TranslateBatches
from multihead.app.translate import Translator

SOURCES = [source for source, _ in VALID]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs in this process, which the command line run here connects to."""
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 << 20, log_to_driver=False)
    yield
    ray.shutdown()


def shards(folder: Path, lines: int = 0) -> list[Path]:
    """Three shards: one with blank lines, one gzipped, one with a line longer than the model reads; with ``lines``,
    each that many lines long besides."""
    folder.mkdir()
    many = [SOURCES[i % len(SOURCES)] for i in range(lines)]
    return [
        write_lines(folder / "a.de", [SOURCES[0], "", SOURCES[1], " ", SOURCES[2], *many]),
        write_lines(folder / "b.de.gz", [*SOURCES[3:9], *many]),
        write_lines(folder / "c.txt", [" ".join(SOURCES * 3), SOURCES[9], *many]),
    ]


def expected(cli: Callable[..., Cli], run: Path, inputs: list[Path], *flags: str) -> dict[str, str]:
    """What ``translate --input SHARD`` prints for each shard, by its name."""
    printed = {path.name: cli("translate", run, "--input", path, *flags) for path in inputs}
    assert all(result.status == 0 for result in printed.values()), printed
    return {name: result.out for name, result in printed.items()}


def recorded(folder: Path) -> dict[str, dict[str, object]]:
    """The shards the folder's manifest records as finished, by input (a JSON object a line after the first)."""
    lines = (folder / MANIFEST).read_text(encoding="utf-8").splitlines()
    return {entry["input"]: entry for entry in map(json.loads, lines[1:])}


def outputs(folder: Path) -> dict[str, str]:
    """The shards' translations in ``folder``, by name (a gzipped one decompressed)."""
    import gzip

    found = {}
    for path in sorted(folder.iterdir()):
        if path.name != MANIFEST and not path.name.startswith("."):
            data = path.read_bytes()
            found[path.name] = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    return found


@pytest.mark.parametrize(
    "flags",
    [[], ["--beam", "3", "--n-best", "2"], ["--sampling-topk", "4", "--seed", "7"]],
    ids=["greedy", "n-best", "sampling"],
)
def test_each_shard_is_translated_as_translate_translates_it(
    cluster: None, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], flags: list[str]
) -> None:
    """Greedy, n-best and sampled: each output shard holds what ``translate --input SHARD`` prints (a blank line for
    a blank one, a long line in pieces), under the shard's name (gzipped for a ``.gz`` one), and the manifest records
    each with its lines."""
    inputs, out = shards(tmp_path / "shards"), tmp_path / "out"
    result = cli("translate", corpus_run.path, "--input", tmp_path / "shards" / "*", "--output", out, "--ray",
                 "--actors", "2", *flags)  # fmt: skip
    assert result.status == 0, result.err
    assert outputs(out) == expected(cli, corpus_run.path, inputs, *flags)
    assert "translated 13 sentences (3 shards)" in result.err, result.err
    assert "on 2 actors" in result.err, result.err
    lines = {Path(name).name: entry["lines"] for name, entry in recorded(out).items()}
    assert lines == {"a.de": 5, "b.de.gz": 6, "c.txt": 2}
    again = cli("translate", corpus_run.path, "--input", tmp_path / "shards" / "*", "--output", out, "--ray", *flags)
    assert_refused(again, "holds a translation job", "--resume")


def test_a_job_goes_on_with_resume_only_under_the_same_options(
    cluster: None, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``--resume`` of a finished job translates nothing; with another search it is refused, naming the option."""
    shards(tmp_path / "shards")
    pattern, out = tmp_path / "shards" / "*", tmp_path / "out"
    assert cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray").status == 0
    done = outputs(out)
    again = cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray", "--resume")
    assert again.status == 0, again.err
    assert "every shard is in" in again.err, again.err
    assert outputs(out) == done
    other = cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray", "--resume", "--beam", "2")
    assert_refused(other, "other options (search)")


def test_a_shard_changed_or_whose_output_is_gone_is_translated_again_on_resume(
    cluster: None, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """``--resume`` after a shard changed, another's output was deleted and the manifest's last line was cut short (a
    driver killed as it wrote): those shards are translated again, each named in a warning, the others left as they
    were; the outputs are ``translate``'s."""
    inputs = shards(tmp_path / "shards")
    pattern, out = tmp_path / "shards" / "*", tmp_path / "out"
    assert cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray").status == 0
    write_lines(inputs[0], SOURCES[10:14])
    (out / inputs[1].name).unlink()
    kept = (out / inputs[2].name).stat().st_mtime_ns
    manifest = out / MANIFEST
    manifest.write_bytes(manifest.read_bytes() + b'{"input": "cut')
    again = cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray", "--resume")
    assert again.status == 0, again.err
    assert "1 shard translated already, 2 shards left" in again.err, again.err
    for path in inputs[:2]:
        assert f"--resume: {path} changed or its translation" in again.err, again.err
    assert (out / inputs[2].name).stat().st_mtime_ns == kept
    assert outputs(out) == expected(cli, corpus_run.path, inputs)
    assert len(recorded(out)) == len(inputs)


def test_a_shard_translate_refuses_is_refused_before_any_work(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not UTF-8, no match, shards that share a name, an output among the inputs, a TEXT beside them, a document: one
    line, exit 2, no folder made, no Ray started."""
    monkeypatch.setattr(raydata, "_connect", lambda address: pytest.fail(f"Ray started ({address})"))
    (tmp_path / "shards").mkdir()
    write_lines(tmp_path / "shards" / "good.de", SOURCES[:2])
    (tmp_path / "shards" / "bad.de").write_bytes(b"Ein Hund\n\xff\xfe l\xe4uft\n")
    out = tmp_path / "out"
    pattern = tmp_path / "shards" / "*"
    assert_refused(cli("translate", corpus_run.path, "--input", pattern, "--output", out, "--ray"),
                   "bad.de", "line 2 is not UTF-8")  # fmt: skip
    assert not out.exists()
    assert_refused(cli("translate", corpus_run.path, "--input", tmp_path / "none*", "--output", out, "--ray"),
                   "matches no file")  # fmt: skip
    (tmp_path / "more").mkdir()
    write_lines(tmp_path / "more" / "good.de", SOURCES[:1])
    assert_refused(cli("translate", corpus_run.path, "--input", tmp_path / "*" / "good.de", "--output", out, "--ray"),
                   "share the name 'good.de'")  # fmt: skip
    assert_refused(cli("translate", corpus_run.path, "--input", pattern, "--output", tmp_path / "shards", "--ray"),
                   "holds the shards")  # fmt: skip
    assert_refused(cli("translate", corpus_run.path, "hello", "--input", pattern, "--output", out, "--ray"), "TEXT")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "page.html").write_text("<p>Ein Hund.</p>", encoding="utf-8")
    assert_refused(cli("translate", corpus_run.path, "--input", tmp_path / "pages", "--output", out, "--ray"),
                   "page.html' is a html document")  # fmt: skip
    assert_refused(cli("translate", corpus_run.path, "hello", "--actors", "2"), "--actors 2 is for --ray")
    assert not out.exists()


def test_a_users_pipeline_gets_translate_s_translations(cluster: None, corpus_run: CorpusRun) -> None:
    """``TranslateBatches`` in a user's own ``map_batches`` over 2 actors: each text's translation as
    :meth:`Translator.translate` gives it, and with ``n_best`` its best few with their scores, as
    :meth:`Translator.scored_hypotheses` ranks them."""
    texts = [*SOURCES, "", SOURCES[0] + " " + SOURCES[1]]
    translator = Translator(corpus_run.path)
    dataset = ray.data.from_items([{"text": text} for text in texts])
    pool = {"compute": ray.data.ActorPoolStrategy(size=2), "num_cpus": 1, "batch_size": 5}
    rows = dataset.map_batches(TranslateBatches, fn_constructor_kwargs={"run": str(corpus_run.path)}, **pool)
    found = {row["text"]: row["translation"] for row in rows.take_all()}
    assert found == dict(zip(texts, translator.translate(texts), strict=True))
    search = beam(3, 2)
    kwargs = {"run": str(corpus_run.path), "search": search, "n_best": 2}
    made = dataset.map_batches(TranslateBatches, fn_constructor_kwargs=kwargs, **pool).take_all()
    ranked = {row["text"]: (list(row["translations"]), list(row["scores"])) for row in made}
    for text, best in zip(texts, translator.scored_hypotheses(texts, search), strict=True):
        assert ranked[text][0] == [hypothesis for _, hypothesis in best]
        assert ranked[text][1] == pytest.approx([score for score, _ in best])


def _job(run: Path, pattern: Path, out: Path, *flags: str) -> subprocess.Popen[str]:
    """``translate --ray`` in a process of its own (its own local cluster), in a new session (killed whole)."""
    command = [sys.executable, "-m", "multihead", "translate", str(run), "--input", str(pattern), "--output", str(out),
               "--ray", *flags]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
                            start_new_session=True)  # fmt: skip


def _wait(until: Callable[[], bool], job: subprocess.Popen[str], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert job.poll() is None, f"the job ended before {what}: {job.communicate()}"
        assert time.monotonic() < deadline, f"no {what} in {seconds} s"
        time.sleep(0.005)


def _actor_processes() -> list[int]:
    """The process ids of the running Ray Data actors that translate shards."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"TranslateShards" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # it ended meanwhile
            continue
    return found


def test_an_actor_killed_while_it_writes_is_restarted_and_its_shard_translated_whole(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """SIGKILL every actor once one is writing a shard: Ray restarts them and translates the shard again from its
    first line; the outputs are ``translate``'s, nothing unfinished is left in the folder."""
    inputs, out = shards(tmp_path / "shards", lines=1500), tmp_path / "out"
    job = _job(corpus_run.path, tmp_path / "shards" / "*", out, "--actors", "2")
    _wait(lambda: out.exists() and any(out.glob(".*.partial")), job, "shard being written")
    killed = _actor_processes()
    assert killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    assert outputs(out) == expected(cli, corpus_run.path, inputs)
    assert not any(out.glob(".*")), sorted(out.iterdir())
    assert not set(killed) & set(_actor_processes())


def test_a_driver_killed_then_resumed_ends_with_every_line_once(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """SIGKILL the driver (and its local cluster) once the manifest holds a shard, then ``--resume``: it translates
    only the shards left and the outputs are ``translate``'s."""
    inputs, out = shards(tmp_path / "shards", lines=1500), tmp_path / "out"
    job = _job(corpus_run.path, tmp_path / "shards" / "*", out, "--actors", "1")
    manifest = out / MANIFEST
    _wait(lambda: manifest.exists() and manifest.read_text(encoding="utf-8").count("\n") >= 2, job, "finished shard")
    os.killpg(job.pid, signal.SIGKILL)
    job.communicate()
    finished = len(recorded(out))
    assert finished < len(inputs)
    again = _job(corpus_run.path, tmp_path / "shards" / "*", out, "--resume")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"{finished} shard{'s' if finished > 1 else ''} translated already" in err, err
    assert outputs(out) == expected(cli, corpus_run.path, inputs)
    assert len(recorded(out)) == len(inputs)
