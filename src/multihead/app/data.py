"""What a run trains on: a built-in task (generated locally, no download) or a parallel corpus, each a
:class:`TrainingData`, the one seam through which training reads its data, sizes its model, batches and judges it.

A built-in task has a fixed held-out split that never overlaps training: an example belongs to it when a hash of
its key (the date, the number, the string) falls in a fixed tenth. A corpus is validated on ``--valid`` when given,
else on a held-out tenth of its own pairs (rule ``"pairs"``): of its ``n`` sentence pairs, the ``⌊n/10⌋`` (at least
one, at most ``HELDOUT_SIZE``) different pairs whose :func:`pair_key` is smallest, found in one pass that keeps the
``HELDOUT_SIZE`` smallest keys in a bounded heap. The key hashes both sides whichever is the source, so the runs of
both directions of a corpus hold out the same pairs; training skips every copy of a held-out pair, and no other.
Runs record the rule (``"heldout"`` in their data facts); a run made before it was recorded resumes under the rule
it was made with (``"sources"``: every pair whose source's CRC-32 falls in a tenth is skipped, at most
``HELDOUT_SIZE`` of them validate), so that resuming never moves validation pairs into training.
"""

from __future__ import annotations

import heapq
import random
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from multihead.app.batching import Batch, Batches, CorpusBatches, make_batch
from multihead.app.console import UserError, is_main_rank, plural, progress_bar, say, warn
from multihead.app.corpus import Pair, fingerprint, iter_parallel, read_parallel
from multihead.app.encoded import EncodedCorpus, encode_pairs
from multihead.app.evaluate import exact_match, score
from multihead.app.generated import GENERATORS, TASKS
from multihead.app.languages import bleu_tokenizer, file_language, from_file_names
from multihead.app.runs import Checkpoint, RunError, encoded_corpus, open_checkpoint
from multihead.app.tokenizers import Tokenizer
from multihead.app.tokenizers import digest as tokenizers_digest

if TYPE_CHECKING:
    from multihead.app.options import RunOptions, TrainOptions

HELDOUT_SIZE = 1000
HELDOUT_RULE = "pairs"
"""How a new run holds out the validation pairs of a corpus given without ``--valid`` (see the module's text)."""
OLD_HELDOUT_RULE = "sources"
"""How runs made before the rule was recorded held them out: by source, ``is_heldout(source)``."""
SIDE_SAMPLE = 200
"""Validation sentences (and ten times as many training ones) whose words tell which way round a corpus reads."""
CORPUS_MAX_LEN = 256
"""The positions of a corpus run's model: pairs longer than this are left out of training."""
__all__ = [
    "CORPUS_MAX_LEN", "HELDOUT_RULE", "HELDOUT_SIZE", "Corpus", "Prepared", "Survey", "Task", "TrainingData",
    "heldout_rule", "load_corpus", "load_task", "pair_key", "survey", "vocabulary_from",
]  # fmt: skip


@dataclass
class Prepared:
    """A run's training data made ready: a corpus's training pairs as ids (``None`` for a task, whose pairs are drawn
    at every step), what they were made from (the run's encoded-corpus cache holds it), whether they are that cache
    (else it is to be written), and the facts each checkpoint records (fingerprints, the longest target)."""

    encoded: EncodedCorpus | None
    cache_key: dict[str, Any] | None
    cached: bool
    facts: dict[str, Any]


