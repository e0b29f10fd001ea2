"""Training: like the paper for a corpus (batches by token count bucketed by length, label smoothing, the warm-up
schedule, gradient clipping, validation loss and BLEU every N steps, a ``best`` checkpoint kept beside ``latest``,
early stopping, checkpoint averaging, the run's history; and the defaults for ``--data`` are the recipe."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy
import torch
import torch.nn.functional as F

import multihead.app.data as data_module
import multihead.app.train_torch as train_torch
import multihead.app.training as training
from app.support import (
    SMALL,
    TINY,
    TRAIN,
    VALID,
    Cli,
    CorpusRun,
    no_evaluation,
    run_ranks,
    tiny,
    torch_trainer,
    write_corpus,
)
from multihead.app.batching import CorpusBatches, join_batches, make_batch
from multihead.app.console import UserError
from multihead.app.encoded import EncodedCorpus
from multihead.app.options import RunOptions
from multihead.app.runs import latest_checkpoint, read_log
from multihead.app.schedule import learning_rate
from multihead.app.tokenizers import PAD, Specials
from multihead.app.train_torch import TokenLoss, TorchTrainer
from multihead.app.training import RECIPES, Training, TrainOptions, train
from multihead.app.translate import Translator
from multihead.io import save_weights


def corpus_options(tmp_path: Path, **overrides: Any) -> TrainOptions:
    data = write_corpus(tmp_path / "corpus")
    valid = write_corpus(tmp_path / "corpus", VALID, "valid")
    base = dict(vocab_size=120, batch_tokens=120, steps=12, warmup=4, lr=1e-2, average=0, dropout=0.0, **SMALL)
    return TrainOptions(out=str(tmp_path / "run"), data=data, valid=valid, **{**base, **overrides})


@pytest.fixture
def steps_seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every training step of the torch trainer: its batch, learning rate, and the rate the optimizer then had."""
    seen: list[dict[str, Any]] = []
    original = TorchTrainer.train_step

    def spy(self: TorchTrainer, batches: Any, lr: float, tokens: int) -> Any:
        loss = original(self, batches, lr, tokens)
        (batch,) = batches
        seen.append({"batch": batch, "lr": lr, "optimizer_lr": self.optimizer.param_groups[0]["lr"]})
        return loss

    monkeypatch.setattr(TorchTrainer, "train_step", spy)
    return seen


@pytest.mark.usefixtures("fast_evaluation")
def test_batches_hold_at_most_batch_tokens_padded_tokens_in_few_lengths(
    tmp_path: Path, steps_seen: list[dict[str, Any]]
) -> None:
    train(corpus_options(tmp_path, batch_tokens=120, steps=24))
    assert len(steps_seen) == 24
    lengths = set()
    for step in steps_seen:
        batch = step["batch"]
        assert batch.src.size <= 120, batch.src.shape  # rows × padded source length
        assert batch.tgt_in.size <= 120, batch.tgt_in.shape  # rows × padded target length (with BOS/EOS)
        real = (batch.tgt_out != PAD).sum(1)
        # bucketed by length: the rows of a batch are of similar length, so little of it is padding
        assert real.max() - real.min() <= 3, real
        lengths.add(batch.tgt_in.shape[1])
    assert len(lengths) > 1  # batches of different lengths, each as full as the budget allows
    assert {len(step["batch"].src) for step in steps_seen} != {1}


def test_every_pair_is_trained_on_once_per_epoch_in_a_new_order() -> None:
    rng = np.random.default_rng(0)
    sources = [list(range(4, 4 + rng.integers(1, 30))) for _ in range(300)]
    targets = [list(range(4, 4 + rng.integers(1, 30))) for _ in range(300)]
    corpus = EncodedCorpus.of(sources, targets)
    batches = CorpusBatches(corpus, Specials(), 200, seed=0)
    epochs, step = [], 0
    for _ in range(2):
        epoch = []
        while batches.epoch_of(step) < len(epochs) + 1:
            epoch.append(batches.rows(step))
            step += 1
        epochs.append(epoch)
    for epoch in epochs:
        assert sorted(i for rows in epoch for i in rows) == list(range(300))
    assert epochs[0] != epochs[1]
    again = CorpusBatches(corpus, Specials(), 200, seed=0)  # what a resumed run replays
    assert [again.rows(s) for s in range(step - 1, -1, -1)][::-1] == [rows for epoch in epochs for rows in epoch]


