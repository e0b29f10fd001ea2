"""The training options, each defined once: its name, flag, help, kind of value, default in each recipe, and whether
``--resume`` may change it (``OPTIONS``).

Everything else is made from this table: :class:`TrainOptions` (the options as a dataclass, checked on creation),
``train``'s arguments and their ``--help`` (:func:`add_train_arguments`), the recipes (``RECIPES``), the options
``--resume`` refuses and the epilog that lists them, and the messages that quote an option as the user types it.

A recipe is the defaults for a kind of data: small and fast for the built-in tasks (fresh examples every step, no
dropout); for a corpus, the paper's recipe sized for a CPU and a corpus of ~30k pairs (joint subwords, tied
embeddings, batches by token count, label smoothing, warm-up then inverse square root decay, validation BLEU).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass
from numbers import Real
from typing import Any

from multihead.app.console import UserError
from multihead.app.devices import DEVICE_CHOICES, PRECISIONS, device_name
from multihead.app.generated import TASKS
from multihead.app.languages import known_language_code
from multihead.app.tokenizers import ALL_KINDS, KINDS
from multihead.app.translate import TRANSLATION
from multihead.decoding import SearchOptions
from multihead.io import FRAMEWORKS

# --- kinds of values: how the command line reads one, and how TrainOptions checks one -------------------------


@dataclass(frozen=True)
class Kind:
    """A kind of option value: ``parse`` reads it from the command line (its errors are what argparse prints after
    "argument --flag:"), ``check`` refuses a bad value given through :class:`TrainOptions`."""

    parse: Callable[[str], Any] | None
    check: Callable[[str, Any], None]


def _whole(text: str, minimum: int) -> int:
    what = {1: "a positive whole number", 0: "a whole number (0 or more)", -1: "-1 (no limit) or a whole number"}
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what[minimum]}, received {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {what[minimum]}, received {text}")
    return value


def limit(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number, ``minimum`` (1, 0, or -1 meaning no limit) or more."""
    return lambda text: _whole(text, minimum)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    value = _whole(text, 0)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port, 0 (a free one) to 65535, received {text}")
    return value


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
"""A byte size's suffixes (:func:`byte_size`), in powers of 1024 as ``docker run --memory`` reads them."""