class TrainingData(Protocol):
    """What a run trains on. Training reads its data through this alone, so that another kind (a pretrained model's
    fine-tuning corpus, a monolingual corpus for back-translation) is added by implementing it."""

    name: str
    recipe: str
    """The recipe of its defaults (``RECIPES``; on a GPU its ``-gpu`` variant where there is one)."""
    metric: str
    """The evaluation's measure that ranks checkpoints, higher better."""
    keeps_best: bool
    """Whether a run keeps its best-evaluated checkpoint as ``best``, the one ``translate`` takes by default."""

    def defaults(self) -> dict[str, Any]:
        """Option values of its own, over the recipe's (a task's tokenizer)."""
        ...

    def recorded(self, options: TrainOptions) -> dict[str, Any]:
        """What a run records of it, whatever else is given: ``task``, ``data``, ``valid``, ``langs``."""
        ...

    def vocabulary_pairs(self, options: RunOptions, progress: bool) -> list[Pair]:
        """The pairs a new run learns its vocabulary from (a corpus checked for the usual mix-ups on the way)."""
        ...

    def positions(self, source: Tokenizer, target: Tokenizer) -> int:
        """The positions the model needs (its ``max_len``)."""
        ...

    def fit(self, max_len: int, source: Tokenizer, target: Tokenizer) -> None:
        """Keep to a model of ``max_len`` positions made elsewhere (``--init``), or refuse it in one line."""
        ...

    def prepare(self, out: Path, source: Tokenizer, target: Tokenizer, progress: bool) -> Prepared:
        """A new run's training data made ready for ``source`` and ``target``."""
        ...

    def resume(self, options: TrainOptions, checkpoint: Checkpoint, out: Path) -> Prepared:
        """A resumed run's training data made ready, refused where it is not what the run trained on."""
        ...

    def batches(self, options: RunOptions, source: Tokenizer, target: Tokenizer, prepared: Prepared,
                pad_to: int) -> Batches:  # fmt: skip
        """The run's training batches, the same whichever framework, rank or resume."""
        ...

    def evaluation_pairs(self, count: int | None) -> list[Pair]:
        """The first ``count`` held-out pairs (all when ``None``)."""
        ...

    def scores(
        self, translations: list[str], pairs: list[Pair], loss: Callable[[], float], langs: Sequence[str] | None
    ) -> dict[str, Any]:
        """An evaluation: greedy ``translations`` of ``pairs``' sources scored against their targets (``loss()``: the
        model's validation loss on them, where it is wanted), with its :attr:`metric` and ``examples``."""
        ...

    def describe(self, step: int, loss: float | None, evaluation: dict[str, Any]) -> str:
        """An evaluation as a line of the training log (``loss`` ``None``: before the first step)."""
        ...

    def summary(self, evaluation: dict[str, Any], checkpoint: str | None) -> str:
        """The final evaluation as the last line of ``train``; ``checkpoint``: the one it is of."""
        ...


def is_heldout(key: str) -> bool:
    """Whether a task's example of this key is held out (and, in runs made before rules were recorded, a corpus's
    pair of this source)."""
    return zlib.crc32(key.encode("utf-8")) % 10 == 0


def pair_key(pair: Pair) -> int:
    """A 64-bit hash of a sentence pair that is the same whichever side is the source: the CRC-32 of both sides in
    sorted order (no line holds a line feed), then their Adler-32 (ties of two different pairs all but impossible).
    Twice as fast as a cryptographic hash, which a held-out split does not need."""
    first, second = pair if pair[0] <= pair[1] else (pair[1], pair[0])
    text = f"{first}\n{second}".encode()
    return zlib.crc32(text) << 32 | zlib.adler32(text)


def heldout_rule(facts: dict[str, Any]) -> str:
    """The rule by which a corpus run (its trainer's data ``facts``) holds out its validation pairs: the one it
    records (``None`` with ``--valid``), else the rule of the versions that recorded none."""
    return (facts["heldout"] or HELDOUT_RULE) if "heldout" in facts else OLD_HELDOUT_RULE


