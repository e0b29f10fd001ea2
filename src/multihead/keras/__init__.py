"""The Keras 3 front end (TensorFlow backend by default; also runs on the torch and JAX backends)."""

from multihead.cache import DecoderCache
from multihead.keras.attention import KVCache, MultiHeadAttention
from multihead.keras.functional import attention
from multihead.keras.masks import causal_mask, padding_mask, padding_mask_from_tokens
from multihead.keras.transformer import (
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
    "MultiHeadAttention",
    "PositionalEncoding",
    "Transformer",
    "attention",
    "causal_mask",
    "padding_mask",
    "padding_mask_from_tokens",
]
