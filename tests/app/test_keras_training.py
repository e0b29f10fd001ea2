"""``--framework keras``: the same pipeline as PyTorch on a corpus and on a task
with batches of several lengths, into the same run format, translated by the same translator; and no framework
chatter on stderr. Marked ``keras``: `make test` runs these on every Keras backend (KERAS_BACKEND)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import multihead.app.training as training
from app.support import (
    CORPUS_FLAGS,
    SAMPLES,
    SMALL,
    TRAIN,
    VALID,
    Cli,
    assert_refused,
    no_evaluation,
    subprocess_env,
    write_corpus,
    write_lines,
)
from multihead.app.runs import latest_checkpoint
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator

pytestmark = pytest.mark.keras

TINY = dict(batch_size=16, eval_every=1000, warmup=5, **SMALL)


def test_keras_trains_a_corpus_and_translates_with_the_same_pipeline(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    data, valid = write_corpus(tmp_path / "corpus"), write_corpus(tmp_path / "corpus", VALID, "valid")
    out = tmp_path / "run"
    flags = [*CORPUS_FLAGS, "--eval-every", "4", "--checkpoint-every", "2", "--keep", "3", "--average", "2"]
    result = cli("train", "--framework", "keras", "--data", *data, "--valid", *valid, "--out", out, *flags,
                 "--steps", "4")  # fmt: skip
    assert result.status == 0, result.err
    assert "bleu: " in result.out
    checkpoint = latest_checkpoint(out)
    trainer = json.loads((checkpoint / "trainer.json").read_text(encoding="utf-8"))
    assert (trainer["framework"], trainer["step"]) == ("keras", 4)
    assert (checkpoint / "subwords.json").is_file()
    assert json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))["tie_embeddings"] is True
    history = json.loads((out / "history.json").read_text(encoding="utf-8"))
    assert [e["step"] for e in history["evals"] if "checkpoint" not in e] == [4]
    assert all(np.isfinite(e["valid_loss"]) for e in history["evals"])
    assert (out / "checkpoints" / "average" / "model.safetensors").is_file()
    # The same translator, whatever trained it; the same commands.
    translated = cli("translate", out, *SAMPLES)
    assert translated.status == 0, translated.err
    assert translated.out_lines == Translator(out).translate(SAMPLES)
    src, ref = write_lines(tmp_path / "test.de", SAMPLES), write_lines(tmp_path / "test.en", SAMPLES)
    assert cli("evaluate", out, src, ref).json()["sentences"] == len(SAMPLES)
    # Resumed, with the same corpus.
    resumed = cli("train", "--resume", "--out", out, "--data", *data, "--valid", *valid, "--steps", "5",
                  "--average", "0", "--no-progress")  # fmt: skip
    assert resumed.status == 0, resumed.err
    trainer = json.loads((latest_checkpoint(out) / "trainer.json").read_text(encoding="utf-8"))
    assert (trainer["framework"], trainer["step"]) == ("keras", 5)
    assert [step for step, _ in trainer["losses"]] == list(range(1, 6))


def test_a_keras_run_is_served_and_translated_on_keras_as_pytorch_translates_it(tmp_path: Path) -> None:
    """``--framework keras`` decodes a run in Keras: ``serve`` (its stream's rows, a sentence's attention, an
    ensemble), the command too, and ``translate``, all giving what PyTorch gives; PyTorch's inference forms
    (``--quantize``) are refused there in one line. (The commands run in subprocesses: TensorFlow's logging, once it
    writes to a stream the tests capture, would close pytest's own.)"""
    from app.served import request, serving, start
    from multihead.app.serve import Limits, Service, create_app
    from multihead.app.view import attention_view
    from multihead.keras.streaming import StreamRows

    data = write_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    train(TrainOptions(out=str(out), data=data, framework="keras", steps=60, eval_every=1000, batch_tokens=200,
                       lr=1e-2, warmup=10, dropout=0.0, vocab_size=120, **SMALL))  # fmt: skip
    served, pytorch = Translator(out, framework="keras"), Translator(out)
    assert (served.loaded.front.name, pytorch.loaded.front.name) == ("keras", "torch")
    assert isinstance(served.stream_rows(), StreamRows)
    body = {"q": SAMPLES, "source": "de", "target": "en"}

    def translated(url: str) -> list[str]:  # (the guard's "doubtful" field aside)
        # Keras' first steps on JAX compile each shape the stream meets: more than 30 s on a busy 2-core machine.
        status, answer = request(url, "/translate", body, timeout=300)
        assert status == 200, answer
        return answer["translatedText"]

    with serving(create_app(Service(served, served.langs), Limits())) as url:
        assert translated(url) == pytorch.translate(SAMPLES)
        status, view = request(url, "/attention", {"q": SAMPLES[0]})
    assert status == 200
    expected = attention_view(pytorch.attention(SAMPLES[0]))
    assert (view["target"], view["target_words"]) == (expected["target"], expected["target_words"])
    # The weights are rounded to 4 decimals.
    np.testing.assert_allclose(np.array(view["layers"]), np.array(expected["layers"]), atol=2e-4)
    pair = Translator(out, ensemble=[out], framework="keras")
    with serving(create_app(Service(pair, pair.langs), Limits())) as url:
        assert translated(url) == Translator(out, ensemble=[out]).translate(SAMPLES)
    command = [sys.executable, "-m", "multihead", "translate", str(out), "--framework", "keras"]
    here = subprocess.run([*command, *SAMPLES], capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert here.returncode == 0, here.stderr
    assert here.stdout.splitlines() == pytorch.translate(SAMPLES)
    refused = subprocess.run([*command, "--quantize", "int8", "Hallo"], capture_output=True, text=True, timeout=300,
                             env=subprocess_env())  # fmt: skip
    assert_refused(Cli(refused.returncode, refused.stdout, refused.stderr),
                   "--quantize int8 is PyTorch's (its inference forms): not with --framework keras")  # fmt: skip
    process, url, _ = start(out, "--framework", "keras")
    try:
        assert translated(url) == pytorch.translate(SAMPLES)
    finally:
        process.terminate()
        process.communicate(timeout=60)


def test_keras_trains_dates_on_batches_of_several_lengths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multihead.app.train_keras import LENGTH_MULTIPLE, KerasTrainer

    shapes: list[tuple[int, int]] = []
    trainers: set[KerasTrainer] = set()
    original = KerasTrainer.train_step

    def spy(self: KerasTrainer, batches: Any, lr: float, tokens: int) -> float:
        (batch,) = batches
        shapes.append((batch.src.shape[1], batch.tgt_in.shape[1]))
        trainers.add(self)
        return original(self, batches, lr, tokens)

    monkeypatch.setattr(KerasTrainer, "train_step", spy)
    monkeypatch.setattr(training.Training, "evaluate", no_evaluation)
    result = train(TrainOptions(out=str(tmp_path / "run"), task="dates", framework="keras", steps=8,
                                checkpoint_every=4, **{**TINY, "batch_size": 4}))  # fmt: skip
    assert result.step == 8
    assert len({source for source, _ in shapes}) > 1, shapes  # sources of different padded lengths
    assert all(np.isfinite(loss) for _, loss in result.losses)
    (trainer,) = trainers
    if keras.backend.backend() == "tensorflow":  # one trace serves every shape
        assert trainer.traced_step.experimental_get_tracing_count() == 1
    if keras.backend.backend() == "jax":  # XLA compiles per shape: lengths come in multiples of 8
        assert all(length % LENGTH_MULTIPLE == 0 for shape in shapes for length in shape), shapes
    assert len(Translator(tmp_path / "run").translate(["21 November 2026", "Tue Mar 9 2021"])) == 2


def test_keras_framework_writes_the_same_run_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(From test_train.py, so that it runs on every Keras backend; the held-out evaluation is left out, as the
    corpus test above evaluates with Keras.)"""
    monkeypatch.setattr(training.Training, "evaluate", no_evaluation)

    def tiny(out: Path, **overrides: Any) -> TrainOptions:
        return TrainOptions(out=str(out), **{"task": "reverse", "steps": 6, "checkpoint_every": 3, **TINY, **overrides})

    result = train(tiny(tmp_path / "run", framework="keras", steps=4, checkpoint_every=2))
    assert result.step == 4
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint.name == "step-0000004"
    assert json.loads((checkpoint / "trainer.json").read_text())["framework"] == "keras"
    resumed = train(tiny(tmp_path / "run", framework="keras", steps=6, checkpoint_every=2, resume=True))
    assert resumed.step == 6
    assert isinstance(Translator(tmp_path / "run").translate(["abc"])[0], str)


def test_a_keras_run_prints_no_framework_chatter(tmp_path: Path) -> None:
    """The real entry point, on this Keras backend, with the user's environment as it comes: no
    TF_CPP_MIN_LOG_LEVEL set, so TensorFlow's absl/oneDNN/cpu-feature INFO lines would show if not kept quiet."""
    env = subprocess_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("JAX_ENABLE_X64", None)  # set by tests/conftest.py for the float64 comparisons, not by users
    env["KERAS_BACKEND"] = os.environ.get("KERAS_BACKEND", "tensorflow")
    data, valid = write_corpus(tmp_path / "corpus", TRAIN[:20]), write_corpus(tmp_path / "corpus", VALID[:2], "valid")
    command = [sys.executable, "-m", "multihead", "train", "--framework", "keras", "--data", *data, "--valid", *valid,
               "--out", str(tmp_path / "run"), "--steps", "1", "--average", "0", *CORPUS_FLAGS]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert "bleu: " in result.stdout


def test_each_step_reports_its_own_loss(tmp_path: Path) -> None:
    """The loss a Keras step returns is that batch's token loss before the update, not a mean over the steps so
    far (Keras' loss tracker accumulates across calls unless it is reset)."""
    from multihead.app.batching import make_batch
    from multihead.app.options import recipe_options
    from multihead.app.tokenizers import PAD, Specials
    from multihead.app.train_keras import KerasTrainer, token_loss
    from multihead.config import TransformerConfig
    from multihead.decoding import Generation

    config = TransformerConfig(12, 12, 16, 2, 1, 1, 32, 0.0, "relu", False, 16, 0, False)
    options = dict(seed=0, lr=1e-2, clip=0.0, label_smoothing=0.0, precision="fp32", tokenizer="char")
    trainer = KerasTrainer(config, recipe_options("task", **options), None, Generation())
    rng = np.random.default_rng(0)
    for length in (5, 7, 6):
        batch = make_batch(
            rng.integers(4, 12, (3, length)).tolist(), rng.integers(4, 12, (3, length - 2)).tolist(), Specials()
        )
        logits = trainer.model((batch.src.astype("int32"), batch.tgt_in.astype("int32")), training=False)
        expected = float(keras.ops.convert_to_numpy(token_loss(0.0, PAD)(batch.tgt_out, logits)))
        assert trainer.train_step([batch], 1e-2, batch.target_tokens) == pytest.approx(expected, rel=1e-5)
