"""Run directories and their checkpoints: the one module that writes and reads the checkpoint format.

    runs/NAME/
      latest                       the name of the newest complete checkpoint
      best                         the checkpoint with the best validation BLEU (corpus runs)
      history.json, history.png    loss and validation scores over the run
      train.jsonl                  the training log, appended to by every process that trains the run: one JSON
                                   object a line, "event" "start" (step, resumed), "step" (every --log-every steps:
                                   loss, lr, tokens_per_s, elapsed, seconds) or "evaluation" (step, seconds and the
                                   evaluation's scores); see append_log
      attention.png                the cross-attention of the demo's first example (multihead demo)
      .lock                        while a process trains the run: its process id (see RunLock)
      checkpoints/step-0000500/    config.json (the architecture), generation.json (what generation reads besides
                                   the search: special ids, banned and forced tokens), model.safetensors,
                                   optimizer.safetensors, trainer.json, tokenizer.json (+ subwords.json for a subword
                                   vocabulary; an imported model's SentencePiece models and vocabularies),
                                   int8-*.safetensors (its int8 forms packed on one kind of CPU, written at the
                                   first --quantize int8 load there: see packed_forms)
      checkpoints/average/         the average of the last checkpoints' weights (``--average N``)

A run that ``multihead import`` wrote holds one checkpoint, ``step-0000000``, without optimizer state: the model
trained elsewhere, its tokenizers, and in ``trainer.json`` where it came from (``imported``). An int8 run
(``multihead export --format multihead --quantization int8``) holds one checkpoint of another run, without optimizer
state, its ``model.safetensors`` storing the matrices as int8 rows (:mod:`multihead.io`), and in ``trainer.json``
where it came from (``exported``).

A checkpoint is written into a hidden temporary directory, every file flushed to disk, then renamed into place in
one step (swapped in one step with an earlier checkpoint of the same name); only then does ``latest`` (itself
replaced atomically) point at it. A process killed at any moment leaves the previous checkpoint as the latest one;
leftover temporary directories are never read, and are removed by the next save. Only the newest ``keep`` step
checkpoints are kept, besides the one ``best`` names; older ones are renamed to temporary directories before they
are deleted.

A checkpoint is self-contained: translating needs nothing but it (never the training corpus).
:func:`open_checkpoint` reads one and, for ``latest``, falls back to the newest intact one when the newest is
damaged (truncated, corrupt or foreign files), warning once with the damaged file's name.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from numbers import Real
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from multihead.app.console import UserError, plural, warn
from multihead.app.encoded import EncodedCorpus, read_cache, write_cache
from multihead.app.tokenizers import Tokenizer, load_tokenizers, save_tokenizers
from multihead.config import MOVED_TO_GENERATION, TransformerConfig
from multihead.decoding import Generation, SearchOptions
from multihead.files import (
    atomic_write,
    atomic_write_text,
    fsync_directory,
    staging_directory,
    umask_mode,
    write_directory,
)
from multihead.io import FRAMEWORKS, read_weights, write_weights
from multihead.schema import tied

CHECKPOINTS, LATEST, BEST, AVERAGE = "checkpoints", "latest", "best", "average"
CONFIG, WEIGHTS, OPTIMIZER, TRAINER = "config.json", "model.safetensors", "optimizer.safetensors", "trainer.json"
GENERATION = "generation.json"
TOKENIZER = "tokenizer.json"
REQUIRED = (CONFIG, WEIGHTS, TOKENIZER, OPTIMIZER, TRAINER)  # what a step checkpoint holds, at least
HISTORY, HISTORY_PLOT, ATTENTION_PLOT = "history.json", "history.png", "attention.png"
TRAIN_LOG = "train.jsonl"
LOCK = ".lock"
ENCODED = "encoded"  # the encoded training corpus (multihead.app.encoded)
FORMAT = 2  # of trainer.json
STEP_NAME = re.compile(r"step-(\d{7,})")

Loaded = TypeVar("Loaded")


class RunError(UserError):
    """A run directory that cannot be used: not ours, damaged, or not writable."""


@dataclass
class Checkpoint:
    """What a checkpoint holds besides its weights and optimizer state (which the trainer or translator loads)."""

    path: Path
    config: TransformerConfig
    generation: Generation  # its search the default: each command chooses its own
    source: Tokenizer
    target: Tokenizer
    trainer: dict[str, Any]

    @property
    def step(self) -> int:
        return self.trainer["step"]

    @property
    def options(self) -> dict[str, Any]:
        return self.trainer["options"]

    @property
    def search(self) -> dict[str, Any]:
        """The search the run's commands make unless told otherwise, as :class:`~multihead.decoding.SearchOptions`
        values (an imported model's: Transformers' default search with its generation config); ``{}``: theirs."""
        return self.options.get("search") or {}


# --- one process at a time ----------------------------------------------------------------------------------


class RunLock:
    """One process at a time writes a run directory.

    :meth:`acquire` takes an advisory lock on ``RUN/.lock`` (the system releases it when the process ends, however
    it ends) and writes the process id into the file; :meth:`release` removes the file, then lets the lock go.
    Another process's :meth:`acquire` meanwhile is refused in one line naming the holder (and ``option``, the flag
    that chose the directory). A lock file whose lock is free was left by a process that could not remove it
    (killed): it is taken over, with a warning.
    """

    def __init__(self, out: Path, option: str = "--out") -> None:
        self.path, self.option = out / LOCK, option
        self.handle: Any = None

    def acquire(self) -> None:
        while self.handle is None:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise RunError(
                    f"{str(self.path.parent)!r} is in use by another multihead process (pid {holder}); wait for it to "
                    f"end, or choose another {self.option}"
                ) from None
            if not self.path.exists() or os.stat(self.path).st_ino != os.fstat(handle.fileno()).st_ino:
                handle.close()  # its holder removed it as we opened it: lock the file there now
                continue
            handle.seek(0)
            left = handle.read().strip()
            if left:
                warn(f"{str(self.path.parent)!r} was locked by process {left}, which ended without unlocking it: "
                     "taking it over")  # fmt: skip
            handle.seek(0)
            handle.truncate()
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            self.handle = handle

    def release(self) -> None:
        if self.handle is not None:
            self.path.unlink(missing_ok=True)  # while still holding it: nobody can lock the removed file after us
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


# --- writing ----------------------------------------------------------------------------------------------


def check_writable(out: Path) -> None:
    try:
        (out / CHECKPOINTS).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as error:
        raise RunError(f"cannot write to output directory {str(out)!r}: {error.strerror or error}") from None


def write_json(values: Any) -> Callable[[Path], object]:
    return lambda path: path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def save_checkpoint(
    out: Path,
    name: str,
    writers: Mapping[str, Callable[[Path], object]],
    *,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``name`` (``step-N`` or ``average``): ``writers`` maps each file name to a function writing
    that file at the given path; ``tokenizers`` adds their files. ``latest`` then names a new step checkpoint."""
    root = out / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)

    def fill(staging: Path) -> None:
        for file_name, write in writers.items():
            write(staging / file_name)
        if tokenizers is not None:
            save_tokenizers(*tokenizers, staging)

    final = root / name
    write_directory(final, fill, prefix=f".tmp-{name}-")  # a checkpoint of the same name is replaced whole
    if STEP_NAME.fullmatch(name):
        point(out, LATEST, final.name)
        _rotate(out, keep)
    return final


