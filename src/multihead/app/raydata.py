"""Batch translation on Ray Data: a run loaded once per actor, translating the batches a user's own pipeline gives it
(:class:`TranslateBatches`), or the shards of a corpus, each written whole, once (:func:`translate_shards`, what
``multihead translate --ray`` runs).

A shard job: every input shard (a text file, plain or ``.gz``, one text a line) is translated by one actor as
``multihead translate --input SHARD`` translates it (its lines in length-sorted batches, a sampled line drawing as it
would there) into a file of the same name in the output folder, written beside it under a temporary name and renamed
when whole, so that a shard's output is either absent or complete. The driver alone writes the folder's manifest
(:class:`Manifest`, appended to as each shard finishes): the options that make the translations and each finished
shard. A job run again with ``--resume`` (after its driver or the whole cluster was killed) translates only the shards
the manifest does not hold; an actor that dies is restarted by Ray and its shard translated again from its first
line. No line is lost, none written twice.

Ray Data's actors come from its actor pool (``ActorPoolStrategy``): each takes ``threads`` CPUs (or one GPU) of the
cluster, which Ray restarts when they die and whose unfinished work it retries. An actor is given one shard at a
time, the next once it is done, so that no shard waits behind another while an actor is idle.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.console import UserError, plural, progress_bar, say, warn
from multihead.app.corpus import read_lines
from multihead.app.devices import use_threads
from multihead.app.runs import RunLock
from multihead.app.translate import TRANSLATION, Translator, translate_into
from multihead.decoding import SearchOptions

MANIFEST = "manifest.jsonl"
"""The output folder's record of the job: what makes its translations and the shards finished."""
Search = SearchOptions | Callable[[Translator], SearchOptions] | None
"""How an actor searches: these options, or those a function makes of the loaded run (``None``: the run's own, over
:data:`~multihead.app.translate.TRANSLATION`)."""


def _search_of(search: Search, translator: Translator) -> SearchOptions:
    if search is None:
        return dataclasses.replace(TRANSLATION, **translator.checkpoint.search)
    return search if isinstance(search, SearchOptions) else search(translator)


class TranslateBatches:
    """For ``Dataset.map_batches``: the run ``run`` loaded once per actor (``options``: :class:`Translator`'s keyword
    arguments: ``checkpoint``, ``device``, ``quantize``, ``source_lang``, ``target_lang``, ``glossary``...), computing
    with ``threads`` CPU threads (``None``: as many as Ray gives the actor); each batch's ``column`` translated into
    ``translation`` as :meth:`Translator.translate` translates it, searched as ``search`` says (:data:`Search`); with
    ``n_best``, each text's best few into ``translations`` (a list of texts, best first) and their ``scores``.

    A sampled text draws by its place in its batch (the same batch draws the same); everything else is translated as
    alone. ::

        ds.map_batches(TranslateBatches, fn_constructor_kwargs={"run": "runs/de-en"}, batch_size=512,
                       compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1)
    """

    def __init__(
        self,
        run: str | os.PathLike[str],
        *,
        search: Search = None,
        n_best: int | None = None,
        threads: int | None = None,
        column: str = "text",
        **options: Any,
    ) -> None:
        if threads is not None:
            use_threads(threads)
        self.translator = Translator(str(run), **options)
        self.search, self.n_best, self.column = _search_of(search, self.translator), n_best, column
        self.place = f"{socket.gethostname()}:{os.getpid()}"  # the actor, as summaries name it

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        texts = [str(text) for text in batch[self.column]]
        names = [f"text {i + 1} of a batch" for i in range(len(texts))]
        if self.n_best is None:
            batch["translation"] = np.array(self.translator.translate(texts, search=self.search, names=names),
                                            dtype=object)  # fmt: skip
            return batch
        found = self.translator.scored_hypotheses(texts, self.search, names=names)
        batch["translations"] = np.array([[text for _, text in best] for best in found], dtype=object)
        batch["scores"] = np.array([[score for score, _ in best] for best in found], dtype=object)
        return batch


