"""Training a translation Transformer on a built-in task or a TSV corpus, with checkpoints and resume.

The PyTorch loop lives here; :mod:`multihead.app.train_keras` runs the same data through ``model.fit``. Both write the
same run directory (see :mod:`multihead.app.runs`). Under ``torchrun`` the PyTorch loop trains data-parallel: every
rank draws the same global batch, trains on its share, and DistributedDataParallel averages the gradients; only
rank 0 writes checkpoints.

Notation: B batch, Ls source length, Lt target length, V target vocabulary.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.runs import (
    RunError,
    check_writable,
    incomplete_checkpoints,
    latest_checkpoint,
    read_json,
    save_checkpoint,
    write_json,
)
from multihead.app.tasks import Dataset, load_task
from multihead.app.tokenizers import BOS, EOS, PAD, Tokenizer
from multihead.config import TransformerConfig
from multihead.io import read_config, read_weights

FORMAT = 1
FRAMEWORKS = ("torch", "keras")


@dataclass
class TrainOptions:
    """Everything a training run is made of; saved in each checkpoint's ``trainer.json``."""

    out: str
    task: str | None = "dates"
    data: str | None = None
    tokenizer: str | None = None
    framework: str = "torch"
    steps: int | None = None
    minutes: float | None = None
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 300
    eval_every: int = 500
    eval_examples: int = 200
    checkpoint_every: int = 500
    seed: int = 0
    d_model: int = 128
    num_heads: int = 4
    layers: int = 2
    d_ff: int = 256
    dropout: float | None = None  # None: 0 for built-in tasks (fresh data every step), 0.1 for --data corpora
    progress: bool = True
    resume: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps is None and self.minutes is None:
            raise ValueError("give --steps N or --minutes M (or both: whichever comes first)")
        if self.steps is not None:
            _check_count("--steps", self.steps)
        if self.minutes is not None:
            # nan or inf would never reach the deadline: a run without end
            _check_positive_number("--minutes", self.minutes)
        _check_positive_number("--lr", self.lr)
        for name in ("batch_size", "warmup", "eval_every", "checkpoint_every", "eval_examples"):
            _check_count(f"--{name.replace('_', '-')}", getattr(self, name))
        _check_count("--seed", self.seed, minimum=0)  # NumPy seeds its batches with it: no negative seeds
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"--framework must be torch or keras, received {self.framework!r}")