def trainer_record(
    *,
    framework: str,
    process: dict[str, Any],
    step: int,
    options: dict[str, Any],
    optimizer: dict[str, Any],
    data: dict[str, Any],
    seconds: float,
    tokens: int,
    history: dict[str, list],
) -> dict[str, Any]:
    """A checkpoint's ``trainer.json``: what trained it (the framework, and ``process``: the device, precision, world
    size, Keras' backend), how far, its options, optimizer and data facts, and the history (``losses`` and
    ``evals``) up to it."""
    return {
        "format": FORMAT, "framework": framework, "process": process, "step": step, "options": options,
        "optimizer": optimizer, "data": data, "seconds": round(seconds, 3), "tokens": tokens, **history,
    }  # fmt: skip


def model_writers(config: TransformerConfig, generation: Generation) -> dict[str, Callable[[Path], object]]:
    """The files that describe a checkpoint's model: its architecture, and what generation reads besides the search
    (which each command chooses)."""
    stored = {name: value for name, value in generation.to_dict().items() if name != "search"}
    return {
        CONFIG: lambda path: path.write_text(config.to_json() + "\n", encoding="utf-8"),
        GENERATION: write_json(stored),
    }


def save_step(
    out: Path,
    step: int,
    *,
    config: TransformerConfig,
    generation: Generation,
    write_weights: Callable[[Path], None],
    write_optimizer: Callable[[Path], dict[str, Any]],
    record: Callable[[dict[str, Any]], dict[str, Any]],
    tokenizers: tuple[Tokenizer, Tokenizer],
    keep: int,
) -> Path:
    """Write the checkpoint of ``step``: the model's config and generation spec, its weights, the optimizer state
    (``write_optimizer``
    returns what ``trainer.json`` keeps of it) and ``trainer.json``, ``record`` of that."""
    kept: dict[str, Any] = {}

    def optimizer(path: Path) -> None:
        kept.update(write_optimizer(path))

    writers = {
        **model_writers(config, generation),
        WEIGHTS: write_weights,
        OPTIMIZER: optimizer,
        TRAINER: lambda path: write_json(record(kept))(path),  # after the optimizer, whose record it holds
    }
    return save_checkpoint(out, checkpoint_name(step), writers, tokenizers=tokenizers, keep=keep)