def byte_size(text: str) -> int:
    """An argparse type: a size in bytes, a whole or decimal number with an optional suffix ``K``, ``M``, ``G`` or
    ``T`` (powers of 1024; ``B``, ``iB`` after one are allowed: ``4G``, ``4GiB``, ``1536M``)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if found is None or float(found[1]) <= 0:
        raise argparse.ArgumentTypeError(f"must be a size such as 4G, 1536M or 2.5G, received {text!r}")
    return int(float(found[1]) * SIZE_UNITS[found[2]])


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, received {text!r}") from None


def _check_whole(minimum: int) -> Callable[[str, Any], None]:
    def check(flag: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{flag} must be an int, received {value!r} of type {type(value).__name__}")
        if value < minimum:
            raise UserError(f"{flag} must be {'positive' if minimum else 'non-negative'}, received {value}")

    return check


def _check_number(*, positive: bool, below_one: bool = False) -> Callable[[str, Any], None]:
    """A finite number, positive or non-negative; ``below_one``: a fraction in [0, 1)."""

    def check(flag: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{flag} must be a number, received {value!r} of type {type(value).__name__}")
        value = float(value)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):  # nan or inf would never end
            kind = "positive" if positive else "non-negative"
            raise UserError(f"{flag} must be a {kind} finite number, received {value}")
        if below_one and value >= 1:
            raise UserError(f"{flag} must be in [0, 1), received {value}")

    return check


def _check_choice(choices: Sequence[str], wording: str) -> Callable[[str, Any], None]:
    def check(flag: str, value: Any) -> None:
        if value not in choices:
            raise UserError(f"{flag} must be {wording}, received {value!r}")

    return check


def _unchecked(flag: str, value: Any) -> None:
    return None


def _check_device(flag: str, value: Any) -> None:
    try:
        device_name(value)
    except argparse.ArgumentTypeError as error:
        raise UserError(f"{flag} {error}") from None


POSITIVE = Kind(lambda text: _whole(text, 1), _check_whole(1))
COUNT = Kind(lambda text: _whole(text, 0), _check_whole(0))  # NumPy seeds batches: no negative seed
POSITIVE_NUMBER = Kind(_number, _check_number(positive=True))
NON_NEGATIVE_NUMBER = Kind(_number, _check_number(positive=False))
FRACTION = Kind(_number, _check_number(positive=False, below_one=True))
TEXT = Kind(None, _unchecked)
DEVICE = Kind(device_name, lambda flag, value: _check_device(flag, value))
FILES = Kind(None, _unchecked)
SWITCH = Kind(None, _unchecked)


def _check_langs(flag: str, value: Any) -> None:
    if isinstance(value, str) or len(value) != 2:
        raise UserError(f"{flag} takes two language codes, SRC TGT, received {value!r}")
    for code in value:
        try:
            known_language_code(code)
        except argparse.ArgumentTypeError as error:
            raise UserError(f"{flag} {error}") from None


LANGS = Kind(known_language_code, _check_langs)


# --- the search: translate, evaluate and serve -------------------------------------------------------------

MAX_BEAM = 64
"""The widest beam ``translate`` and ``evaluate`` take: beyond a few dozen a beam costs much and finds nothing more."""


def beam_size(text: str) -> int:
    value = _whole(text, 1)
    if value > MAX_BEAM:
        raise argparse.ArgumentTypeError(f"must be from 1 (greedy) to {MAX_BEAM}, received {text}")
    return value


def length_penalty(text: str) -> float:
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more (0: scores not divided), received {text}")
    return value


def _top_p(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 1:  # nan too
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], received {text}")
    return value


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, received {text}")
    return value


def seconds_limit(text: str) -> float:
    """An argparse type: ``-1`` (no limit) or a number of seconds above 0."""
    value = _number(text)
    if value != -1 and not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be -1 (no limit) or a number of seconds above 0, received {text}")
    return value


SEARCH_OPTIONS = (
    ("beam_size", "--beam", beam_size, "K", f"beam size, 1 to {MAX_BEAM} (1: greedy)"),
    ("length_penalty", "--length-penalty", length_penalty, "LP", "beam search ranks hypotheses by log-probability / "
     "length^LP (0 or more; 0: by log-probability)"),
    ("sampling_topk", "--sampling-topk", limit(0), "K", "sample each token from the K most probable (0: from all; "
     "1: take the most probable, no sampling)"),
    ("sampling_topp", "--sampling-topp", _top_p, "P", "sample only from the fewest most probable tokens whose "
     "probability reaches P, in (0, 1] (nucleus sampling)"),
    ("sampling_temperature", "--sampling-temperature", positive_number, "T", "divide the log-probabilities by T before "
     "sampling (above 0; below 1 sharper, above flatter)"),
    ("seed", "--seed", limit(0), "S", "seed of the sampling: the same seed and input give the same translations "
     "(default: a fresh seed each run)"),
    ("max_length", "--max-length", limit(1), "N", "the most tokens a translation may take, more or fewer than by "
     "default, within the model's positions (default: twice the source's plus 10, or the longest training target if "
     "more)"),
    ("min_length", "--min-length", limit(0), "N", "the fewest tokens a translation takes before its end token "
     "(default 0); the length limit still ends it; more than the model's positions leave room for is refused"),
)  # fmt: skip
"""The search options of ``translate``, ``evaluate`` and ``serve``: the :class:`~multihead.decoding.SearchOptions`
field each sets, its flag (CTranslate2's names), how it is read, its metavar and help; their defaults are the run's
(:func:`search_options`)."""
SEARCH_FLAGS = {name: flag for name, flag, *_ in SEARCH_OPTIONS}
IMPORTED_SEARCH = {"beam_size": "num_beams", "length_penalty": "length_penalty", "max_length": "max_length",
                   "min_length": "min_length"}  # fmt: skip
"""The search options whose default an imported run takes from its model's generation config: the key it reads."""


def add_search_arguments(command: argparse.ArgumentParser) -> None:
    """The search options, each ``None`` when not given (:func:`search_options`), its help saying its defaults."""
    for name, flag, kind, metavar, text in SEARCH_OPTIONS:
        value = getattr(TRANSLATION, name)
        said = [] if value in (None, False) else [f"default: {value}"]  # as the help shows a default
        if name in IMPORTED_SEARCH:
            said.append(f"an imported model's {IMPORTED_SEARCH[name]} (serve: the first run's)")
        command.add_argument(flag, dest=name, type=kind, metavar=metavar, default=None,
                             help=f"{text} ({'; '.join(said)})" if said else text)  # fmt: skip


def search_text(search: SearchOptions) -> str:
    """How a command's summary names its search: ``beam K``, or the sampling and its seed."""
    if not search.strategy.draws:
        return f"beam {search.beam_size}"
    seed = "a fresh seed" if search.seed is None else f"seed {search.seed}"
    return (
        f"sampling (top-k {search.sampling_topk}, top-p {search.sampling_topp}, temperature "
        f"{search.sampling_temperature}, {seed})"
    )


def search_options(args: argparse.Namespace, recorded: dict[str, Any] | None = None) -> SearchOptions:
    """The search the command line asks for, the options it does not give the run's (``recorded``: its
    :attr:`~multihead.app.runs.Checkpoint.search`, an imported model's) or else
    :data:`~multihead.app.translate.TRANSLATION`'s; sampling searches one beam unless ``--beam`` says more. A
    combination that makes none (sampling with a beam, a temperature or a seed without sampling, ``translate --n-best
    N`` with a narrower beam) refused in one line naming the flags."""
    given = {name: getattr(args, name) for name in SEARCH_FLAGS if getattr(args, name) is not None}
    values = {name: getattr(TRANSLATION, name) for name in SEARCH_FLAGS} | (recorded or {}) | given
    if values["sampling_topk"] != 1 and "beam_size" not in given:
        values["beam_size"] = 1
    n_best = getattr(args, "n_best", None)  # translate's --n-best
    if n_best is not None:
        if n_best > values["beam_size"]:
            raise UserError(
                f"--n-best {n_best} lists the best of a beam search at least as wide: add --beam {n_best} (or more); "
                f"received --beam {values['beam_size']}"
            )
        values["n_best"] = n_best
    if values["seed"] is not None and values["sampling_topk"] == 1:
        raise UserError(f"--seed {values['seed']} seeds sampling, which this search does not do: add --sampling-topk 0 "
                        "(every token) or K > 1, or drop --seed")  # fmt: skip
    try:
        return SearchOptions(**values)
    except ValueError as error:
        message = str(error)
        for name, flag in SEARCH_FLAGS.items():
            message = message.replace(f"`{name}`=", f"{flag} ").replace(f"`{name}`", flag)
        raise UserError(message) from None


def check_min_length(search: SearchOptions, positions: int) -> None:
    """Refuse, in one line, a ``--min-length`` that no translation can reach and still end within a model of
    ``positions`` positions, where a translation takes at most ``positions - 1`` tokens, its end token included (the
    search would take every sentence to that limit and cut it there)."""
    most = positions - 2
    if search.min_length > most:
        raise UserError(f"--min-length {search.min_length}: this model's translations take at most {positions - 1} "
                        f"tokens, their end token included ({positions} positions), so none could end: give at most "
                        f"{most}")  # fmt: skip


# --- the table ----------------------------------------------------------------------------------------------

TASK, CORPUS, CORPUS_GPU = "task", "corpus", "corpus-gpu"
FINE_TUNING: dict[str, Any] = {"lr": 1e-4, "warmup": 100}
"""What ``train --init`` changes in the recipe: a model that already translates takes smaller steps, sooner."""
AS_CORPUS = object()  # an option's GPU default when it is the corpus recipe's
LOG_EVERY = 100
"""``--log-every``'s default, fairseq's ``--log-interval`` (OpenNMT's ``report_every`` is 50): on a CPU a line every
few seconds for a built-in task, every few minutes for the corpus recipe (twice between its evaluations)."""
THREADS_HELP = (
    "CPU threads the process computes with (PyTorch's torch.set_num_threads; for --framework keras TensorFlow's "
    "pools too, JAX's cannot be set); fewer than the cores leaves them to other work (default: the cores other "
    "processes leave free when the command starts, at least 1, looked at again every second while it runs; with "
    "OMP_NUM_THREADS set, PyTorch's choice)"
)
"""What ``--threads`` does for ``train`` (see :func:`multihead.app.devices.use_threads`)."""
RUN_THREADS_HELP = THREADS_HELP.replace("; for --framework keras TensorFlow's pools too, JAX's cannot be set", "")
"""What ``--threads`` does on the commands that run a trained model (PyTorch's, whatever trained it)."""
RUN_FRAMEWORK_HELP = (
    "what decodes: torch (PyTorch, the default: the fastest here, and --quantize's forms) or keras (Keras on the "
    "backend KERAS_BACKEND names, whatever framework trained the run; serve's streams step eagerly there, slowly)"
)
"""What ``--framework`` does on the commands that run a trained model."""
RUN_DEVICE_HELP = f"where the model runs: {DEVICE_CHOICES} (auto: the first CUDA device, else the CPU)"
"""What ``--device`` does on the commands that run a trained model (``demo`` too)."""


@dataclass(frozen=True)
class Option:
    """One training option, described by its :class:`TrainOptions` field (see :func:`option`): its flag and help,
    how the command line reads it, its defaults in the recipes (``task``, ``corpus``; ``gpu``: the corpus recipe's on
    a GPU) when ``recipe`` (``None``: none, or the task's own); ``resumable``: ``--resume`` may change it; ``saved``:
    part of what a run is made of, kept in its checkpoints (the others say how this process runs); ``machine``: a
    choice of this machine's, not the run's (``--resume`` takes it as given, else its default, never the run's);
    ``argparse``: what else ``add_argument`` takes."""

    name: str
    flag: str
    help: str
    kind: Kind
    task: Any = None
    corpus: Any = None
    recipe: bool = True
    resumable: bool = False
    saved: bool = True
    machine: bool = False
    argparse: dict[str, Any] = dataclasses.field(default_factory=dict)
    gpu: Any = AS_CORPUS  # the corpus recipe's default on a GPU

    @property
    def gpu_default(self) -> Any:
        return self.corpus if self.gpu is AS_CORPUS else self.gpu

    def default_text(self) -> str:
        """What ``--help`` says of the recipes' defaults."""
        gpu = "" if self.gpu_default == self.corpus else f" ({self.gpu_default} on a GPU)"
        if self.task == self.corpus:
            return f"default: {self.task}{gpu}"
        task = "the task's" if self.task is None else self.task
        corpus = "none" if self.corpus is None else self.corpus
        return f"default: {task} for a built-in task, {corpus} for --data{gpu}"

    def add_to(self, parser: Any, *, help: str | None = None) -> None:
        """This option as an argument of ``parser`` (or of an argument group), with its help or, on another command,
        ``help``."""
        extra = dict(self.argparse)
        if self.kind.parse is not None:
            extra["type"] = self.kind.parse
        parser.add_argument(self.flag, dest=self.name, help=help or self.help_text(), **extra)

    def help_text(self) -> str:
        if not self.recipe:
            return self.help  # it says itself what happens without the option
        if "{default}" in self.help:
            return self.help.format(default=self.default_text())
        return f"{self.help} ({self.default_text()})" if self.help else self.default_text()

    def typed(self, value: Any) -> str:
        """The option as the user types it: ``--d-model 64``, ``--joint-vocab``, ``--no-joint-vocab``,
        ``--langs de en``; ``no --vocab-from`` when not given."""
        if value is None:
            return f"no {self.flag}"
        if isinstance(value, bool):
            return self.flag if value else f"--no-{self.flag[2:]}"
        if isinstance(value, (list, tuple)):
            return " ".join([self.flag, *map(str, value)])
        return f"{self.flag} {value}"


# --- the options as a dataclass -----------------------------------------------------------------------------

OPTION = "option"
"""Where a :class:`TrainOptions` field's metadata keeps its :class:`Option`."""


def option(
    flag: str,
    help: str,
    kind: Kind,
    task: Any = None,
    corpus: Any = None,
    *,
    recipe: bool = True,
    resumable: bool = False,
    saved: bool = True,
    machine: bool = False,
    argparse: dict[str, Any] | None = None,
    gpu: Any = AS_CORPUS,
    default: Any = None,
) -> Any:
    """A :class:`TrainOptions` field: ``default`` (``None``: not given, the recipe's or the run's value) and, in its
    metadata, its :class:`Option` (named after the field)."""
    described = Option("", flag, help, kind, task, corpus, recipe, resumable, saved, machine, argparse or {}, gpu)
    return dataclasses.field(default=default, metadata={OPTION: described})


@dataclass(frozen=True)
class TrainOptions:
    """Everything a training run is made of, as given: one field per option, its :class:`Option` in the field's
    metadata (``OPTIONS``); ``None`` takes the recipe's value (see ``RECIPES``) or, on resume, the run's. Checked when
    made. Resolved into :class:`RunOptions`."""

    out: str = option(
        "--out",
        "run directory for checkpoints (e.g. runs/dates)",
        TEXT,
        recipe=False,
        saved=False,
        argparse=dict(required=True),
        default=MISSING,
    )
    task: str | None = option(
        "--task",
        f"built-in task: {', '.join(TASKS)} (default: dates)",
        TEXT,
        recipe=False,
        argparse=dict(metavar="NAME"),
    )
    data: Sequence[str] | None = option(
        "--data",
        "a parallel corpus: SRC TGT (two line-aligned files) or FILE.tsv; plain or .gz",
        FILES,
        recipe=False,
        argparse=dict(nargs="+", metavar="FILE"),
    )
    valid: Sequence[str] | None = option(
        "--valid",
        "validation set for --data, as --data (default: a held-out tenth of --data)",
        FILES,
        recipe=False,
        argparse=dict(nargs="+", metavar="FILE"),
    )
    langs: Sequence[str] | None = option(
        "--langs",
        "the languages translated, ISO 639-1 codes (default: what the run recorded, for a new "
        "run read from --data file names such as train.de.gz train.en.gz); with --init or --vocab-from of a "
        "many-to-many model (M2M100, NLLB-200, multilingual OPUS-MT), the pair of its languages trained, whose "
        "tokens open every source and target",
        LANGS,
        recipe=False,
        argparse=dict(nargs=2, metavar=("SRC", "TGT")),
    )
    framework: str | None = option(
        "--framework",
        "PyTorch, or Keras on the backend KERAS_BACKEND names (tensorflow, jax or torch)",
        TEXT,
        "torch",
        "torch",
        argparse=dict(choices=FRAMEWORKS),
    )
    device: str | None = option(
        "--device",
        f"where the model runs: {DEVICE_CHOICES} (auto: the first CUDA device, else the "
        "CPU; under torchrun each rank its cuda:LOCAL_RANK; on resume too, whatever the run trained on)",
        DEVICE,
        "auto",
        "auto",
        resumable=True,
        machine=True,
    )
    precision: str | None = option(
        "--precision",
        "fp32, or autocast to bf16 or fp16 (fp16 with dynamic loss scaling); auto: "
        "bf16 on a CUDA device that has it and on CPUs measured to train faster in it (docs/performance.md), else fp32",
        TEXT,
        "auto",
        "auto",
        resumable=True,
        argparse=dict(choices=PRECISIONS),
    )
    compile: bool | None = option(
        "--compile",
        "run the training step under torch.compile (its first steps compile)",
        SWITCH,
        False,
        False,
        resumable=True,
        argparse=dict(action=argparse.BooleanOptionalAction),
    )
    steps: int | None = option(
        "--steps",
        "total optimizer steps (--steps or --minutes is required for a new run)",
        POSITIVE,
        recipe=False,
        resumable=True,
    )
    minutes: float | None = option(
        "--minutes",
        "the most wall-clock time this command takes, in minutes (a fraction too: 0.5 is 30 s), counted from its "
        "start: reading the data, training, evaluations, checkpoints and the final evaluation (and averaging); "
        "training stops early enough for the final evaluation to fit, as long as the last evaluation took per "
        "held-out example (until one is timed, a tenth of the time is kept for it); with --steps: whichever comes "
        "first",
        POSITIVE_NUMBER,
        recipe=False,
        resumable=True,
    )
    resume: bool = option(
        "--resume",
        "continue the run in --out",
        SWITCH,
        recipe=False,
        saved=False,
        argparse=dict(action="store_true"),
        default=False,
    )
    tokenizer: str | None = option(
        "--tokenizer",
        "characters, whitespace-separated words or learned subwords (BPE)",
        TEXT,
        None,
        "subword",
        argparse=dict(choices=KINDS),
    )
    vocab_size: int | None = option(
        "--vocab-size", "subword vocabulary size (--tokenizer subword only)", POSITIVE, None, 8000
    )
    vocab_sample: int | None = option(
        "--vocab-sample",
        "learn the vocabulary from at most this many sentence pairs (a fixed-seed sample of a larger corpus)",
        POSITIVE,
        None,
        1_000_000,
    )
    joint: bool | None = option(
        "--joint-vocab",
        "one vocabulary for both languages, with tied embeddings",
        SWITCH,
        False,
        True,
        argparse=dict(action=argparse.BooleanOptionalAction),
    )
    vocab_from: str | None = option(
        "--vocab-from",
        "take the vocabulary (the tokenizers) of the run in RUN, so that runs can be compared or ensembled; its "
        "--tokenizer, --vocab-size and --joint-vocab come with it (default: learn one from the data)",
        TEXT,
        recipe=False,
        argparse=dict(metavar="RUN"),
    )
    init: str | None = option(
        "--init",
        "start from the weights of the run in RUN, trained here or imported (multihead import): fine-tuning. Its "
        "checkpoint is the one translate takes (best, else latest); its vocabulary and model come with it "
        "(--tokenizer, --vocab-size, --joint-vocab, --d-model, --heads, --layers, --d-ff: given, they must agree), "
        f"the run is evaluated before its first step, and --lr defaults to {FINE_TUNING['lr']:g} and --warmup to "
        f"{FINE_TUNING['warmup']} (default: start from random weights)",
        TEXT,
        recipe=False,
        argparse=dict(metavar="RUN"),
    )
    batch_size: int | None = option("--batch-size", "sentences per batch, tasks", POSITIVE, 64, None, resumable=True)
    batch_tokens: int | None = option(
        "--batch-tokens",
        "padded tokens per batch and rank, corpora (an optimizer step takes "
        "world size x --batch-tokens x --accumulate)",
        POSITIVE,
        None,
        4096,
        resumable=True,
        gpu=8192,
    )
    accumulate: int | None = option(
        "--accumulate",
        "batches whose gradients add up to one optimizer step (on each rank)",
        POSITIVE,
        1,
        1,
        resumable=True,
    )
    lr: float | None = option("--lr", "peak learning rate", POSITIVE_NUMBER, 1e-3, 1.5e-3, resumable=True, gpu=1e-3)
    warmup: int | None = option(
        "--warmup", "warm-up steps, then 1/sqrt decay", POSITIVE, 300, 200, resumable=True, gpu=400
    )
    clip: float | None = option(
        "--clip", "gradient norm clipping, 0: off", NON_NEGATIVE_NUMBER, 0.0, 1.0, resumable=True
    )
    label_smoothing: float | None = option(
        "--label-smoothing",
        "the share of each target's probability spread over the whole vocabulary in the loss, in [0, 1)",
        FRACTION,
        0.0,
        0.1,
        resumable=True,
    )
    d_model: int | None = option(
        "--d-model", "the model's width: embeddings and every layer's output", POSITIVE, 128, 256, gpu=512
    )
    num_heads: int | None = option(
        "--heads",
        "attention heads per layer (they must divide --d-model)",
        POSITIVE,
        4,
        4,
        argparse=dict(metavar="HEADS"),
        gpu=8,
    )
    layers: int | None = option("--layers", "encoder and decoder layers each", POSITIVE, 2, 3, gpu=6)
    d_ff: int | None = option("--d-ff", "the feed-forward blocks' inner width", POSITIVE, 256, 1024, gpu=2048)
    dropout: float | None = option("--dropout", "dropout rate in training, in [0, 1)", FRACTION, 0.0, 0.1, gpu=0.3)
    eval_every: int | None = option(
        "--eval-every", "evaluation interval in steps", POSITIVE, 500, 200, resumable=True, gpu=250
    )
    eval_examples: int | None = option(
        "--eval-examples", "held-out examples per evaluation ({default}: all)", POSITIVE, 200, None, resumable=True
    )
    checkpoint_every: int | None = option(
        "--checkpoint-every", "checkpoint interval in steps", POSITIVE, 500, 100, resumable=True, gpu=250
    )
    keep: int | None = option("--keep", "step checkpoints kept, besides the best", POSITIVE, 2, 5, resumable=True)
    average: int | None = option("--average", "average the last N checkpoints at the end", COUNT, 0, 5, resumable=True)
    patience: int | None = option(
        "--patience", "stop after N evaluations without improvement, 0: never", COUNT, 0, 0, resumable=True
    )
    seed: int | None = option(
        "--seed", "random seed of the initial weights, dropout and the order of the batches", COUNT, 0, 0
    )
    log_every: int | None = option(
        "--log-every",
        "every N steps, a line of progress (step, loss, learning rate, tokens/s, time elapsed and left) on stdout "
        "where no progress bar is drawn (stderr not a terminal: nohup, Slurm, CI; or --no-progress), and the same "
        "figures as a line of OUT/train.jsonl",
        POSITIVE,
        LOG_EVERY,
        LOG_EVERY,
        resumable=True,
        argparse=dict(metavar="N"),
    )
    threads: int | None = option(
        "--threads",
        THREADS_HELP,
        POSITIVE,
        recipe=False,
        saved=False,
        argparse=dict(metavar="N"),
    )
    progress: bool = option(
        "--no-progress",
        "no progress bar",
        SWITCH,
        recipe=False,
        saved=False,
        argparse=dict(action="store_false"),
        default=True,
    )

    def __post_init__(self) -> None:
        """Every given value of its kind, and the combinations the options allow."""
        for name in ("data", "valid"):  # one file given as a string
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, [getattr(self, name)])
        if self.task is not None and self.data is not None:
            raise UserError("give --task or --data, not both")
        if self.valid is not None and self.data is None:
            raise UserError("--valid goes with --data (a built-in task has its own held-out set)")
        if self.langs is not None and self.data is None:
            raise UserError("--langs goes with --data (a built-in task translates no language)")
        for described in OPTIONS:
            value = getattr(self, described.name)
            if value is not None:
                described.kind.check(described.flag, value)
        if self.framework is not None:
            _check_choice(FRAMEWORKS, " or ".join(FRAMEWORKS))("--framework", self.framework)
        taken = self.init is not None or self.vocab_from is not None  # another run's: any kind of tokenizer
        if self.tokenizer is not None and not (taken and self.tokenizer in ALL_KINDS):
            _check_choice(KINDS, f"one of {', '.join(KINDS)}")("--tokenizer", self.tokenizer)
        if self.precision is not None:
            _check_choice(PRECISIONS, f"one of {', '.join(PRECISIONS)}")("--precision", self.precision)
        if self.steps is None and self.minutes is None and not self.resume:
            raise UserError("give --steps N or --minutes M (or both: whichever comes first)")