@dataclass
class Task:
    """A built-in task (a :class:`TrainingData`): training pairs drawn on demand, a fixed held-out list, the tokenizer
    kind it suits. Judged by exact match; every step draws a fresh batch of ``--batch-size`` pairs."""

    name: str
    tokenizer: str
    heldout: list[Pair]
    draw: Callable[[np.random.Generator], Pair]  # one training pair
    recipe = "task"
    metric = "accuracy"
    keeps_best = False

    def batch(self, seed: int, step: int, size: int) -> list[Pair]:
        rng = np.random.default_rng([seed, step])
        return [self.draw(rng) for _ in range(size)]

    def vocabulary_sample(self, count: int = 5000) -> list[Pair]:
        rng = np.random.default_rng([12345])
        return [self.draw(rng) for _ in range(count)] + self.heldout

    def defaults(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer}

    def recorded(self, options: TrainOptions) -> dict[str, Any]:
        return {"task": self.name, "data": None, "valid": None, "langs": None}

    def vocabulary_pairs(self, options: RunOptions, progress: bool) -> list[Pair]:
        return self.vocabulary_sample()

    def positions(self, source: Tokenizer, target: Tokenizer) -> int:
        """Twice the longest tokenized example and more: room for what training never shows."""
        sample = self.vocabulary_sample()
        longest = max(len(side.encode(text)[0]) for s, t in sample for side, text in ((source, s), (target, t)))
        return max(64, 2 * longest + 2)

    def fit(self, max_len: int, source: Tokenizer, target: Tokenizer) -> None:
        needed = self.positions(source, target)
        if max_len < needed:
            raise UserError(
                f"--init: its model reads at most {max_len} tokens, and task {self.name!r} needs {needed} (twice its "
                "longest example and more)"
            )

    def prepare(self, out: Path, source: Tokenizer, target: Tokenizer, progress: bool) -> Prepared:
        longest = max(len(target.encode(t)[0]) for _, t in self.vocabulary_sample())
        return Prepared(None, None, True, {"longest_target": longest})

    def resume(self, options: TrainOptions, checkpoint: Checkpoint, out: Path) -> Prepared:
        return Prepared(None, None, True, dict(checkpoint.trainer["data"]))

    def batches(self, options: RunOptions, source: Tokenizer, target: Tokenizer, prepared: Prepared,
                pad_to: int) -> Batches:  # fmt: skip
        if options.batch_size is None:
            raise TypeError("a task's batches need a batch size")
        return TaskBatches(self, options.seed, options.batch_size, source, target, pad_to)

    def evaluation_pairs(self, count: int | None) -> list[Pair]:
        return self.heldout[:count]

    def scores(
        self, translations: list[str], pairs: list[Pair], loss: Callable[[], float], langs: Sequence[str] | None
    ) -> dict[str, Any]:
        return {"accuracy": exact_match(translations, [t for _, t in pairs]), "examples": len(pairs)}

    def describe(self, step: int, loss: float | None, evaluation: dict[str, Any]) -> str:
        trained = "before training" if loss is None else f"this step's training loss {loss:.4f}"
        return f"step {step}: {trained}, held-out exact match {evaluation['accuracy']:.3f}"

    def summary(self, evaluation: dict[str, Any], checkpoint: str | None) -> str:
        return f"accuracy: {evaluation['accuracy']:.3f} (exact match on {evaluation['examples']} held-out examples)"


@dataclass
class TaskBatches:
    """A task's batches: batch ``index`` drawn from an RNG seeded with ``(seed, index)`` and encoded."""

    task: Task
    seed: int
    size: int
    source: Tokenizer
    target: Tokenizer
    pad_to: int

    def batch(self, index: int) -> Batch:
        pairs = self.task.batch(self.seed, index, self.size)
        sources, targets = self.source.encode_all([s for s, _ in pairs]), self.target.encode_all([t for _, t in pairs])
        return make_batch(sources, targets, self.target.specials, self.pad_to)

    def target_tokens(self, index: int) -> int:
        return self.batch(index).target_tokens