def save_average(out: Path, count: int, tokenizers: tuple[Tokenizer, Tokenizer]) -> tuple[Path, int] | None:
    """Average the weights of the last ``count`` step checkpoints (fewer where fewer are kept) into
    ``checkpoints/average`` (with the newest one's config and ``trainer.json``): it, and how many were averaged;
    ``None`` when there are fewer than two."""
    kept = _step_checkpoints(out)[-count:]
    if len(kept) < 2:
        return None
    return save_checkpoint(out, AVERAGE, _average_writers(kept), tokenizers=tokenizers), len(kept)


def _mean_weights(paths: Sequence[Path]) -> dict[str, np.ndarray]:
    """The mean of the weights files ``paths``, tensor by tensor (in the newest one's dtypes), read one file at a time:
    a sum and one file in memory, not every file at once. Added in order and divided once, as ``np.mean`` over the
    stacked files would; a ``ValueError`` where their shapes differ."""
    total: dict[str, np.ndarray] = {}
    for path in paths:
        weights = read_weights(path)
        if total and weights.keys() != total.keys():
            raise ValueError(f"{str(path)!r} holds other tensors than {str(paths[0])!r}")
        for name, value in weights.items():
            if name not in total:
                total[name] = value.astype(np.result_type(value.dtype, np.float32))  # a copy, summed into
            elif value.shape != total[name].shape:
                raise ValueError(f"{name} of {str(path)!r} is {value.shape}, not {total[name].shape} as before")
            else:
                total[name] += value
    for name, value in weights.items():
        total[name] /= len(paths)  # in place: no second copy of the model
        total[name] = total[name].astype(value.dtype, copy=False)
    return total


def _average_writers(
    kept: Sequence[Path], trainer: dict[str, Any] | None = None
) -> dict[str, Callable[[Path], object]]:
    """What an average checkpoint of ``kept`` holds: the mean of their weights, tensor by tensor, the newest one's
    config, and its ``trainer.json`` (or ``trainer``)."""
    averaged = _mean_weights([path / WEIGHTS for path in kept])
    writers = _described_by(kept[-1], trainer)
    tied_names = tied(read_checkpoint(kept[-1]).config)
    writers[WEIGHTS] = lambda path: write_weights(averaged, path, tied=tied_names)
    return writers


def _described_by(checkpoint: Path, trainer: dict[str, Any] | None) -> dict[str, Callable[[Path], object]]:
    """The files of ``checkpoint`` that describe its model, copied: its config, generation spec, and ``trainer.json``
    (or ``trainer``)."""

    def copied(name: str) -> Callable[[Path], object]:
        return lambda path: path.write_bytes((checkpoint / name).read_bytes())

    writers = {CONFIG: copied(CONFIG), TRAINER: copied(TRAINER) if trainer is None else write_json(trainer)}
    if (checkpoint / GENERATION).is_file():  # a checkpoint older versions wrote has none (see read_checkpoint)
        writers[GENERATION] = copied(GENERATION)
    return writers