OPTIONS = tuple(
    dataclasses.replace(field.metadata[OPTION], name=field.name) for field in dataclasses.fields(TrainOptions)
)
BY_NAME = {described.name: described for described in OPTIONS}
SAVED = tuple(described for described in OPTIONS if described.saved)
RECIPES: dict[str, dict[str, Any]] = {
    recipe: {described.name: getattr(described, recipe) for described in OPTIONS if described.recipe}
    for recipe in (TASK, CORPUS)
}
RECIPES[CORPUS_GPU] = {described.name: described.gpu_default for described in OPTIONS if described.recipe}
FLAGS = {described.name: described.flag for described in OPTIONS}
"""Every option's flag, for messages in the user's words."""
RESUMABLE = tuple(described.name for described in OPTIONS if described.resumable)
"""What ``--resume`` may change; every other saved option would change the model or the data."""
DATA = ("task", "data", "valid")
"""The options that say what a run learns from, which ``--resume`` checks its own way (the corpus' fingerprint)."""


def in_flags(message: str) -> str:
    """A config error in the user's words: ``d_model=7`` and `` `num_heads` `` become ``--d-model 7``, ``--heads``."""
    message = message.replace(" when `head_dim` is not given", "")  # the command line has no such option
    for name, flag in FLAGS.items():
        message = message.replace(f"`{name}`", flag).replace(f"{name}=", f"{flag} ")
    return message


