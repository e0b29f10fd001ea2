"""The PyTorch front end: ``attention`` and ``packed_attention``, mask helpers, ``MultiHeadAttention``, ``KVCache``,
the Transformer, ``quantize`` (int8 or bf16 inference) and ``Layouts`` (weights laid out for decoding)."""

from multihead.cache import DecoderCache
from multihead.torch.attention import KVCache, MultiHeadAttention
from multihead.torch.functional import attention, packed_attention
from multihead.torch.layouts import Layouts, quantize
from multihead.torch.masks import causal_mask, padding_mask, padding_mask_from_tokens
from multihead.torch.transformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    PositionalEncoding,
    Transformer,
)

__all__ = [
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "Layouts",
    "MultiHeadAttention",
    "PositionalEncoding",
    "Transformer",
    "attention",
    "causal_mask",
    "packed_attention",
    "padding_mask",
    "padding_mask_from_tokens",
    "quantize",
]
