"""The Transformer's weights, declared once: each layer kind's children by name, and every weight's name and shape for
a :class:`~multihead.config.TransformerConfig`.

Both front ends name their sublayers after it (PyTorch's attributes are its state-dict names; Keras' layers give
theirs through ``state_children``, built from these tuples), ``multihead.io`` saves and loads by these names, and
the CTranslate2 export and the Marian import map them: a test holds each front end's weights to
:func:`weight_shapes`. The LayerNorms follow the sublayers they wrap: ``norm1`` self-attention's, then
cross-attention's in a decoder layer, the last one the feed-forward block's.

Notation: E d_model, F d_ff, V vocabulary.
"""

from __future__ import annotations

from multihead.config import TransformerConfig

ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")
"""A multi-head attention's linear layers: the query, key, value and output projections."""
FEED_FORWARD = ("linear1", "linear2")
"""A feed-forward block's linear layers: ``E -> F`` and ``F -> E``."""
SELF_ATTENTION, CROSS_ATTENTION, FEED_FORWARD_BLOCK = "self_attn", "cross_attn", "feed_forward"
ENCODER_LAYER = (SELF_ATTENTION, FEED_FORWARD_BLOCK, "norm1", "norm2")
DECODER_LAYER = (SELF_ATTENTION, CROSS_ATTENTION, FEED_FORWARD_BLOCK, "norm1", "norm2", "norm3")
LAYERS, STACK_NORM = "layers", "norm"
"""A stack's layers (``layers.0``, ``layers.1``...) and a pre-norm stack's final LayerNorm."""
ENCODER, DECODER = "encoder", "decoder"
SOURCE_EMBEDDING, TARGET_EMBEDDING, OUTPUT = "src_embed", "tgt_embed", "output_proj"
TRANSFORMER = (SOURCE_EMBEDDING, TARGET_EMBEDDING, ENCODER, DECODER, OUTPUT)
WEIGHT, BIAS = "weight", "bias"


def layer(stack: str, index: int) -> str:
    """The name of layer ``index`` of ``stack`` (:data:`ENCODER` or :data:`DECODER`)."""
    return f"{stack}.{LAYERS}.{index}"


def layers_of(stack: str) -> tuple[str, ...]:
    """The children of a layer of ``stack``."""
    return DECODER_LAYER if stack == DECODER else ENCODER_LAYER


def norms(stack: str) -> tuple[str, ...]:
    """A layer's LayerNorms in order, the last one the feed-forward block's."""
    return tuple(name for name in layers_of(stack) if name.startswith("norm"))


def weight_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of a Transformer built from ``config``, by name (a tied matrix under each of its names, as
    ``multihead.io`` saves it), with its shape (PyTorch's: a linear's weight ``(out, in)``)."""
    e, f = config.d_model, config.d_ff
    linear = {name: (e, e) for name in ATTENTION}
    feed_forward = {
        f"{FEED_FORWARD_BLOCK}.{name}": shape for name, shape in zip(FEED_FORWARD, ((f, e), (e, f)), strict=True)
    }
    shapes: dict[str, tuple[int, ...]] = {
        f"{SOURCE_EMBEDDING}.{WEIGHT}": (config.src_vocab, e),
        f"{TARGET_EMBEDDING}.{WEIGHT}": (config.tgt_vocab, e),
    }
    for stack, count in ((ENCODER, config.num_encoder_layers), (DECODER, config.num_decoder_layers)):
        attentions = (SELF_ATTENTION, CROSS_ATTENTION) if stack == DECODER else (SELF_ATTENTION,)
        for index in range(count):
            name = layer(stack, index)
            products = {f"{a}.{p}": shape for a in attentions for p, shape in linear.items()} | feed_forward
            for product, (out, inp) in products.items():
                shapes[f"{name}.{product}.{WEIGHT}"] = (out, inp)
                shapes[f"{name}.{product}.{BIAS}"] = (out,)
            for norm in norms(stack):
                shapes[f"{name}.{norm}.{WEIGHT}"] = shapes[f"{name}.{norm}.{BIAS}"] = (e,)
        if config.norm_first:
            shapes[f"{stack}.{STACK_NORM}.{WEIGHT}"] = shapes[f"{stack}.{STACK_NORM}.{BIAS}"] = (e,)
    shapes[f"{OUTPUT}.{WEIGHT}"] = (config.tgt_vocab, e)
    shapes[f"{OUTPUT}.{BIAS}"] = (config.tgt_vocab,)
    return shapes


def tied(config: TransformerConfig) -> list[tuple[str, ...]]:
    """The groups of names that are one matrix in a Transformer built from ``config``: the three embeddings with
    ``tie_embeddings``, the target embedding and the output projection with ``tie_output``."""
    source, target, output = (f"{name}.{WEIGHT}" for name in (SOURCE_EMBEDDING, TARGET_EMBEDDING, OUTPUT))
    if config.tie_embeddings:
        return [(source, target, output)]
    return [(target, output)] if config.tie_output else []