def averaged_checkpoints(run: Path, *, last: int | None = None, names: Sequence[str] | None = None) -> list[Path]:
    """The step checkpoints of ``run`` that ``multihead average`` averages, oldest first: the ``last`` newest, or
    those ``names`` names (``step-N`` or ``N``); at least two, each once. Refused in one line otherwise."""
    check_run(run)
    kept = _step_checkpoints(run)
    listed = ", ".join(path.name for path in kept) or "none"
    if last is not None:
        if last < 2:
            raise RunError(f"--last {last} averages nothing: give 2 or more")
        if last > len(kept):
            raise RunError(f"--last {last}: {str(run)!r} keeps {plural(len(kept), 'step checkpoint')} ({listed})")
        return kept[-last:]
    chosen: list[Path] = []
    for name in names or ():
        digits = name.removeprefix("step-")
        if not digits.isdigit():
            raise RunError(f"--checkpoints takes step-N names, received {name!r} ({str(run)!r} keeps: {listed})")
        path = _named_checkpoint(run, digits)
        if path in chosen:
            raise RunError(f"--checkpoints names {path.name} twice")
        chosen.append(path)
    if len(chosen) < 2:
        raise RunError(f"--checkpoints needs two or more checkpoints to average ({str(run)!r} keeps: {listed})")
    return sorted(chosen)


def save_average_run(run: Path, kept: Sequence[Path], out: Path) -> Path:
    """Write a new run directory ``out`` whose one checkpoint, ``checkpoints/average`` (which ``latest`` names), is
    the average of the checkpoints ``kept`` of ``run``, with the newest one's config and tokenizers, and its
    ``trainer.json`` plus what was averaged (``averaged``); no optimizer state (nothing to resume). Every checkpoint
    is read and checked first (one model, intact files); ``out`` must not exist, and appears whole or not at all."""
    check_new_run(out, "--out", "average")
    checkpoints = [read_checkpoint(path) for path in kept]
    newest = checkpoints[-1]
    for checkpoint in checkpoints[:-1]:
        if checkpoint.config != newest.config:
            raise RunError(
                f"{checkpoint.path.name} and {newest.path.name} of {str(run)!r} are different models (their "
                f"{CONFIG} differ): they cannot be averaged"
            )
    averaged = {"run": str(run.resolve()), "checkpoints": [path.name for path in kept]}
    try:
        writers = _average_writers(kept, {**newest.trainer, "averaged": averaged})
    except ValueError as error:  # a weights file that is not one
        raise RunError(str(error)) from None

    def fill(staging: Path) -> None:
        save_checkpoint(staging, AVERAGE, writers, tokenizers=(newest.source, newest.target))
        point(staging, LATEST, AVERAGE)

    return _new_run(out, fill)


def save_int8_run(run: Path, checkpoint: Checkpoint, weights: Mapping[str, np.ndarray], out: Path) -> Path:
    """Write a new run directory ``out`` whose one checkpoint, of ``checkpoint``'s name (which ``latest`` names), is
    ``checkpoint`` (of ``run``, its ``weights`` as read) with its matrices stored as int8 rows
    (:func:`multihead.io.write_weights`: about a quarter of the size), its config, generation spec and tokenizers,
    and its ``trainer.json`` plus where it came from (``exported``); no optimizer state (nothing to resume), no packed
    forms (made at the first load on each kind of CPU). ``out`` must not exist, and appears whole or not at all."""
    check_new_run(out, "OUT", "export")
    name = checkpoint.path.name
    exported = {"run": str(run.resolve()), "checkpoint": name, "quantization": "int8"}
    writers = _described_by(checkpoint.path, {**checkpoint.trainer, "exported": exported})
    writers[WEIGHTS] = lambda path: write_weights(weights, path, tied=tied(checkpoint.config), int8=True)

    def fill(staging: Path) -> None:
        save_checkpoint(staging, name, writers, tokenizers=(checkpoint.source, checkpoint.target))
        point(staging, LATEST, name)

    return _new_run(out, fill)