@pytest.mark.usefixtures("fast_evaluation")
def test_learning_rate_follows_the_warm_up_and_inverse_square_root_schedule(
    tmp_path: Path, steps_seen: list[dict[str, Any]]
) -> None:
    train(corpus_options(tmp_path, steps=12, warmup=4, lr=2e-3))
    expected = [learning_rate(step, peak=2e-3, warmup=4) for step in range(1, 13)]
    assert [step["lr"] for step in steps_seen] == pytest.approx(expected)
    assert [step["optimizer_lr"] for step in steps_seen] == pytest.approx(expected)
    assert max(expected) == pytest.approx(2e-3)


@pytest.mark.usefixtures("fast_evaluation")
@pytest.mark.parametrize("clip", [0.05, 0.0])
def test_gradients_are_clipped_by_their_global_norm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clip: float):
    norms: list[tuple[float, float]] = []
    original = torch.nn.utils.clip_grad_norm_

    def spy(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        parameters = list(parameters)
        before = original(parameters, max_norm, *args, **kwargs)
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None]))
        norms.append((max_norm, float(before), float(after)))
        return before

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    train(corpus_options(tmp_path, steps=4, clip=clip))
    if not clip:
        assert norms == []
        return
    assert len(norms) == 4
    for max_norm, before, after in norms:
        assert max_norm == clip
        assert before > clip  # (a fresh model's gradients are larger than this)
        assert after == pytest.approx(clip, rel=1e-3)


def _smoothed_loss(model: torch.nn.Module, batch: Any, smoothing: float) -> float:
    logits = model(torch.from_numpy(batch.src), torch.from_numpy(batch.tgt_in))
    summed = F.cross_entropy(
        logits.flatten(0, 1), torch.from_numpy(batch.tgt_out).flatten(), ignore_index=PAD, reduction="sum",
        label_smoothing=smoothing,
    )  # fmt: skip
    return float(summed) / batch.target_tokens


@pytest.mark.parametrize(("given", "used"), [(None, 0.1), (0.0, 0.0), (0.3, 0.3)], ids=["default", "off", "0.3"])
def test_label_smoothing_defaults_to_0_1_for_a_corpus_and_reaches_the_loss(
    tmp_path: Path, given: float | None, used: float
) -> None:
    run = Training(corpus_options(tmp_path, label_smoothing=given))
    run.build()
    assert run.setup.options.label_smoothing == used
    batch = run.batches.batch(0)
    with torch.no_grad():
        expected = _smoothed_loss(run.trainer.model, batch, used)
        other = _smoothed_loss(run.trainer.model, batch, 0.2)
    loss = float(run.trainer.train_step([batch], 0.0, batch.target_tokens))  # the loss before the step
    assert loss == pytest.approx(expected, rel=1e-5)
    assert loss != pytest.approx(other, rel=1e-3)


