"""``multihead import`` chooses a checkpoint's family from its registry: by the ``model_type`` of ``config.json`` and
the ``tokenizer_class`` of ``tokenizer_config.json``, as Transformers' ``AutoConfig`` and its tokenizers write them;
a ``model_type`` no registered family has is refused in one line naming every one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from app.support import Cli, assert_refused
from multihead.app import families
from multihead.app.console import UserError
from multihead.app.families import FAMILIES, M2M100, family_of
from multihead.app.hf_checkpoints import CheckpointFiles

transformers = pytest.importorskip("transformers")

CHECKPOINTS = {
    "marian": ("marian", "MarianTokenizer", "Marian"),
    "m2m100": ("m2m_100", "M2M100Tokenizer", "M2M100"),
    "m2m100-no-tokenizer-config": ("m2m_100", None, "M2M100"),
    "nllb": ("m2m_100", "NllbTokenizer", "NLLB-200"),
    "nllb-fast": ("m2m_100", "NllbTokenizerFast", "NLLB-200"),
}
"""A checkpoint's model_type, the Transformers tokenizer it was saved with (none: no tokenizer_config.json), and the
family ``multihead import`` names."""


def checkpoint(directory: Path, model_type: str, tokenizer: str | None) -> CheckpointFiles:
    """The settings of a checkpoint as Transformers writes them: ``config.json`` of ``model_type``'s config class,
    and ``tokenizer_config.json`` naming the tokenizer class ``tokenizer``."""
    directory.mkdir()
    transformers.AutoConfig.for_model(model_type).save_pretrained(directory)
    if tokenizer is not None:
        tokenizer_class = getattr(transformers, tokenizer).__name__  # a class Transformers has
        (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return CheckpointFiles(directory, directory.name)


@pytest.mark.parametrize(("model_type", "tokenizer", "family"), CHECKPOINTS.values(), ids=CHECKPOINTS.keys())
def test_each_checkpoint_finds_its_family(tmp_path: Path, model_type: str, tokenizer: str | None, family: str) -> None:
    files = checkpoint(tmp_path / "model", model_type, tokenizer)
    assert family_of(files.json("config.json"), files).name == family


def test_every_registered_family_is_checked_here() -> None:
    assert sorted(family.name for family in FAMILIES) == sorted({family for _, _, family in CHECKPOINTS.values()})


def test_the_registry_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A family added to the registry is the one of its model_type, and is named when none fits."""

    class Bart(M2M100):
        name, model_type = "BART", "bart"

    files = checkpoint(tmp_path / "bart", "bart", None)
    with pytest.raises(UserError, match="model_type='bart'"):
        family_of(files.json("config.json"), files)
    monkeypatch.setattr(families, "FAMILIES", (*FAMILIES, Bart()))
    assert family_of(files.json("config.json"), files).name == "BART"
    t5 = checkpoint(tmp_path / "t5", "t5", None)
    with pytest.raises(UserError, match=r"model_type='t5'.*BART \(model_type 'bart'\)"):
        family_of(t5.json("config.json"), t5)


def test_an_unknown_model_type_is_refused_naming_every_family(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    checkpoint(tmp_path / "bart", "bart", "BartTokenizer")
    assert_refused(cli("import", tmp_path / "bart", tmp_path / "run"), "config.json", "model_type='bart'",
                   "Marian (model_type 'marian')", "M2M100 (model_type 'm2m_100')",
                   "NLLB-200 (model_type 'm2m_100', tokenizer_class Nllb")  # fmt: skip
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bart"]  # nothing written