@dataclass
class Corpus:
    """A parallel corpus (a :class:`TrainingData`): its files, read line by line when its training pairs are wanted
    (:meth:`pairs`), and its validation pairs, in memory; judged by validation BLEU, trained in batches of at most
    ``--batch-tokens`` tokens of its pairs encoded once. ``holdout`` says which pairs of ``data`` are held out for
    validation: none (``--valid`` given), every copy of the ``valid`` pairs (``"pairs"``, the rule of new runs), or,
    in runs made before it, those whose source hashes into the held-out tenth (``"hash"``) or, in a corpus too small
    for that, those whose source is the last line's (``"last"``, that source in ``last_source``)."""

    name: str
    data: list[str]
    valid: list[Pair]
    holdout: str | None
    last_source: str | None = None
    valid_files: list[str] | None = None  # ``--valid``, when given
    surveyed: int | None = field(default=None, compare=False)  # its training pairs, once counted
    max_len: int | None = None  # fit() to a model made elsewhere: at most CORPUS_MAX_LEN
    recipe = "corpus"
    metric = "bleu"
    keeps_best = True

    def pairs(self) -> Iterator[Pair]:
        """The training pairs, in file order, read as they are wanted."""
        pairs = iter_parallel(self.data, "--data")
        if self.holdout == "pairs":
            heldout = set(self.valid)
            yield from (pair for pair in pairs if pair not in heldout)
        elif self.holdout == "hash":
            yield from (pair for pair in pairs if not is_heldout(pair[0]))
        elif self.holdout == "last":
            yield from (pair for pair in pairs if pair[0] != self.last_source)
        else:
            yield from pairs

    def defaults(self) -> dict[str, Any]:
        return {}

    def recorded(self, options: TrainOptions) -> dict[str, Any]:
        data, valid = options.data or [], options.valid
        langs = list(options.langs) if options.langs else from_file_names(data)
        return {"task": None, "data": list(data), "valid": list(valid) if valid else None, "langs": langs}

    def vocabulary_pairs(self, options: RunOptions, progress: bool) -> list[Pair]:
        """A fixed-seed sample of at most ``--vocab-sample`` training pairs; the sides checked for the usual
        mix-ups (a new run's corpus: a resumed one's is the same files)."""
        found = survey(self, options.vocab_sample or HELDOUT_SIZE, seed=options.seed, progress=progress)
        check_sides(self, found, options.data or [], options.valid)
        self.surveyed = found.size
        sampled = f", a sample of the {found.size:,}" if len(found.sample) < found.size else ""
        say(f"learning a {options.tokenizer} vocabulary from {plural(len(found.sample), 'sentence pair')}{sampled}")
        return found.sample

    @property
    def limit(self) -> int:
        """Pairs longer than this (either side) are left out of training."""
        return CORPUS_MAX_LEN if self.max_len is None else self.max_len

    def positions(self, source: Tokenizer, target: Tokenizer) -> int:
        return self.limit

    def fit(self, max_len: int, source: Tokenizer, target: Tokenizer) -> None:
        self.max_len = min(CORPUS_MAX_LEN, max_len)  # longer pairs are left out of training

    def prepare(self, out: Path, source: Tokenizer, target: Tokenizer, progress: bool) -> Prepared:
        train, heldout = fingerprint(self.data), None if self.valid_files else HELDOUT_RULE
        key = _cache_key(train, source, target, heldout, self.limit)
        encoded, cached = _shared_encoding(out, key, lambda: self._encode(source, target, self.surveyed, progress))
        facts = {
            "train": train,
            "valid": fingerprint(self.valid_files) if self.valid_files else None,
            "heldout": heldout,
            "longest_target": int(encoded.targets.lengths.max()),
        }
        return Prepared(encoded, key, cached, facts)

    def resume(self, options: TrainOptions, checkpoint: Checkpoint, out: Path) -> Prepared:
        """The same files as the run's (sizes and SHA-256s), validated the same way; the run's encoding, when its
        cache is intact."""
        run, facts, saved = repr(str(checkpoint.path.parents[1])), checkpoint.trainer["data"], checkpoint.options
        if options.valid is None and facts.get("valid") is not None:
            raise UserError(
                f"{run} validated on --valid {' '.join(saved['valid'] or [])}; give --valid again (the same files) "
                "to continue training"
            )
        if options.valid is not None and facts.get("valid") is None:
            raise UserError(f"--valid would change the run: {run} validated on a held-out tenth of --data")
        _check_same_files("--data", options.data, facts.get("train"))
        _check_same_files("--valid", options.valid, facts.get("valid"))
        source, target = checkpoint.source, checkpoint.target
        heldout = None if facts.get("valid") is not None else heldout_rule(facts)
        self.fit(checkpoint.config.max_len, source, target)
        cache_key = _cache_key(facts["train"], source, target, heldout, self.limit)
        progress = options.progress
        encoded, cached = _shared_encoding(out, cache_key, lambda: self._encode(source, target, None, progress))
        return Prepared(encoded, cache_key, cached, dict(facts))

    def _encode(self, source: Tokenizer, target: Tokenizer, size: int | None, progress: bool) -> EncodedCorpus:
        """The ids of the training pairs that fit the model's positions; a warning for those left out."""
        encoded = encode_pairs(self.pairs(), source, target, self.limit, total=size, progress=progress)
        if not len(encoded):
            raise UserError(f"--data: every sentence pair is longer than {self.limit} tokens: nothing to train on")
        if encoded.dropped:
            left_out = f"{plural(encoded.dropped, 'sentence pair')} longer than {self.limit} tokens"
            warn(f"--data: {left_out} {'is' if encoded.dropped == 1 else 'are'} left out of training")
        return encoded

    def batches(self, options: RunOptions, source: Tokenizer, target: Tokenizer, prepared: Prepared,
                pad_to: int) -> Batches:  # fmt: skip
        if prepared.encoded is None or options.batch_tokens is None:
            raise TypeError("a corpus's batches need its encoded pairs and a number of tokens a batch")
        return CorpusBatches(prepared.encoded, target.specials, options.batch_tokens, options.seed, pad_to)

    def evaluation_pairs(self, count: int | None) -> list[Pair]:
        return self.valid[:count]

    def scores(
        self, translations: list[str], pairs: list[Pair], loss: Callable[[], float], langs: Sequence[str] | None
    ) -> dict[str, Any]:
        scores = score(translations, [t for _, t in pairs], tokenize=bleu_tokenizer(langs[1] if langs else None))
        return {"valid_loss": loss(), **scores, "examples": len(pairs)}

    def describe(self, step: int, loss: float | None, evaluation: dict[str, Any]) -> str:
        trained = "before training" if loss is None else f"this step's training loss {loss:.3f}"
        return (
            f"step {step}: {trained}, validation loss {evaluation['valid_loss']:.3f}, "
            f"BLEU {evaluation['bleu']:.2f}, chrF {evaluation['chrf']:.2f}"
        )

    def summary(self, evaluation: dict[str, Any], checkpoint: str | None) -> str:
        sentences = plural(evaluation["examples"], "validation sentence")
        return (
            f"bleu: {evaluation['bleu']:.2f}, chrf: {evaluation['chrf']:.2f} (sacreBLEU, greedy, on {sentences}; "
            f"checkpoint {checkpoint}: translate and evaluate use it by default)"
        )