LOSS_BATCH = (
    torch.tensor([[5, 6, 7, 8, 9], [4, 5, 6, 0, 0], [11, 10, 9, 8, 0]]),  # src (3, 5)
    torch.tensor([[1, 4, 5, 6], [1, 7, 0, 0], [1, 9, 10, 11]]),  # tgt_in (3, 4)
    torch.tensor([[4, 5, 6, 2], [7, 2, 0, 0], [9, 10, 11, 2]]),  # tgt_out, padded like tgt_in
)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")])]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("slice_rows", [1, 7, 1000])
def test_the_sliced_loss_and_its_gradients_are_the_whole_logits_cross_entropy(
    monkeypatch: pytest.MonkeyPatch, smoothing: float, slice_rows: int, device: str
) -> None:
    """ProjectedLoss against F.cross_entropy on the whole logits, float64: loss and every parameter's gradient, with
    padding targets, in slices of one row, of rows that do not divide the batch, and whole."""
    trainer = torch_trainer()
    model = trainer.model.double().to(device)
    monkeypatch.setattr(train_torch, "SLICE_ELEMENTS", slice_rows * model.config.tgt_vocab)
    src, tgt_in, tgt_out = (tensor.to(device) for tensor in LOSS_BATCH)
    results = []
    for sliced in (True, False):
        model.zero_grad()
        loss = TokenLoss(model, sliced=sliced)(src, tgt_in, tgt_out, smoothing)
        (loss * 0.37).backward()  # the gradient flowing in is applied
        results.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (loss, grads), (expected, expected_grads) = results
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("slice_rows", [1, 7, 1000])
def test_an_evaluations_sliced_loss_is_the_whole_logits_cross_entropy(
    monkeypatch: pytest.MonkeyPatch, smoothing: float, slice_rows: int
) -> None:
    """Without gradients (an evaluation), the loss takes the logits a slice of rows at a time too: the same sum as
    F.cross_entropy on the whole logits, float64, padding targets left out."""
    model = torch_trainer().model.double().eval()
    monkeypatch.setattr(train_torch, "SLICE_ELEMENTS", slice_rows * model.config.tgt_vocab)
    with torch.inference_mode():
        sliced, whole = (TokenLoss(model, sliced=flag)(*LOSS_BATCH, smoothing) for flag in (True, False))
    torch.testing.assert_close(sliced, whole, rtol=1e-12, atol=1e-12)
    assert sliced.dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
def test_the_sliced_loss_under_bf16_autocast_follows_the_whole_logits(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    trainer = torch_trainer()
    trainer.model.to(device)
    monkeypatch.setattr(train_torch, "SLICE_ELEMENTS", 5 * trainer.model.config.tgt_vocab)
    src, tgt_in, tgt_out = (tensor.to(device) for tensor in LOSS_BATCH)
    results = []
    for sliced in (True, False):
        trainer.model.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = TokenLoss(trainer.model, sliced=sliced)(src, tgt_in, tgt_out, 0.1)
        loss.backward()
        results.append((loss.detach(), torch.cat([p.grad.flatten() for p in trainer.model.parameters()])))
    (loss, grads), (expected, expected_grads) = results
    assert loss.dtype == expected.dtype == grads.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-2, atol=0.0)
    assert float((grads - expected_grads).norm()) < 0.02 * float(expected_grads.norm())  # bf16 rounds differently


def test_built_in_tasks_train_without_label_smoothing(tmp_path: Path) -> None:
    run = Training(TrainOptions(out=str(tmp_path / "run"), task="copy", steps=1, **SMALL))
    run.build()
    assert run.setup.options.label_smoothing == 0.0


def test_the_defaults_for_data_are_the_recipe(tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch):
    """``multihead train --data SRC TGT --valid SRC TGT --out RUN --minutes 30`` and nothing else."""
    built: list[tuple[Any, dict[str, Any]]] = []

    def capture(framework: str, config: Any, options: RunOptions, checkpoint: Any, *rest: Any) -> None:
        built.append((config, options))
        raise KeyboardInterrupt  # stop before training

    monkeypatch.setattr(training, "make_trainer", capture)
    data, valid = write_corpus(tmp_path / "corpus"), write_corpus(tmp_path / "corpus", VALID, "valid")
    result = cli("train", "--data", *data, "--valid", *valid, "--out", tmp_path / "run", "--minutes", "30")
    assert result.status == 130
    ((config, options),) = built
    recipe = RECIPES["corpus"]
    assert {name: getattr(options, name) for name in recipe} == recipe
    assert (recipe["tokenizer"], recipe["joint"], recipe["vocab_size"]) == ("subword", True, 8000)
    assert (recipe["d_model"], recipe["layers"], recipe["dropout"], recipe["label_smoothing"]) == (256, 3, 0.1, 0.1)
    assert recipe["batch_tokens"] == 4096
    assert recipe["batch_size"] is None
    assert (config.d_model, config.num_encoder_layers, config.d_ff, config.tie_embeddings) == (256, 3, 1024, True)
    assert options.minutes == 30.0


# --- evaluation, best, early stopping, averaging, history -------------------------------------------------