class TranslateShards(TranslateBatches):
    """For ``Dataset.map_batches`` over rows of ``input`` and ``output`` paths: each input shard translated as
    ``multihead translate --input SHARD [--n-best N]`` writes it, into its output, whole (written under a temporary
    name beside it, then renamed; gzip-compressed where the output's name ends in ``.gz``). Each row gives back what
    its shard took: ``lines``, ``words`` (of the translations), the ``actor`` and its ``seconds``."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        done: dict[str, list[Any]] = {"input": [], "lines": [], "words": [], "actor": [], "seconds": []}
        for source, output in zip(batch["input"], batch["output"], strict=True):
            begin = time.perf_counter()
            texts = read_lines(source, "--input")
            names = [f"{source} line {number}" for number in range(1, len(texts) + 1)]
            target = Path(output)
            partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
            try:
                translate_into(partial, texts, names, self.translator, self.search, n_best=self.n_best,
                               progress=False)  # fmt: skip
                words = _words(partial)
                if target.suffix == ".gz":
                    _compress(partial)
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
            row = {"input": str(source), "lines": len(texts), "words": words, "actor": self.place,
                   "seconds": time.perf_counter() - begin}  # fmt: skip
            for name, value in row.items():
                done[name].append(value)
        return {name: np.array(values) for name, values in done.items()}


def _words(path: Path) -> int:
    with open(path, "rb") as file:
        return sum(len(line.split()) for line in file)


def _compress(path: Path) -> None:
    """``path`` gzip-compressed in place (through a second temporary file), made durable."""
    packed = path.with_name(path.name + ".gz")
    try:
        with open(path, "rb") as plain, gzip.open(packed, "wb") as out:
            shutil.copyfileobj(plain, out)
        with open(packed, "rb") as written:
            os.fsync(written.fileno())
        os.replace(packed, path)
    finally:
        packed.unlink(missing_ok=True)


@dataclass
class Manifest:
    """An output folder's record of its job, ``folder/manifest.jsonl``, one JSON object a line: first what makes the
    translations (``made_by``), then one a finished shard: its ``input``'s path, its ``output``'s name, ``lines``,
    ``words`` and the input's ``stamp`` (size and modification time) when it was translated (a later line for the same
    input replaces an earlier one). Each line is appended and made durable as its shard finishes, so that recording a
    shard costs the same however many came before; a line cut short by a kill is dropped when the job goes on."""

    folder: Path
    made_by: dict[str, Any]
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.folder / MANIFEST

    @classmethod
    def begin(cls, folder: Path, made_by: dict[str, Any], *, resume: bool) -> Manifest:
        """The folder's manifest: with ``resume``, the one there (refused where another job's), else a new one,
        refused where the folder holds a job's manifest already (``--resume`` continues it)."""
        made = cls(folder, json.loads(json.dumps(made_by)))
        if not made.path.exists():
            return made
        if not resume:
            raise UserError(f"--output {str(folder)!r} holds a translation job (its {MANIFEST}): add --resume to go on "
                            "with it, or choose another folder")  # fmt: skip
        data = made.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        try:
            recorded, *shards = [json.loads(line) for line in complete.decode("utf-8").splitlines()]
            made.shards = {shard["input"]: shard for shard in shards}
        except (ValueError, KeyError, TypeError):
            raise UserError(f"--resume: {str(made.path)!r} is not a manifest multihead wrote") from None
        if recorded != made.made_by:
            changed = sorted(key for key in recorded.keys() | made.made_by.keys()
                             if recorded.get(key) != made.made_by.get(key))  # fmt: skip
            raise UserError(f"--resume: the job in {str(folder)!r} was made with other options ({', '.join(changed)}); "
                            "give the same ones, or choose another folder")  # fmt: skip
        if len(complete) < len(data):
            made.path.write_bytes(complete)  # a line cut short goes
        return made

    def finished(self, source: Path, output: Path) -> bool:
        """Whether the shard ``source`` was translated into ``output`` and is unchanged since (a changed input or a
        missing output is translated again, with a warning)."""
        entry = self.shards.get(str(source))
        if entry is None:
            return False
        if entry["stamp"] != _stamp(source) or not output.exists():
            warn(f"--resume: {source} changed or its translation {output} is gone since it was translated: translating "
                 "it again")  # fmt: skip
            del self.shards[str(source)]
            return False
        return True

    def add(self, source: str, output: Path, lines: int, words: int) -> None:
        """Record the shard ``source`` as finished, durably (the manifest begun with its first shard)."""
        entry = {"input": source, "output": output.name, "lines": lines, "words": words, "stamp": _stamp(Path(source))}
        self.shards[source] = entry
        head = [] if self.path.exists() else [self.made_by]
        with open(self.path, "a", encoding="utf-8") as out:
            out.write("".join(json.dumps(line, sort_keys=True) + "\n" for line in [*head, entry]))
            out.flush()
            os.fsync(out.fileno())