@dataclass(frozen=True)
class RunOptions:
    """The options a run trains with: each saved option of :class:`TrainOptions` resolved (given, else the run's,
    else the recipe's), as every checkpoint keeps them (``asdict``)."""

    task: str | None
    data: list[str] | None
    valid: list[str] | None
    langs: list[str] | None
    framework: str
    device: str
    precision: str
    compile: bool
    steps: int | None
    minutes: float | None
    tokenizer: str
    vocab_size: int | None
    vocab_sample: int | None
    joint: bool
    vocab_from: str | None
    init: str | None
    batch_size: int | None
    batch_tokens: int | None
    accumulate: int
    lr: float
    warmup: int
    clip: float
    label_smoothing: float
    d_model: int
    num_heads: int
    layers: int
    d_ff: int
    dropout: float
    eval_every: int
    eval_examples: int | None
    checkpoint_every: int
    keep: int
    average: int
    patience: int
    seed: int
    log_every: int

    def __post_init__(self) -> None:
        unset = [field.name for field in dataclasses.fields(self)
                 if getattr(self, field.name) is None and "None" not in str(field.type)]  # fmt: skip
        if unset:  # a recipe or the resolution lacks them: a bug, not the user's
            raise TypeError(f"RunOptions: {', '.join(unset)} resolved to None")