def save_imported_run(
    out: Path,
    *,
    config: TransformerConfig,
    generation: Generation,
    weights: Mapping[str, np.ndarray],
    tokenizers: tuple[Tokenizer, Tokenizer],
    options: dict[str, Any],
    record: dict[str, Any],
) -> Path:
    """Write a new run directory ``out`` for a model trained elsewhere (``multihead import``): its one checkpoint,
    ``step-0000000`` (which ``latest`` names), holds ``config``, ``generation``, ``weights`` (by our names, stored as
    float32), ``tokenizers`` and a ``trainer.json`` of step 0 with ``options`` (``task``, ``data``, ``tokenizer``,
    ``langs``...), no history, and ``record`` as ``imported`` (where the model came from, its own config); no optimizer
    state (nothing to resume). ``out`` must not exist, and appears whole or not at all."""
    check_new_run(out, "RUN", "import")
    tensors = {name: np.asarray(array, dtype=np.float32) for name, array in weights.items()}
    trainer = trainer_record(
        framework="torch", process={}, step=0, options=options, optimizer={}, data={}, seconds=0.0, tokens=0,
        history={"losses": [], "evals": []},
    )  # fmt: skip
    writers = {
        **model_writers(config, generation),
        WEIGHTS: lambda path: write_weights(tensors, path, tied=tied(config)),
        TRAINER: write_json({**trainer, "imported": record}),
    }
    return _new_run(out, lambda staging: save_checkpoint(staging, checkpoint_name(0), writers, tokenizers=tokenizers))


def check_new_run(out: Path, name: str, command: str) -> None:
    """``out`` (given as ``name``) does not exist, as a run that ``command`` writes must not."""
    if out.exists() or out.is_symlink():
        raise RunError(f"{name} {str(out)!r} exists: {command} writes a new run directory; choose another or remove it")


def _new_run(out: Path, fill: Callable[[Path], object]) -> Path:
    """Make the run directory ``out``, which ``fill`` writes: in a hidden sibling directory, renamed into place when
    whole (refused if another process made a run there meanwhile)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(out, f".{out.name}.tmp-")
    try:
        fill(staging)
        fsync_directory(staging)
        os.chmod(staging, umask_mode(directory=True))
        os.rename(staging, out)
        fsync_directory(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def point(out: Path, pointer: str, name: str) -> None:
    """Make ``RUN/latest`` or ``RUN/best`` name checkpoint ``name`` (atomically)."""
    atomic_write_text(out / pointer, name + "\n")


def _rotate(out: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step checkpoints and the one ``best`` names."""
    protected = _pointed_at(out, BEST)
    root = out / CHECKPOINTS
    for old in _step_checkpoints(out)[:-keep]:
        if old == protected:
            continue
        # Renamed first, so that a kill while deleting leaves a temporary directory, not a partial checkpoint.
        doomed = root / f".tmp-{old.name}-removed"
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def encoded_corpus(out: Path, key: dict[str, Any]) -> EncodedCorpus | None:
    """The run's encoded corpus if it was made from what ``key`` says and is intact (see
    :mod:`multihead.app.encoded`)."""
    return read_cache(out / ENCODED, key)


def save_encoded_corpus(out: Path, corpus: EncodedCorpus, key: dict[str, Any]) -> EncodedCorpus:
    """Write the run's encoded corpus; the same, memory-mapped from the files written."""
    return write_cache(out / ENCODED, corpus, key)


def write_history(out: Path, history: dict[str, Any]) -> None:
    atomic_write(out / HISTORY, lambda tmp: write_json(history)(Path(tmp)))


def append_log(out: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the run's ``train.jsonl`` as one line, in one write to the end of the file (several
    processes appending never interleave within a line), which goes to the system before this returns. A process
    killed meanwhile leaves at most a partial last line: the next append starts on a line of its own, and
    :func:`read_log` skips it."""
    line = json.dumps(entry, sort_keys=True).encode("utf-8") + b"\n"
    handle = os.open(out / TRAIN_LOG, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)  # read: its last byte
    try:
        end = os.fstat(handle).st_size
        if end and os.pread(handle, 1, end - 1) != b"\n":  # a partial line, left by a killed process
            line = b"\n" + line
        os.write(handle, line)
    finally:
        os.close(handle)


def read_log(out: Path) -> list[dict[str, Any]]:
    """The entries of the run's ``train.jsonl``, in order; lines that are not a whole JSON object (a line cut short
    by a killed process) are skipped. Empty when the run has no log."""
    try:
        lines = (out / TRAIN_LOG).read_bytes().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def history_plot(out: Path) -> Path:
    """Where the run's history is drawn."""
    return out / HISTORY_PLOT