def _check_count(option: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{option} must be an int, received {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{option} must be {'positive' if minimum else 'non-negative'}, received {value}")


def _check_positive_number(option: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{option} must be a number, received {value!r} of type {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option} must be a positive finite number, received {value}")


@dataclass
class Setup:
    """What a run trains: its data, tokenizers and model configuration."""

    dataset: Dataset
    source: Tokenizer
    target: Tokenizer
    config: TransformerConfig


def learning_rate(options: TrainOptions, step: int) -> float:
    """Linear warm-up, then decay with the inverse square root of the step (the paper's schedule, rescaled)."""
    step = max(step, 1)
    return options.lr * min(step / options.warmup, math.sqrt(options.warmup / step))


def encode_batch(pairs: Sequence[tuple[str, str]], source: Tokenizer, target: Tokenizer) -> tuple[np.ndarray, ...]:
    """``src (B, Ls)``, ``tgt_in (B, Lt)`` = BOS + target, ``tgt_out (B, Lt)`` = target + EOS, padded with PAD."""
    src = [source.encode(s)[0] for s, _ in pairs]
    tgt = [target.encode(t)[0] for _, t in pairs]
    src_array = np.full((len(pairs), max(map(len, src))), PAD, dtype=np.int64)
    tgt_in = np.full((len(pairs), max(map(len, tgt)) + 1), PAD, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD)
    for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_array[row, : len(s)] = s
        tgt_in[row, : len(t) + 1] = [BOS, *t]
        tgt_out[row, : len(t) + 1] = [*t, EOS]
    return src_array, tgt_in, tgt_out


def make_setup(options: TrainOptions) -> Setup:
    dataset = load_task(options.task, data=options.data, tokenizer=options.tokenizer)
    sample = dataset.vocabulary_sample() if options.data is None else dataset.vocabulary_sample(20000)
    source = Tokenizer.build(dataset.tokenizer, (s for s, _ in sample))
    target = Tokenizer.build(dataset.tokenizer, (t for _, t in sample))
    longest = max(len(Tokenizer.split_text(dataset.tokenizer, text)) for pair in sample for text in pair)
    config = TransformerConfig(
        len(source), len(target), d_model=options.d_model, num_heads=options.num_heads,
        num_encoder_layers=options.layers, num_decoder_layers=options.layers, d_ff=options.d_ff,
        dropout=options.dropout if options.dropout is not None else 0.1 if options.data else 0.0,
        max_len=max(64, 2 * longest + 2), pad_id=PAD,
    )  # fmt: skip
    return Setup(dataset, source, target, config)


def exact_match(
    generate: Callable[[np.ndarray, int], np.ndarray], setup: Setup, pairs: Sequence[tuple[str, str]]
) -> float:
    """The share of ``pairs`` whose greedy translation equals the target exactly."""
    longest = max(len(setup.target.encode(t)[0]) for _, t in pairs) + 1
    correct = 0
    for start in range(0, len(pairs), 250):
        chunk = pairs[start : start + 250]
        src, _, _ = encode_batch(chunk, setup.source, setup.target)
        for row, (_, expected) in zip(generate(src, longest), chunk, strict=True):
            correct += setup.target.decode(row.tolist()) == expected
    return correct / len(pairs)


def checkpoint_files(
    setup: Setup, options: TrainOptions, step: int, history: dict[str, list], save_model: Callable[[Path], None],
    save_optimizer: Callable[[Path], None], optimizer_meta: dict[str, Any],
) -> dict[str, Callable[[Path], None]]:  # fmt: skip
    trainer = {
        "format": FORMAT,
        "framework": options.framework,
        "step": step,
        "options": {k: v for k, v in asdict(options).items() if k not in ("resume", "progress")},
        "optimizer": optimizer_meta,
        **history,
    }
    return {
        "config.json": lambda path: path.write_text(setup.config.to_json() + "\n", encoding="utf-8"),
        "tokenizer.json": write_json({"source": setup.source.to_dict(), "target": setup.target.to_dict()}),
        "model.safetensors": save_model,
        "optimizer.safetensors": save_optimizer,
        "trainer.json": write_json(trainer),
    }


def _check_trainer(trainer: object, path: Path) -> dict[str, Any]:
    """``trainer.json`` as :func:`checkpoint_files` writes it; a :class:`RunError` naming the file otherwise."""
    if not isinstance(trainer, dict) or trainer.get("format") != FORMAT:
        found = trainer.get("format") if isinstance(trainer, dict) else type(trainer).__name__
        raise RunError(f"{str(path)!r} was not written by this version of multihead train (format {found!r})")
    missing = sorted({"framework", "step", "options", "optimizer", "losses", "evals"} - set(trainer))
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
    elif not isinstance(trainer["optimizer"], dict):
        problem = f"its optimizer is a {type(trainer['optimizer']).__name__}, not a JSON object"
    else:
        for name in ("losses", "evals"):
            if not isinstance(trainer[name], list) or not all(_is_step_value(entry) for entry in trainer[name]):
                problem = f"{name} is not a list of [step, value] pairs"
    if problem is not None:
        raise RunError(f"{str(path)!r} is damaged: {problem}")
    return trainer


def _is_step_value(entry: object) -> bool:
    """``[step, value]``, as a loss or an evaluation is recorded."""
    if not isinstance(entry, list) or len(entry) != 2:
        return False
    step, value = entry
    json_booleans = isinstance(step, bool) or isinstance(value, bool)
    return isinstance(step, int) and isinstance(value, Real) and not json_booleans


def _read_tokenizers(path: Path) -> tuple[Tokenizer, Tokenizer]:
    values = read_json(path)
    if not isinstance(values, dict) or set(values) != {"source", "target"}:
        raise RunError(f"{str(path)!r} is damaged: it must be a JSON object with 'source' and 'target' tokenizers")
    try:
        return Tokenizer.from_dict(values["source"]), Tokenizer.from_dict(values["target"])
    except (TypeError, ValueError) as error:
        raise RunError(f"{str(path)!r} is damaged: {error}") from None


def load_setup(checkpoint: Path) -> tuple[Setup, dict[str, Any]]:
    """The setup and ``trainer.json`` of a checkpoint, each file checked and all checked against each other."""
    trainer = _check_trainer(read_json(checkpoint / "trainer.json"), checkpoint / "trainer.json")
    try:
        config = read_config(checkpoint / "config.json")
    except (TypeError, ValueError) as error:
        raise RunError(str(error)) from None
    source, target = _read_tokenizers(checkpoint / "tokenizer.json")
    sizes = {"src_vocab": (len(source), config.src_vocab), "tgt_vocab": (len(target), config.tgt_vocab)}
    for name, (symbols, vocabulary) in sizes.items():
        if symbols != vocabulary:
            raise RunError(
                f"{str(checkpoint / 'tokenizer.json')!r} does not fit {str(checkpoint / 'config.json')!r}: "
                f"{symbols} symbols for the model's {name}={vocabulary}"
            )
    if config.pad_id != PAD:
        raise RunError(f"{str(checkpoint / 'config.json')!r} has pad_id={config.pad_id}, the tokenizers pad with {PAD}")
    saved = trainer["options"]
    try:
        dataset = load_task(saved["task"], data=saved["data"], tokenizer=saved["tokenizer"])
    except TypeError as error:  # a task, data or tokenizer of the wrong kind: only damage writes that
        raise RunError(f"{str(checkpoint / 'trainer.json')!r} is damaged: {error}") from None
    return Setup(dataset, source, target, config), trainer


def read_optimizer_state(checkpoint: Path) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint's ``optimizer.safetensors``."""
    try:
        return read_weights(checkpoint / "optimizer.safetensors")
    except (FileNotFoundError, ValueError) as error:
        raise RunError(f"cannot resume: {error}") from None


def prepare(options: TrainOptions) -> tuple[Setup, dict[str, Any] | None, Path | None]:
    """Check the output directory; on resume, read the latest checkpoint (whose setup then wins)."""
    out = Path(options.out)
    checkpoint = latest_checkpoint(out) if out.exists() else None
    if checkpoint is not None and not options.resume:
        raise RunError(f"{str(out)!r} already holds a run; pass --resume to continue it, or choose another --out")
    if out.exists() and not out.is_dir():
        raise RunError(f"cannot write to output directory {str(out)!r}: it is a file")
    if checkpoint is None:
        damaged = incomplete_checkpoints(out)
        if damaged:  # starting afresh would discard them
            raise RunError(f"{str(out)!r} holds no complete checkpoint to resume: {damaged}")
        return make_setup(options), None, None
    setup, trainer = load_setup(checkpoint)
    saved = trainer["options"]
    if (options.task, options.data) != (saved["task"], saved["data"]) and options.extra.get("task_given"):
        raise RunError(f"{str(out)!r} trained task {saved['data'] or saved['task']!r}; resume it with the same task")
    if trainer["framework"] != options.framework:
        raise RunError(f"{str(out)!r} was trained with --framework {trainer['framework']}; resume it with that")
    skipped = incomplete_checkpoints(out, newer_than=checkpoint.name)
    if skipped and _distributed()[0] == 0:
        print(f"warning: resuming from {checkpoint.name}, the newest complete checkpoint: {skipped}", file=sys.stderr)
    return setup, trainer, checkpoint


class Interrupt:
    """Turns SIGINT into a flag checked between steps, so a checkpoint is saved before exiting."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None

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
    accuracy: float | None
    heldout: int
    interrupted: bool
    losses: list[tuple[int, float]]
    model: Any = None  # the trained model (this rank's copy under torchrun)


def train(options: TrainOptions) -> Result:
    if options.framework == "keras":
        from multihead.app.train_keras import train_keras

        return train_keras(options)
    return train_torch(options)


def _distributed() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _restore_torch_optimizer(optimizer: Any, meta: dict[str, Any], checkpoint: Path) -> None:
    """Load the optimizer state and torch RNG of a checkpoint; a :class:`RunError` if they do not fit the model."""
    import torch

    tensors = read_optimizer_state(checkpoint)
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    try:
        state = {}
        for index, names in meta["state"].items():
            state[int(index)] = {name: torch.from_numpy(tensors[f"state.{index}.{name}"]) for name in names}
            for name, value in state[int(index)].items():
                if value.dim() and value.shape != parameters[int(index)].shape:  # a 0-d value is a count
                    raise ValueError(f"state.{index}.{name} has shape {tuple(value.shape)}")
        optimizer.load_state_dict({"param_groups": meta["param_groups"], "state": state})
        torch.set_rng_state(torch.from_numpy(tensors["rng.torch"]))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as error:
        raise RunError(
            f"cannot resume: {str(checkpoint / 'optimizer.safetensors')!r} and the optimizer in trainer.json "
            f"do not fit the model ({type(error).__name__}: {error})"
        ) from None


def train_torch(options: TrainOptions) -> Result:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from torch.nn.parallel import DistributedDataParallel
    from tqdm import tqdm

    from multihead.io import load_weights, save_weights
    from multihead.torch import Transformer

    rank, world = _distributed()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    setup, trainer, checkpoint = prepare(options)
    if rank == 0:
        check_writable(Path(options.out))
    torch.manual_seed(options.seed)
    model = Transformer.from_config(setup.config)
    optimizer = torch.optim.Adam(model.parameters(), lr=options.lr, betas=(0.9, 0.98), eps=1e-9)
    step, history = 0, {"losses": [], "evals": []}
    if checkpoint is not None:
        load_weights(model, checkpoint / "model.safetensors")
        _restore_torch_optimizer(optimizer, trainer["optimizer"], checkpoint)
        step, history = trainer["step"], {"losses": trainer["losses"], "evals": trainer["evals"]}
    engine = DistributedDataParallel(model) if world > 1 else model
    total = options.steps if options.steps is not None else sys.maxsize
    deadline = None if options.minutes is None else time.monotonic() + 60 * options.minutes

    def generate(src: np.ndarray, max_len: int) -> np.ndarray:
        model.eval()
        out = model.generate(torch.from_numpy(src), max_len=max_len, bos_id=BOS, eos_id=EOS)
        model.train()
        return out.numpy()

    def save() -> None:
        if rank != 0:
            return
        state = optimizer.state_dict()
        tensors = {f"state.{i}.{k}": v.contiguous() for i, s in state["state"].items() for k, v in s.items()}
        tensors["rng.torch"] = torch.get_rng_state()
        meta = {"param_groups": state["param_groups"], "state": {i: list(s) for i, s in state["state"].items()}}
        save_checkpoint(
            Path(options.out),
            step,
            checkpoint_files(
                setup, options, step, history, lambda path: save_weights(model, path),
                lambda path: save_file(tensors, str(path)), meta,
            ),
        )  # fmt: skip

    progress = tqdm(
        total=None if options.steps is None else total, initial=step, disable=not options.progress or rank != 0,
        unit="step", dynamic_ncols=True, file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30.0,
    )  # fmt: skip
    model.train()
    interrupted = False
    tokens_seen, started = 0, time.monotonic()
    with Interrupt() as interrupt:
        while step < total:
            stop = interrupt.requested or (deadline is not None and time.monotonic() >= deadline)
            if world > 1:  # every rank stops at the same step
                flag = torch.tensor([float(stop)])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                stop = bool(flag.item())
            if stop:
                interrupted = interrupt.requested
                break
            pairs = setup.dataset.batch(options.seed, step, options.batch_size)
            src, tgt_in, tgt_out = (torch.from_numpy(a) for a in encode_batch(pairs, setup.source, setup.target))
            global_tokens = int((tgt_out != PAD).sum())
            src, tgt_in, tgt_out = src[rank::world], tgt_in[rank::world], tgt_out[rank::world]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(options, step + 1)
            logits = engine(src, tgt_in)  # (B, Lt, V)
            summed = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum")
            # DDP averages gradients over ranks; scaling by the world size makes that the global token mean.
            loss = summed * world / global_tokens
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            reported = summed.detach()
            if world > 1:
                dist.all_reduce(reported)
            history["losses"].append([step, float(reported) / global_tokens])
            tokens_seen += global_tokens
            progress.update(1)
            progress.set_postfix(
                loss=f"{history['losses'][-1][1]:.4f}",
                tok_s=f"{tokens_seen / (time.monotonic() - started):.0f}",
                refresh=False,  # drawing is progress.update's job, at most every mininterval
            )
            if rank == 0 and step % options.eval_every == 0:
                accuracy = exact_match(generate, setup, setup.dataset.heldout[: options.eval_examples])
                history["evals"].append([step, accuracy])
                progress.write(f"step {step}: loss {history['losses'][-1][1]:.4f}, held-out exact match {accuracy:.3f}")
            if step % options.checkpoint_every == 0:
                save()
    progress.close()
    save()
    accuracy = None
    if rank == 0 and not interrupted:
        accuracy = exact_match(generate, setup, setup.dataset.heldout)
    if world > 1:
        dist.barrier()
    losses = [tuple(x) for x in history["losses"]]
    return Result(step, accuracy, len(setup.dataset.heldout), interrupted, losses, model)