def test_validation_loss_and_bleu_every_n_steps_into_the_history(corpus_run: CorpusRun) -> None:
    history = json.loads((corpus_run.path / "history.json").read_text(encoding="utf-8"))
    assert history["metric"] == "bleu"
    assert history["label_smoothing"] == 0.1  # the corpus recipe's: history.png names it
    assert [step for step, _ in history["losses"]] == list(range(1, 121))
    steps = [evaluation for evaluation in history["evals"] if "checkpoint" not in evaluation]
    assert [evaluation["step"] for evaluation in steps] == [30, 60, 90, 120]  # --eval-every 30
    for evaluation in history["evals"]:
        assert evaluation["examples"] == len(VALID)  # the whole --valid set
        assert evaluation["valid_loss"] > 0
        assert 0 <= evaluation["bleu"] <= 100
        assert 0 <= evaluation["chrf"] <= 100
        assert evaluation["signature"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert steps[-1]["valid_loss"] < steps[0]["valid_loss"]  # it learned
    assert max(e["bleu"] for e in steps) > 5
    assert (corpus_run.path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_averaging_the_last_checkpoints(corpus_run: CorpusRun) -> None:
    """``--average 2`` writes ``checkpoints/average``: the mean of the last two checkpoints' weights, evaluated."""
    checkpoints = corpus_run.path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["average", "step-0000090", "step-0000120"]  # --keep 2
    last = [safetensors.numpy.load_file(checkpoints / f"step-{step:07d}" / "model.safetensors") for step in (90, 120)]
    averaged = safetensors.numpy.load_file(checkpoints / "average" / "model.safetensors")
    assert averaged.keys() == last[0].keys()
    for name, value in averaged.items():
        np.testing.assert_allclose(value, (last[0][name] + last[1][name]) / 2, rtol=1e-6, atol=1e-7)
    history = json.loads((corpus_run.path / "history.json").read_text(encoding="utf-8"))
    assert [e["checkpoint"] for e in history["evals"] if "checkpoint" in e] == ["average"]
    assert not (checkpoints / "average" / "optimizer.safetensors").exists()  # nothing to resume from there


def _bleu_by_step(scores: dict[int, float]) -> Callable[[Training, int | None], dict[str, Any]]:
    """A stand-in for ``Training.evaluate`` whose BLEU at step s is ``scores[s]`` (0 where not given)."""

    def evaluate(self: Training, count: int | None) -> dict[str, Any]:
        bleu = scores.get(self.step_count, 0.0)
        return {**no_evaluation(self, count), "bleu": bleu}

    return evaluate


def test_best_is_kept_beside_latest_and_rotation_never_deletes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Callable[..., Cli]
) -> None:
    monkeypatch.setattr(Training, "evaluate", _bleu_by_step({4: 30.0, 8: 10.0, 12: 20.0, 16: 25.0}))
    result = train(corpus_options(tmp_path, steps=16, eval_every=4, checkpoint_every=2, keep=1))
    out = tmp_path / "run"
    assert (out / "best").read_text().strip() == "step-0000004"
    assert (out / "latest").read_text().strip() == "step-0000016"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000004", "step-0000016"]
    assert (result.checkpoint, result.evaluation["bleu"]) == ("step-0000004", 30.0)
    monkeypatch.undo()
    best = Translator(out, "best").translate(["der Hund läuft schnell."])
    assert Translator(out).checkpoint.path.name == "step-0000004"  # translate and evaluate use best by default
    assert Translator(out, "step-4").translate(["der Hund läuft schnell."]) == best


def test_patience_stops_training_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Training, "evaluate", _bleu_by_step({2: 10.0, 4: 12.0, 6: 11.0, 8: 12.0}))
    result = train(corpus_options(tmp_path, steps=1000, eval_every=2, checkpoint_every=100, patience=2))
    assert result.step == 8  # best at step 4, then two evaluations without improvement
    assert not result.interrupted
    assert "stopping early: no better validation bleu in 2 evaluations" in capsys.readouterr().out
    assert latest_checkpoint(tmp_path / "run").name == "step-0000008"
    assert (tmp_path / "run" / "best").read_text().strip() == "step-0000004"