def attention_plot(out: Path) -> Path:
    """Where ``multihead demo`` draws the cross-attention of its first example."""
    return out / ATTENTION_PLOT


# --- reading ----------------------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{str(path)!r} is not a readable JSON file of a multihead run ({error})") from None


def _step_checkpoints(out: Path) -> list[Path]:
    root = out / CHECKPOINTS
    return sorted(path for path in root.glob("step-*") if STEP_NAME.fullmatch(path.name) and path.is_dir())


def _pointed_at(out: Path, pointer: str) -> Path | None:
    """The checkpoint ``latest`` or ``best`` names, or ``None`` when it names none (missing, not text, not ours)."""
    try:
        name = (out / pointer).read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if (STEP_NAME.fullmatch(name) or name == AVERAGE) and (out / CHECKPOINTS / name).is_dir():
        return out / CHECKPOINTS / name
    return None


def _is_step_value(entry: object) -> bool:
    """``[step, value]``, as a training loss is recorded."""
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    step, value = entry
    json_booleans = isinstance(step, bool) or isinstance(value, bool)
    return isinstance(step, int) and isinstance(value, Real) and not json_booleans


def _check_trainer(trainer: object, path: Path) -> dict[str, Any]:
    """``trainer.json`` as the trainer writes it; a :class:`RunError` naming the file otherwise."""
    if not isinstance(trainer, dict) or trainer.get("format") != FORMAT:
        found = trainer.get("format") if isinstance(trainer, dict) else type(trainer).__name__
        raise RunError(f"{str(path)!r} was not written by this version of multihead train (format {found!r})")
    missing = sorted({"framework", "step", "options", "optimizer", "losses", "evals", "data"} - set(trainer))
    options = trainer.get("options")
    problem = None
    if missing:
        problem = f"it lacks {missing}"
    elif trainer["framework"] not in FRAMEWORKS:
        problem = f"framework {trainer['framework']!r} is not one of {FRAMEWORKS}"
    elif isinstance(trainer["step"], bool) or not isinstance(trainer["step"], int) or trainer["step"] < 0:
        problem = f"step {trainer['step']!r} is not a non-negative int"
    elif not isinstance(options, dict) or not {"task", "data", "tokenizer"} <= set(options):
        problem = "its options do not name the task, data and tokenizer"
    elif (search := _search_problem(options.get("search") or {})) is not None:
        problem = f"its search is none multihead can run ({search})"
    elif not isinstance(trainer["optimizer"], dict):
        problem = f"its optimizer is a {type(trainer['optimizer']).__name__}, not a JSON object"
    elif not isinstance(trainer["data"], dict):
        problem = f"its data is a {type(trainer['data']).__name__}, not a JSON object"
    elif not isinstance(trainer["losses"], list) or not all(_is_step_value(entry) for entry in trainer["losses"]):
        problem = "losses is not a list of [step, value] pairs"
    elif not isinstance(trainer["evals"], list) or not all(
        isinstance(entry, dict) and isinstance(entry.get("step"), int) for entry in trainer["evals"]
    ):
        problem = "evals is not a list of evaluations"
    if problem is not None:
        raise RunError(f"{str(path)!r} is damaged: {problem}")
    return trainer