# --- the command line ---------------------------------------------------------------------------------------


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option as an argument of ``train``: ``--task`` and ``--data`` exclusive, each with its help."""
    data = parser.add_mutually_exclusive_group()
    for option in OPTIONS:
        option.add_to(data if option.name in ("task", "data") else parser)


def recipe_options(recipe: str, **values: Any) -> RunOptions:
    """The options of the recipe ``recipe`` (a key of ``RECIPES``) with ``values`` over them; those it leaves unset
    (what the data says: a task, a corpus's files, its tokenizer) from ``values``, else ``None``."""
    return RunOptions(**_saved_only({**dict.fromkeys(FLAGS), **RECIPES[recipe], **values}))


def _saved_only(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if BY_NAME[name].saved}


def on_this_machine(options: TrainOptions) -> dict[str, Any]:
    """The ``machine`` options (the device) as ``options`` give them, else their default; never a saved run's."""
    return {
        option.name: option.corpus if getattr(options, option.name) is None else getattr(options, option.name)
        for option in SAVED
        if option.machine
    }


def resume_epilog() -> str:
    refused = ", ".join(option.flag for option in SAVED if not option.resumable)
    changeable = ", ".join(BY_NAME[name].flag for name in RESUMABLE)
    return (
        f"--resume continues a run as it was built: it refuses options that would change the model or the data "
        f"({refused}) and takes the run's values for those not given. These may change on resume: {changeable}."
    )


def train_options(args: argparse.Namespace) -> TrainOptions:
    """The :class:`TrainOptions` a parsed ``train`` command line gives."""
    return TrainOptions(**{option.name: getattr(args, option.name) for option in OPTIONS})


def continuing_command(args: argparse.Namespace) -> list[str]:
    """The command line that continues the run ``train`` was given as ``args``: ``--resume`` in its ``--out``, with
    its corpus again (a corpus run reads it again)."""
    command = ["multihead", "train", BY_NAME["resume"].flag, BY_NAME["out"].flag, args.out]
    for name in ("data", "valid"):
        if getattr(args, name, None):
            command += [BY_NAME[name].flag, *getattr(args, name)]
    return command