def test_equal_bleu_is_ranked_by_the_lower_validation_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """BLEU 0 at every early evaluation while the validation loss falls: best follows the loss, and patience waits."""
    losses = {2: 8.0, 4: 7.0, 6: 6.0, 8: 6.5, 10: 6.8}

    def evaluate(self: Training, count: int | None) -> dict[str, Any]:
        return {**no_evaluation(self, count), "valid_loss": losses.get(self.step_count, 9.0)}

    monkeypatch.setattr(Training, "evaluate", evaluate)
    result = train(corpus_options(tmp_path, steps=1000, eval_every=2, checkpoint_every=100, patience=2))
    assert result.step == 10  # best at step 6, then two evaluations without a lower loss
    assert "stopping early: no better validation bleu in 2 evaluations" in capsys.readouterr().out
    assert (tmp_path / "run" / "best").read_text().strip() == "step-0000006"
    assert (result.checkpoint, result.evaluation["valid_loss"]) == ("step-0000006", 6.0)


@pytest.mark.usefixtures("fast_evaluation")
def test_training_pairs_longer_than_the_model_reads_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(data_module, "CORPUS_MAX_LEN", 12)
    pairs = [*TRAIN[:40], ("der Hund " * 10, "the dog " * 10)]
    options = replace(corpus_options(tmp_path, steps=1), data=write_corpus(tmp_path / "long", pairs))
    run = Training(options)
    run.build()
    assert len(run.setup.prepared.encoded) == 40
    assert "warning: --data: 1 sentence pair longer than 12 tokens is left out of training" in capsys.readouterr().err


def test_held_out_pairs_longer_than_the_model_reads_are_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluations translate their sources cut to the model's positions and leave them out of the validation loss: the
    first evaluation says how many, the next ones nothing more."""
    monkeypatch.setattr(data_module, "CORPUS_MAX_LEN", 12)
    long = [("der Hund " * 10, "the dog."), ("die Katze schläft.", "the cat " * 10)]
    valid = write_corpus(tmp_path / "valid", [*VALID[:4], *long], "valid")
    train(replace(corpus_options(tmp_path, steps=2, eval_every=1), valid=valid))
    said = [line for line in capsys.readouterr().err.splitlines() if "held-out pair" in line]
    assert said == [
        "warning: 2 held-out pairs of 6 are longer than the model reads (12 tokens a side): evaluations translate "
        "their sources cut to that, and leave them out of the validation loss"
    ]


@pytest.mark.usefixtures("fast_evaluation")
@pytest.mark.parametrize(("langs", "warned"), [(["en", "fr"], True), (["de", "en"], False), (["deu", "eng"], False)])
def test_langs_other_than_the_data_file_names_say_are_warned_of(
    langs: list[str], warned: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train.de`` and ``train.en`` say German to English: ``--langs en fr`` is likely a mistake (of ``--langs``, or of
    the files), which the run would record and a many-language model would train its language tokens on."""
    train(replace(corpus_options(tmp_path, steps=1), langs=langs))
    said = [line for line in capsys.readouterr().err.splitlines() if "file names say" in line]
    warning = (
        f"warning: --langs {' '.join(langs)} is not what the --data file names say (de → en: train.de, train.en): "
        "check which language each side is; the run records --langs"
    )
    assert said == ([warning] if warned else [])


@pytest.mark.usefixtures("fast_evaluation")
def test_the_progress_bar_shows_loss_tokens_per_second_and_time_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar is drawn as it goes, and stays
    train(corpus_options(tmp_path, steps=5, minutes=5, progress=True))
    final = capsys.readouterr().err.split("\r")[-1]
    assert re.search(r"5/5 \[\d\d:\d\d<00:00, ", final), final  # tqdm's elapsed<remaining
    assert re.search(r"loss=\d+\.\d{3}, tok/s=\d+, left=\d+:\d\d\]", final), final


# --- a short run, the options, Ctrl-C, data-parallel --------------------------------------------------------