def read_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint's config, tokenizers and ``trainer.json``, each file checked and all checked against each
    other; a :class:`RunError` naming the damaged file."""
    trainer = _check_trainer(read_json(path / TRAINER), path / TRAINER)
    values = read_json(path / CONFIG)
    moved = {key: values.pop(key) for key in MOVED_TO_GENERATION if isinstance(values, dict) and key in values}
    try:
        config = TransformerConfig.from_dict(values)
    except (TypeError, ValueError) as error:
        raise RunError(f"{str(path / CONFIG)!r}: {error}") from None
    try:
        source, target = load_tokenizers(path)
    except ValueError as error:
        raise RunError(str(error)) from None
    generation = _read_generation(path, target, moved.get("banned_ids") or ())
    try:
        generation.check(config.tgt_vocab)
    except ValueError as error:
        raise RunError(f"{str(path / GENERATION)!r} does not fit {str(path / CONFIG)!r}: {error}") from None
    sizes = {"source": (len(source), config.src_vocab), "target": (len(target), config.tgt_vocab)}
    for side, (symbols, vocabulary) in sizes.items():
        if symbols != vocabulary:
            name = "src_vocab" if side == "source" else "tgt_vocab"
            raise RunError(
                f"{str(_vocabulary_file(path, side))!r} does not fit {str(path / CONFIG)!r}: "
                f"{symbols} symbols for the model's {name}={vocabulary}"
            )
    pads = sorted({source.specials.pad, target.specials.pad})
    if pads != [config.pad_id]:
        raise RunError(
            f"{str(path / CONFIG)!r} has pad_id={config.pad_id}, the tokenizers pad with {' and '.join(map(str, pads))}"
        )
    return Checkpoint(path, config, generation, source, target, trainer)


def _read_generation(path: Path, target: Tokenizer, banned: object) -> Generation:
    """A checkpoint's generation spec, checked against its target tokenizer's special ids; a checkpoint older versions
    wrote has none: its tokenizer's ids, and the tokens its config banned (``banned``)."""
    if not (path / GENERATION).is_file():
        values: Any = {"specials": asdict(target.specials), "banned": banned}
        where = path / CONFIG
    else:
        values, where = read_json(path / GENERATION), path / GENERATION
        if isinstance(values, dict) and "search" in values:
            raise RunError(f"{str(where)!r} is damaged: it holds a search, which each command chooses")
    try:
        generation = Generation.from_dict(values)
    except (TypeError, ValueError) as error:
        raise RunError(f"{str(where)!r} is damaged: {error}") from None
    if generation.specials != target.specials:
        raise RunError(
            f"{str(path / GENERATION)!r} has the special ids {generation.specials}, the target tokenizer "
            f"{target.specials}"
        )
    return generation