def _cache_key(train: Any, source: Tokenizer, target: Tokenizer, heldout: str | None, max_len: int) -> dict[str, Any]:
    """What a corpus's ids are made from: its files' fingerprints, the tokenizers, the length limit, and the rule
    that held out its validation pairs (where they are its own)."""
    key = {"train": train, "tokenizers": tokenizers_digest(source, target), "max_len": max_len}
    return key if heldout is None else {**key, "heldout": heldout}


def _shared_encoding(out: Path, key: dict[str, Any], encode: Callable[[], EncodedCorpus]) -> tuple[EncodedCorpus, bool]:
    """The run's encoded corpus, and whether it is the run's cache: the cache when it matches ``key``; else rank 0
    encodes it (and the training writes the cache), and the other ranks of a torchrun wait for the cache and map it
    (one copy on a machine)."""
    found = encoded_corpus(out, key)
    if found is not None:
        return found, True
    if is_main_rank():
        return encode(), False
    while (found := encoded_corpus(out, key)) is None:
        time.sleep(0.5)
    return found, True


@dataclass
class Survey:
    """What one pass over a corpus's training pairs finds: how many, a fixed-seed sample of at most ``sample_size``
    of them in corpus order (all of them in a smaller corpus) to learn the vocabulary from, the first ones (to tell
    which way round the corpus reads), whether every pair is one text twice, and whether every validation pair is
    also a training pair."""

    size: int
    sample: list[Pair]
    first: list[Pair]
    copies: bool
    valid_in_training: bool