def test_short_run_lowers_the_loss_and_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    result = train(tiny(tmp_path / "run", steps=60, checkpoint_every=30, lr=3e-3))
    first, last = np.mean([x for _, x in result.losses[:5]]), np.mean([x for _, x in result.losses[-5:]])
    assert last < 0.9 * first
    assert 0.0 <= result.evaluation["accuracy"] <= 1.0
    assert result.evaluation["examples"] == 1000
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint.name == "step-0000060"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "config.json", "generation.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json",
        "trainer.json",
    ]  # fmt: skip
    assert isinstance(Translator(tmp_path / "run").translate(["abcd"])[0], str)
    assert oct(checkpoint.stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"lr": float("nan")}, UserError, r"--lr must be a positive finite number, received nan"),
        ({"minutes": float("inf")}, UserError, r"--minutes must be a positive finite number, received inf"),
        ({"seed": -1}, UserError, r"--seed must be non-negative, received -1"),
        ({"warmup": 0}, UserError, r"--warmup must be positive, received 0"),
        ({"steps": "6"}, TypeError, r"--steps must be an int, received '6' of type str"),
    ],
    ids=["lr-nan", "minutes-inf", "seed-negative", "warmup-zero", "steps-string"],
)
def test_train_options_are_checked(tmp_path: Path, overrides: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        tiny(tmp_path / "run", **overrides)
    assert not (tmp_path / "run").exists()


def test_sigint_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "multihead", "train", "--task", "reverse", "--out", str(out), "--steps", "100000",
               "--checkpoint-every", "5", "--no-progress", "--d-model", "16", "--heads", "2", "--layers", "1",
               "--d-ff", "32", "--batch-size", "8"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while latest_checkpoint(out) is None and time.monotonic() < deadline:  # training is under way
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=max(1, deadline - time.monotonic()))
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "checkpoint saved" in stderr
    checkpoint = latest_checkpoint(out)
    step = json.loads((checkpoint / "trainer.json").read_text())["step"]
    assert step >= 5
    assert checkpoint.name == f"step-{step:07d}"
    assert f"interrupted at step {step}: checkpoint saved" in stderr  # the interrupted step itself was saved


def test_tokenizer_kind_is_checked_with_the_options(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"tokenizer.*'byte'"):
        TrainOptions(out=str(tmp_path / "run"), task="copy", steps=1, tokenizer="byte")


