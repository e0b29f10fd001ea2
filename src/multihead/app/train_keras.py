"""The Keras trainer under :mod:`multihead.app.training`: the same data, schedule, records and run directory as the
PyTorch one, one compiled ``train_on_batch`` step at a time, on any Keras backend.

The loss is the PyTorch trainer's: cross-entropy with label smoothing, summed over target tokens (padding
excluded) and divided by their number. Gradients are clipped by their global norm, as
``torch.nn.utils.clip_grad_norm_`` does.

On TensorFlow the step is one ``tf.function`` traced once for batches of any shape (Keras' own ``train_on_batch``
traces a first shape, then every shape again, each trace taking seconds), so batches keep their lengths. JAX compiles
its step (XLA) once per input shape, so there batches come in few shapes: lengths are rounded up to a multiple of
``LENGTH_MULTIPLE``, and a corpus batch of padded length ``L`` is filled up with empty rows to ``batch_tokens // L``
rows (the loss ignores them). The torch backend runs eagerly and takes batches as they come.

Where JAX sees several devices (GPUs, or CPU devices made with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``),
training is data-parallel through ``keras.distribution.DataParallel``: the weights are replicated, each batch's rows
are split over the devices (filled up with empty rows to a multiple of their number) and the gradients combined.

Notation: B batch, Lt target length, V target vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras import ops

from multihead.app.batching import Batch, join_batches
from multihead.app.devices import keras_device
from multihead.app.options import RunOptions
from multihead.app.runs import OPTIMIZER, TRAINER, WEIGHTS, Checkpoint, RunError
from multihead.config import TransformerConfig
from multihead.decoding import Generation
from multihead.io import load_weights, read_weights, save_weights
from multihead.keras import Transformer


def token_loss(label_smoothing: float, pad: int) -> Any:
    """Mean per target token of the (label-smoothed) cross-entropy, padding (``pad``) excluded."""

    def loss(targets: Any, logits: Any) -> Any:
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B, Lt, V)
        targets = ops.cast(targets, "int32")
        picked = ops.take_along_axis(log_probs, ops.expand_dims(targets, -1), axis=-1)[..., 0]  # (B, Lt)
        per_token = -(1.0 - label_smoothing) * picked - label_smoothing * ops.mean(log_probs, axis=-1)
        real = ops.cast(ops.not_equal(targets, pad), "float32")
        return ops.sum(per_token * real) / ops.maximum(ops.sum(real), 1.0)

    return loss


LENGTH_MULTIPLE = 8


def fill_rows(batch: Batch, rows: int) -> Batch:
    """``batch`` with empty (all-padding) rows appended up to ``rows``."""
    missing = rows - len(batch.src)
    if missing <= 0:
        return batch
    src, tgt_in, tgt_out = (
        np.concatenate([a, np.full((missing, a.shape[1]), batch.pad, a.dtype)]) for a in batch.as_arrays()
    )
    return Batch(src, tgt_in, tgt_out, batch.pad)


def _one_thread_per_operation() -> None:
    """On TensorFlow, run operations side by side on one thread each (inter-op threads: the cores; intra-op: 1).

    TensorFlow's default gives every core an operation and every operation every core, so a step of many small
    operations (a built-in task's: a few dozen short sentences at d_model 128) oversubscribes the cores; a corpus
    step's large products want every core each, so corpora keep the default (docs/performance.md has the figures).
    Thread pools are fixed once TensorFlow has run an operation in the process; then this changes nothing. ``--threads
    N`` (:func:`multihead.app.devices.use_threads`) makes the inter-op threads N instead of the cores.
    """
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    try:
        tf.config.threading.set_inter_op_parallelism_threads(
            int(os.environ.get("TF_NUM_INTEROP_THREADS") or os.cpu_count() or 1)
        )
        tf.config.threading.set_intra_op_parallelism_threads(1)
    except RuntimeError:  # the pools are in use already
        pass


def _traced_step(model: Transformer) -> Any:
    """Keras' own training step (forward, loss, gradients, optimizer) as one ``tf.function`` for int32 ``(B, L)``
    batches of any shape: ``(src, tgt_in, tgt_out) -> loss``."""
    import tensorflow as tf

    batch = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[batch, batch, batch])
    def step(src: Any, tgt_in: Any, tgt_out: Any) -> Any:
        return model.train_step(((src, tgt_in), tgt_out))["loss"]

    return step


def _data_parallel() -> int:
    """On JAX with several devices, distribute what Keras builds next over all of them, data-parallel; the number of
    devices a batch is split over."""
    devices = keras.distribution.list_devices() if keras.backend.backend() == "jax" else []
    if len(devices) < 2:
        return 1
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    return len(devices)


class KerasTrainer:
    framework = "keras"

    def __init__(
        self,
        config: TransformerConfig,
        options: RunOptions,
        checkpoint: Checkpoint | None,
        generation: Generation,
        *,
        weights: Path | None = None,
    ) -> None:
        self.generation, self.specials = generation, generation.specials
        self.backend, self.device = keras.backend.backend(), keras_device()
        self.prefetch = False
        self.devices = _data_parallel()
        if options.batch_tokens is None:  # a built-in task: batches of a few dozen short sentences
            _one_thread_per_operation()
        keras.utils.set_random_seed(options.seed)
        self.model = Transformer.from_config(config)
        self.model.build()
        self.configure(options)
        if checkpoint is not None:
            load_weights(self.model, checkpoint.path / WEIGHTS)
            self._restore_optimizer(checkpoint)
        elif weights is not None:
            load_weights(self.model, weights)

    def configure(self, options: RunOptions) -> None:
        """(Re)compile with the options that may change on resume (gradient clipping, label smoothing)."""
        self.batch_tokens = options.batch_tokens
        previous = getattr(self, "optimizer", None)
        self.optimizer = keras.optimizers.Adam(
            learning_rate=options.lr, beta_1=0.9, beta_2=0.98, epsilon=1e-9,
            global_clipnorm=options.clip or None,
        )  # fmt: skip
        self.optimizer.build(self.model.trainable_variables)
        if previous is not None:  # keep the moments and the step count through a recompile
            for mine, theirs in zip(self.optimizer.variables, previous.variables, strict=True):
                mine.assign(theirs)
        pad = self.specials.pad
        self.model.compile(optimizer=self.optimizer, loss=token_loss(options.label_smoothing, pad))
        self.fixed_shapes = keras.backend.backend() == "jax"
        self.traced_step = _traced_step(self.model) if keras.backend.backend() == "tensorflow" else None

    def pad_to(self) -> int:
        return LENGTH_MULTIPLE if self.fixed_shapes else 1

    def facts(self) -> dict[str, Any]:
        return {"device": self.device, "devices": self.devices, "precision": "fp32", "keras_backend": self.backend}

    def train_step(self, batches: Sequence[Batch], lr: float, global_tokens: int) -> float:
        """One optimizer step; several batches (``--accumulate``) are joined into one, which gives the same token-mean
        loss and gradients (their padding is masked)."""
        batch = join_batches(batches)
        self.optimizer.learning_rate.assign(lr)
        if self.fixed_shapes and self.batch_tokens is not None:  # a corpus: one row count per padded length
            batch = fill_rows(batch, self.batch_tokens // max(batch.src.shape[1], batch.tgt_in.shape[1]))
        batch = fill_rows(batch, -(-len(batch.src) // self.devices) * self.devices)  # rows split over the devices
        src, tgt_in, tgt_out = (a.astype("int32") for a in batch.as_arrays())
        if self.traced_step is None:
            return float(self.model.train_on_batch((src, tgt_in), tgt_out))
        self.model.reset_metrics()  # the loss reported is this step's, as train_on_batch's
        return float(self.traced_step(src, tgt_in, tgt_out))

    def loss_sum(self, batch: Batch) -> float:
        logits = self.model((batch.src.astype("int32"), batch.tgt_in.astype("int32")), training=False)
        log_probs = np.asarray(ops.convert_to_numpy(ops.log_softmax(ops.cast(logits, "float32"), axis=-1)))
        picked = np.take_along_axis(log_probs, batch.tgt_out[..., None], axis=-1)[..., 0]  # (B, Lt)
        return float(-(picked * (batch.tgt_out != batch.pad)).sum())

    def generate(self, src: np.ndarray, limits: np.ndarray) -> np.ndarray:
        return self.model.generate(src.astype("int32"), max_len=limits, generation=self.generation)

    def agree(self, flag: bool) -> bool:
        return flag

    def release(self) -> None:
        """Nothing: a Keras optimizer's variables stay as long as the optimizer (the final evaluations take their
        memory beside them)."""

    def write_weights(self, path: Path) -> None:
        save_weights(self.model, path)

    def load_weights(self, path: Path) -> None:
        load_weights(self.model, path)

    def write_optimizer(self, path: Path) -> dict[str, Any]:
        import safetensors.numpy

        tensors = {f"keras.{i}": np.asarray(ops.convert_to_numpy(v)) for i, v in enumerate(self.optimizer.variables)}
        safetensors.numpy.save_file(tensors, str(path))
        return {"variables": len(tensors)}

    def _restore_optimizer(self, checkpoint: Checkpoint) -> None:
        """Assign a checkpoint's optimizer variables; a :class:`RunError`, with nothing assigned, if they do not fit."""
        path = checkpoint.path / OPTIMIZER
        try:
            saved = read_weights(path)
        except (FileNotFoundError, ValueError) as error:
            raise RunError(f"cannot resume: {error}") from None
        expected = {f"keras.{index}": tuple(variable.shape) for index, variable in enumerate(self.optimizer.variables)}
        stored = {name: tuple(value.shape) for name, value in saved.items()}
        count = checkpoint.trainer["optimizer"].get("variables")
        if count != len(expected) or stored != expected:
            raise RunError(
                f"cannot resume: {str(path)!r} does not hold this model's {len(expected)} optimizer variables "
                f"({TRAINER} counts {count!r})"
            )
        for index, variable in enumerate(self.optimizer.variables):
            variable.assign(saved[f"keras.{index}"])
