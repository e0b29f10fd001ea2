"""The PyTorch trainer under :mod:`multihead.app.training`: model, Adam, one step at a time, on the CPU or a GPU.

An optimizer step takes this rank's micro-batches (``--accumulate`` of them), adds up their gradients and steps;
under ``torchrun`` DistributedDataParallel averages the gradients of every rank (NCCL on GPUs, each rank on
``cuda:LOCAL_RANK``; gloo on the CPU). The loss is scaled so that the average is the token mean of the whole global
batch. Only rank 0 writes checkpoints.

On a GPU nothing in a step waits for the device: the batches come from pinned memory without blocking, the model
runs its unchecked path (the batches are the run's own tokens), and the loss stays a tensor until the training loop
reads it, every few steps. ``--precision`` autocasts the forward pass and the loss to bf16 or fp16 (fp16 with a
``GradScaler``, whose state is checkpointed); the weights and the optimizer state stay float32. ``--compile`` runs
the step's forward pass under ``torch.compile``.

The loss of a training step never holds the whole ``(B·Lt, V)`` logits: :class:`ProjectedLoss` projects the decoder's
output a few rows at a time and takes each slice's gradient while it has the slice (a summed cross-entropy's gradient
does not depend on what comes after it), so memory holds one slice at a time instead of the logits, their
log-probabilities and two gradients of that size.

Notation: B batch, Lt target length, N = B·Lt rows, E d_model, V target vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from multihead.app.batching import Batch
from multihead.app.console import UserError, rank, world_size
from multihead.app.devices import resolve_device, resolve_precision
from multihead.app.memory import keep_freed_memory
from multihead.app.options import RunOptions
from multihead.app.runs import OPTIMIZER, TRAINER, WEIGHTS, Checkpoint, RunError
from multihead.config import TransformerConfig
from multihead.decoding import Generation
from multihead.io import load_weights, read_weights, save_weights
from multihead.torch import Transformer
from multihead.torch.layouts import product

SLICE_ELEMENTS = 1 << 22
"""The logits :class:`ProjectedLoss` computes at a time: rows of ``V`` floats, 16 MiB in float32."""


class TokenLoss(nn.Module):
    """What DistributedDataParallel and ``torch.compile`` wrap: a batch's summed (label-smoothed) cross-entropy over
    its target tokens (padding, the model's ``pad_id``, excluded), through the model's unchecked teacher-forced path;
    the logits a slice of rows at a time (not under ``torch.compile``, which sees the whole logits):
    :class:`ProjectedLoss` where gradients are taken, :func:`sliced_cross_entropy` in evaluation."""

    def __init__(self, model: Transformer, *, sliced: bool = True) -> None:
        super().__init__()
        self.model, self.sliced = model, sliced
        self.pad = model.config.pad_id if model.config.pad_id is not None else -100  # -100: no target is padding

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, smoothing: float) -> torch.Tensor:
        if self.sliced:
            hidden = self.model(src, tgt_in, project=False, check=False).flatten(0, 1)  # (B*Lt, E)
            projection, target = self.model.output_proj, tgt_out.flatten()
            if torch.is_grad_enabled():
                return ProjectedLoss.apply(hidden, projection.weight, projection.bias, target, smoothing, self.pad)
            return sliced_cross_entropy(hidden, projection, target, smoothing, self.pad)
        logits = self.model(src, tgt_in, check=False)  # (B, Lt, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # autocast's half precision: float32
        return F.cross_entropy(
            logits.flatten(0, 1), tgt_out.flatten(), ignore_index=self.pad, reduction="sum", label_smoothing=smoothing
        )


def sliced_cross_entropy(
    hidden: torch.Tensor, projection: nn.Linear, target: torch.Tensor, smoothing: float, pad: int
) -> torch.Tensor:
    """``F.cross_entropy(projection(hidden), target, ignore_index=pad, reduction="sum", label_smoothing=smoothing)``
    without gradients (an evaluation's loss), the logits of ``SLICE_ELEMENTS`` at a time: ``hidden (N, E)``,
    ``target (N,)``."""
    step = max(1, SLICE_ELEMENTS // projection.out_features)
    total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
    for start in range(0, hidden.shape[0], step):
        logits = projection(hidden[start : start + step])  # (n, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # autocast's half precision: float32
        total += F.cross_entropy(logits, target[start : start + step], ignore_index=pad, reduction="sum",
                                 label_smoothing=smoothing)  # fmt: skip
    return total


class ProjectedLoss(torch.autograd.Function):
    """``F.cross_entropy(hidden @ weight.T + bias, target, ignore_index=pad, reduction="sum", label_smoothing=s)``,
    computed a slice of rows at a time, with its gradients (log-probabilities in float32 at least, as ``TokenLoss``;
    under autocast the projection computes in ``hidden``'s dtype, as ``nn.Linear`` would). A row's loss is
    ``-(1 - s) log p[target] - (s / V) Σ log p``; its gradient with respect to the logits is ``p - (1 - s) onehot -
    s / V``, zero for ``pad`` targets."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        target: torch.Tensor,
        s: float,
        pad: int,
    ) -> torch.Tensor:
        rows, vocab, dtype = hidden.shape[0], weight.shape[0], hidden.dtype  # hidden (N, E), weight (V, E)
        exact = torch.promote_types(dtype, torch.float32)  # what the log-probabilities take
        with torch.autocast(hidden.device.type, enabled=False):
            cast_weight, cast_bias = weight.to(dtype), bias.to(dtype)
            grad_hidden = torch.empty_like(hidden)
            grad_weight, grad_bias = torch.zeros_like(weight), torch.zeros_like(bias)
            total = torch.zeros((), dtype=exact, device=hidden.device)
            step = max(1, SLICE_ELEMENTS // vocab)
            for start in range(0, rows, step):
                part, wanted = hidden[start : start + step], target[start : start + step, None]  # (n, E), (n, 1)
                log_probs = product(part, cast_weight, cast_bias).to(exact).log_softmax(-1)  # (n, V)
                kept = (wanted != pad).to(exact)  # (n, 1)
                picked = log_probs.gather(1, wanted)
                total += (kept * ((s - 1.0) * picked - (s / vocab) * log_probs.sum(1, keepdim=True))).sum()
                grad = log_probs.exp_().sub_(s / vocab)  # (n, V): the probabilities' buffer
                grad.scatter_add_(1, wanted, torch.full_like(picked, s - 1.0)).mul_(kept)
                grad = grad.to(dtype)
                grad_hidden[start : start + step] = product(grad, cast_weight.t())  # (n, V) @ (V, E)
                grad_weight.add_(product(grad.t(), part.t()))  # (V, n) @ (n, E)
                grad_bias.add_(grad.sum(0))
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, grad_bias * grad_total, None, None, None


class TorchTrainer:
    framework = "torch"

    def __init__(
        self,
        config: TransformerConfig,
        options: RunOptions,
        checkpoint: Checkpoint | None,
        generation: Generation,
        *,
        weights: Path | None = None,
    ) -> None:
        keep_freed_memory()
        self.generation, self.specials = generation, generation.specials
        self.rank, self.world = rank(), world_size()
        self.device = torch.device(resolve_device(options.device or "auto"))
        self.prefetch = self.device.type == "cuda"  # batches built on a thread while the GPU computes
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            if self.device.type == "cpu":
                torch.set_num_threads(max(1, torch.get_num_threads() // self.world))
        torch.manual_seed(options.seed)
        self.model = Transformer.from_config(config)  # initialised on the CPU: the same weights on any device
        start = checkpoint.path / WEIGHTS if checkpoint is not None else weights
        if start is not None:
            load_weights(self.model, start)
        self.model.to(self.device).train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=options.lr, betas=(0.9, 0.98), eps=1e-9)
        self.configure(options)
        if checkpoint is not None:
            self._restore_optimizer(checkpoint)

    def configure(self, options: RunOptions) -> None:
        """Take the options that may change on resume (clipping, label smoothing, precision, compilation)."""
        self.clip, self.label_smoothing = options.clip, options.label_smoothing
        self.precision = resolve_precision(options.precision or "auto", str(self.device), self.model.config.d_model)
        previous = getattr(self, "scaler", None)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision.scaled else None
        if self.scaler is not None and previous is not None:
            self.scaler.load_state_dict(previous.state_dict())
        self.skipped = getattr(self, "skipped", 0)
        step = TokenLoss(self.model, sliced=not options.compile)
        self.ddp = DistributedDataParallel(step) if self.world > 1 else None
        engine = self.ddp or step
        self.engine = torch.compile(engine, dynamic=True) if options.compile else engine

    def pad_to(self) -> int:
        return 1

    def _tensors(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """A batch on the device: from pinned memory, without waiting, on a GPU."""
        arrays = (torch.from_numpy(a) for a in batch.as_arrays())
        if self.device.type == "cpu":
            return tuple(arrays)
        return tuple(a.pin_memory().to(self.device, non_blocking=True) for a in arrays)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.precision.autocast))

    def train_step(self, batches: Sequence[Batch], lr: float, global_tokens: int) -> torch.Tensor:
        """One optimizer step over this rank's ``batches``; the mean loss per target token of the whole global batch
        (``global_tokens`` tokens), as a tensor on the device."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        summed = torch.zeros((), device=self.device)
        try:
            for index, batch in enumerate(batches):
                last = index == len(batches) - 1
                # Gradients are averaged over the ranks once, after this rank's last batch.
                with self.ddp.no_sync() if self.ddp is not None and not last else contextlib.nullcontext():
                    with self._autocast():
                        loss_sum = self.engine(*self._tensors(batch), self.label_smoothing)
                    # DDP averages gradients over ranks; scaling by the world size makes that the global token mean.
                    loss = loss_sum * self.world / global_tokens
                    (loss if self.scaler is None else self.scaler.scale(loss)).backward()
                summed += loss_sum.detach()
        except torch.OutOfMemoryError:
            raise UserError(
                f"out of memory on {self.device} with a batch of {max(b.src.size for b in batches)} source and "
                f"{max(b.tgt_in.size for b in batches)} target positions: lower --batch-tokens (or --batch-size), "
                "and raise --accumulate to keep the step's size"
            ) from None
        self._update()
        if self.world > 1:
            dist.all_reduce(summed)
        return summed / global_tokens

    def _update(self) -> None:
        """Clip and step; with fp16, through the loss scaler, counting the steps it skips."""
        if self.scaler is None:
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.optimizer.step()
            return
        self.scaler.unscale_(self.optimizer)
        parameters = list(self.model.parameters())
        grads = [grad for grad in (parameter.grad for parameter in parameters) if grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)  # on the device: nothing waits for it
        if self.clip > 0:
            torch.nn.utils.clip_grads_with_norm_(parameters, self.clip, norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.skipped += ~torch.isfinite(norm)  # the scaler skips exactly the steps whose gradients hold inf or NaN

    def loss_sum(self, batch: Batch) -> float:
        self.model.eval()
        with torch.inference_mode():
            src, tgt_in, tgt_out = self._tensors(batch)
            summed = TokenLoss(self.model)(src, tgt_in, tgt_out, 0.0)
        self.model.train()
        return float(summed)

    def generate(self, src: np.ndarray, limits: np.ndarray) -> np.ndarray:
        self.model.eval()
        out = self.model.generate(torch.from_numpy(src).to(self.device), max_len=limits, generation=self.generation)
        self.model.train()
        return out.cpu().numpy()

    def release(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.state.clear()

    def agree(self, flag: bool) -> bool:
        if self.world == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def facts(self) -> dict[str, Any]:
        """What the run's record keeps of how this process trained."""
        facts = {"device": str(self.device), "precision": self.precision.name}
        return facts if self.scaler is None else {**facts, "skipped_steps": int(self.skipped)}

    def write_weights(self, path: Path) -> None:
        save_weights(self.model, path)

    def load_weights(self, path: Path) -> None:
        load_weights(self.model, path)

    def write_optimizer(self, path: Path) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        tensors = {f"state.{i}.{k}": v.cpu().contiguous() for i, s in state["state"].items() for k, v in s.items()}
        tensors["rng.torch"] = torch.get_rng_state()
        if self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        save_file(tensors, str(path))
        meta = {"param_groups": state["param_groups"], "state": {i: list(s) for i, s in state["state"].items()}}
        if self.scaler is None:
            return meta
        return {**meta, "scaler": self.scaler.state_dict(), "skipped_steps": int(self.skipped)}

    def _restore_optimizer(self, checkpoint: Checkpoint) -> None:
        """Load the optimizer state, the RNG (the CUDA one when both runs are on GPUs) and the loss scaler of a
        checkpoint; a :class:`RunError` if they do not fit."""
        path = checkpoint.path / OPTIMIZER
        try:
            tensors = read_weights(path)
        except (FileNotFoundError, ValueError) as error:
            raise RunError(f"cannot resume: {error}") from None
        meta = checkpoint.trainer["optimizer"]
        parameters = [parameter for group in self.optimizer.param_groups for parameter in group["params"]]
        try:
            state = {}
            for index, names in meta["state"].items():
                state[int(index)] = {name: torch.from_numpy(tensors[f"state.{index}.{name}"]) for name in names}
                for name, value in state[int(index)].items():
                    if value.dim() and value.shape != parameters[int(index)].shape:  # a 0-d value is a count
                        raise ValueError(f"state.{index}.{name} has shape {tuple(value.shape)}")
            self.optimizer.load_state_dict({"param_groups": meta["param_groups"], "state": state})
            torch.set_rng_state(torch.from_numpy(tensors["rng.torch"]))
            if "rng.cuda" in tensors and self.device.type == "cuda":
                torch.cuda.set_rng_state(torch.from_numpy(tensors["rng.cuda"]), self.device)
            if self.scaler is not None and "scaler" in meta:
                self.scaler.load_state_dict(meta["scaler"])
                self.skipped = int(meta.get("skipped_steps", 0))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as error:
            raise RunError(
                f"cannot resume: {str(path)!r} and the optimizer in {TRAINER} do not fit the model "
                f"({type(error).__name__}: {error})"
            ) from None
