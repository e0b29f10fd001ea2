"""Damaged checkpoints: a truncated, corrupt, foreign or missing file in the newest checkpoint
(weights, optimizer state, ``trainer.json``, config, tokenizer) makes ``translate``, ``evaluate`` and ``--resume`` fall
back to the newest intact checkpoint, with one warning on stderr naming the damaged file; with no intact checkpoint
they refuse in one line.

``translate`` and ``evaluate`` never read the optimizer state: a damaged one does not stop them using the newest
checkpoint, and they say nothing about it (``--resume``, which needs it, falls back). They translate with
``--no-guard``: these four-step models seldom end a translation, and the guard's warnings of that are not what is
read here."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from app.support import (
    SAMPLES,
    SMALL,
    Cli,
    CorpusRun,
    assert_refused,
    damaged_run,
    snapshot,
    tiny,
    trainer_without,
    undamaged,
    write_lines,
)
from multihead.app.runs import RunError, latest_checkpoint, read_checkpoint
from multihead.app.tokenizers import SubwordTokenizer
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator
from multihead.io import save_weights
from multihead.torch import Transformer

TEXTS = ["abcd", "cab"]


pytestmark = pytest.mark.usefixtures("fast_evaluation")


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff\x13 not what it should be")


def _foreign_weights(path: Path) -> None:
    """Weights of another model (two encoder layers)."""
    other = Transformer(30, 30, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=1, d_ff=32)
    save_weights(other, path)


def _foreign_optimizer(path: Path) -> None:
    """A safetensors file that is not this optimizer's state (the model's weights)."""
    shutil.copyfile(path.parent / "model.safetensors", path)


def _foreign_trainer(path: Path) -> None:
    path.write_text(json.dumps({"format": 1, "step": 4, "framework": "torch"}), encoding="utf-8")


def _trainer_with(**changes: object) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **changes}), encoding="utf-8")

    return damage


def _foreign_tokenizer(path: Path) -> None:
    """A tokenizer of another vocabulary."""
    symbols = {"kind": "char", "symbols": ["a", "b"]}
    path.write_text(json.dumps({"source": symbols, "target": symbols, "joint": False}), encoding="utf-8")


def _foreign_config(path: Path) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, "d_ff": 48}), encoding="utf-8")


# damage: (the file, what happens to it, the file the warning names)
DAMAGES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "weights-truncated": ("model.safetensors", _cut, "model.safetensors"),
    "weights-corrupt": ("model.safetensors", _garbage, "model.safetensors"),
    "weights-foreign": ("model.safetensors", _foreign_weights, "model.safetensors"),
    "weights-missing": ("model.safetensors", Path.unlink, "model.safetensors"),
    "optimizer-truncated": ("optimizer.safetensors", _cut, "optimizer.safetensors"),
    "optimizer-corrupt": ("optimizer.safetensors", _garbage, "optimizer.safetensors"),
    "optimizer-foreign": ("optimizer.safetensors", _foreign_optimizer, "optimizer.safetensors"),
    "optimizer-missing": ("optimizer.safetensors", Path.unlink, "optimizer.safetensors"),
    "trainer-truncated": ("trainer.json", _cut, "trainer.json"),
    "trainer-corrupt": ("trainer.json", _garbage, "trainer.json"),
    "trainer-foreign": ("trainer.json", _foreign_trainer, "trainer.json"),
    "trainer-missing": ("trainer.json", Path.unlink, "trainer.json"),
    "trainer-data-a-list": ("trainer.json", _trainer_with(data=[]), "trainer.json"),
    "tokenizer-truncated": ("tokenizer.json", _cut, "tokenizer.json"),
    "tokenizer-foreign": ("tokenizer.json", _foreign_tokenizer, "tokenizer.json"),
    "tokenizer-missing": ("tokenizer.json", Path.unlink, "tokenizer.json"),
    "config-truncated": ("config.json", _cut, "config.json"),
    # A config that does not fit the weights beside it: the weights are named, as the file that does not fit.
    "config-foreign": ("config.json", _foreign_config, "model.safetensors"),
}


def damaged_copy(run: Path, tmp_path: Path, checkpoint: str, damage: str) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    name, apply, _ = DAMAGES[damage]
    apply(copy / "checkpoints" / checkpoint / name)
    return copy


def assert_fell_back(result: Cli, doing: str, intact: str, damaged_file: Path | str) -> None:
    """One warning: what was used instead, and the damaged file by its path."""
    assert result.status == 0, result.err
    assert len(result.err_lines) == 1, result.err
    warning = result.err_lines[0]
    assert warning.startswith(f"warning: {doing} {intact}, the newest intact checkpoint: damaged "), warning
    assert str(damaged_file) in warning, warning


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_translate_falls_back_to_the_newest_intact_checkpoint(
    damage: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = damaged_copy(task_run, tmp_path, "step-0000004", damage)
    result = cli("translate", run, "--no-guard", *TEXTS)
    if damage.startswith("optimizer"):  # not read: the newest checkpoint translates, and nothing is said
        assert (result.status, result.err) == (0, "")
        assert result.out_lines == Translator(task_run, "step-4", guard=False).translate(TEXTS)
        return
    damaged_file = run / "checkpoints" / "step-0000004" / DAMAGES[damage][2]
    assert_fell_back(result, "using", "step-0000002", damaged_file)
    assert result.out_lines == Translator(task_run, "step-2", guard=False).translate(TEXTS)


@pytest.mark.parametrize("damage", ["weights-truncated", "trainer-foreign", "tokenizer-foreign", "optimizer-corrupt"])
def test_evaluate_falls_back_to_the_newest_intact_checkpoint(
    damage: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = damaged_copy(task_run, tmp_path, "step-0000004", damage)
    src, ref = write_lines(tmp_path / "src.txt", TEXTS), write_lines(tmp_path / "ref.txt", TEXTS)
    result = cli("evaluate", run, "--no-guard", src, ref)
    expected = "step-0000004" if damage.startswith("optimizer") else "step-0000002"
    assert result.json()["checkpoint"] == expected
    if expected == "step-0000004":
        assert result.err == ""
    else:
        assert_fell_back(result, "using", expected, run / "checkpoints" / "step-0000004" / DAMAGES[damage][2])


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_falls_back_to_the_newest_intact_checkpoint(
    damage: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = damaged_copy(task_run, tmp_path, "step-0000004", damage)
    before = json.loads((task_run / "checkpoints" / "step-0000002" / "trainer.json").read_text(encoding="utf-8"))
    result = cli("train", "--resume", "--out", run, "--no-progress")
    damaged_file = run / "checkpoints" / "step-0000004" / DAMAGES[damage][2]
    assert_fell_back(result, "resuming from", "step-0000002", damaged_file)
    resumed = read_checkpoint(latest_checkpoint(run))  # step-0000004 again, intact
    assert resumed.step == 4
    assert resumed.trainer["losses"][:2] == before["losses"]  # it went on from step 2
    assert [step for step, _ in resumed.trainer["losses"]] == [1, 2, 3, 4]


def test_damage_in_the_newest_subword_vocabulary(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]):
    """A corpus run's vocabulary is a file of Hugging Face's format beside the manifest."""
    other = SubwordTokenizer.train(["ein ganz anderer Text", "another text"], 40).to_json()
    for damage, apply in {
        "truncated": _cut,
        "foreign": lambda path: path.write_text(other, encoding="utf-8"),
        "missing": Path.unlink,
    }.items():
        run = corpus_run.copy(tmp_path / damage)
        apply(run / "checkpoints" / "step-0000120" / "subwords.json")
        result = cli("translate", run, "--no-guard", *SAMPLES, "--checkpoint", "latest")
        assert_fell_back(result, "using", "step-0000090", run / "checkpoints" / "step-0000120" / "subwords.json")
        assert result.out_lines == Translator(corpus_run.path, "step-90").translate(SAMPLES)


def test_a_joint_manifest_with_two_vocabularies_is_damage(task_run: Path, tmp_path: Path, cli: Callable[..., Cli]):
    run = tmp_path / "run"
    shutil.copytree(task_run, run)
    manifest_path = run / "checkpoints" / "step-0000004" / "tokenizer.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    target = {**manifest["target"], "symbols": manifest["target"]["symbols"][::-1]}  # same size, other ids
    manifest_path.write_text(json.dumps({**manifest, "target": target, "joint": True}), encoding="utf-8")
    result = cli("translate", run, "--no-guard", *TEXTS)
    assert_fell_back(result, "using", "step-0000002", manifest_path)
    assert "joint" in result.err


def test_the_default_checkpoint_falls_back_when_best_is_damaged(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """A corpus run translates with ``best`` by default; if it is damaged, with the newest intact checkpoint."""
    run = corpus_run.copy(tmp_path / "run")
    best = (run / "best").read_text(encoding="utf-8").strip()
    _cut(run / "checkpoints" / best / "model.safetensors")
    newest = "step-0000090" if best == "step-0000120" else "step-0000120"
    result = cli("translate", run, "--no-guard", *SAMPLES)
    assert_fell_back(result, "using", newest, run / "checkpoints" / best / "model.safetensors")
    assert result.out_lines == Translator(corpus_run.path, newest).translate(SAMPLES)
    # Asked for by name, a damaged checkpoint is refused, not replaced.
    assert_refused(cli("translate", run, *SAMPLES, "--checkpoint", "best"), f"checkpoint 'best' of '{run}' is damaged")


@pytest.mark.parametrize("command", ["translate", "evaluate", "resume"])
def test_no_intact_checkpoint_is_refused_in_one_line(
    command: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    run = damaged_copy(task_run, tmp_path, "step-0000004", "weights-truncated")
    _garbage(run / "checkpoints" / "step-0000002" / "trainer.json")
    before = snapshot(run)
    src, ref = write_lines(tmp_path / "src.txt", TEXTS), write_lines(tmp_path / "ref.txt", TEXTS)
    args = {
        "translate": ["translate", run, "--no-guard", *TEXTS],
        "evaluate": ["evaluate", run, "--no-guard", src, ref],
        "resume": ["train", "--resume", "--out", run, "--no-progress"],
    }[command]
    result = cli(*args)
    assert_refused(result, f"'{run}' holds no intact checkpoint", "step-0000004: ", "model.safetensors",
                   "step-0000002: ", "trainer.json")  # fmt: skip
    assert result.out == ""
    assert snapshot(run) == before


def test_a_damaged_pointer_is_no_damage(task_run: Path, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """``latest`` only says which checkpoint is newest: garbage there leaves the newest step checkpoint in use."""
    run = tmp_path / "run"
    shutil.copytree(task_run, run)
    (run / "latest").write_bytes(b"\xff\xfe garbage")
    result = cli("translate", run, "--no-guard", *TEXTS)
    assert (result.status, result.err) == (0, "")
    assert result.out_lines == Translator(task_run, "step-4", guard=False).translate(TEXTS)


# --- one damaged file, one checkpoint: resume and translate refuse it, and change nothing -----------------


def _small_tokenizer(checkpoint: Path) -> None:
    tokenizer = {"kind": "char", "symbols": ["a", "b"]}
    (checkpoint / "tokenizer.json").write_text(json.dumps({"source": tokenizer, "target": tokenizer}))


def _generation_with(**values: object) -> Callable[[Path], None]:
    def damage(checkpoint: Path) -> None:
        stored = json.loads((checkpoint / "generation.json").read_text())
        (checkpoint / "generation.json").write_text(json.dumps({**stored, **values}))

    return damage


RUN_DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "optimizer-garbage": (lambda c: (c / "optimizer.safetensors").write_bytes(b"not safetensors"), "optimizer"),
    "optimizer-cut": (lambda c: (c / "optimizer.safetensors").write_bytes(b"\x08" + bytes(7)), "optimizer"),
    "optimizer-missing": (lambda c: (c / "optimizer.safetensors").unlink(), "optimizer"),
    "model-cut": (lambda c: (c / "model.safetensors").write_bytes(b"\x08" + bytes(7)), "model.safetensors"),
    "model-missing": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors|checkpoint"),
    "trainer-without-optimizer": (trainer_without("optimizer"), "trainer.json"),
    "trainer-without-options": (trainer_without("options"), "trainer.json"),
    "trainer-without-step": (trainer_without("step"), "trainer.json"),
    "trainer-step-string": (lambda c: _trainer_with(step="two")(c / "trainer.json"), "trainer.json"),
    "tokenizer-not-the-models": (_small_tokenizer, "tokenizer"),
    "generation-garbage": (lambda c: (c / "generation.json").write_text("{banned"), "generation.json"),
    "generation-with-a-search": (_generation_with(search={"beam_size": 4}), "generation.json.*holds a search"),
    "generation-other-specials": (_generation_with(specials={"pad": 0, "bos": 0, "eos": 2, "unk": 3}),
                                  "generation.json.*special ids"),
    "generation-out-of-vocabulary": (_generation_with(forced=[10**4]), "generation.json.*received 10000"),
}  # fmt: skip


@pytest.mark.parametrize("damage", list(RUN_DAMAGES))
def test_resume_from_a_damaged_checkpoint_is_refused_and_changes_nothing(
    short_run: Path, tmp_path: Path, damage: str
) -> None:
    apply, message = RUN_DAMAGES[damage]
    out = damaged_run(short_run, tmp_path, apply)
    before = snapshot(out)
    with pytest.raises(RunError, match=message):
        train(
            TrainOptions(
                out=str(out), task="reverse", steps=3, checkpoint_every=3, batch_size=4, warmup=5, resume=True, **SMALL
            )
        )
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "damage", ["trainer-without-options", "tokenizer-not-the-models", "model-cut", "generation-with-a-search"]
)
def test_translate_from_a_damaged_checkpoint_is_refused(short_run: Path, tmp_path: Path, damage: str) -> None:
    apply, message = RUN_DAMAGES[damage]
    out = damaged_run(short_run, tmp_path, apply)
    with pytest.raises(RunError, match=message):
        Translator(out).translate(["abc"])


def test_translate_needs_no_optimizer_state(short_run: Path, tmp_path: Path) -> None:
    out = damaged_run(short_run, tmp_path, RUN_DAMAGES["optimizer-garbage"][0])
    assert isinstance(Translator(out).translate(["abc"])[0], str)


def test_a_damaged_latest_pointer_falls_back_or_is_refused_by_name(short_run: Path, tmp_path: Path) -> None:
    out = damaged_run(short_run, tmp_path, undamaged)
    (out / "latest").write_bytes(b"\xff\xfe\x00step")
    try:
        translator = Translator(out)
    except ValueError as error:
        refusal = str(error)
    else:
        refusal = None
        assert isinstance(translator.translate(["abc"])[0], str)
    assert refusal is None or "latest" in refusal, refusal


def test_resume_skips_a_damaged_newer_checkpoint_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train(tiny(out, steps=6, checkpoint_every=3))
    (out / "checkpoints" / "step-0000006" / "model.safetensors").unlink()
    resumed = train(tiny(out, steps=6, checkpoint_every=3, resume=True))
    assert [step for step, _ in resumed.losses] == list(range(1, 7))
    assert "resuming from step-0000003" in capsys.readouterr().err
    assert latest_checkpoint(out).name == "step-0000006"
