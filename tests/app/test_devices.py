"""Where a run trains and translates, in what precision, and how a step's batches add up: ``--device``,
``--precision``, ``--compile``, ``--accumulate``, the GPU recipe (multihead.app.devices, options, training).

CUDA is simulated where only the choice matters (``torch.cuda`` patched); the ``cuda``-marked tests at the end run
the command line on a real CUDA device and are skipped where PyTorch sees none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import multihead.app.training as training
from app.support import (
    CORPUS_FLAGS,
    SAMPLES,
    SMALL_FLAGS,
    VALID,
    Cli,
    assert_refused,
    snapshot,
    subprocess_env,
    tiny,
    torch_trainer,
    write_corpus,
)
from multihead import cpu
from multihead.app.batching import make_batch
from multihead.app.console import UserError
from multihead.app.devices import resolve_device, resolve_precision
from multihead.app.options import RECIPES
from multihead.app.runs import latest_checkpoint
from multihead.app.tokenizers import Specials
from multihead.app.train_torch import TokenLoss
from multihead.app.training import Training, TrainOptions, new_setup, train
from multihead.app.translate import Translator

TASK = ["--task", "reverse", *SMALL_FLAGS, "--batch-size", "16", "--eval-every", "1000"]


def trainer_json(run: Path) -> dict:
    return json.loads((latest_checkpoint(run) / "trainer.json").read_text())


def cuda_machine(monkeypatch: pytest.MonkeyPatch, count: int, *, bf16: bool = True) -> None:
    """``torch.cuda`` as on a machine with ``count`` CUDA devices (where only the choice of device matters)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)


def batch() -> object:
    return make_batch([[4, 5, 6, 7, 8], [9, 10], [4, 11, 6]], [[5, 6, 7], [8], [9, 10, 11, 4]], Specials())


# --- choosing the device and the precision -------------------------------------------------------------------


