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

import importlib
import importlib.util
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from multihead.app.batching import Batch, CorpusBatches, evaluation_batches, make_batch
from multihead.app.console import (
    UserError,
    framework_notices_filtered,
    is_main_rank,
    plural,
    progress_bar,
    rank,
    say,
    warn,
    world_size,
)
from multihead.app.corpus import fingerprint
from multihead.app.data import Corpus, Task, check_sides, load_corpus, load_task, survey
from multihead.app.devices import keep_frameworks_off_gpus, resolve_device
from multihead.app.encoded import EncodedCorpus, encode_pairs
from multihead.app.evaluate import exact_match, score
from multihead.app.languages import bleu_tokenizer, from_file_names
from multihead.app.memory import release_freed_memory
from multihead.app.options import DATA, FLAGS, RECIPES, RESUMABLE, SAVED, TrainOptions, in_flags, on_this_machine
from multihead.app.runs import (
    AVERAGE,
    BEST,
    WEIGHTS,
    Checkpoint,
    RunError,
    RunLock,
    check_writable,
    checkpoint_name,
    encoded_corpus,
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
from multihead.app.tokenizers import PAD, Tokenizer, build_tokenizers
from multihead.app.tokenizers import digest as tokenizers_digest
from multihead.app.translate import length_limit, translate_ids
from multihead.config import TransformerConfig

CORPUS_MAX_LEN = 256
READ_EVERY = 10
"""Steps between reads of the loss from the device (and, with several ranks, between their agreeing to stop): a GPU
waits for the host only then."""


# --- what a run is made of --------------------------------------------------------------------------------


@dataclass
class Setup:
    """A run's data, tokenizers, model configuration and resolved options."""

    options: dict[str, Any]
    data: Task | Corpus
    source: Tokenizer
    target: Tokenizer
    config: TransformerConfig
    encoded: EncodedCorpus | None  # a corpus's training pairs as ids
    cache_key: dict[str, Any] | None  # what they were made from (the run's encoded-corpus cache holds it)
    cached: bool  # whether they are the run's cache (else it is to be written)
    facts: dict[str, Any]  # saved in each checkpoint's record: fingerprints, longest target

    @property
    def is_corpus(self) -> bool:
        return isinstance(self.data, Corpus)


def _resolve(options: TrainOptions, kind: str, saved: dict[str, Any] | None) -> dict[str, Any]:
    """The options in force: those given, else the run's (on resume; not this machine's choices), else the
    recipe's."""
    recipe = RECIPES[kind]
    base = recipe if saved is None else saved
    resolved = {}
    for option in SAVED:  # a run saved before an option existed takes the recipe's value for it
        given = getattr(options, option.name)
        resolved[option.name] = given if given is not None else base.get(option.name, recipe.get(option.name))
    resolved.update(on_this_machine(options))
    if saved is None and kind != "task" and options.tokenizer in ("char", "word") and options.joint is None:
        resolved["joint"] = True
    if resolved["average"]:
        resolved["keep"] = max(resolved["keep"], resolved["average"])
    return resolved


def _cache_key(train: Any, source: Tokenizer, target: Tokenizer) -> dict[str, Any]:
    """What a corpus's ids are made from: its files' fingerprints, the tokenizers, the length limit."""
    return {"train": train, "tokenizers": tokenizers_digest(source, target), "max_len": CORPUS_MAX_LEN}


def _encode(corpus: Corpus, source: Tokenizer, target: Tokenizer, size: int | None, progress: bool) -> EncodedCorpus:
    """The ids of ``corpus``'s training pairs that fit the model's positions; a warning for those left out."""
    encoded = encode_pairs(corpus.pairs(), source, target, CORPUS_MAX_LEN, total=size, progress=progress)
    if not len(encoded):
        raise UserError(f"--data: every sentence pair is longer than {CORPUS_MAX_LEN} tokens: nothing to train on")
    if encoded.dropped:
        left_out = f"{plural(encoded.dropped, 'sentence pair')} longer than {CORPUS_MAX_LEN} tokens"
        warn(f"--data: {left_out} {'is' if encoded.dropped == 1 else 'are'} left out of training")
    return encoded


def _shared_encoding(out: Path, key: dict[str, Any], encode: Callable[[], EncodedCorpus]) -> tuple[EncodedCorpus, bool]:
    """The run's encoded corpus, and whether it is the run's cache: the cache when it matches ``key``; else rank 0
    encodes it (and :meth:`Training.build` writes the cache), and the other ranks of a torchrun wait for the cache
    and map it (one copy on a machine)."""
    found = encoded_corpus(out, key)
    if found is not None:
        return found, True
    if is_main_rank():
        return encode(), False
    while (found := encoded_corpus(out, key)) is None:
        time.sleep(0.5)
    return found, True


def _config(options: dict[str, Any], source: Tokenizer, target: Tokenizer, max_len: int) -> TransformerConfig:
    try:
        return TransformerConfig(
            len(source), len(target), d_model=options["d_model"], num_heads=options["num_heads"],
            num_encoder_layers=options["layers"], num_decoder_layers=options["layers"], d_ff=options["d_ff"],
            dropout=options["dropout"], max_len=max_len, pad_id=PAD, tie_embeddings=source is target,
        )  # fmt: skip
    except ValueError as error:
        raise UserError(in_flags(str(error))) from None


def _load_data(options: TrainOptions, saved: dict[str, Any] | None) -> Task | Corpus:
    if options.data is not None:
        return load_corpus(options.data, options.valid)
    name = options.task or (saved["task"] if saved else "dates")
    return load_task(name)


def _check_vocab_size(options: TrainOptions, resolved: dict[str, Any]) -> None:
    """``--vocab-size`` sizes a subword vocabulary; given with another tokenizer, it would do nothing."""
    if options.vocab_size is not None and resolved["tokenizer"] != "subword":
        raise UserError(
            f"--vocab-size sets the size of a subword vocabulary, and this run's tokenizer is {resolved['tokenizer']} "
            "(it keeps every symbol it sees): drop --vocab-size, or add --tokenizer subword"
        )


def _tokenizers(resolved: dict[str, Any], pairs: Sequence[tuple[str, str]]) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers learned from ``pairs``; a warning when a subword vocabulary outgrew ``--vocab-size`` (which
    cannot be smaller than the specials and the characters of the corpus)."""
    asked = resolved["vocab_size"] or 0
    source, target = build_tokenizers(
        resolved["tokenizer"], [s for s, _ in pairs], [t for _, t in pairs], vocab_size=asked, joint=resolved["joint"]
    )
    grown = max(len(source), len(target))
    if resolved["tokenizer"] == "subword" and asked and grown > asked:
        warn(f"--vocab-size {asked} is too small for the corpus's characters: the vocabulary has {grown} symbols")
    return source, target


def new_setup(options: TrainOptions, out: Path) -> Setup:
    """The setup of a fresh run: data read, tokenizers learned, model sized."""
    data = _load_data(options, None)
    kind = "task" if isinstance(data, Task) else "corpus"
    if kind == "corpus" and resolve_device(options.device or "auto").startswith("cuda"):
        kind = "corpus-gpu"  # the recipe sized for a GPU
    resolved = _resolve(options, kind, None)
    if isinstance(data, Task):
        resolved.update(task=data.name, data=None, valid=None, tokenizer=resolved["tokenizer"] or data.tokenizer)
        _check_vocab_size(options, resolved)
        sample = data.vocabulary_sample()
        source, target = _tokenizers(resolved, sample)
        longest = max(
            len(tokenizer.encode(text)[0]) for s, t in sample for tokenizer, text in ((source, s), (target, t))
        )
        config = _config(resolved, source, target, max(64, 2 * longest + 2))
        facts = {"longest_target": max(len(target.encode(t)[0]) for _, t in sample)}
        return Setup(resolved, data, source, target, config, None, None, True, facts)
    resolved.update(task=None, data=list(options.data), valid=list(options.valid) if options.valid else None)
    resolved["langs"] = list(options.langs) if options.langs else from_file_names(options.data)
    _check_vocab_size(options, resolved)
    found = survey(data, resolved["vocab_sample"], seed=resolved["seed"], progress=options.progress)
    check_sides(data, found, options.data, options.valid)  # a new run's corpus (a resumed one's is the same files)
    sampled = f", a sample of the {found.size:,}" if len(found.sample) < found.size else ""
    say(f"learning a {resolved['tokenizer']} vocabulary from {plural(len(found.sample), 'sentence pair')}{sampled}")
    source, target = _tokenizers(resolved, found.sample)
    size = found.size
    del found  # the sample's texts
    release_freed_memory()  # theirs and the BPE trainer's
    config = _config(resolved, source, target, CORPUS_MAX_LEN)
    train = fingerprint(options.data)
    key = _cache_key(train, source, target)
    encoded, cached = _shared_encoding(out, key, lambda: _encode(data, source, target, size, options.progress))
    facts = {
        "train": train,
        "valid": fingerprint(options.valid) if options.valid else None,
        "longest_target": int(encoded.targets.lengths.max()),
    }
    return Setup(resolved, data, source, target, config, encoded, key, cached, facts)


def _refuse_changes(options: TrainOptions, saved: dict[str, Any]) -> None:
    """Refuse, on resume, a given option that would change the run's model (its data are checked apart)."""
    may_change = ", ".join(FLAGS[name] for name in RESUMABLE)
    for option in SAVED:
        given = getattr(options, option.name)
        if option.resumable or option.name in DATA or given is None or given == saved.get(option.name):
            continue
        raise UserError(
            f"{option.typed(given)} would change the run, which has {option.typed(saved.get(option.name))}: "
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
    resolved = _resolve(options, "corpus" if saved["task"] is None else "task", saved)
    data = _load_data(options, saved)
    facts = checkpoint.trainer["data"]
    if isinstance(data, Corpus):
        if options.valid is None and facts.get("valid") is not None:
            raise UserError(
                f"{run} validated on --valid {' '.join(saved['valid'] or [])}; give --valid again (the same files) "
                "to continue training"
            )
        if options.valid is not None and facts.get("valid") is None:
            raise UserError(f"--valid would change the run: {run} validated on a held-out tenth of --data")
        for flag, paths, key in ((FLAGS["data"], options.data, "train"), (FLAGS["valid"], options.valid, "valid")):
            now = fingerprint(paths) if paths else None
            if now is not None and facts.get(key) is not None:
                now = [{**entry, "name": old["name"]} for entry, old in zip(now, facts[key], strict=False)]
            if now != facts.get(key):
                raise UserError(
                    f"{flag} {' '.join(paths or [])} is not the corpus this run trained on "
                    "(its size or SHA-256 differs); --resume needs the same files"
                )
        resolved.update(data=list(options.data), valid=list(options.valid) if options.valid else None)
        key = _cache_key(facts["train"], checkpoint.source, checkpoint.target)
        encoded, cached = _shared_encoding(
            out, key, lambda: _encode(data, checkpoint.source, checkpoint.target, None, options.progress)
        )
    else:
        key, encoded, cached = None, None, True
    return Setup(
        resolved, data, checkpoint.source, checkpoint.target, checkpoint.config, encoded, key, cached, dict(facts)
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

    def pad_to(self) -> int:
        """Batch lengths are rounded up to a multiple of this (fewer shapes for a compiling framework)."""
        ...


KERAS_BACKENDS = ("tensorflow", "jax", "torch")
"""The Keras backends ``--framework keras`` trains on."""


def check_keras_backend() -> None:
    """``KERAS_BACKEND``, when set, names a backend Keras trains on here: checked before Keras is imported (which would
    fail on another name) and before anything is written."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend is not None and backend not in KERAS_BACKENDS:
        raise UserError(
            f"KERAS_BACKEND={backend!r} is not a backend --framework keras trains on: set it to "
            f"{', '.join(KERAS_BACKENDS[:-1])} or {KERAS_BACKENDS[-1]} (unset: Keras' default, tensorflow)"
        )


def check_device(framework: str, device: str) -> None:
    """The device a run is to train on exists: checked before anything is written. Keras is imported here, after
    its backend's name is checked and, for ``--device cpu``, with the GPUs hidden from it."""
    if framework != "keras":
        resolve_device(device)
        return
    check_keras_backend()
    if device == "cpu":
        keep_frameworks_off_gpus()
    with framework_notices_filtered():
        # Keras imports TensorFlow whenever it is installed, whatever the backend (set_random_seed seeds it too):
        # here, where its start-up notices are filtered, rather than in the middle of a progress bar.
        if importlib.util.find_spec("tensorflow") is not None:
            importlib.import_module("tensorflow")
        from multihead.app.train_keras import keras_device

    found = keras_device()
    if device.startswith("cuda") and found == "cpu":
        raise UserError(f"--device {device}: Keras' {os.environ.get('KERAS_BACKEND', 'tensorflow')} backend sees no "
                        "GPU on this machine; use --device cpu, or auto")  # fmt: skip


def make_trainer(
    framework: str, setup_config: TransformerConfig, options: dict[str, Any], checkpoint: Checkpoint | None
) -> Trainer:
    """The framework's trainer; :meth:`Training.build` has checked the device (and imported Keras) before."""
    if framework == "keras":
        from multihead.app.train_keras import KerasTrainer

        return KerasTrainer(setup_config, options, checkpoint)
    from multihead.app.train_torch import TorchTrainer

    return TorchTrainer(setup_config, options, checkpoint)


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
    accuracy: float | None = None  # a task's exact match on its held-out set
    heldout: int = 0
    scores: dict[str, Any] | None = None  # a corpus's validation scores (BLEU, chrF)
    checkpoint: str | None = None  # the checkpoint the final scores are of
    model: Any = None  # the trained model (this rank's copy under torchrun)


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
        o = self.setup.options
        self.batches = None
        if self.setup.is_corpus:
            self.batches = CorpusBatches(self.setup.encoded, o["batch_tokens"], o["seed"], self.trainer.pad_to())

    def _resume(self) -> None:
        here = on_this_machine(self.options)  # the device: this machine's, never the run's

        def load(found: Checkpoint) -> Trainer:
            # The run's own framework: a different --framework is refused by resumed_setup, as a change of the run
            # (not as a damaged checkpoint).
            return make_trainer(found.trainer["framework"], found.config, {**found.options, **here}, found)

        self.checkpoint, self.trainer = open_checkpoint(self.out, "latest", load, doing="resuming from")
        self.setup = resumed_setup(self.options, self.checkpoint, self.out)
        self._save_encoding()
        self.trainer.configure(self.setup.options)
        record = self.checkpoint.trainer
        self._warn_of_changes(record.get("process") or {})
        self.step_count = record["step"]
        self.history = {key: record[key] for key in ("losses", "evals")}
        self.seconds, self.tokens = record.get("seconds", 0.0), record.get("tokens", 0)

    def _save_encoding(self) -> None:
        """Write the run's encoded corpus when it was encoded here (rank 0, the run's lock held), and train from the
        files written, memory-mapped, as a resumed run does: the arrays encoding made are let go."""
        if is_main_rank() and not self.setup.cached:
            mapped = save_encoded_corpus(self.out, self.setup.encoded, self.setup.cache_key)
            self.setup = replace(self.setup, encoded=mapped, cached=True)
            release_freed_memory()

    def _warn_of_changes(self, before: dict[str, Any]) -> None:
        """Say what resuming changes in how the run trains: Keras' backend, or the batch a step takes (world size
        × ``--accumulate`` batches of ``--batch-tokens``)."""
        trained_on, now = before.get("keras_backend"), self.trainer.facts().get("keras_backend")
        if trained_on is not None and trained_on != now:
            warn(f"this run trained on the Keras backend {trained_on}; it goes on with {now} (KERAS_BACKEND): the "
                 "same model, other numerics")  # fmt: skip
        accumulate = self.setup.options["accumulate"] or 1
        saved_accumulate = self.checkpoint.options.get("accumulate") or 1
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
        self.checkpoint = None
        o = self.setup.options
        self.trainer = make_trainer(o["framework"], self.setup.config, o, None)
        self.step_count, self.history, self.seconds, self.tokens = 0, {"losses": [], "evals": []}, 0.0, 0

    # step ----------------------------------------------------------------------------------------------

    def micro_batch(self, index: int) -> Batch:
        """Batch ``index`` of the run (0-based): the same whichever framework, rank or resume. Optimizer step ``s``
        takes batches ``s·n .. s·n + n - 1``, ``n`` = world size × ``--accumulate``; rank ``r`` those ``≡ r mod``
        the world size."""
        o = self.setup.options
        if self.batches is not None:
            return self.batches.batch(index)
        pairs = self.setup.data.batch(o["seed"], index, o["batch_size"])
        sources = self.setup.source.encode_all([s for s, _ in pairs])
        targets = self.setup.target.encode_all([t for _, t in pairs])
        return make_batch(sources, targets, self.trainer.pad_to())

    def step_batches(self, step: int) -> tuple[list[Batch], int]:
        """This rank's batches of optimizer step ``step`` and the target tokens of all the ranks' batches."""
        per_step = self.world * (self.setup.options["accumulate"] or 1)
        indices = range(step * per_step, (step + 1) * per_step)
        mine = {index: self.micro_batch(index) for index in indices[rank() :: self.world]}
        tokens = sum(mine[index].target_tokens if index in mine else self._target_tokens(index) for index in indices)
        return list(mine.values()), tokens

    def _target_tokens(self, index: int) -> int:
        """The target tokens of another rank's batch ``index`` (a corpus counts them without building it)."""
        if self.batches is not None:
            return self.batches.target_tokens(index)
        return self.micro_batch(index).target_tokens

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
        lr = learning_rate(self.step_count + 1, peak=o["lr"], warmup=o["warmup"])
        loss = self.trainer.train_step(batches, lr, tokens)
        self.step_count += 1
        self.tokens += tokens
        self.history["losses"].append([self.step_count, loss])  # a tensor on the device until read

    def losses_read(self) -> float:
        """Read the losses still held as tensors (a GPU waits here, not at every step); the newest loss."""
        losses = self.history["losses"]
        for entry in reversed(losses):
            if isinstance(entry[1], float):
                break
            entry[1] = float(entry[1])
        return losses[-1][1]

    # evaluate ------------------------------------------------------------------------------------------

    def _translate(self, sources: Sequence[str]) -> list[str]:
        setup = self.setup
        ids = setup.source.encode_all(sources)
        limit = lambda length: length_limit(length, setup.facts["longest_target"], setup.config.max_len)  # noqa: E731
        generate = lambda src, limits, _: self.trainer.generate(src, limits)  # noqa: E731 (greedy: no sentence keys)
        return [setup.target.decode(out) for out in translate_ids(generate, ids, limit=limit)]

    def evaluate(self, count: int | None) -> dict[str, Any]:
        """Held-out exact match (a task), or validation loss, BLEU and chrF with greedy decoding (a corpus), on the
        first ``count`` held-out examples (all when ``None``)."""
        setup = self.setup
        if isinstance(setup.data, Task):
            pairs = setup.data.heldout[:count]
            translations = self._translate([s for s, _ in pairs])
            return {"accuracy": exact_match(translations, [t for _, t in pairs]), "examples": len(pairs)}
        pairs = setup.data.valid[:count]
        sources = setup.source.encode_all([s for s, _ in pairs])
        targets = setup.target.encode_all([t for _, t in pairs])
        summed = sum(self.trainer.loss_sum(batch) for _, batch in evaluation_batches(sources, targets, 4096))
        translations = self._translate([s for s, _ in pairs])
        langs = setup.options.get("langs")
        scores = score(translations, [t for _, t in pairs], tokenize=bleu_tokenizer(langs[1] if langs else None))
        return {"valid_loss": summed / sum(len(t) + 1 for t in targets), **scores, "examples": len(pairs)}

    @property
    def metric(self) -> str:
        return "bleu" if self.setup.is_corpus else "accuracy"

    def record(self, evaluation: dict[str, Any]) -> bool:
        """Keep an evaluation in the history; whether it is the best so far."""
        best = max((e[self.metric] for e in self.history["evals"] if self.metric in e), default=-math.inf)
        self.history["evals"].append({"step": self.step_count, "seconds": round(self.seconds, 1), **evaluation})
        return evaluation[self.metric] > best

    # save ----------------------------------------------------------------------------------------------

    def save(self) -> None:
        """Write a checkpoint of this step (rank 0 only) and the run's history files."""
        if not is_main_rank():
            return

        self.losses_read()

        def record(optimizer: dict[str, Any]) -> dict[str, Any]:
            return trainer_record(
                framework=self.setup.options["framework"], process=self.process_facts(), step=self.step_count,
                options=self.setup.options, optimizer=optimizer, data=self.setup.facts, seconds=self.seconds,
                tokens=self.tokens, history=self.history,
            )  # fmt: skip

        save_step(
            self.out, self.step_count, config=self.setup.config, write_weights=self.trainer.write_weights,
            write_optimizer=self.trainer.write_optimizer, record=record,
            tokenizers=(self.setup.source, self.setup.target), keep=self.setup.options["keep"],
        )  # fmt: skip
        self.write_history()

    def process_facts(self) -> dict[str, Any]:
        """How this run is trained: the framework's facts (device, precision...) and the world size."""
        return {**self.trainer.facts(), "world_size": self.world}

    def write_history(self) -> None:
        self.losses_read()
        history = {
            "metric": self.metric, **self.history, "seconds": round(self.seconds, 1), "tokens": self.tokens,
            "device": self.process_facts()["device"],
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
        deadline = None if o["minutes"] is None else time.monotonic() + 60 * o["minutes"]
        bar = progress_bar(o["steps"], self.step_count, self.options.progress)
        self._stale = 0
        started, tokens_before, first_step = time.monotonic(), self.tokens, self.step_count
        with Interrupt() as interrupt:
            while o["steps"] is None or self.step_count < o["steps"]:
                out_of_time = deadline is not None and time.monotonic() >= deadline
                early = bool(o["patience"]) and self._stale >= o["patience"]
                # Ranks agree on stopping at the same steps (every step alone; with several, every READ_EVERY).
                due = self.world == 1 or self.step_count % READ_EVERY == 0
                if due and self.trainer.agree(interrupt.requested or out_of_time or early):
                    if early and not interrupt.requested:
                        say(f"stopping early: no better validation {self.metric} in {self._stale} evaluations")
                    break
                tick = time.monotonic()
                self.step()
                self.seconds += time.monotonic() - tick
                if o["compile"] and self.step_count == first_step + 1:
                    bar.write(f"--compile: the first step took {time.monotonic() - tick:.1f} s (compiling it)")
                bar.update(1)
                if self.step_count % READ_EVERY == 0 or self.step_count == o["steps"]:
                    rate = (self.tokens - tokens_before) / (time.monotonic() - started)
                    bar.set_postfix(self._postfix(rate, deadline), refresh=False)  # drawn by bar.update, at most
                self._evaluate_and_save(bar)  # every mininterval
        bar.close()
        if latest_checkpoint(self.out) is None or latest_checkpoint(self.out).name != checkpoint_name(self.step_count):
            self.save()
        return self.finish(interrupt.requested)

    def _postfix(self, rate: float, deadline: float | None) -> dict[str, str]:
        """The progress bar's loss (read from the device here), tokens/s and time left."""
        postfix = {"loss": f"{self.losses_read():.3f}", "tok/s": f"{rate:.0f}"}
        skipped = self.trainer.facts().get("skipped_steps")  # by fp16's loss scaler
        if skipped:
            postfix["skipped"] = str(skipped)
        if deadline is not None:
            left = max(0, int(deadline - time.monotonic()))
            postfix["left"] = f"{left // 60}:{left % 60:02d}"
        return postfix

    def _evaluate_and_save(self, bar: Any) -> None:
        """Evaluate (rank 0) and checkpoint when this step is due to; ``best`` follows an improving corpus run."""
        o, saved = self.setup.options, False
        if is_main_rank() and self.step_count % o["eval_every"] == 0:
            evaluation = self.evaluate(o["eval_examples"])
            improved = self.record(evaluation)
            self._stale = 0 if improved else self._stale + 1
            bar.write(self._describe(evaluation))
            if improved and self.setup.is_corpus:
                self.save()
                saved = True
                point(self.out, BEST, checkpoint_name(self.step_count))
        if self.step_count % o["checkpoint_every"] == 0 and not saved:
            self.save()

    def _describe(self, evaluation: dict[str, Any]) -> str:
        loss = self.losses_read()
        if "accuracy" in evaluation:
            return f"step {self.step_count}: loss {loss:.4f}, held-out exact match {evaluation['accuracy']:.3f}"
        return (
            f"step {self.step_count}: loss {loss:.3f}, validation loss {evaluation['valid_loss']:.3f}, "
            f"BLEU {evaluation['bleu']:.2f}, chrF {evaluation['chrf']:.2f}"
        )

    def consider(self, evaluation: dict[str, Any], checkpoint: str) -> None:
        """Record an evaluation of ``checkpoint``; ``best`` names it when it is the best so far."""
        if self.record(evaluation):
            point(self.out, BEST, checkpoint)

    def finish(self, interrupted: bool) -> Result:
        """The final evaluation: a task's held-out exact match; for a corpus, the last step and the average of the
        last checkpoints are evaluated too, and the result is the best checkpoint's scores."""
        self.losses_read()
        losses = [tuple(x) for x in self.history["losses"]]
        result = Result(self.step_count, interrupted, losses, model=self.trainer.model)
        if interrupted or not is_main_rank():
            return result
        if isinstance(self.setup.data, Task):
            result.accuracy = self.evaluate(None)["accuracy"]
            result.heldout = len(self.setup.data.heldout)
            return result
        o = self.setup.options
        if not self.history["evals"] or self.history["evals"][-1]["step"] != self.step_count:
            self.consider(self.evaluate(o["eval_examples"]), checkpoint_name(self.step_count))
        averaged = (
            save_average(self.out, o["average"], (self.setup.source, self.setup.target)) if o["average"] else None
        )
        if averaged is not None:
            self.trainer.load_weights(averaged / WEIGHTS)
            evaluation = {**self.evaluate(o["eval_examples"]), "checkpoint": AVERAGE}
            say(f"average of the last {o['average']} checkpoints: BLEU {evaluation['bleu']:.2f}")
            self.consider(evaluation, AVERAGE)
        self.write_history()
        best = max((e for e in self.history["evals"] if "bleu" in e), key=lambda e: e["bleu"])
        result.scores = {k: best[k] for k in ("bleu", "bleu_lowercase", "chrf", "examples", "signature")}
        result.checkpoint = best.get("checkpoint", checkpoint_name(best["step"]))
        return result


def train(options: TrainOptions) -> Result:
    """Train as ``options`` say: build, step until done, save; the final evaluation in the result."""
    training = Training(options)
    try:
        training.build()
        return training.run()
    finally:
        training.lock.release()
