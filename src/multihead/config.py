"""The Transformer's configuration, shared by both front ends and saved as JSON next to the weights."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multihead.validation import (
    check_dropout,
    check_flag,
    check_heads,
    check_non_negative_int,
    check_positive_int,
    resolve_head_dim,
)

ACTIVATIONS = ("relu", "gelu", "silu")
POSITION_LAYOUTS = ("interleaved", "halves", "fairseq")
"""How the sinusoidal table lays out its sines and cosines (see :mod:`multihead.positional`)."""
QUANTIZED = ("int8", "bf16")
"""What inference may compute the linear layers in besides the weights' own type (``multihead.torch.quantize``)."""
MOVED_TO_GENERATION = ("decoder_start_id", "banned_ids")
"""Keys of the configs older versions wrote (``null`` and ``[]`` when unused), now a generation spec's."""
LAYER_NORM_EPS = 1e-5
"""The LayerNorms' epsilon in both front ends (PyTorch's default), so that both compute the same function."""


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and choices of an encoder-decoder Transformer (defaults: the paper's base model).

    ``pad_id``: when set, key padding masks default to ``tokens != pad_id`` (a target's first position, its decoder
    start token, is always real) and ``generate`` pads finished sequences with it (else with ``eos_id``). ``max_len``:
    the longest sequence the positional table covers. ``tie_embeddings``: one vocabulary for source and target, whose
    embedding matrix is also the output projection's weight (as in the paper); needs ``src_vocab == tgt_vocab``.

    Options for models trained elsewhere (Marian/OPUS-MT sets them all; the defaults are the paper's):
    ``activation`` ``"silu"`` (Marian's "swish"); ``positions``: the sinusoidal table's layout, ``"interleaved"``
    (the paper's sin, cos, sin, ...), ``"halves"`` (all sines, then all cosines) or ``"fairseq"`` (M2M100's and
    NLLB's; see :mod:`multihead.positional`); ``first_position``: the table's position of a sequence's first token
    (fairseq's models count from their pad id + 1); ``scale_embeddings``: multiply
    embeddings by ``sqrt(d_model)``; ``tie_output``: the target embedding is also the output projection's weight
    while the source has its own (two vocabularies). The output projection always has a bias (Marian's
    ``final_logits_bias``). What generation reads (special ids, banned and forced tokens, the search) is a
    :class:`multihead.decoding.Generation`, not the architecture.
    """

    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False
    max_len: int = 512
    pad_id: int | None = None
    tie_embeddings: bool = False
    positions: str = "interleaved"
    scale_embeddings: bool = True
    tie_output: bool = False
    first_position: int = 0

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "d_ff", "max_len"):
            check_positive_int(name, getattr(self, name))
        check_non_negative_int("num_encoder_layers", self.num_encoder_layers)
        check_non_negative_int("num_decoder_layers", self.num_decoder_layers)
        check_heads(self.num_heads, None)
        resolve_head_dim(self.d_model, self.num_heads, None)
        check_dropout("dropout", self.dropout)
        check_flag("norm_first", self.norm_first)
        check_flag("tie_embeddings", self.tie_embeddings)
        if self.tie_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"`tie_embeddings` needs one vocabulary for both sides, received src_vocab={self.src_vocab}, "
                f"tgt_vocab={self.tgt_vocab}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, received {self.activation!r}")
        if self.positions not in POSITION_LAYOUTS:
            raise ValueError(f"`positions` must be one of {POSITION_LAYOUTS}, received {self.positions!r}")
        check_flag("scale_embeddings", self.scale_embeddings)
        check_flag("tie_output", self.tie_output)
        check_non_negative_int("first_position", self.first_position)
        if self.tie_output and self.tie_embeddings:
            raise ValueError("`tie_output` ties the target side only, `tie_embeddings` all three matrices: set one")
        if self.pad_id is not None:
            check_non_negative_int("pad_id", self.pad_id)
            if self.pad_id >= min(self.src_vocab, self.tgt_vocab):
                raise ValueError(
                    f"`pad_id` must be a token of both vocabularies (< {min(self.src_vocab, self.tgt_vocab)}), "
                    f"received {self.pad_id}"
                )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        if not isinstance(values, dict):
            raise TypeError(f"a Transformer config must be a JSON object, received {type(values).__name__}")
        moved = {key: values[key] for key in MOVED_TO_GENERATION if key in values}
        if any(value not in (None, []) for value in moved.values()):
            raise ValueError(
                f"a Transformer config describes the architecture only, received {moved}: the tokens generation starts "
                "from and never chooses are a multihead.decoding.Generation's (a run keeps its own)"
            )
        values = {key: value for key, value in values.items() if key not in moved}  # as older versions wrote them
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown Transformer config keys {unknown}; known keys are {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        if not isinstance(text, str | bytes | bytearray):
            raise TypeError(
                f"`text` must be a Transformer config as JSON text, received {text!r} of type {type(text).__name__}"
            )
        try:
            values = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:  # bytes are decoded first
            raise ValueError(f"a Transformer config must be JSON, which this is not: {error}") from None
        return cls.from_dict(values)


def config_fields(config: object) -> dict[str, Any]:
    """The fields of a :class:`TransformerConfig`, or of a mapping checked as one."""
    if isinstance(config, Mapping):
        config = TransformerConfig.from_dict(dict(config))
    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"`config` must be a TransformerConfig or a dict of its fields, received {type(config).__name__}"
        )
    return dataclasses.asdict(config)
