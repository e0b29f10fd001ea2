"""``TransformerConfig``, shared by both front ends: JSON round trips and the fields it refuses.

Each refused field is also refused, with the same message, by the PyTorch ``Transformer`` built from it.
"""

from __future__ import annotations

import json
import re

import pytest

from multihead.config import TransformerConfig, config_fields
from multihead.torch import Transformer


@pytest.mark.parametrize(
    "config",
    [
        TransformerConfig(11, 12, d_model=16, num_heads=2, norm_first=True, activation="gelu", pad_id=0),
        TransformerConfig(9, 9, d_model=8, num_heads=2, num_encoder_layers=0, max_len=7, tie_embeddings=True),
        TransformerConfig(9, 9, d_model=8, num_heads=2, norm_first=True, positions="fairseq", first_position=2),
    ],
    ids=["gelu-pre-norm-pad", "tied-no-encoder-layers", "fairseq-positions-from-2"],
)
def test_config_json_round_trip(config: TransformerConfig) -> None:
    assert TransformerConfig.from_json(config.to_json()) == config
    assert TransformerConfig.from_dict(json.loads(config.to_json())) == config
    assert Transformer.from_config(config).config == config


def test_config_fields_takes_a_config_or_a_dict_of_its_fields() -> None:
    config = TransformerConfig(5, 6, d_model=8, num_heads=2, tie_embeddings=False)
    fields = config_fields(config)
    assert fields["tgt_vocab"] == 6
    assert config_fields(fields) == fields
    with pytest.raises(TypeError, match=r"`config` must be a TransformerConfig or a dict of its fields, received list"):
        config_fields([5, 6])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"src_vocab": 0}, ValueError, r"`src_vocab` must be a positive int, received 0"),
        ({"tgt_vocab": "10"}, TypeError, r"`tgt_vocab` must be an int"),
        ({"num_heads": 0}, ValueError, r"`num_heads` must be a positive int"),
        ({"num_heads": True}, TypeError, r"`num_heads` must be an int"),
        ({"d_model": 30, "num_heads": 4}, ValueError, r"d_model=30, num_heads=4"),
        ({"num_encoder_layers": -1}, ValueError, r"`num_encoder_layers` must be a non-negative int"),
        ({"num_decoder_layers": 1.5}, TypeError, r"`num_decoder_layers` must be an int"),
        ({"d_ff": 0}, ValueError, r"`d_ff` must be a positive int"),
        ({"dropout": float("nan")}, ValueError, r"`dropout` must be in \[0, 1\)"),
        ({"dropout": 1.5}, ValueError, r"`dropout` must be in \[0, 1\)"),
        ({"dropout": "0.1"}, TypeError, r"`dropout` must be a float"),
        ({"activation": None}, ValueError, r"`activation` must be one of"),
        ({"activation": "tanh"}, ValueError, r"`activation` must be one of"),
        ({"norm_first": "no"}, TypeError, r"`norm_first` must be True or False"),
        ({"max_len": True}, TypeError, r"`max_len` must be an int"),
        ({"max_len": 0}, ValueError, r"`max_len` must be a positive int"),
        ({"pad_id": -1}, ValueError, r"`pad_id` must be a non-negative int"),
        ({"pad_id": 10}, ValueError, r"`pad_id` must be a token of both vocabularies \(< 10\)"),
        ({"pad_id": 50}, ValueError, r"`pad_id` must be a token of both vocabularies \(< 10\), received 50"),
        ({"pad_id": False}, TypeError, r"`pad_id` must be an int"),
        ({"tie_embeddings": "yes"}, TypeError, r"`tie_embeddings` must be True or False, received 'yes'"),
        ({"first_position": -1}, ValueError, r"`first_position` must be a non-negative int, received -1"),
        ({"positions": "rotary"}, ValueError, r"`positions` must be one of \('interleaved', 'halves', 'fairseq'\)"),
        (
            {"tie_embeddings": True},
            ValueError,
            r"`tie_embeddings` needs one vocabulary for both sides, received src_vocab=10, tgt_vocab=12",
        ),
    ],
    ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None,
)
def test_config_fields_refused(kwargs: dict, error: type[Exception], match: str) -> None:
    fields = {"src_vocab": 10, "tgt_vocab": 12, **kwargs}
    with pytest.raises(error, match=match):
        TransformerConfig(**fields)
    with pytest.raises(error, match=match):
        Transformer(fields.pop("src_vocab"), fields.pop("tgt_vocab"), **fields)


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        (None, TypeError, r"`text`|config"),
        ("[1, 2]", TypeError, r"must be a JSON object, received list"),
        ('"base"', TypeError, r"must be a JSON object, received str"),
        ('{"src_vocab": 3}', TypeError, r"tgt_vocab"),
        ('{"src_vocab": 3, "tgt_vocab": 3, "d_model": "64"}', TypeError, r"`d_model` must be an int"),
        ('{"src_vocab": 3, "tgt_vocab": 4, "tie_embeddings": true}', ValueError, r"`tie_embeddings`.*tgt_vocab=4"),
        ("", ValueError, r"must be JSON"),
        ("{not json", ValueError, r"must be JSON"),
    ],
    ids=["none", "list", "string", "missing-field", "wrong-type", "tied-vocabularies-differ", "empty", "not-json"],
)
def test_config_json_refused(text: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        TransformerConfig.from_json(text)


def test_config_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown Transformer config keys \['heads'\]"):
        TransformerConfig.from_dict({"src_vocab": 3, "tgt_vocab": 3, "heads": 2})


def test_a_config_older_versions_wrote_reads_without_its_generation_keys() -> None:
    """Older versions wrote ``decoder_start_id`` and ``banned_ids`` into every config (``null`` and ``[]`` unused):
    those read as the architecture they describe; set, they are a generation spec's, which a config cannot hold."""
    config = TransformerConfig(11, 12, d_model=16, num_heads=2, pad_id=0)
    older = {**json.loads(config.to_json()), "decoder_start_id": None, "banned_ids": []}
    assert TransformerConfig.from_dict(older) == config
    for key, value in (("banned_ids", [0]), ("decoder_start_id", 0)):
        with pytest.raises(ValueError, match=re.escape(f"'{key}': {value}")):
            TransformerConfig.from_dict({**older, key: value})
