"""The PyTorch trainer under :mod:`multihead.app.training`: model, Adam, one step at a time.

Under ``torchrun`` it trains data-parallel: every rank draws the same global batch, trains on its share, and
DistributedDataParallel averages the gradients; the loss is scaled so that the average is the global token mean.
Only rank 0 writes checkpoints.

Notation: B batch, Lt target length, V target vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel

from multihead.app.batching import Batch
from multihead.app.console import rank, world_size
from multihead.app.memory import keep_freed_memory
from multihead.app.runs import OPTIMIZER, TRAINER, WEIGHTS, Checkpoint, RunError
from multihead.app.tokenizers import BOS, EOS, PAD
from multihead.config import TransformerConfig
from multihead.io import load_weights, read_weights, save_weights
from multihead.torch import Transformer


class TorchTrainer:
    framework = "torch"
    backend = None

    def __init__(self, config: TransformerConfig, options: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        keep_freed_memory()
        self.rank, self.world = rank(), world_size()
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            torch.set_num_threads(max(1, torch.get_num_threads() // self.world))
        self.configure(options)
        torch.manual_seed(options["seed"])
        self.model = Transformer.from_config(config)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=options["lr"], betas=(0.9, 0.98), eps=1e-9)
        if checkpoint is not None:
            load_weights(self.model, checkpoint.path / WEIGHTS)
            self._restore_optimizer(checkpoint)
        self.engine = DistributedDataParallel(self.model) if self.world > 1 else self.model
        self.model.train()

    def configure(self, options: dict[str, Any]) -> None:
        """Take the options that may change on resume (gradient clipping, label smoothing)."""
        self.clip, self.label_smoothing = options["clip"], options["label_smoothing"]

    def pad_to(self) -> int:
        return 1

    def train_step(self, batch: Batch, lr: float) -> float:
        global_tokens = batch.target_tokens
        share = batch.rows(self.rank, self.world)
        src, tgt_in, tgt_out = (torch.from_numpy(a) for a in (share.src, share.tgt_in, share.tgt_out))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        logits = self.engine(src, tgt_in)  # (B, Lt, V)
        summed = F.cross_entropy(
            logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, reduction="sum",
            label_smoothing=self.label_smoothing,
        )  # fmt: skip
        # DDP averages gradients over ranks; scaling by the world size makes that the global token mean.
        loss = summed * self.world / global_tokens
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        reported = summed.detach()
        if self.world > 1:
            dist.all_reduce(reported)
        return float(reported) / global_tokens

    def loss_sum(self, batch: Batch) -> float:
        self.model.eval()
        with torch.inference_mode():
            logits = self.model(torch.from_numpy(batch.src), torch.from_numpy(batch.tgt_in))
            summed = F.cross_entropy(
                logits.flatten(0, 1), torch.from_numpy(batch.tgt_out).flatten(), ignore_index=PAD, reduction="sum"
            )
        self.model.train()
        return float(summed)

    def generate(self, src: np.ndarray, max_len: int) -> np.ndarray:
        self.model.eval()
        out = self.model.generate(torch.from_numpy(src), max_len=max_len, bos_id=BOS, eos_id=EOS)
        self.model.train()
        return out.numpy()

    def agree(self, flag: bool) -> bool:
        if self.world == 1:
            return flag
        value = torch.tensor([float(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def write_weights(self, path: Path) -> None:
        save_weights(self.model, path)

    def load_weights(self, path: Path) -> None:
        load_weights(self.model, path)

    def write_optimizer(self, path: Path) -> dict[str, Any]:
        state = self.optimizer.state_dict()
        tensors = {f"state.{i}.{k}": v.contiguous() for i, s in state["state"].items() for k, v in s.items()}
        tensors["rng.torch"] = torch.get_rng_state()
        save_file(tensors, str(path))
        return {"param_groups": state["param_groups"], "state": {i: list(s) for i, s in state["state"].items()}}

    def _restore_optimizer(self, checkpoint: Checkpoint) -> None:
        """Load the optimizer state and torch RNG of a checkpoint; a :class:`RunError` if they do not fit."""
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
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as error:
            raise RunError(
                f"cannot resume: {str(path)!r} and the optimizer in {TRAINER} do not fit the model "
                f"({type(error).__name__}: {error})"
            ) from None