def _stamp(path: Path) -> list[int]:
    """What says a file has not changed: its size and modification time (ns)."""
    found = path.stat()
    return [found.st_size, found.st_mtime_ns]


@dataclass(frozen=True)
class ShardJob:
    """A folder of shards to translate (``translate --ray``): the ``inputs`` into ``folder``, each by an actor of
    :class:`TranslateShards` made of ``run``, ``options``, ``search`` and ``n_best``; ``made_by``: what the manifest
    records of them (a job goes on with ``resume`` only under the same). On the Ray cluster at ``address`` (``None``: a
    new local one, or the one ``RAY_ADDRESS`` names; ``"auto"``: the running one), with ``actors`` actors (``None``:
    as many as the cluster's CPUs hold at ``threads`` each, or its GPUs where ``options`` put the model on CUDA)."""

    inputs: Sequence[Path]
    folder: Path
    run: str
    options: Mapping[str, Any]
    search: Search
    n_best: int | None
    made_by: Mapping[str, Any]
    address: str | None = None
    actors: int | None = None
    threads: int = 1
    resume: bool = False

    @property
    def on_gpu(self) -> bool:
        return str(self.options.get("device") or "").startswith("cuda")


@dataclass
class Tally:
    """What a job's actors translated: sentences, words and seconds of translation, per actor and in all."""

    lines: int = 0
    words: int = 0
    shards: int = 0
    actors: dict[str, list[float]] = field(default_factory=dict)  # actor -> [lines, words, seconds]

    def add(self, row: Mapping[str, Any]) -> None:
        self.lines += int(row["lines"])
        self.words += int(row["words"])
        self.shards += 1
        mine = self.actors.setdefault(str(row["actor"]), [0, 0, 0.0])
        for index, name in enumerate(("lines", "words", "seconds")):
            mine[index] += float(row[name])

    def text(self, seconds: float) -> str:
        """The summary: in all (over ``seconds`` of wall time), then each actor over its own time translating."""
        seconds = max(seconds, 1e-9)
        lines = [f"translated {plural(self.lines, 'sentence')} ({plural(self.shards, 'shard')}) in {seconds:.1f} s: "
                 f"{self.lines / seconds:.1f} sentences/s, {self.words / seconds:.0f} words/s on "
                 f"{plural(len(self.actors), 'actor')}"]  # fmt: skip
        for actor, (count, words, busy) in sorted(self.actors.items()):
            busy = max(busy, 1e-9)
            lines.append(f"  actor {actor}: {count:.0f} sentences in {busy:.1f} s, {count / busy:.1f} sentences/s, "
                         f"{words / busy:.0f} words/s")  # fmt: skip
        return "\n".join(lines)


def _pending(job: ShardJob, manifest: Manifest) -> tuple[list[tuple[Path, Path]], int]:
    """The shards ``manifest`` does not hold as finished, each with its output, and their lines: every one read
    first, so that one that ``translate`` would refuse (not UTF-8, a damaged gzip file) is refused before any work."""
    pending = [(source, job.folder / source.name) for source in job.inputs]
    pending = [(source, output) for source, output in pending if not manifest.finished(source, output)]
    return pending, sum(len(read_lines(source, "--input")) for source, _ in pending)


