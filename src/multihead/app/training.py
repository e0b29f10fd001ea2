"""Training a translation Transformer on a built-in task or a parallel corpus: the scaffold both frameworks share.

:class:`Training` builds a run (fresh, or resumed from its newest intact checkpoint), then steps, evaluates and
saves; a framework's :class:`Trainer` (``train_torch``, ``train_keras``) only builds the model and optimizer and
runs one step, one loss evaluation, one batch of translations. So resume, the learning-rate schedule, batches,
the progress bar, the history and the evaluation records are the same whichever framework trains, one record per
step. The run directory is described in :mod:`multihead.app.runs`.

The options and their defaults, a recipe per kind of data, are in :mod:`multihead.app.options`.

Notation: B batch, Ls source length, Lt target length, V target vocabulary.
"""

from __future__ import annotations

import itertools
import math
import signal
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from multihead.app.batching import Batch, Batches, evaluation_batches
from multihead.app.console import (
    UserError,
    is_main_rank,
    plural,
    progress_bar,
    rank,
    say,
    warn,
    world_size,
)
from multihead.app.data import (
    HELDOUT_RULE,
    Prepared,
    TrainingData,
    heldout_rule,
    initial_run,
    load_corpus,
    load_task,
    vocabulary_from,
)
from multihead.app.devices import check_device, fit_threads, resolve_device, use_threads
from multihead.app.languages import LanguageTokens, from_file_names
from multihead.app.loaded import run_direction
from multihead.app.memory import release_freed_memory
from multihead.app.options import (
    DATA,
    FINE_TUNING,
    FLAGS,
    RECIPES,
    RESUMABLE,
    SAVED,
    RunOptions,
    TrainOptions,
    in_flags,
    on_this_machine,
)
from multihead.app.runs import (
    AVERAGE,
    BEST,
    WEIGHTS,
    Checkpoint,
    RunError,
    RunLock,
    append_log,
    check_writable,
    checkpoint_name,
    exported_from,
    has_checkpoints,
    history_plot,
    latest_checkpoint,
    open_checkpoint,
    point,
    save_average,
    save_encoded_corpus,
    save_step,
    trained_options,
    trainer_record,
    write_history,
)
from multihead.app.schedule import learning_rate
from multihead.app.tokenizers import SentencePieceTokenizer, Tokenizer, build_tokenizers, forcing
from multihead.app.translate import length_limit, translate_ids
from multihead.config import TransformerConfig
from multihead.decoding import Generation

READ_EVERY = 10
"""Steps between reads of the loss from the device (and, with several ranks, between their agreeing to stop): a GPU
waits for the host only then."""


# --- what a run is made of --------------------------------------------------------------------------------


@dataclass
class Setup:
    """A run's data, tokenizers, model configuration, resolved options, and its training data made ready;
    ``initial``: the checkpoint a new run starts from (``--init``)."""

    options: RunOptions
    data: TrainingData
    source: Tokenizer
    target: Tokenizer
    config: TransformerConfig
    generation: Generation
    prepared: Prepared
    initial: Checkpoint | None = None

    @property
    def targets(self) -> Tokenizer:
        """What training's targets are encoded with: the target tokenizer, after the tokens generation forces."""
        return forcing(self.target, self.generation.forced)


def _resolve(
    options: TrainOptions, recipe: str, saved: dict[str, Any] | None, data: TrainingData | None = None
) -> RunOptions:
    """The options in force: what the data records of itself, those given, else the run's (on resume; not this
    machine's choices), else the data's own defaults, else the recipe's."""
    base = {**RECIPES[recipe], **(FINE_TUNING if options.init else {}), **(data.defaults() if data is not None else {})}
    resolved: dict[str, Any] = {}
    for described in SAVED:  # a run saved before an option existed takes the recipe's value for it
        given, name = getattr(options, described.name), described.name
        resolved[name] = given if given is not None else (base if saved is None else saved).get(name, base.get(name))
    resolved.update(on_this_machine(options))
    if data is not None:
        resolved.update(data.recorded(options))
    if saved is None and recipe != "task" and options.tokenizer in ("char", "word") and options.joint is None:
        resolved["joint"] = True
    if resolved["average"]:
        resolved["keep"] = max(resolved["keep"], resolved["average"])
    return RunOptions(**resolved)


def saved_recipe(saved: dict[str, Any]) -> str:
    """The recipe of a saved run's options: a task's, or a corpus's."""
    return "corpus" if saved.get("task") is None else "task"


def _config(options: RunOptions, source: Tokenizer, target: Tokenizer, max_len: int) -> TransformerConfig:
    """A new model for the tokenizers, padded with their pad."""
    try:
        return TransformerConfig(
            len(source), len(target), d_model=options.d_model, num_heads=options.num_heads,
            num_encoder_layers=options.layers, num_decoder_layers=options.layers, d_ff=options.d_ff,
            dropout=options.dropout, max_len=max_len, pad_id=target.specials.pad, tie_embeddings=source is target,
        )  # fmt: skip
    except ValueError as error:
        raise UserError(in_flags(str(error))) from None


def _load_data(options: TrainOptions, saved: dict[str, Any] | None, heldout: str = HELDOUT_RULE) -> TrainingData:
    if options.data is not None:
        return load_corpus(options.data, options.valid, heldout)
    name = options.task or (saved["task"] if saved else "dates")
    return load_task(name)