def survey(corpus: Corpus, sample_size: int, seed: int = 0, progress: bool = False) -> Survey:
    """One pass over ``corpus``'s training pairs (see :class:`Survey`); the sample is drawn by reservoir sampling."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, Pair]] = []
    first: list[Pair] = []
    copies, size = True, 0
    valid, found = set(corpus.valid), set()
    bar = progress_bar(None, enabled=progress, unit="pair")
    for size, pair in enumerate(corpus.pairs(), start=1):
        if size <= sample_size:
            reservoir.append((size, pair))
        elif (slot := int(rng.random() * size)) < sample_size:
            reservoir[slot] = (size, pair)
        if size <= SIDE_SAMPLE * 10:
            first.append(pair)
        copies = copies and pair[0] == pair[1]
        if pair in valid:
            found.add(pair)
        if size % 10_000 == 0:
            bar.update(10_000)
    bar.close()
    if not size:
        raise UserError(f"--data: {corpus.name} holds no sentence pairs")
    reservoir.sort(key=lambda entry: entry[0])
    return Survey(size, [pair for _, pair in reservoir], first, copies, bool(valid) and found == valid)


def load_task(name: str) -> Task:
    """A built-in task by name."""
    if not isinstance(name, str):
        raise TypeError(f"the task `name` must be a str, received {name!r} of type {type(name).__name__}")
    if name not in GENERATORS:
        raise UserError(f"--task: unknown task {name!r}; built-in tasks are {', '.join(TASKS)} (or use --data)")
    make, kind = GENERATORS[name]

    def draw(rng: np.random.Generator) -> Pair:
        while True:
            key, pair = make(rng)
            if not is_heldout(key):
                return pair

    heldout: list[Pair] = []
    seen, rng = set(), np.random.default_rng([2026])
    while len(heldout) < HELDOUT_SIZE:
        key, pair = make(rng)
        if is_heldout(key) and key not in seen:
            seen.add(key)
            heldout.append(pair)
    return Task(name, kind, heldout, draw)


def _check_same_files(flag: str, paths: Sequence[str] | None, recorded: list[dict[str, Any]] | None) -> None:
    """``paths`` (given as ``flag``) are the files a run ``recorded`` (sizes and SHA-256s; names may differ)."""
    now = fingerprint(paths) if paths else None
    if now is not None and recorded is not None:
        now = [{**entry, "name": old["name"]} for entry, old in zip(now, recorded, strict=False)]
    if now != recorded:
        raise UserError(
            f"{flag} {' '.join(paths or [])} is not the corpus this run trained on (its size or SHA-256 differs); "
            "--resume needs the same files"
        )


def load_corpus(data: Sequence[str], valid: Sequence[str] | None = None, rule: str = HELDOUT_RULE) -> Corpus:
    """The corpus in ``data`` (a TSV file or two line-aligned files), validated on ``valid`` or a held-out tenth (read
    in one pass over ``data``; only the held-out pairs are kept) as ``rule`` holds it out (the module's text)."""
    name = " ".join(data)
    if valid:
        iter_parallel(data, "--data").close()  # its files checked now; its lines are read when wanted
        return Corpus(name, list(data), read_parallel(valid, "--valid"), None, valid_files=list(valid))
    if rule == OLD_HELDOUT_RULE:
        return _held_out_by_source(name, data)
    if rule != HELDOUT_RULE:
        raise UserError(
            f"--data: the run holds out its validation pairs by a rule this version does not know, {rule!r}"
        )
    return Corpus(name, list(data), _held_out_pairs(name, data), "pairs")


def _held_out_pairs(name: str, data: Sequence[str]) -> list[Pair]:
    """The ``⌊n/10⌋`` (at least one, at most ``HELDOUT_SIZE``) different pairs of the ``n`` of ``data`` whose
    :func:`pair_key` is smallest, in file order (each at its first line); one pair fewer where that would be every
    different pair, so that one is left to train on."""
    heap: list[tuple[int, int, Pair]] = []  # (-key, line, pair): the HELDOUT_SIZE smallest keys, the largest on top
    kept: set[int] = set()  # their keys
    count, largest, above = 0, -1, 1 << 64  # above: no key from here on is kept (the heap's largest, once full)
    for count, pair in enumerate(iter_parallel(data, "--data"), start=1):
        key = pair_key(pair)
        if key > largest:
            largest = key
        if key >= above or key in kept:  # not among the smallest, or a copy of a pair kept
            continue
        if len(heap) == HELDOUT_SIZE:
            kept.discard(-heapq.heapreplace(heap, (-key, count, pair))[0])
        else:
            heapq.heappush(heap, (-key, count, pair))
        kept.add(key)
        if len(heap) == HELDOUT_SIZE:
            above = -heap[0][0]
    if not count:
        raise UserError(f"--data: {' and '.join(repr(path) for path in data)} hold no sentence pairs")
    ranked = sorted((-negative, line, pair) for negative, line, pair in heap)
    size = min(max(1, count // 10), len(ranked))
    if ranked[size - 1][0] == largest:  # every different pair
        size -= 1
    if not size:
        raise UserError(f"--data: {name}: need at least two different sentence pairs, so that some can be held out")
    return [pair for _, _, pair in sorted(ranked[:size], key=lambda entry: entry[1])]


def _held_out_by_source(name: str, data: Sequence[str]) -> Corpus:
    """The corpus held out as runs made before the rule was recorded hold it out (``OLD_HELDOUT_RULE``)."""
    heldout: list[Pair] = []
    trained, last = False, None
    for source, target in iter_parallel(data, "--data"):
        if is_heldout(source):
            if len(heldout) < HELDOUT_SIZE:
                heldout.append((source, target))
        else:
            trained = True
        last = source
    if last is None:
        raise UserError(f"--data: {' and '.join(repr(path) for path in data)} hold no sentence pairs")
    if trained and heldout:
        return Corpus(name, list(data), heldout, "hash")
    # Too few lines for a tenth to fall out by hash: hold out the last line's source instead.
    corpus = Corpus(name, list(data), [], "last", last)
    corpus.valid = [pair for pair in iter_parallel(data, "--data") if pair[0] == last][:HELDOUT_SIZE]
    if next(corpus.pairs(), None) is None:
        raise UserError(f"--data: {name}: need at least two different source lines, so that some can be held out")
    return corpus


VOCABULARY = ("tokenizer", "vocab_size", "joint")
"""The options that say how a run's vocabulary was made, which ``--vocab-from`` takes from the other run."""


def vocabulary_from(options: TrainOptions) -> tuple[TrainOptions, Checkpoint]:
    """``--vocab-from RUN``: ``options`` with the ``VOCABULARY`` options of the run in ``RUN``, and the checkpoint
    whose tokenizers the new run takes (every checkpoint of a run has the same: its newest intact one); refused in
    one line where ``RUN`` is no run, or where an option given conflicts with them."""
    if options.vocab_from is None:
        raise TypeError("vocabulary_from needs options with a vocab_from")
    checkpoint = _other_run(options.vocab_from, "--vocab-from", "latest", "--vocab-from: the vocabulary of")
    theirs: dict[str, Any] = {name: checkpoint.options.get(name) for name in VOCABULARY}
    options = _taken(options, theirs, "--vocab-from", f"--vocab-from {options.vocab_from}, whose vocabulary has")
    say(f"taking the {theirs['tokenizer']} vocabulary of {options.vocab_from} ({checkpoint.path.name})")
    return options, checkpoint


SHAPE = ("d_model", "num_heads", "layers", "d_ff")
"""The options that size a run's model, which ``--init`` takes from the other run's."""


def initial_run(options: TrainOptions) -> tuple[TrainOptions, Checkpoint]:
    """``--init RUN``: the checkpoint of the run in ``RUN`` that fine-tuning starts from (the one ``translate`` takes:
    best, else the newest intact), and ``options`` with its vocabulary and model's options (``VOCABULARY``,
    ``SHAPE``); refused in one line where ``RUN`` is no run, or where an option given conflicts with them."""
    if options.init is None:
        raise TypeError("initial_run needs options with an init")
    if options.vocab_from is not None:
        raise UserError(f"--init {options.init} brings its vocabulary: drop --vocab-from {options.vocab_from}")
    checkpoint = _other_run(options.init, "--init", None, "--init: starting from")
    config = checkpoint.config
    theirs: dict[str, Any] = {name: checkpoint.options.get(name) for name in VOCABULARY}
    theirs.update(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff)
    layers = {config.num_encoder_layers, config.num_decoder_layers}
    if len(layers) > 1 and options.layers is not None:
        raise UserError(
            f"--layers {options.layers} conflicts with --init {options.init}, whose model has "
            f"{config.num_encoder_layers} encoder and {config.num_decoder_layers} decoder layers: drop --layers"
        )
    theirs["layers"] = config.num_encoder_layers  # the model itself comes from the run's config
    options = _taken(options, theirs, "--init", f"--init {options.init}, whose model has")
    say(f"starting from {options.init} ({checkpoint.path.name}, step {checkpoint.step}): its {theirs['tokenizer']} "
        f"vocabulary and model (d_model {config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} "
        "layers)")  # fmt: skip
    return options, checkpoint


def _other_run(run: str, flag: str, which: str | None, doing: str) -> Checkpoint:
    """The checkpoint ``which`` of the run in ``run``, which ``flag`` names; refused in one line where it is none."""
    try:
        checkpoint, _ = open_checkpoint(Path(run), which, lambda found: None, doing=doing)
    except RunError as error:
        raise UserError(f"{flag}: {error}") from None
    return checkpoint


def _taken(options: TrainOptions, theirs: dict[str, Any], flag: str, whose: str) -> TrainOptions:
    """``options`` with ``theirs`` (the values of the run ``flag`` names), refused in one line where a given option
    differs (``whose`` names the run: "--init RUN, whose model has"), or where ``--vocab-sample`` would learn a
    vocabulary."""
    from multihead.app.options import BY_NAME

    for name, value in theirs.items():
        given = getattr(options, name)
        if given is not None and given != value:
            described = BY_NAME[name]
            mine = described.typed(given)
            raise UserError(f"{mine} conflicts with {whose} {described.typed(value)}: drop {mine}")
    if options.vocab_sample is not None:
        raise UserError(
            f"--vocab-sample {options.vocab_sample} chooses the sentence pairs a vocabulary is learned from, and with "
            f"{flag} the run learns none: drop --vocab-sample"
        )
    return replace(options, **theirs)


# --- what looks like a mistake ------------------------------------------------------------------------------


def _words(texts: Sequence[str]) -> set[str]:
    return {word for text in texts for word in text.lower().split()}


def _overlap(texts: Sequence[str], others: set[str]) -> float:
    """The share of the words of ``texts`` that are among ``others``."""
    words = _words(texts)
    return len(words & others) / max(len(words), 1)


def swapped(corpus: Corpus, found: Survey, data: Sequence[str], valid: Sequence[str]) -> bool:
    """Whether ``valid`` reads as the other way round from ``data``: by the files' language codes where both name
    theirs, else by vocabulary (the validation sources share more words with the training targets)."""
    if len(data) == 2 and len(valid) == 2:
        data_codes, valid_codes = [file_language(p) for p in data], [file_language(p) for p in valid]
        if None not in data_codes + valid_codes and data_codes[0] != data_codes[1]:
            return valid_codes == data_codes[::-1]
    sources = [s for s, _ in corpus.valid[:SIDE_SAMPLE]]
    train_sources = _words([s for s, _ in found.first])
    train_targets = _words([t for _, t in found.first])
    return _overlap(sources, train_targets) > max(2 * _overlap(sources, train_sources), 0.2)


def check_sides(corpus: Corpus, found: Survey, data: Sequence[str], valid: Sequence[str] | None) -> None:
    """Warn about the usual mix-ups: one text on both sides, the validation set swapped, or the training set again."""
    if found.copies:
        warn(
            f"--data {' '.join(data)}: source and target are the same text on every line: the model will learn to copy"
        )
    if valid is None:
        return
    if swapped(corpus, found, data, valid):
        warn(f"--valid {' '.join(valid)} reads the other way round from --data {' '.join(data)}: source and target "
             "swapped? (validation scores, and the best checkpoint, would mean nothing)")  # fmt: skip
    if found.valid_in_training:
        warn(f"--valid {' '.join(valid)} holds only training pairs: its scores will not say how the model does on "
             "new sentences")  # fmt: skip
