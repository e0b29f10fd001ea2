"""The PyTorch front end: ``attention``, mask helpers and ``MultiHeadAttention``."""

from multihead.torch.attention import MultiHeadAttention
from multihead.torch.functional import attention
from multihead.torch.masks import causal_mask, padding_mask, padding_mask_from_tokens

__all__ = ["MultiHeadAttention", "attention", "causal_mask", "padding_mask", "padding_mask_from_tokens"]