def _check_vocab_size(options: TrainOptions, resolved: RunOptions) -> None:
    """``--vocab-size`` sizes a subword vocabulary; given with another tokenizer, it would do nothing."""
    if options.vocab_size is not None and resolved.tokenizer != "subword":
        raise UserError(
            f"--vocab-size sets the size of a subword vocabulary, and this run's tokenizer is {resolved.tokenizer} "
            "(it keeps every symbol it sees): drop --vocab-size, or add --tokenizer subword"
        )


def _tokenizers(resolved: RunOptions, pairs: Sequence[tuple[str, str]]) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers learned from ``pairs``; a warning when a subword vocabulary outgrew ``--vocab-size`` (which
    cannot be smaller than the specials and the characters of the corpus)."""
    asked = resolved.vocab_size or 0
    source, target = build_tokenizers(
        resolved.tokenizer, [s for s, _ in pairs], [t for _, t in pairs], vocab_size=asked, joint=resolved.joint
    )
    grown = max(len(source), len(target))
    if resolved.tokenizer == "subword" and asked and grown > asked:
        warn(f"--vocab-size {asked} is too small for the corpus's characters: the vocabulary has {grown} symbols")
    return source, target


def _language(code: str) -> str:
    """The language a code names, without its script or region, as its shortest code (``deu``: de; ``zh-Hant``: zh;
    ``iw``: he)."""
    import langcodes

    return str(langcodes.standardize_tag(code.replace("_", "-"), macro=True).split("-")[0])


def _check_langs_and_file_names(options: TrainOptions) -> None:
    """Warn, in one line, where ``--langs`` names other languages than the ``--data`` files' names (``train.de``,
    ``train.en``: ISO 639-1 codes), which a run without ``--langs`` would record: one of them is likely wrong."""
    named = from_file_names(options.data or [])
    if options.langs is None or named is None or any(len(code) != 2 for code in named):
        return
    if [_language(code) for code in options.langs] != [_language(code) for code in named]:
        warn(f"--langs {' '.join(options.langs)} is not what the --data file names say ({' → '.join(named)}: "
             f"{', '.join(Path(path).name for path in options.data or [])}): check which language each side is; the "
             "run records --langs")  # fmt: skip


def new_setup(options: TrainOptions, out: Path) -> Setup:
    """The setup of a fresh run: data read, tokenizers learned (or another run's taken), model sized (or, with
    ``--init``, another run's taken whole), training data made ready."""
    taken: Checkpoint | None = None  # of the run whose model (--init) or vocabulary (--vocab-from) this one takes
    if options.init is not None:
        options, taken = initial_run(options)
    elif options.vocab_from is not None:
        options, taken = vocabulary_from(options)
    initial = taken if options.init is not None else None
    data = _load_data(options, None)
    recipe = data.recipe
    if f"{recipe}-gpu" in RECIPES and resolve_device(options.device or "auto").startswith("cuda"):
        recipe += "-gpu"  # the recipe sized for a GPU
    resolved = _resolve(options, recipe, None, data)
    if taken is not None:  # its vocabulary's options as it recorded them, never the recipe's
        theirs = taken.options
        resolved = replace(
            resolved,
            tokenizer=theirs["tokenizer"],
            vocab_size=theirs.get("vocab_size"),
            joint=bool(theirs.get("joint")),
        )
    _check_vocab_size(options, resolved)
    if taken is None:
        pairs = data.vocabulary_pairs(resolved, options.progress)
        source, target = _tokenizers(resolved, pairs)
        del pairs  # the sample's texts
        release_freed_memory()  # theirs and the BPE trainer's
    else:
        source, target = taken.source, taken.target
    # A vocabulary taken from another run (an imported one's) keeps what that run's generation bans and forces, for
    # the pair --langs chooses of a model that marks its languages with tokens (M2M100, NLLB, multilingual OPUS-MT).
    generation = Generation(target.specials) if taken is None else taken.generation
    if taken is not None and resolved.langs and isinstance(source, SentencePieceTokenizer):
        tokens = LanguageTokens.of(source.vocabulary, getattr(target, "vocabulary", {}))
        if tokens is not None:
            try:
                chosen = tokens.direction(run_direction(taken), *resolved.langs)
            except ValueError as error:
                raise UserError(f"--langs {' '.join(resolved.langs)}: {error}") from None
            source, generation = source.with_prefix(chosen.prefix), chosen.generation
    targets = forcing(target, generation.forced)
    if initial is None:
        config = _config(resolved, source, targets, data.positions(source, targets))
    else:
        config = replace(initial.config, dropout=resolved.dropout)
        data.fit(config.max_len, source, targets)
    _check_langs_and_file_names(options)
    prepared = data.prepare(out, source, targets, options.progress)
    return Setup(resolved, data, source, target, config, generation, prepared, initial)


def _refuse_changes(options: TrainOptions, saved: dict[str, Any]) -> None:
    """Refuse, on resume, a given option that would change the run's model (its data are checked apart)."""
    may_change = ", ".join(FLAGS[name] for name in RESUMABLE)
    for described in SAVED:
        given = getattr(options, described.name)
        if described.resumable or described.name in DATA or given is None or given == saved.get(described.name):
            continue
        raise UserError(
            f"{described.typed(given)} would change the run, which has {described.typed(saved.get(described.name))}: "
            f"--resume continues a run as it was built; it may change only {may_change}"
        )


def resumed_setup(options: TrainOptions, checkpoint: Checkpoint, out: Path) -> Setup:
    """The setup of the run ``checkpoint`` belongs to; options that would change its model or data are refused."""
    saved = checkpoint.options
    _refuse_changes(options, saved)
    run, corpus = repr(str(checkpoint.path.parents[1])), " ".join(saved["data"] or [])
    if saved["task"] is not None:
        if options.data is not None:
            raise UserError(f"--data would change the run: {run} trained task {saved['task']!r}, not a corpus")
        if options.task is not None and options.task != saved["task"]:
            raise UserError(f"--task {options.task} would change the run, which has --task {saved['task']}")
    elif options.task is not None:
        raise UserError(f"--task {options.task} would change the run: {run} trained on --data {corpus}")
    elif options.data is None:
        raise UserError(f"{run} trained on --data {corpus}; give --data again (the same corpus) to continue training")
    data = _load_data(options, saved, heldout_rule(checkpoint.trainer["data"]))  # the run's held-out pairs
    resolved = _resolve(options, saved_recipe(saved), saved)
    given = data.recorded(options)
    resolved = replace(resolved, data=given["data"], valid=given["valid"])  # the same files, maybe by other paths
    prepared = data.resume(options, checkpoint, out)
    return Setup(
        resolved, data, checkpoint.source, checkpoint.target, checkpoint.config, checkpoint.generation, prepared
    )


# --- the framework's part ---------------------------------------------------------------------------------


class Trainer(Protocol):
    """What a framework supplies: the model and its optimizer, and the computations on them."""

    framework: str
    model: Any
    prefetch: bool  # whether the next step's batches are built while this one computes

    def train_step(self, batches: Sequence[Batch], lr: float, global_tokens: int) -> Any:
        """One optimizer step over this rank's ``batches``; the mean loss per target token of the whole global batch
        (``global_tokens`` tokens), a float or a 0-d tensor that ``float()`` reads."""
        ...

    def configure(self, options: RunOptions) -> None:
        """Take the options that may change on resume."""
        ...

    def facts(self) -> dict[str, Any]:
        """How this process trains (device, precision...), for the run's record."""
        ...

    def loss_sum(self, batch: Batch) -> float:
        """The summed cross-entropy (no smoothing, no dropout) over the batch's target tokens."""
        ...

    def generate(self, src: np.ndarray, limits: np.ndarray) -> np.ndarray:
        """Greedy translations ``(B, T)`` of ``src (B, Ls)``, row ``i`` at most ``limits[i]`` tokens long."""
        ...

    def write_weights(self, path: Path) -> None: ...

    def load_weights(self, path: Path) -> None: ...

    def write_optimizer(self, path: Path) -> dict[str, Any]:
        """Write the optimizer state (and RNG state); return what the checkpoint's record keeps about it."""
        ...

    def agree(self, flag: bool) -> bool:
        """Whether any rank raised ``flag`` (data-parallel runs stop together)."""
        ...

    def release(self) -> None:
        """Training is over and its last checkpoint saved: drop what only further steps need (the optimizer's state,
        the gradients), so that the final evaluations and the average of the last checkpoints take that memory."""
        ...

    def pad_to(self) -> int:
        """Batch lengths are rounded up to a multiple of this (fewer shapes for a compiling framework)."""
        ...


def make_trainer(
    framework: str,
    setup_config: TransformerConfig,
    options: RunOptions,
    checkpoint: Checkpoint | None,
    generation: Generation,
    weights: Path | None = None,
) -> Trainer:
    """The framework's trainer, resuming from ``checkpoint`` or starting from ``weights`` (``--init``) or at random,
    batching with ``generation``'s special ids (the target tokenizer's) and validating with its greedy search;
    :meth:`Training.build` has checked the device (and imported Keras) before."""
    if framework == "keras":
        from multihead.app.train_keras import KerasTrainer

        return KerasTrainer(setup_config, options, checkpoint, generation, weights=weights)
    from multihead.app.train_torch import TorchTrainer

    return TorchTrainer(setup_config, options, checkpoint, generation, weights=weights)


# --- the scaffold -----------------------------------------------------------------------------------------


class Interrupt:
    """Turns SIGINT into a flag checked between steps, so a checkpoint is saved before exiting."""

    def __init__(self) -> None:
        self.requested = False
        self.previous: Any = None

    def __enter__(self) -> Interrupt:
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self.previous)