def translate_shards(job: ShardJob) -> Tally:
    """Run ``job``: its shards not yet finished translated on the Ray cluster, each recorded in the folder's manifest
    as its output is renamed into place; a progress bar in sentences and, at the end, the speed in all and per
    actor. The folder is locked while it runs."""
    made = not job.folder.exists()
    job.folder.mkdir(parents=True, exist_ok=True)
    lock = RunLock(job.folder, "--output")
    lock.acquire()
    try:
        manifest = Manifest.begin(job.folder, dict(job.made_by), resume=job.resume)
        try:
            pending, lines = _pending(job, manifest)
        except UserError:
            if made:  # nothing was done: no folder left behind
                lock.release()
                job.folder.rmdir()
            raise
        if len(pending) < len(job.inputs):
            say(f"resuming {job.folder}: {plural(len(job.inputs) - len(pending), 'shard')} translated already, "
                f"{plural(len(pending), 'shard')} left", sys.stderr)  # fmt: skip
        tally = Tally()
        _sweep(job.folder)  # what the actors of a job killed before left
        try:
            if pending:
                _run(job, pending, lines, manifest, tally)
                _sweep(job.folder)  # what actors killed during this one left (their shards translated again since)
        except KeyboardInterrupt:
            say(f"{plural(len(manifest.shards), 'shard')} of {len(job.inputs)} translated in {job.folder}; the same "
                "command with --resume translates the others", sys.stderr)  # fmt: skip
            raise
        return tally
    finally:
        lock.release()


def _sweep(folder: Path) -> None:
    """The unfinished outputs of actors that were killed (the folder is locked: no actor of another job writes)."""
    for partial in folder.glob(".*.partial"):
        partial.unlink(missing_ok=True)


def _run(job: ShardJob, pending: list[tuple[Path, Path]], lines: int, manifest: Manifest, tally: Tally) -> None:
    import ray

    ray_data = _connect(job.address)
    actors = job.actors or _actors(ray.cluster_resources(), job)
    say(f"translating {plural(len(pending), 'shard')} ({plural(lines, 'sentence')}) on {plural(actors, 'actor')} "
        f"of {'one GPU' if job.on_gpu else plural(job.threads, 'thread')} each", sys.stderr)  # fmt: skip
    rows = [{"input": str(source), "output": str(output)} for source, output in pending]
    resources = {"num_gpus": 1} if job.on_gpu else {"num_cpus": job.threads}
    shards = ray_data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        TranslateShards, batch_size=1, compute=ray_data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
        fn_constructor_kwargs={"run": job.run, "search": job.search, "n_best": job.n_best,
                               "threads": None if job.on_gpu else job.threads, **job.options},
        **resources,
    )  # fmt: skip
    outputs = dict(pending)
    bar = progress_bar(lines, unit="sentence")
    for row in shards.iter_rows():
        manifest.add(str(row["input"]), outputs[Path(str(row["input"]))], int(row["lines"]), int(row["words"]))
        tally.add(row)
        bar.update(int(row["lines"]))
    bar.close()


def _actors(resources: Mapping[str, float], job: ShardJob) -> int:
    """As many actors as the cluster holds: one a GPU, or one a ``threads`` CPUs."""
    if job.on_gpu:
        gpus = int(resources.get("GPU", 0))
        if not gpus:
            raise UserError("--device cuda: the Ray cluster has no GPU")
        return gpus
    return max(1, int(resources.get("CPU", 1)) // job.threads)


def _connect(address: str | None) -> Any:
    """``ray.data``, once connected to the cluster at ``address`` (see :class:`ShardJob`), its logs kept to warnings
    and its own progress bars off (the job draws one)."""
    import logging

    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    for name in ("ray", "ray.data"):  # Ray Data's logger is its own
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray.data
