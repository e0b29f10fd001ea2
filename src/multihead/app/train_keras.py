"""The Keras training path: the same data, schedule and run directory as the PyTorch loop, through ``model.fit``.

``fit`` runs in chunks of ``checkpoint_every`` steps; a checkpoint (weights in the shared safetensors layout,
the optimizer's variables, the step) is written after each chunk. Ctrl-C and ``--minutes`` stop ``fit`` at the
next batch boundary, and the steps done so far are saved.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.runs import RunError, check_writable, save_checkpoint
from multihead.app.tokenizers import BOS, EOS, PAD
from multihead.app.train import (
    Interrupt,
    Result,
    TrainOptions,
    checkpoint_files,
    encode_batch,
    exact_match,
    prepare,
    read_optimizer_state,
)


def _restore_keras_optimizer(optimizer: Any, meta: dict[str, Any], checkpoint: Path) -> None:
    """Assign a checkpoint's optimizer variables; a :class:`RunError`, with nothing assigned, if they do not fit."""
    saved = read_optimizer_state(checkpoint)
    expected = {f"keras.{index}": tuple(variable.shape) for index, variable in enumerate(optimizer.variables)}
    stored = {name: tuple(value.shape) for name, value in saved.items()}
    if meta.get("variables") != len(expected) or stored != expected:
        raise RunError(
            f"cannot resume: {str(checkpoint / 'optimizer.safetensors')!r} does not hold this model's "
            f"{len(expected)} optimizer variables (trainer.json counts {meta.get('variables')!r})"
        )
    for index, variable in enumerate(optimizer.variables):
        variable.assign(saved[f"keras.{index}"])


def train_keras(options: TrainOptions) -> Result:
    import keras
    import safetensors.numpy
    from keras import ops
    from tqdm import tqdm

    from multihead.io import load_weights, save_weights
    from multihead.keras import Transformer

    setup, trainer, checkpoint = prepare(options)
    check_writable(Path(options.out))
    keras.utils.set_random_seed(options.seed)

    class Schedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            step = ops.maximum(ops.cast(step, "float32") + 1.0, 1.0)
            return options.lr * ops.minimum(step / options.warmup, ops.sqrt(options.warmup / step))

    model = Transformer.from_config(setup.config)
    model.build()
    optimizer = keras.optimizers.Adam(Schedule(), beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD)
    model.compile(optimizer=optimizer, loss=loss)
    optimizer.build(model.trainable_variables)
    step, history = 0, {"losses": [], "evals": []}
    if checkpoint is not None:
        load_weights(model, checkpoint / "model.safetensors")
        _restore_keras_optimizer(optimizer, trainer["optimizer"], checkpoint)
        step, history = trainer["step"], {"losses": trainer["losses"], "evals": trainer["evals"]}
    total = options.steps if options.steps is not None else sys.maxsize
    deadline = None if options.minutes is None else time.monotonic() + 60 * options.minutes

    class Batches(keras.utils.PyDataset):
        def __init__(self, start: int, count: int) -> None:
            super().__init__()
            self.start, self.count = start, count

        def __len__(self) -> int:
            return self.count

        def __getitem__(self, index: int) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
            pairs = setup.dataset.batch(options.seed, self.start + index, options.batch_size)
            src, tgt_in, tgt_out = (a.astype("int32") for a in encode_batch(pairs, setup.source, setup.target))
            return (src, tgt_in), tgt_out

    progress = tqdm(
        total=None if options.steps is None else total, initial=step, disable=not options.progress,
        unit="step", dynamic_ncols=True, file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30.0,
    )  # fmt: skip

    def generate(src: np.ndarray, max_len: int) -> np.ndarray:
        return model.generate(ops.convert_to_tensor(src.astype("int32")), max_len=max_len, bos_id=BOS, eos_id=EOS)

    def save() -> None:
        tensors = {f"keras.{i}": np.asarray(ops.convert_to_numpy(v)) for i, v in enumerate(optimizer.variables)}
        save_checkpoint(
            Path(options.out),
            step,
            checkpoint_files(
                setup, options, step, history, lambda path: save_weights(model, path),
                lambda path: safetensors.numpy.save_file(tensors, str(path)), {"variables": len(tensors)},
            ),
        )  # fmt: skip

    interrupted = False
    with Interrupt() as interrupt:

        class Watch(keras.callbacks.Callback):
            done = 0

            def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
                self.done = batch + 1
                progress.update(1)
                progress.set_postfix(loss=f"{(logs or {}).get('loss', float('nan')):.4f}", refresh=False)
                if interrupt.requested or (deadline is not None and time.monotonic() >= deadline):
                    self.model.stop_training = True

        while step < total and not interrupted:
            if deadline is not None and time.monotonic() >= deadline:
                break
            count = min(options.checkpoint_every - step % options.checkpoint_every, total - step)
            watch = Watch()
            fitted = model.fit(Batches(step, count), epochs=1, verbose=0, callbacks=[watch], shuffle=False)
            previous, step = step, step + watch.done
            # fit reports the mean loss over the chunk's batches
            history["losses"].append([step, float(fitted.history["loss"][-1])])
            interrupted = interrupt.requested
            if step // options.eval_every > previous // options.eval_every:
                accuracy = exact_match(generate, setup, setup.dataset.heldout[: options.eval_examples])
                history["evals"].append([step, accuracy])
                progress.write(f"step {step}: loss {history['losses'][-1][1]:.4f}, held-out exact match {accuracy:.3f}")
            save()
    progress.close()
    if step == 0 or (history["losses"] and history["losses"][-1][0] != step) or not history["losses"]:
        save()
    accuracy = None if interrupted else exact_match(generate, setup, setup.dataset.heldout)
    losses = [tuple(x) for x in history["losses"]]
    return Result(step, accuracy, len(setup.dataset.heldout), interrupted, losses, model)