@dataclass
class Result:
    step: int
    interrupted: bool
    losses: list[tuple[int, float]]
    evaluation: dict[str, Any] | None = None  # the final evaluation (a corpus: the best checkpoint's)
    summary: str | None = None  # it, in a line
    checkpoint: str | None = None  # the checkpoint the final evaluation is of
    model: Any = None  # the trained model (this rank's copy under torchrun)


def clock(seconds: float) -> str:
    """A duration as a clock shows it: ``M:SS``, from an hour ``H:MM:SS``."""
    hours, rest = divmod(max(0, int(seconds)), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@dataclass(frozen=True)
class Progress:
    """Where training stands, as the progress bar (:meth:`postfix`), the log lines without one (:meth:`line`) and
    ``train.jsonl`` (:meth:`entry`) say it: each says it from these figures, and only these say it."""

    step: int
    steps: int | None  # the run's total, when --steps bounds it
    loss: float  # the bar: the newest step's; a log line: the mean of the steps since the previous line
    lr: float
    rate: float  # target tokens per second; the bar: since this process began training; a log line: of its steps
    elapsed: float  # wall-clock seconds since this process began the run (as --minutes counts them)
    seconds: float  # the run's training seconds, every process's together (history.json's)
    left: float | None  # wall-clock seconds until the run ends, when known
    timed: bool  # whether --minutes bounds the run
    skipped: int | None = None  # steps fp16's loss scaler skipped

    def postfix(self) -> dict[str, str]:
        """The bar's figures after its own (step, elapsed, and its estimate of the time left by steps)."""
        postfix = {"loss": f"{self.loss:.3f}", "tok/s": f"{self.rate:.0f}"}
        if self.skipped:
            postfix["skipped"] = str(self.skipped)
        if self.timed and self.left is not None:
            postfix["left"] = clock(self.left)
        return postfix

    def line(self) -> str:
        """A line of the log: ``step 200/1500: loss 2.345, lr 1.00e-03, 2012 tok/s, elapsed 0:42, left 4:51``."""
        figures = [
            f"loss {self.loss:.3f}",
            f"lr {self.lr:.2e}",
            f"{self.rate:.0f} tok/s",
            f"elapsed {clock(self.elapsed)}",
        ]
        if self.skipped:
            figures.append(f"{self.skipped} skipped")
        if self.left is not None:
            figures.append(f"left {clock(self.left)}")
        total = "" if self.steps is None else f"/{self.steps}"
        return f"step {self.step}{total}: {', '.join(figures)}"

    def entry(self) -> dict[str, Any]:
        """The figures as a line of ``train.jsonl``."""
        entry = {
            "event": "step", "step": self.step, "loss": self.loss, "lr": self.lr, "tokens_per_s": round(self.rate, 1),
            "elapsed": round(self.elapsed, 1), "seconds": round(self.seconds, 1),
        }  # fmt: skip
        if self.skipped:
            entry["skipped"] = self.skipped
        return entry


UNMEASURED_SHARE = 0.1
"""The share of ``--minutes`` kept for the final evaluation while no evaluation has been timed."""


def _holds_a_run(out: Path) -> RunError:
    return RunError(f"{str(out)!r} already holds a run; pass --resume to continue it, or choose another --out")


class Training:
    """One run: :meth:`build`, then :meth:`step` until done, :meth:`evaluate` and :meth:`save` along the way."""

    def __init__(self, options: TrainOptions) -> None:
        self.options = options
        self.out = Path(options.out)
        self.lock = RunLock(self.out)
        self.world = world_size()
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches")
        self._upcoming: Future | None = None
        self.began = time.monotonic()  # --minutes counts from here: reading the data is part of the run's time
        # The durations measured last (seconds), which say how long the work before a deadline will take.
        self._step_seconds, self._save_seconds, self.lr = 0.0, 0.0, 0.0  # self.lr: the last step's learning rate
        self._evaluation_seconds: float | None = None  # per held-out example, once an evaluation has been timed
        self._started, self._first_step = self.began, 0  # when and at which step this process's training began
        self._warned_long = False  # of held-out pairs longer than the model reads (:meth:`evaluate`)

    # build ---------------------------------------------------------------------------------------------

    def build(self) -> None:
        """Check the output directory, take its lock, then set up afresh or from the newest intact checkpoint."""
        out, options = self.out, self.options
        if out.exists() and not out.is_dir():
            raise RunError(f"cannot write to output directory {str(out)!r}: it is a file")
        if out.is_dir() and is_main_rank():
            self.lock.acquire()  # before reading it: another process may be writing it
        existing = out.exists() and has_checkpoints(out)
        if options.resume and not existing:
            why = "does not exist" if not out.exists() else "holds no run"
            raise RunError(f"--resume: {str(out)!r} {why}; drop --resume to start a new run there")
        if existing and not options.resume:
            raise _holds_a_run(out)
        trained = (trained_options(out) or {}) if existing else {}
        framework = options.framework or trained.get("framework") or "torch"
        if framework == "keras" and (options.precision not in (None, "auto", "fp32") or options.compile):
            what = (
                f"--precision {options.precision}" if options.precision not in (None, "auto", "fp32") else "--compile"
            )
            raise UserError(
                f"{what} applies to --framework torch: Keras trains in float32 and compiles its steps itself"
            )
        check_device(framework, options.device or "auto")
        if existing:
            self._resume()
        else:
            self._start()
        setup = self.setup
        self.batches: Batches = setup.data.batches(
            setup.options, setup.source, setup.targets, setup.prepared, self.trainer.pad_to()
        )

    def _resume(self) -> None:
        made = "a model multihead import made" if (trained_options(self.out) or {}).get("imported") else None
        exported = exported_from(self.out)
        if exported is not None:
            made = f"an {exported.get('quantization')} run exported from {exported.get('run')!r} (resume that one)"
        if made is not None:
            raise UserError(
                f"{str(self.out)!r} is {made}: it has no training to resume; fine-tune it into a new run with: "
                f"multihead train --init {self.out} --data SRC TGT --out NEW ..."
            )
        nothing_given = TrainOptions(out=self.options.out, resume=True, device=self.options.device)

        def load(found: Checkpoint) -> Trainer:
            # The run's own framework and options (the device: this machine's, never the run's); a different
            # --framework is refused by resumed_setup, as a change of the run (not as a damaged checkpoint).
            saved = _resolve(nothing_given, saved_recipe(found.options), found.options)
            return make_trainer(found.trainer["framework"], found.config, saved, found, found.generation)

        checkpoint, self.trainer = open_checkpoint(self.out, "latest", load, doing="resuming from")
        self.setup = resumed_setup(self.options, checkpoint, self.out)
        self._save_encoding()
        self.trainer.configure(self.setup.options)
        record = checkpoint.trainer
        self._warn_of_changes(record.get("process") or {}, checkpoint.options.get("accumulate") or 1)
        self.step_count = record["step"]
        self.history = {key: record[key] for key in ("losses", "evals")}
        self.seconds, self.tokens = record.get("seconds", 0.0), record.get("tokens", 0)
        steps = self.setup.options.steps
        left = "" if steps is None else f" of {steps}" + (": no step left to train" if self.step_count >= steps else "")
        say(f"resuming {self.out} from step {self.step_count}{left} ({checkpoint.path.name})")

    def _save_encoding(self) -> None:
        """Write the run's encoded corpus when it was encoded here (rank 0, the run's lock held), and train from the
        files written, memory-mapped, as a resumed run does: the arrays encoding made are let go."""
        prepared = self.setup.prepared
        if is_main_rank() and not prepared.cached and prepared.encoded is not None and prepared.cache_key is not None:
            mapped = save_encoded_corpus(self.out, prepared.encoded, prepared.cache_key)
            self.setup = replace(self.setup, prepared=replace(prepared, encoded=mapped, cached=True))
            release_freed_memory()

    def _warn_of_changes(self, before: dict[str, Any], saved_accumulate: int) -> None:
        """Say what resuming changes in how the run trains: Keras' backend, the CPU threads (without ``--threads``,
        the run's own are taken), or the batch a step takes (world size × ``--accumulate`` batches of
        ``--batch-tokens``; the run's process ``before``, its ``saved_accumulate``)."""
        import torch

        threads, current = before.get("threads"), torch.get_num_threads()
        if threads is not None and threads != current and self.options.threads is None:
            use_threads(threads)
            say(f"resuming with the {plural(threads, 'CPU thread')} the run trained with (--threads N chooses others)")
        elif threads is not None and threads != current:
            warn(f"this run trained with {plural(threads, 'CPU thread')}; with {current}, its sums round otherwise: it "
                 "goes on as it would not have without the interruption")  # fmt: skip
        trained_on, now = before.get("keras_backend"), self.trainer.facts().get("keras_backend")
        if trained_on is not None and trained_on != now:
            warn(f"this run trained on the Keras backend {trained_on}; it goes on with {now} (KERAS_BACKEND): the "
                 "same model, other numerics")  # fmt: skip
        accumulate = self.setup.options.accumulate or 1
        batches_before, batches_now = before.get("world_size", 1) * saved_accumulate, self.world * accumulate
        if batches_now != batches_before:
            warn(f"a step now takes {batches_now} batches (world size {self.world} × --accumulate {accumulate}), "
                 f"where it took {batches_before}: keep world size × --accumulate equal to keep the batch a step "
                 "learns from")  # fmt: skip

    def _start(self) -> None:
        self.setup = new_setup(self.options, self.out)
        if is_main_rank():
            check_writable(self.out)
            self.lock.acquire()
            if has_checkpoints(self.out):  # another process made a run here while this one read its data
                raise _holds_a_run(self.out)
        self._save_encoding()
        o = self.setup.options
        initial = self.setup.initial
        weights = None if initial is None else initial.path / WEIGHTS
        self.trainer = make_trainer(o.framework, self.setup.config, o, None, self.setup.generation, weights)
        self.step_count, self.history, self.seconds, self.tokens = 0, {"losses": [], "evals": []}, 0.0, 0

    # step ----------------------------------------------------------------------------------------------

    def step_batches(self, step: int) -> tuple[list[Batch], int]:
        """This rank's batches of optimizer step ``step`` and the target tokens of all the ranks' batches. Optimizer
        step ``s`` takes batches ``s·n .. s·n + n - 1``, ``n`` = world size × ``--accumulate``; rank ``r`` those
        ``≡ r mod`` the world size."""
        per_step = self.world * (self.setup.options.accumulate or 1)
        indices = range(step * per_step, (step + 1) * per_step)
        mine = {index: self.batches.batch(index) for index in indices[rank() :: self.world]}
        tokens = sum(
            mine[index].target_tokens if index in mine else self.batches.target_tokens(index) for index in indices
        )
        return list(mine.values()), tokens

    def _next_batches(self) -> tuple[list[Batch], int]:
        """This step's batches; on a GPU the next step's are built meanwhile, on a thread of their own."""
        upcoming, self._upcoming = self._upcoming, None
        batches = upcoming.result() if upcoming is not None else self.step_batches(self.step_count)
        if self.trainer.prefetch:
            self._upcoming = self._builder.submit(self.step_batches, self.step_count + 1)
        return batches

    def step(self) -> None:
        o = self.setup.options
        batches, tokens = self._next_batches()
        self.lr = lr = learning_rate(self.step_count + 1, peak=o.lr, warmup=o.warmup)
        loss = self.trainer.train_step(batches, lr, tokens)
        self.step_count += 1
        self.tokens += tokens
        self.history["losses"].append([self.step_count, loss])  # a tensor on the device until read

    def losses_read(self) -> float:
        """Read the losses still held as tensors (a GPU waits here, not at every step); the newest loss (nan before the
        first step)."""
        losses = self.history["losses"]
        for entry in reversed(losses):
            if isinstance(entry[1], float):
                break
            entry[1] = float(entry[1])
        return losses[-1][1] if losses else math.nan

    # evaluate ------------------------------------------------------------------------------------------

    def _translate(self, sources: Sequence[list[int]]) -> list[str]:
        """Greedy translations of held-out ``sources`` (their ids), each cut to the positions the model has."""
        setup = self.setup
        ids = [piece[: setup.config.max_len] for piece in sources]
        longest = setup.prepared.facts["longest_target"]
        limit = lambda length: length_limit(length, longest, setup.config.max_len)  # noqa: E731
        generate = lambda src, limits, _: self.trainer.generate(src, limits)  # noqa: E731 (greedy: no sentence keys)
        found = translate_ids(generate, ids, limit=limit, generation=setup.generation)
        return [setup.target.decode(out) for out in found]

    def evaluate(self, count: int | None) -> dict[str, Any]:
        """The data's evaluation (exact match for a task; validation loss, BLEU and chrF for a corpus), greedy, on the
        first ``count`` held-out examples (all when ``None``). The first that holds pairs longer than the model reads
        says how many: their sources are cut for translating, and they are left out of the loss."""
        setup, max_len = self.setup, self.setup.config.max_len
        pairs = setup.data.evaluation_pairs(count)
        sources = setup.source.encode_all([s for s, _ in pairs])
        targets = setup.targets.encode_all([t for _, t in pairs])
        fits = [len(s) <= max_len and len(t) < max_len for s, t in zip(sources, targets, strict=True)]
        if not all(fits) and not self._warned_long:
            self._warned_long = True
            long = fits.count(False)
            warn(f"{plural(long, 'held-out pair')} of {len(pairs)} {'is' if long == 1 else 'are'} longer than the "
                 f"model reads ({max_len} tokens a side): evaluations translate {'its' if long == 1 else 'their'} "
                 "sources cut to that, and leave them out of the validation loss")  # fmt: skip

        def loss() -> float:  # over the pairs the model has positions for, as training takes only those
            kept = [(s, t) for s, t, fit in zip(sources, targets, fits, strict=True) if fit]
            if not kept:
                return math.nan
            batches = evaluation_batches([s for s, _ in kept], [t for _, t in kept], setup.target.specials, 4096)
            summed = sum(self.trainer.loss_sum(batch) for _, batch in batches)
            return summed / sum(len(t) + 1 for _, t in kept)

        return setup.data.scores(self._translate(sources), pairs, loss, setup.options.langs)

    @property
    def metric(self) -> str:
        return self.setup.data.metric

    def rank(self, evaluation: dict[str, Any]) -> tuple[float, float]:
        """What ranks evaluations, the best highest: the metric, and among equal ones (BLEU 0 early in a run) the
        lower validation loss."""
        return evaluation[self.metric], -evaluation.get("valid_loss", 0.0)

    def record(self, evaluation: dict[str, Any], final: bool = False) -> bool:
        """Keep an evaluation in the history and the log; whether it is the best so far."""
        best = max((self.rank(e) for e in self.history["evals"] if self.metric in e), default=(-math.inf, 0.0))
        self.history["evals"].append(self.log_evaluation(evaluation, final))
        return self.rank(evaluation) > best

    def log_evaluation(self, evaluation: dict[str, Any], final: bool) -> dict[str, Any]:
        """Append an evaluation of this step to ``train.jsonl``, marked ``final`` when it is one of the run's last
        (rank 0 only); the evaluation as the history keeps it."""
        entry = {"step": self.step_count, "seconds": round(self.seconds, 1), **evaluation}
        if is_main_rank():
            append_log(self.out, {"event": "evaluation", **entry, **({"final": True} if final else {})})
        return entry

    def timed_evaluation(self, count: int | None) -> dict[str, Any]:
        """:meth:`evaluate`, its time per held-out example measured for the deadline of ``--minutes``."""
        began = time.monotonic()
        evaluation = self.evaluate(count)
        examples = max(1, len(self.setup.data.evaluation_pairs(count)))
        self._evaluation_seconds = (time.monotonic() - began) / examples
        return evaluation

    # save ----------------------------------------------------------------------------------------------

    def save(self) -> None:
        """Write a checkpoint of this step (rank 0 only) and the run's history files."""
        if not is_main_rank():
            return

        began = time.monotonic()
        self.losses_read()

        def record(optimizer: dict[str, Any]) -> dict[str, Any]:
            return trainer_record(
                framework=self.setup.options.framework, process=self.process_facts(), step=self.step_count,
                options=asdict(self.setup.options), optimizer=optimizer, data=self.setup.prepared.facts,
                seconds=self.seconds,
                tokens=self.tokens, history=self.history,
            )  # fmt: skip

        save_step(
            self.out, self.step_count, config=self.setup.config, generation=self.setup.generation,
            write_weights=self.trainer.write_weights,
            write_optimizer=self.trainer.write_optimizer, record=record,
            tokenizers=(self.setup.source, self.setup.target), keep=self.setup.options.keep,
        )  # fmt: skip
        self.write_history()
        self._save_seconds = time.monotonic() - began

    def process_facts(self) -> dict[str, Any]:
        """How this run is trained: the framework's facts (device, precision...), the world size and the CPU threads
        (they change the float rounding of the CPU's sums, so the run's numbers)."""
        import torch

        return {**self.trainer.facts(), "world_size": self.world, "threads": torch.get_num_threads()}

    def write_history(self) -> None:
        self.losses_read()
        history = {
            "metric": self.metric, **self.history, "seconds": round(self.seconds, 1), "tokens": self.tokens,
            "device": self.process_facts()["device"], "label_smoothing": self.setup.options.label_smoothing,
        }  # fmt: skip
        write_history(self.out, history)
        try:
            from multihead.app.plot import plot_history

            plot_history(history, history_plot(self.out))
        except ImportError:  # matplotlib is optional for training
            pass

    # the whole run -------------------------------------------------------------------------------------

    def run(self) -> Result:
        o = self.setup.options
        deadline = None if o.minutes is None else self.began + 60 * o.minutes
        bar = progress_bar(o.steps, self.step_count, self.options.progress)
        self._stale = 0
        self._started, self._first_step = time.monotonic(), self.step_count
        tokens_before = self.tokens
        logged = (self.step_count, self.tokens, self.seconds)  # where the log's last line left the run
        if is_main_rank():
            began = datetime.now(timezone.utc).isoformat(timespec="seconds")
            append_log(self.out, {"event": "start", "step": self.step_count, "resumed": self.options.resume,
                                  "time": began})  # fmt: skip
        if self.setup.initial is not None and self.step_count == 0:
            self._evaluate_and_save(bar)  # the curve starts at the score of the model fine-tuning starts from
        with Interrupt() as interrupt:
            while o.steps is None or self.step_count < o.steps:
                out_of_time = deadline is not None and time.monotonic() + self._time_needed(o.minutes) >= deadline
                early = bool(o.patience) and self._stale >= o.patience
                # Ranks agree on stopping at the same steps (every step alone; with several, every READ_EVERY).
                due = self.world == 1 or self.step_count % READ_EVERY == 0
                if due and self.trainer.agree(interrupt.requested or out_of_time or early):
                    if early and not interrupt.requested:
                        say(f"stopping early: no better validation {self.metric} in {self._stale} evaluations")
                    break
                fit_threads()
                tick = time.monotonic()
                self.step()
                self._step_seconds = time.monotonic() - tick
                self.seconds += self._step_seconds
                if o.compile and self.step_count == self._first_step + 1:
                    bar.write(f"--compile: the first step took {self._step_seconds:.1f} s (compiling it)")
                bar.update(1)
                if self.step_count % READ_EVERY == 0 or self.step_count == o.steps:
                    rate = (self.tokens - tokens_before) / (time.monotonic() - self._started)
                    progress = self._progress(self.losses_read(), rate, deadline)
                    bar.set_postfix(progress.postfix(), refresh=False)  # drawn by bar.update, at most every mininterval
                if self.step_count % o.log_every == 0 and is_main_rank():
                    logged = self._log_progress(logged, deadline, printed=bool(bar.disable))
                self._evaluate_and_save(bar)
        bar.close()
        latest = latest_checkpoint(self.out)
        if latest is None or latest.name != checkpoint_name(self.step_count):
            self.save()
        self.trainer.release()
        return self.finish(interrupt.requested)

    def _progress(self, loss: float, rate: float, deadline: float | None) -> Progress:
        """Where the run stands, with this ``loss`` and ``rate``; the time left is the deadline's, or that of the steps
        left at this process's pace so far, whichever is sooner."""
        o, now = self.setup.options, time.monotonic()
        lefts = [] if deadline is None else [deadline - now]
        done = self.step_count - self._first_step
        if o.steps is not None and done:
            lefts.append((o.steps - self.step_count) * (now - self._started) / done)
        skipped = self.trainer.facts().get("skipped_steps")  # by fp16's loss scaler
        return Progress(
            self.step_count, o.steps, loss, self.lr, rate, now - self.began, self.seconds, min(lefts, default=None),
            timed=deadline is not None, skipped=skipped,
        )  # fmt: skip

    def _log_progress(
        self, logged: tuple[int, int, float], deadline: float | None, printed: bool
    ) -> tuple[int, int, float]:
        """Log the steps since ``logged`` (the step, tokens and training seconds of the last line): their mean loss
        and tokens per second of training into ``train.jsonl``, and as a line on stdout when ``printed`` (no progress
        bar is drawn). Where this line leaves the run."""
        step, tokens, seconds = logged
        self.losses_read()
        losses = list(itertools.takewhile(lambda entry: entry[0] > step, reversed(self.history["losses"])))
        trained = self.seconds - seconds
        rate = (self.tokens - tokens) / trained if trained > 0 else 0.0
        progress = self._progress(sum(loss for _, loss in losses) / max(1, len(losses)), rate, deadline)
        if printed:
            say(progress.line())
        append_log(self.out, progress.entry())
        return self.step_count, self.tokens, self.seconds

    def _time_needed(self, minutes: float | None) -> float:
        """The seconds the run needs to end after one more step (with several ranks, the ``READ_EVERY`` steps until
        they next agree): those steps, the evaluation and checkpoint they are due to make, then the final evaluations
        and checkpoints, each as long as the last one measured (an evaluation by its held-out examples). Until an
        evaluation has been timed, a share of ``minutes`` (``UNMEASURED_SHARE``) is kept for the final ones. Rank 0
        evaluates and saves, and knows how long they take; the other ranks stop when it does."""
        if not is_main_rank():
            return 0.0
        o = self.setup.options
        ahead = range(self.step_count + 1, self.step_count + (1 if self.world == 1 else READ_EVERY) + 1)
        needed = len(ahead) * self._step_seconds
        if any(step % o.eval_every == 0 for step in ahead):
            needed += self._evaluation_time(o.eval_examples)
        if any(step % o.checkpoint_every == 0 for step in ahead):
            needed += self._save_seconds
        # What finish() does: a task's evaluation on every held-out example; a corpus's of the last step, and of
        # the average of the last checkpoints, which it saves.
        final = [None] if not self.setup.data.keeps_best else [o.eval_examples] * (2 if o.average else 1)
        needed += (1 + bool(o.average)) * self._save_seconds
        if self._evaluation_seconds is None:
            return needed + UNMEASURED_SHARE * 60 * (minutes or 0)
        return needed + sum(self._evaluation_time(count) for count in final)

    def _evaluation_time(self, count: int | None) -> float:
        """How long an evaluation on ``count`` held-out examples takes, at the pace last measured (0 before)."""
        return (self._evaluation_seconds or 0.0) * len(self.setup.data.evaluation_pairs(count))

    def _evaluate_and_save(self, bar: Any) -> None:
        """Evaluate (rank 0) and checkpoint when this step is due to; ``best`` follows an improving corpus run."""
        o, saved = self.setup.options, False
        if is_main_rank() and self.step_count % o.eval_every == 0:
            evaluation = self.timed_evaluation(o.eval_examples)
            improved = self.record(evaluation)
            self._stale = 0 if improved else self._stale + 1
            loss = self.losses_read() if self.history["losses"] else None
            bar.write(self.setup.data.describe(self.step_count, loss, evaluation))
            if improved and self.setup.data.keeps_best:
                self.save()
                saved = True
                point(self.out, BEST, checkpoint_name(self.step_count))
        if self.step_count % o.checkpoint_every == 0 and not saved:
            self.save()

    def consider(self, evaluation: dict[str, Any], checkpoint: str) -> None:
        """Record a final evaluation of ``checkpoint``; ``best`` names it when it is the best so far."""
        if self.record(evaluation, final=True):
            point(self.out, BEST, checkpoint)

    def finish(self, interrupted: bool) -> Result:
        """The final evaluation: of the last step on every held-out example, where the data keeps no best checkpoint
        (a task); else of the last step and of the average of the last checkpoints too, the result the best
        checkpoint's evaluation."""
        self.losses_read()
        losses = [tuple(x) for x in self.history["losses"]]
        result = Result(self.step_count, interrupted, losses, model=self.trainer.model)
        if interrupted or not is_main_rank():
            return result
        data, o, metric = self.setup.data, self.setup.options, self.metric
        if not data.keeps_best:
            result.evaluation = self.evaluate(None)
            self.log_evaluation(result.evaluation, final=True)
            result.summary = data.summary(result.evaluation, None)
            return result
        if not self.history["evals"] or self.history["evals"][-1]["step"] != self.step_count:
            self.consider(self.evaluate(o.eval_examples), checkpoint_name(self.step_count))
        averaged = save_average(self.out, o.average, (self.setup.source, self.setup.target)) if o.average else None
        if averaged is not None:
            directory, count = averaged
            self.trainer.load_weights(directory / WEIGHTS)
            evaluation = {**self.evaluate(o.eval_examples), "checkpoint": AVERAGE}
            say(f"average of the last {count} checkpoints: {metric.upper()} {evaluation[metric]:.2f}")
            self.consider(evaluation, AVERAGE)
        self.write_history()
        best = max((e for e in self.history["evals"] if metric in e), key=self.rank)
        result.evaluation = best
        result.checkpoint = best.get("checkpoint", checkpoint_name(best["step"]))
        result.summary = data.summary(best, result.checkpoint)
        return result


def train(options: TrainOptions) -> Result:
    """Train as ``options`` say: build, step until done, save; the final evaluation in the result."""
    if options.threads is not None:
        use_threads(options.threads)
    training = Training(options)
    try:
        training.build()
        return training.run()
    finally:
        training.lock.release()