def _vocabulary_file(path: Path, side: str) -> Path:
    """The file that holds a side's vocabulary: its subword file or SentencePiece vocabulary, else the tokenizer
    manifest itself."""
    try:
        entry = json.loads((path / TOKENIZER).read_text(encoding="utf-8"))[side]
        if entry.get("kind") == "subword" and isinstance(entry.get("file"), str):
            return path / entry["file"]
        if entry.get("kind") == "sentencepiece" and isinstance(entry.get("vocabulary"), str):
            return path / entry["vocabulary"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return path / TOKENIZER


def _search_problem(search: object) -> str | None:
    """What is wrong with a run's recorded search (:attr:`Checkpoint.search`), if anything."""
    if not isinstance(search, dict):
        return f"a {type(search).__name__}, not a JSON object"
    try:
        SearchOptions(**search)
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def trained_options(out: Path) -> dict[str, Any] | None:
    """The options the run in ``out`` was trained with, as its newest readable ``trainer.json`` says (resuming checks
    the rest, and warns); ``None`` when no checkpoint's can be read."""
    options = _newest_record(out, "options")
    return options if isinstance(options, dict) else None


def exported_from(out: Path) -> dict[str, Any] | None:
    """Where the int8 run in ``out`` was exported from (its ``trainer.json``'s ``exported``: ``run``, ``checkpoint``,
    ``quantization``); ``None`` for any other run."""
    exported = _newest_record(out, "exported")
    return exported if isinstance(exported, dict) else None


def _newest_record(out: Path, key: str) -> object:
    """``key``'s entry in the newest readable ``trainer.json`` of the run in ``out`` (``None`` where none holds it)."""
    for checkpoint in reversed(_step_checkpoints(out)):
        try:
            return read_json(checkpoint / TRAINER)[key]
        except (RunError, KeyError, TypeError):
            continue
    return None


def has_checkpoints(out: Path) -> bool:
    return bool(_step_checkpoints(out)) or _pointed_at(out, LATEST) is not None


def check_run(out: Path) -> None:
    """``out`` is an existing run directory; a :class:`RunError` in the user's terms otherwise."""
    if not out.exists():
        raise RunError(f"{str(out)!r} does not exist")
    if not out.is_dir() or not (out / CHECKPOINTS).is_dir():
        raise RunError(f"{str(out)!r} is not a multihead run: it has no {CHECKPOINTS}/ directory")


def open_checkpoint(
    out: Path, which: str | None, load: Callable[[Checkpoint], Loaded], doing: str = "using"
) -> tuple[Checkpoint, Loaded]:
    """Read the checkpoint ``which`` names and ``load`` it (the caller's loading of weights, optimizer state...).

    ``which``: ``"latest"``, ``"best"``, ``"average"``, ``"step-N"`` (or just ``N``), or ``None`` for ``best`` when
    the run has one, else ``latest``. ``latest`` and the default fall back: when their checkpoint (or a file ``load``
    reads) is damaged, the newest intact step checkpoint is used, with one warning naming what was damaged
    (``"{doing} step-N, the newest intact checkpoint: ..."``). A checkpoint chosen by name that is damaged, or a run
    with no intact checkpoint, is refused in one line.
    """
    check_run(out)
    default = which is None
    if which is None:
        which = BEST if _pointed_at(out, BEST) is not None else LATEST
    if which == LATEST or default:
        candidates = _step_checkpoints(out)[::-1]
        named = _pointed_at(out, LATEST)
        if named is not None:  # normally the newest step checkpoint (an average, in a run `multihead average` made)
            candidates = [named, *(path for path in candidates if path != named)]
        if which == BEST:  # the default: best first, then the newest intact one
            best = _named_checkpoint(out, BEST)
            candidates = [best, *(path for path in candidates if path != best)]
        if not candidates:
            raise RunError(f"{str(out)!r} is not a multihead run: it holds no checkpoint")
    else:
        candidates = [_named_checkpoint(out, which)]
    damaged = []
    for path in candidates:
        try:
            checkpoint = read_checkpoint(path)
            loaded = load(checkpoint)
        except (RunError, ValueError, OSError) as error:
            damaged.append(f"{path.name}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
            continue
        if damaged:
            warn(f"{doing} {path.name}, the newest intact checkpoint: damaged {'; '.join(damaged)}")
        return checkpoint, loaded
    if len(candidates) == 1 and which != LATEST:
        raise RunError(f"checkpoint {which!r} of {str(out)!r} is damaged: {damaged[0].split(': ', 1)[1]}")
    raise RunError(f"{str(out)!r} holds no intact checkpoint ({'; '.join(damaged)})")


def _named_checkpoint(out: Path, which: str) -> Path:
    """The checkpoint a ``--checkpoint`` value names, which must exist."""
    if which in (BEST, AVERAGE):
        path = _pointed_at(out, BEST) if which == BEST else out / CHECKPOINTS / AVERAGE
        if path is None or not path.is_dir():
            raise RunError(
                f"{str(out)!r} has no {which} checkpoint (only corpus runs with validation BLEU have "
                f"{'one' if which == BEST else 'an average, with --average'}); use --checkpoint latest"
            )
        return path
    digits = which.removeprefix("step-")
    if not digits.isdigit():
        raise RunError(f"--checkpoint must be latest, best, average or step-N, received {which!r}")
    path = out / CHECKPOINTS / checkpoint_name(int(digits))
    if not path.is_dir():
        kept = ", ".join(p.name for p in _step_checkpoints(out)) or "none"
        raise RunError(f"{str(out)!r} has no checkpoint {path.name} (it keeps: {kept})")
    return path


def packed_forms(checkpoint: Path, packing: str) -> tuple[Path, str]:
    """Where ``checkpoint``'s int8 forms packed as ``packing`` says (:func:`multihead.torch.packed.packing`: the CPU
    kind and PyTorch) are kept, a file of the checkpoint's own, and the key of the weights they are made from: its
    weights file's size, modification time and inode (a checkpoint's files are replaced whole, never written in place,
    so any new weights file has another)."""
    name = "int8-" + hashlib.sha256(packing.encode()).hexdigest()[:16] + ".safetensors"
    stat = (checkpoint / WEIGHTS).stat()
    return checkpoint / name, f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_dev}:{stat.st_ino}"


def _complete(path: Path) -> bool:
    """Whether a checkpoint has every file a save writes (a kill during a save leaves none that lacks one)."""
    return all((path / name).is_file() for name in (CONFIG, WEIGHTS, TRAINER, TOKENIZER))


def latest_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint ``latest`` names, else the newest complete one; ``None`` if there is none. (Whether
    its files are intact is for :func:`open_checkpoint` to find out.)"""
    named = _pointed_at(out, LATEST)
    if named is not None and _complete(named):
        return named
    complete = [path for path in _step_checkpoints(out) if _complete(path)]
    return complete[-1] if complete else None
