"""The Keras 3 front end (TensorFlow backend by default; also runs on the torch backend)."""

from multihead.keras.attention import MultiHeadAttention
from multihead.keras.functional import attention
from multihead.keras.masks import causal_mask, padding_mask, padding_mask_from_tokens

__all__ = ["MultiHeadAttention", "attention", "causal_mask", "padding_mask", "padding_mask_from_tokens"]