def test_auto_takes_the_first_cuda_device_and_torchrun_ranks_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_machine(monkeypatch, 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert (resolve_device("auto"), resolve_device("cuda"), resolve_device("cuda:1")) == ("cuda:0", "cuda:0", "cuda:1")
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert (resolve_device("auto"), resolve_device("cuda")) == ("cuda:1", "cuda:1")
    with pytest.raises(UserError, match=r"--device cuda:2: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")
    cuda_machine(monkeypatch, 0)
    assert resolve_device("auto") == "cpu"


def cpu_kind(monkeypatch: pytest.MonkeyPatch, vendor: str, family: int, flags: str) -> None:
    monkeypatch.setattr(cpu, "vendor", lambda: vendor)
    monkeypatch.setattr(cpu, "family", lambda: family)
    monkeypatch.setattr(cpu, "flags", lambda: frozenset(flags.split()))


def test_auto_precision_is_bf16_where_it_was_measured_faster_and_fp32_elsewhere(monkeypatch: pytest.MonkeyPatch):
    """bf16 on a GPU that has it; on the CPU, for models as wide as the corpus recipe's on AMD's Zen 5 with
    AVX512-BF16 and on CPUs with AMX; fp32 on other CPUs (an Intel Xeon with AVX512-BF16 and no AMX was slower) and
    for narrower models."""
    cuda_machine(monkeypatch, 1)
    assert resolve_precision("auto", "cuda:0", 128).name == "bf16"
    for vendor, family, flags in [("AuthenticAMD", 26, "avx2 avx512f avx512_bf16"),
                                  ("GenuineIntel", 6, "avx512f avx512_bf16 amx_tile amx_bf16 amx_int8")]:  # fmt: skip
        cpu_kind(monkeypatch, vendor, family, flags)
        assert resolve_precision("auto", "cpu", 256).name == "bf16", (vendor, family, flags)
        assert resolve_precision("auto", "cpu", 128).name == "fp32"  # a built-in task's model
    assert resolve_precision("fp32", "cpu", 512).name == "fp32"
    for vendor, family, flags in [("GenuineIntel", 6, "avx512f avx512_bf16"), ("AuthenticAMD", 25, "avx512_bf16"),
                                  ("AuthenticAMD", 26, "avx2 avx512f"), ("", 0, "")]:  # fmt: skip
        cpu_kind(monkeypatch, vendor, family, flags)
        assert resolve_precision("auto", "cpu", 512).name == "fp32", (vendor, family, flags)
    assert resolve_precision("bf16", "cpu", 128).autocast == "bfloat16"
    assert resolve_precision("fp16", "cpu", 128).scaled
    assert not resolve_precision("bf16", "cuda:0", 128).scaled
    cuda_machine(monkeypatch, 1, bf16=False)
    assert resolve_precision("auto", "cuda:0", 512).name == "fp32"


@pytest.mark.parametrize("command", ["train", "translate", "evaluate", "demo"])
def test_cuda_without_cuda_is_refused_before_anything_is_written(
    command: str, cli: Callable[..., Cli], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task_run: Path
) -> None:
    cuda_machine(monkeypatch, 0)
    before = snapshot(task_run)
    src = tmp_path / "src.txt"
    src.write_text("abc\n")
    arguments = {
        "train": ["train", *TASK, "--out", tmp_path / "run", "--steps", "2"],
        "translate": ["translate", task_run, "abc"],
        "evaluate": ["evaluate", task_run, src, src],
        "demo": ["demo", "--out", tmp_path / "run"],
    }[command]
    assert_refused(cli(*arguments, "--device", "cuda"), "--device cuda: PyTorch sees no CUDA device", "--device cpu")
    assert not (tmp_path / "run").exists()
    assert snapshot(task_run) == before


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"])
def test_a_device_of_another_form_is_named(value: str, cli: Callable[..., Cli], tmp_path: Path) -> None:
    result = cli("train", *TASK, "--out", tmp_path / "run", "--steps", "2", "--device", value)
    assert_refused(result, "--device", "auto, cpu, cuda or cuda:N", repr(value))


def test_device_cpu_trains_and_translates_there_and_the_run_records_it(
    cli: Callable[..., Cli], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda_machine(monkeypatch, 1)  # a GPU the user chose not to use
    assert cli("train", *TASK, "--out", tmp_path / "run", "--steps", "3", "--device", "cpu").status == 0
    process = trainer_json(tmp_path / "run")["process"]
    assert (process["device"], process["precision"], process["world_size"]) == ("cpu", "fp32", 1)
    assert json.loads((tmp_path / "run" / "history.json").read_text())["device"] == "cpu"
    translated = cli("translate", tmp_path / "run", "abc", "--device", "cpu")
    assert translated.status == 0
    assert len(translated.out_lines) == 1


def test_a_run_resumes_on_this_machines_device_whatever_it_trained_on(cli: Callable[..., Cli], tmp_path: Path) -> None:
    assert cli("train", *TASK, "--out", tmp_path / "run", "--steps", "2").status == 0
    record_path = latest_checkpoint(tmp_path / "run") / "trainer.json"
    record = json.loads(record_path.read_text())
    record["options"]["device"] = record["process"]["device"] = "cuda:1"  # as if trained on a GPU machine's cuda:1
    record_path.write_text(json.dumps(record))
    resumed = cli("train", "--out", tmp_path / "run", "--resume", "--steps", "3", "--no-progress")
    assert resumed.status == 0, resumed.err
    assert trainer_json(tmp_path / "run")["process"]["device"] == "cpu"
    assert trainer_json(tmp_path / "run")["options"]["device"] == "auto"


def test_a_gpu_takes_the_gpu_recipe_for_a_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data, valid = write_corpus(tmp_path / "corpus"), write_corpus(tmp_path / "corpus", VALID, "valid")
    options = dict(data=data, valid=valid, out=str(tmp_path / "run"), steps=1)
    assert new_setup(TrainOptions(**options), tmp_path / "run").options.d_model == RECIPES["corpus"]["d_model"]
    monkeypatch.setattr(training, "resolve_device", lambda name: "cpu" if name == "cpu" else "cuda:0")
    setup = new_setup(TrainOptions(**options), tmp_path / "run")
    gpu = RECIPES["corpus-gpu"]
    assert {name: getattr(setup.options, name) for name in gpu} == gpu
    assert (gpu["d_model"], gpu["num_heads"], gpu["layers"], gpu["d_ff"]) == (512, 8, 6, 2048)  # the paper's base
    assert setup.config.d_model == 512
    assert setup.config.num_encoder_layers == 6
    given = new_setup(
        TrainOptions(**options, d_model=64, num_heads=4), tmp_path / "run"
    ).options  # what is given still wins
    assert (given.d_model, given.num_heads, given.layers) == (64, 4, 6)
    assert (
        new_setup(TrainOptions(**options, device="cpu"), tmp_path / "run").options.d_model
        == RECIPES["corpus"]["d_model"]
    )


# --- precision -----------------------------------------------------------------------------------------------


def test_bf16_on_the_cpu_is_finite_close_to_fp32_and_keeps_float32_weights() -> None:
    losses = {}
    for precision in ("fp32", "bf16"):
        trainer = torch_trainer(precision=precision)
        losses[precision] = float(trainer.train_step([batch()], 1e-2, batch().target_tokens))
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
        state = trainer.optimizer.state_dict()["state"]
        assert all(v.dtype == torch.float32 for s in state.values() for k, v in s.items() if k != "step")
    assert torch.isfinite(torch.tensor(losses["bf16"]))
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    assert losses["bf16"] != losses["fp32"]  # it did compute in bf16


def test_fp16_skips_a_step_that_overflows_and_counts_it() -> None:
    trainer = torch_trainer(precision="fp16")
    scaler = trainer.scaler.state_dict()
    trainer.scaler.load_state_dict({**scaler, "scale": 3e38})  # the scaled loss overflows float32
    before = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    trainer.train_step([batch()], 1e-2, batch().target_tokens)
    assert trainer.facts()["skipped_steps"] == 1
    assert all(torch.equal(value, trainer.model.state_dict()[name]) for name, value in before.items())
    assert trainer.scaler.get_scale() == pytest.approx(1.5e38)  # backed off
    loss = trainer.train_step([batch()], 1e-2, batch().target_tokens)  # 1.5e38 still overflows; then it fits
    for _ in range(200):
        if trainer.scaler.get_scale() < 1e5:
            break
        loss = trainer.train_step([batch()], 1e-2, batch().target_tokens)
    assert torch.isfinite(loss)
    skipped = trainer.facts()["skipped_steps"]
    trainer.train_step([batch()], 1e-2, batch().target_tokens)
    assert trainer.facts()["skipped_steps"] == skipped  # a step that fits is not skipped
    assert not all(torch.equal(value, trainer.model.state_dict()[name]) for name, value in before.items())


def test_fp16_keeps_its_loss_scale_in_the_checkpoint_and_resumes_it(tmp_path: Path, fast_evaluation: None) -> None:
    train(tiny(tmp_path / "run", precision="fp16", steps=4))
    record = trainer_json(tmp_path / "run")
    scale = record["optimizer"]["scaler"]["scale"]
    assert record["process"]["precision"] == "fp16"
    assert "skipped_steps" in record["process"]
    resumed = Training(TrainOptions(out=str(tmp_path / "run"), resume=True, steps=6, progress=False))
    try:
        resumed.build()
        assert resumed.trainer.scaler.get_scale() == scale
        assert resumed.trainer.skipped == record["process"]["skipped_steps"]
    finally:
        resumed.lock.release()


def test_a_precision_keras_does_not_have_is_refused(cli: Callable[..., Cli], tmp_path: Path) -> None:
    for flags in (["--precision", "bf16"], ["--compile"]):
        result = cli("train", *TASK, "--out", tmp_path / "run", "--steps", "2", "--framework", "keras", *flags)
        assert_refused(result, flags[0], "applies to --framework torch")
    assert not (tmp_path / "run").exists()


# --- the step: compiled, out of memory, accumulated ----------------------------------------------------------


def test_the_compiled_forward_pass_has_no_graph_breaks() -> None:
    """What ``--compile`` compiles (the loss through the model's unchecked path) is one graph: no host
    synchronisation, no Python fallback inside the step."""
    trainer = torch_trainer()
    src, tgt_in, tgt_out = (torch.from_numpy(a) for a in batch().as_arrays())
    explanation = torch._dynamo.explain(TokenLoss(trainer.model, sliced=False))(src, tgt_in, tgt_out, 0.1)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


def test_out_of_memory_names_batch_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = torch_trainer()

    def out_of_memory(*args: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "engine", out_of_memory)
    with pytest.raises(UserError, match=r"out of memory on cpu .*lower --batch-tokens .*raise --accumulate"):
        trainer.train_step([batch()], 1e-2, batch().target_tokens)


def test_resuming_with_another_batch_per_step_is_named(
    cli: Callable[..., Cli], tmp_path: Path, fast_evaluation: None
) -> None:
    assert cli("train", *TASK, "--out", tmp_path / "run", "--steps", "2").status == 0
    kept = cli("train", "--out", tmp_path / "run", "--resume", "--steps", "3", "--no-progress")
    assert kept.status == 0
    assert "batches" not in kept.err
    changed = cli("train", "--out", tmp_path / "run", "--resume", "--steps", "4", "--accumulate", "2", "--no-progress")
    assert changed.status == 0
    assert "a step now takes 2 batches (world size 1 × --accumulate 2), where it took 1" in changed.err
    assert trainer_json(tmp_path / "run")["options"]["accumulate"] == 2


def test_keras_on_jax_trains_data_parallel_over_every_device(tmp_path: Path) -> None:
    """Two JAX devices (CPU devices made by XLA_FLAGS here; GPUs alike) split each batch: the run records them, and
    its losses are those of one device."""
    losses = {}
    for devices in (1, 2):
        out = tmp_path / f"run{devices}"
        env = subprocess_env(KERAS_BACKEND="jax", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
        command = [sys.executable, "-m", "multihead", "train", "--framework", "keras", *TASK, "--out", str(out),
                   "--steps", "3", "--warmup", "5"]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert trainer_json(out)["process"]["devices"] == devices
        losses[devices] = [loss for _, loss in json.loads((out / "history.json").read_text())["losses"]]
    assert losses[2] == pytest.approx(losses[1], rel=1e-5)


# --- on a CUDA device ----------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")
def test_a_run_trains_translates_and_evaluates_on_cuda_and_translates_on_the_cpu(
    cli: Callable[..., Cli], tmp_path: Path
) -> None:
    data, valid = write_corpus(tmp_path / "corpus"), write_corpus(tmp_path / "corpus", VALID, "valid")
    flags = [*CORPUS_FLAGS, "--steps", "60", "--eval-every", "30", "--checkpoint-every", "30", "--average", "0"]
    result = cli("train", "--data", *data, "--valid", *valid, "--out", tmp_path / "run", *flags, "--device", "cuda")
    assert result.status == 0, result.err
    process = trainer_json(tmp_path / "run")["process"]
    assert process["device"] == "cuda:0"
    assert process["precision"] in ("bf16", "fp32")
    on_gpu = Translator(tmp_path / "run", device="cuda").translate(SAMPLES)
    on_cpu = Translator(tmp_path / "run", device="cpu").translate(SAMPLES)
    assert on_gpu == on_cpu
    evaluated = cli("evaluate", tmp_path / "run", *valid, "--device", "cuda")
    assert evaluated.status == 0
    assert evaluated.json()["sentences"] == len(VALID)
    resumed = cli("train", "--out", tmp_path / "run", "--resume", "--steps", "70", "--device", "cpu", "--no-progress",
                  "--data", *data, "--valid", *valid)  # fmt: skip
    assert resumed.status == 0, resumed.err
    assert trainer_json(tmp_path / "run")["process"]["device"] == "cpu"