def _rank(rank: int, world: int, port: int, out: str, weights: list[str], accumulate: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_default_dtype(torch.float64)  # so that only the order of summation differs, at 1e-16
    options = dict(task="reverse", steps=4, checkpoint_every=4, accumulate=accumulate, **TINY)
    result = train(TrainOptions(out=out, **options))
    save_weights(result.model, weights[rank])
    torch.distributed.barrier()  # both ranks done before either tears the group down (gloo aborts a rank left behind)
    torch.distributed.destroy_process_group()


def test_two_processes_accumulating_equal_one_accumulating_twice_as_many(tmp_path: Path) -> None:
    """A step takes world size × --accumulate batches: two ranks of 2 learn what one process of 4 learns."""
    weights = [str(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    run_ranks(_rank, 2, str(tmp_path / "ddp"), weights, 2)
    torch.set_default_dtype(torch.float64)
    try:
        options = dict(task="reverse", steps=4, checkpoint_every=4, accumulate=4, **TINY)
        single = train(TrainOptions(out=str(tmp_path / "single"), **options))
    finally:
        torch.set_default_dtype(torch.float32)
    expected = {name: value.numpy() for name, value in single.model.state_dict().items()}
    ranks = [safetensors.numpy.load_file(path) for path in weights]
    for name, value in expected.items():
        assert ranks[0][name].dtype == np.float64
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
        np.testing.assert_allclose(ranks[0][name], value, atol=1e-9, rtol=0)
    assert latest_checkpoint(tmp_path / "ddp").name == "step-0000004"
    ddp, alone = (json.loads((latest_checkpoint(tmp_path / run) / "trainer.json").read_text())
                  for run in ("ddp", "single"))  # fmt: skip
    assert ddp["tokens"] == alone["tokens"]  # the same global batches
    assert ddp["process"]["world_size"] == 2


def _corpus_rank(rank: int, world: int, port: int, options: dict[str, Any]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(TrainOptions(**options))
    torch.distributed.barrier()  # both ranks done before either tears the group down (gloo aborts a rank left behind)
    torch.distributed.destroy_process_group()


def test_two_processes_train_a_corpus_from_one_encoding(tmp_path: Path) -> None:
    """Rank 0 encodes the corpus and writes the run's cache; rank 1 waits for it and maps it. Together they take the
    batches one process takes with twice the accumulation."""
    base = vars(corpus_options(tmp_path, steps=3, eval_every=1000))
    run_ranks(_corpus_rank, 2, base)
    train(TrainOptions(**{**base, "out": str(tmp_path / "single"), "accumulate": 2}))
    ddp, alone = (json.loads((latest_checkpoint(Path(out)) / "trainer.json").read_text())
                  for out in (base["out"], tmp_path / "single"))  # fmt: skip
    assert ddp["process"]["world_size"] == 2
    assert ddp["tokens"] == alone["tokens"]  # the same global batches, counted on both ranks
    assert (Path(base["out"]) / "encoded" / "manifest.json").exists()


def test_two_accumulated_batches_equal_one_batch_of_both() -> None:
    """Gradients of batches accumulated into one step equal those of one batch holding all their sentences (their
    padding masked), in float64. (Not the updated weights: Adam divides a gradient by its own size, so the keys'
    biases, whose exact gradient is zero, move by the sign of rounding noise.)"""
    rng = np.random.default_rng(0)
    first = make_batch(rng.integers(4, 12, (3, 5)).tolist(), rng.integers(4, 12, (3, 4)).tolist(), Specials())
    second = make_batch(rng.integers(4, 12, (2, 8)).tolist(), rng.integers(4, 12, (2, 7)).tolist(), Specials())
    both = join_batches([first, second])
    torch.set_default_dtype(torch.float64)
    try:
        accumulated, whole = torch_trainer(), torch_trainer()
        tokens = first.target_tokens + second.target_tokens
        loss_accumulated = accumulated.train_step([first, second], 1e-2, tokens)
        loss_whole = whole.train_step([both], 1e-2, tokens)
    finally:
        torch.set_default_dtype(torch.float32)
    assert float(loss_accumulated) == pytest.approx(float(loss_whole), rel=1e-12)
    assert accumulated.model.output_proj.weight.grad.abs().sum() > 0
    for (name, value), other in zip(accumulated.model.named_parameters(), whole.model.parameters(), strict=True):
        torch.testing.assert_close(value.grad, other.grad, atol=1e-12, rtol=0, msg=name)


# --- options that would do nothing, or not what was asked -----------------------------------------------------


def test_a_vocabulary_size_for_a_tokenizer_without_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--vocab-size sets the size of a subword vocabulary, and this run's "
                       r"tokenizer is char .*drop --vocab-size, or add --tokenizer subword"):  # fmt: skip
        train(tiny(tmp_path / "run", task="dates", vocab_size=50))
    assert not (tmp_path / "run").exists()


@pytest.mark.usefixtures("fast_evaluation")
def test_a_vocabulary_smaller_than_the_corpus_alphabet_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Training(corpus_options(tmp_path, vocab_size=10, steps=1))
    run.build()
    assert len(run.setup.source) > 10
    symbols = len(run.setup.source)
    assert (
        f"warning: --vocab-size 10 is too small for the corpus's characters: the vocabulary has {symbols} symbols"
    ) in capsys.readouterr().err.splitlines()


@pytest.mark.usefixtures("fast_evaluation")
def test_no_progress_bar_is_drawn_into_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a log file a bar is only stale lines: none is drawn when stderr is not a terminal."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    train(corpus_options(tmp_path, steps=5, minutes=5, progress=True))
    err = capsys.readouterr().err
    assert "it/s" not in err
    assert "step/s" not in err
    assert "\r" not in err
    assert "%|" not in err


STEP_LINE = re.compile(
    r"step (\d+)/(\d+): loss \d+\.\d{3}, lr \d\.\d\de-\d\d, \d+ tok/s, elapsed \d+:\d\d, left \d+:\d\d"
)


@pytest.mark.usefixtures("fast_evaluation")
def test_without_a_terminal_a_line_every_n_steps_and_train_jsonl_appended_on_resume(
    tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under nohup, Slurm or CI (stderr not a terminal: no bar) a plain line every --log-every steps on stdout, and
    the same figures in RUN/train.jsonl with every evaluation; a resumed run appends to it, past a cut line."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    out = tmp_path / "run"
    small = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--batch-size", "16"]
    first = cli("train", "--task", "reverse", "--out", out, "--steps", "7", "--log-every", "3", "--eval-every", "4",
                *small)  # fmt: skip
    assert first.status == 0, first.err
    lines = [line for line in first.out_lines if STEP_LINE.fullmatch(line)]
    assert [STEP_LINE.fullmatch(line).groups() for line in lines] == [("3", "7"), ("6", "7")], first.out
    assert "step 4: this step's training loss " in first.out  # the evaluation's line, its loss named
    log = read_log(out)
    assert [(entry["event"], entry["step"]) for entry in log] == [
        ("start", 0), ("step", 3), ("evaluation", 4), ("step", 6), ("evaluation", 7),
    ]  # fmt: skip
    assert log[0]["resumed"] is False
    for entry in log[1::2]:
        assert {"loss", "lr", "tokens_per_s", "elapsed", "seconds"} <= set(entry), entry
        assert min(entry["loss"], entry["lr"], entry["tokens_per_s"], entry["elapsed"]) > 0, entry
    assert log[2]["accuracy"] == 0.0
    assert "final" not in log[2]
    assert log[4]["final"] is True
    written = (out / "train.jsonl").read_bytes()
    with (out / "train.jsonl").open("ab") as cut:  # a process killed in the middle of a line
        cut.write(b'{"event": "step", "lo')

    resumed = cli("train", "--out", out, "--resume", "--steps", "9", "--log-every", "3")
    assert resumed.status == 0, resumed.err
    assert f"resuming {out} from step 7 of 9 (step-0000007)" in resumed.out_lines
    assert [STEP_LINE.fullmatch(line).groups() for line in resumed.out_lines if STEP_LINE.fullmatch(line)] == [
        ("9", "9")
    ]
    assert (out / "train.jsonl").read_bytes().startswith(written)
    log = read_log(out)
    assert [(entry["event"], entry["step"]) for entry in log[5:]] == [
        ("start", 7), ("evaluation", 8), ("step", 9), ("evaluation", 9),
    ]  # fmt: skip
    assert log[5]["resumed"] is True


@pytest.mark.usefixtures("fast_evaluation")
def test_a_progress_bar_leaves_the_log_lines_to_train_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar says it
    train(tiny(tmp_path / "run", progress=True, log_every=2))
    assert not [line for line in capsys.readouterr().out.splitlines() if STEP_LINE.fullmatch(line)]
    assert [entry["step"] for entry in read_log(tmp_path / "run") if entry["event"] == "step"] == [2, 4, 6]


def test_minutes_bound_the_whole_run_the_final_evaluation_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--minutes`` stops training early enough for the final evaluation (here 1000 held-out examples, 5 s), whose
    length is foreseen from the evaluations on the way (50 examples each); the data's reading counts too."""

    counts: list[int | None] = []

    def slow_evaluation(self: Training, count: int | None) -> dict:
        counts.append(count)
        time.sleep(0.005 * len(self.setup.data.evaluation_pairs(count)))
        return no_evaluation(self, count)

    monkeypatch.setattr(Training, "evaluate", slow_evaluation)
    minutes = 0.2  # 12 s
    options = tiny(tmp_path / "run", steps=None, minutes=minutes, eval_every=5, eval_examples=50, checkpoint_every=5)
    began = time.monotonic()
    result = train(options)
    took = time.monotonic() - began
    assert result.step > 0
    assert not result.interrupted
    assert (counts[0], counts[-1]) == (50, None)  # evaluations on the way, then the final one on every example
    assert took < 60 * minutes + 2.0, took  # a margin for a step, a checkpoint or a sleep longer than measured
