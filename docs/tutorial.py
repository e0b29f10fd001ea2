# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Attention, step by step
#
# This tutorial follows "Attention Is All You Need" (Vaswani et al., 2017) from one attention head to a trained
# translation model. Every step is written twice: once by hand in PyTorch, as the paper writes it, and once with
# `multihead`; both are checked against `multihead.reference`, a plain NumPy float64 implementation. The shapes
# are the paper's: `d_model = 512`, `h = 8` heads, `d_k = d_v = 64`.
#
# It is a script in jupytext's "percent" format. Run it as it is (`.venv/bin/python docs/tutorial.py`), or make
# the notebook with `make notebooks` and open `docs/tutorial.ipynb`. Figures go to `runs/tutorial/` (the
# environment variable `MULTIHEAD_TUTORIAL_OUT` changes that; `MULTIHEAD_TUTORIAL_STEPS` sets the training steps
# of parts 6 and 9, 1500 by default, and part 9 stops after 5 minutes; `MULTI30K` names the Multi30k folder). On
# two CPU cores it runs in about 8 minutes (part 6's training about 2, part 9's 5), and in about 2 with
# `MULTIHEAD_TUTORIAL_STEPS=20`. What the text says about each computation is checked by an `assert` in the code,
# and the tests run this tutorial from top to bottom (with those 20 steps), so it cannot drift from the library.
#
# Notation: `B` batch, `L` length (`Lq` queries, `Lk` keys), `h` heads, `d_k`/`d_v` per-head widths.

# %%
import math
import os
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from multihead import reference
from multihead.torch import (
    EncoderLayer,
    FeedForward,
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    padding_mask,
)

OUT = Path(os.environ.get("MULTIHEAD_TUTORIAL_OUT", "runs/tutorial"))
OUT.mkdir(parents=True, exist_ok=True)
STEPS = int(os.environ.get("MULTIHEAD_TUTORIAL_STEPS", "1500"))
IN_NOTEBOOK = "ipykernel" in sys.modules
torch.manual_seed(0)


def save(figure: plt.Figure, name: str) -> None:
    """Write a figure under OUT (and leave it on screen in a notebook)."""
    figure.savefig(OUT / name, dpi=100, bbox_inches="tight")
    print(f"figure: {OUT / name}")
    if not IN_NOTEBOOK:
        plt.close(figure)


def largest_difference(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    return float(np.abs(a - b).max())


# %% [markdown]
# ## 1. Scaled dot-product attention in five steps
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{QK^\top}{\sqrt{d_k}}\right)V$$
#
# Each query is compared with every key (a dot product), the scores are scaled by $1/\sqrt{d_k}$, positions the
# query may not see are masked, a softmax turns each row of scores into weights that sum to 1, and the output is
# the weighted average of the values. The functional layout is `(B, h, L, d)`: batch, heads, length, per-head width.

# %%
B, L, d_model, h = 2, 6, 512, 8
d_k = d_v = d_model // h  # 64, the paper's per-head width
q = torch.randn(B, h, L, d_k, dtype=torch.float64)
k = torch.randn(B, h, L, d_k, dtype=torch.float64)
v = torch.randn(B, h, L, d_v, dtype=torch.float64)

scores = q @ k.transpose(-2, -1)  # step 1, QKᵀ: (B, h, Lq, Lk)
print("1. QKᵀ                 ", tuple(scores.shape))
scores = scores / math.sqrt(d_k)  # step 2, scale by √d_k
print("2. / √d_k              ", tuple(scores.shape))
look_ahead = causal_mask(L, L)  # (Lq, Lk), True = this query may attend this key
scores = scores.masked_fill(~look_ahead, float("-inf"))  # step 3, mask
print("3. mask                ", tuple(scores.shape))
weights = scores.softmax(dim=-1)  # step 4, softmax over the keys
print("4. softmax             ", tuple(weights.shape))
by_hand = weights @ v  # step 5, weighted average of V: (B, h, Lq, d_v)
print("5. × V                 ", tuple(by_hand.shape))

ours, our_weights = attention(q, k, v, look_ahead, return_weights=True)
oracle, oracle_weights = reference.attention(q.numpy(), k.numpy(), v.numpy(), look_ahead.numpy())
print("by hand vs multihead   ", largest_difference(by_hand, ours))
print("multihead vs reference ", largest_difference(ours, oracle), largest_difference(our_weights, oracle_weights))
assert largest_difference(by_hand, ours) < 1e-12 and largest_difference(ours, oracle) < 1e-12

# %% [markdown]
# Why divide by $\sqrt{d_k}$? With unit-variance entries, a dot product of two `d_k`-vectors has variance `d_k`:
# its standard deviation is 8 for `d_k = 64`. Scores that large push the softmax into saturation, where almost all
# weight goes to one key and the gradients vanish. Dividing by $\sqrt{d_k}$ brings the spread back to about 1.

# %%
raw = q @ k.transpose(-2, -1)
print(f"std of QKᵀ: {raw.std():.2f}, after / √d_k: {(raw / math.sqrt(d_k)).std():.2f}")
assert 6 < raw.std() < 10 and 0.75 < (raw / math.sqrt(d_k)).std() < 1.25

figure, axes = plt.subplots(1, 2, figsize=(8, 3.5))
for axis, matrix, title in ((axes[0], raw[0, 0], "QKᵀ / √d_k, masked"), (axes[1], weights[0, 0], "weights")):
    shown = matrix / math.sqrt(d_k) if title.startswith("QK") else matrix
    shown = shown.masked_fill(~look_ahead, float("nan"))
    image = axis.imshow(shown.numpy(), cmap="viridis")
    axis.set(title=title, xlabel="key position", ylabel="query position")
    figure.colorbar(image, ax=axis, shrink=0.8)
save(figure, "scaled_dot_product.png")

# %% [markdown]
# ## 2. Multi-head attention: project, split heads, attend, concatenate, project
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)W^O,\quad
# \mathrm{head}_i = \mathrm{Attention}(QW_i^Q, KW_i^K, VW_i^V)$$
#
# The `h` projections $W_i^Q$ are the row blocks of one `Linear(d_model, h·d_k)`: head `i` owns rows
# `i·d_k:(i+1)·d_k` of `q_proj`. Splitting heads is a reshape, `(B, L, h·d_k) → (B, L, h, d_k) → (B, h, L, d_k)`.
# Below, the module's own weights are used by hand, then the module is called.

# %%
mha = MultiHeadAttention(d_model, h).double().eval()
x = torch.randn(B, L, d_model, dtype=torch.float64)  # (B, L, d_model)

projected = mha.q_proj(x)  # project: (B, L, h·d_k)
print("project               ", tuple(projected.shape))
q = projected.view(B, L, h, d_k).transpose(1, 2)  # split heads: (B, h, L, d_k)
k = mha.k_proj(x).view(B, L, h, d_k).transpose(1, 2)  # (B, h, L, d_k)
v = mha.v_proj(x).view(B, L, h, d_v).transpose(1, 2)  # (B, h, L, d_v)
print("split heads           ", tuple(q.shape))
heads = attention(q, k, v)  # attend: (B, h, L, d_v)
print("attend                ", tuple(heads.shape))
concatenated = heads.transpose(1, 2).reshape(B, L, h * d_v)  # concatenate: (B, L, h·d_v)
print("concatenate           ", tuple(concatenated.shape))
by_hand = mha.out_proj(concatenated)  # project: (B, L, d_model)
print("project out           ", tuple(by_hand.shape))

params = {name: value.numpy() for name, value in mha.state_dict().items()}
oracle, _ = reference.multi_head_attention(x.numpy(), None, None, params, num_heads=h)
print("by hand vs module     ", largest_difference(by_hand, mha(x)))
print("module vs reference   ", largest_difference(mha(x), oracle))
assert largest_difference(by_hand, mha(x)) < 1e-12 and largest_difference(mha(x), oracle) < 1e-12

# %% [markdown]
# The same module does cross-attention (queries from one sequence, keys and values from another, of another
# length) and grouped-query attention, where groups of query heads share key/value heads (`num_kv_heads`):

# %%
memory = torch.randn(B, 9, d_model, dtype=torch.float64)  # an encoder output of length 9
print("cross-attention       ", tuple(mha(x, memory).shape))
gqa = MultiHeadAttention(d_model, h, num_kv_heads=2)
print("GQA k_proj            ", tuple(gqa.k_proj.weight.shape), "(2 key/value heads of 64 for 8 query heads)")

# %% [markdown]
# ## 3. Masks: padding and look-ahead, and why `True` means "attend"
#
# Two masks appear in the Transformer. The **padding mask** hides the padding that fills short sentences up to the
# batch's length; it is one row per sequence, `(B, Lk)`, and is broadcast over queries and heads. The
# **look-ahead (causal) mask** keeps the decoder from seeing the future: query `i` may attend key `j` only if
# `j ≤ i`. Both are boolean with `True` = "this query may attend this key", combined by AND.
#
# Why this polarity? It reads like the sentence it encodes, it is what `scaled_dot_product_attention`, Keras'
# `attention_mask` and JAX use, and a mask of all `True` means "no masking". (`torch.nn.MultiheadAttention` uses
# the opposite polarity: see the bugs below.)

# %%
lengths = [6, 4]
key_padding = padding_mask(lengths, L)  # (B, Lk): True at real tokens
print(key_padding.int())
combined = key_padding[:, None, :] & causal_mask(L, L)  # (B, Lq, Lk)
print(combined[1].int())

figure, axes = plt.subplots(1, 3, figsize=(10, 3.2))
panels = (
    (key_padding[1, None, :].expand(L, L), "padding (sequence of length 4)"),
    (causal_mask(L, L), "look-ahead"),
    (combined[1], "both (AND)"),
)
for axis, (matrix, title) in zip(axes, panels, strict=True):
    axis.imshow(matrix.numpy(), cmap="Greys_r", vmin=0, vmax=1)
    axis.set(title=title, xlabel="key", ylabel="query")
figure.suptitle("white: True = may attend")
save(figure, "masks.png")

# %% [markdown]
# The padding mask makes padded keys invisible: the real positions of a padded sequence get exactly what the
# unpadded sequence gets.

# %%
padded = mha(x, key_mask=key_padding)
alone = mha(x[1:, :4])  # sequence 1 without its two padding positions
print("real positions, padded vs alone:", largest_difference(padded[1, :4], alone[0]))
assert largest_difference(padded[1, :4], alone[0]) < 1e-12

# %% [markdown]
# ## 4. Layer normalization and the feed-forward block
#
# Each sub-layer's output is added to its input and normalized: `LayerNorm(x + Sublayer(x))`. Layer normalization
# rescales every position's `d_model` features to mean 0 and variance 1, then applies a learned gain and bias.
# The position-wise feed-forward block is two linear layers with a ReLU between: `max(0, xW₁ + b₁)W₂ + b₂`, with an
# inner width `d_ff = 2048`.

# %%
norm = nn.LayerNorm(d_model).double()
mean = x.mean(dim=-1, keepdim=True)  # (B, L, 1)
variance = x.var(dim=-1, unbiased=False, keepdim=True)  # (B, L, 1)
by_hand = (x - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias
print("LayerNorm by hand vs nn.LayerNorm:", largest_difference(by_hand, norm(x)))
assert largest_difference(by_hand, norm(x)) < 1e-12

feed_forward = FeedForward(d_model, 2048).double()
inner = torch.relu(feed_forward.linear1(x))  # (B, L, d_ff)
print("inner width           ", tuple(inner.shape))
by_hand = feed_forward.linear2(inner)  # (B, L, d_model)
print("feed-forward by hand vs FeedForward:", largest_difference(by_hand, feed_forward(x)))
assert largest_difference(by_hand, feed_forward(x)) < 1e-12

# %% [markdown]
# ## 5. The encoder block
#
# An encoder layer is self-attention then feed-forward, each wrapped in a residual connection and LayerNorm (the
# paper's "post-norm"; `norm_first=True` gives the pre-norm variant most modern models use).

# %%
encoder_layer = EncoderLayer(d_model, h, 2048, dropout=0.0).double().eval()
after_attention = encoder_layer.norm1(x + encoder_layer.self_attn(x, key_mask=key_padding))  # (B, L, d_model)
by_hand = encoder_layer.norm2(after_attention + encoder_layer.feed_forward(after_attention))  # (B, L, d_model)
print("encoder layer by hand vs EncoderLayer:", largest_difference(by_hand, encoder_layer(x, key_mask=key_padding)))
assert largest_difference(by_hand, encoder_layer(x, key_mask=key_padding)) < 1e-12

# %% [markdown]
# ## 6. The full Transformer on the `dates` task
#
# The built-in `dates` task asks the model to rewrite dates written in many ways ("21 November 2026", "Tue Mar 9
# 2021", "the 4th of July 1976") as `YYYY-MM-DD`. The data is generated, so nothing is downloaded, and 1000
# examples are held out for evaluation. `multihead.app.training` trains an encoder-decoder Transformer (2+2 layers,
# `d_model = 128`) on it; the command line does the same with `multihead train --task dates --steps 1500 --out
# runs/dates`. About two minutes on two CPU cores; the model then gets at least 98% of the held-out dates exactly
# right (the tests train only a few steps, so there the translations are still wrong). If the run directory
# already exists, training resumes from its last checkpoint.

# %%
from multihead.app.plot import plot_cross_attention
from multihead.app.training import TrainOptions, train
from multihead.app.translate import Translator

run = OUT / "dates"
result = train(TrainOptions(out=str(run), task="dates", steps=STEPS, resume=run.exists()))
print(f"after {result.step} steps, {result.summary}")
assert 0.0 <= result.evaluation["accuracy"] <= 1.0

translator = Translator(run)
examples = ["21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021"]
for text, translated in zip(examples, translator.translate(examples), strict=True):
    print(f"{text!r} -> {translated!r}")

# %% [markdown]
# What did it look at? The decoder's cross-attention weights say, for each output character, which input
# characters it drew from. After training, the heads that read the year look at the year's digits while the year
# is written, then move on to the month and the day.

# %%
translation = translator.attention("21 November 2026")
path = plot_cross_attention(translation, OUT / "dates_attention.png")
print(f"figure: {path}")

# %% [markdown]
# ## 7. Common bugs in attention code
#
# Each bug below is shown in a tiny plain implementation, the way it appears in widely copied tutorials, then
# the library's behaviour on the same input.
#
# ### 7.1 Projections created inside `forward` (or Keras `call`)
#
# A layer created inside the forward pass is a new, randomly initialized layer at every call: it is not a
# parameter of the module, so the optimizer never sees it, and the same input gives a different output each time.


# %%
class PerCallProjections(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.d_model, self.heads = d_model, heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q_proj = nn.Linear(self.d_model, self.d_model)  # the bug: a fresh layer per call
        k_proj = nn.Linear(self.d_model, self.d_model)
        v_proj = nn.Linear(self.d_model, self.d_model)
        b, length, _ = x.shape
        q, k, v = (p(x).view(b, length, self.heads, -1).transpose(1, 2) for p in (q_proj, k_proj, v_proj))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, length, self.d_model)


small = torch.randn(1, 3, 64)
buggy = PerCallProjections(64, 4)
print(
    "plain: parameters", len(list(buggy.parameters())), "| same output twice:", torch.equal(buggy(small), buggy(small))
)
assert not list(buggy.parameters()) and not torch.equal(buggy(small), buggy(small))
ours = MultiHeadAttention(64, 4)
print(
    "multihead: parameters", len(list(ours.parameters())), "| same output twice:", torch.equal(ours(small), ours(small))
)
assert len(list(ours.parameters())) == 8 and torch.equal(ours(small), ours(small))

# %% [markdown]
# ### 7.2 Scaling by `d_model` instead of `d_k`
#
# The scale is $1/\sqrt{d_k}$ with `d_k` the per-head width (64), not the model width (512). Dividing by
# $\sqrt{512}$ makes every head's weights much flatter: the model can still learn, but it starts from attention
# that looks at nothing in particular, and the outputs are not the paper's.

# %%
q, k, v = (torch.randn(1, h, L, d_k, dtype=torch.float64) for _ in range(3))
wrong_weights = ((q @ k.transpose(-2, -1)) / math.sqrt(d_model)).softmax(-1)
_, right_weights = attention(q, k, v, return_weights=True)
_, oracle_weights = reference.attention(q.numpy(), k.numpy(), v.numpy())
print(f"largest weight, scaled by √d_model: {wrong_weights.max():.3f}; by √d_k: {right_weights.max():.3f}")
print("plain vs reference:", largest_difference(wrong_weights, oracle_weights))
print("multihead vs reference:", largest_difference(right_weights, oracle_weights))
assert largest_difference(wrong_weights, oracle_weights) > 0.05 > largest_difference(right_weights, oracle_weights)

# %% [markdown]
# ### 7.3 `-1e9` in half precision
#
# The largest float16 is 65504. Filling masked scores with `-1e9` either fails outright, or (when the mask is
# added as a float tensor) overflows to `-inf`, and a row that is entirely masked then becomes NaN. The library
# never writes a fill constant into a half tensor: scores and softmax are computed in float32, masked positions
# are removed, and the result is cast back.

# %%
scores16 = torch.randn(1, 4, dtype=torch.float16)
try:
    scores16.masked_fill(torch.tensor([[False, True, True, True]]), -1e9)
    raise AssertionError("masked_fill(-1e9) in float16 was expected to fail")
except RuntimeError as error:
    print("plain masked_fill(-1e9) in float16:", error)
additive = torch.full((1, 4), -1e9).half()  # every key masked
print("plain -1e9 mask added in float16:", additive, "→ softmax", (scores16 + additive).softmax(-1))
assert torch.isinf(additive).all() and torch.isnan((scores16 + additive).softmax(-1)).all()

q16, k16, v16 = (torch.randn(1, 1, 2, 8, dtype=torch.float16) for _ in range(3))
nothing_to_see = torch.tensor([[True, True], [False, False]])  # the second query may attend no key
out16 = attention(q16, k16, v16, nothing_to_see)
print("multihead in float16:", out16[0, 0])
assert torch.isfinite(out16).all() and not out16[0, 0, 1].any()

# %% [markdown]
# ### 7.4 Fully masked rows
#
# A query whose keys are all masked (a padded query row in a left-padded batch, a sentence of length zero, a
# sliding window with nothing in it) has no weights to normalize. With `-inf` the plain softmax divides 0 by 0 and
# returns NaN, which then spreads through the gradients; with `-1e9` it silently returns the average of all values.
# `torch.nn.MultiheadAttention` gives NaN when its weights are requested. The library defines the answer: output 0,
# weights 0, gradient 0, on every path.

# %%
q, k, v = (torch.randn(1, 1, 2, 4) for _ in range(3))
scores = q @ k.transpose(-2, -1) / 2.0
print("plain with -inf:", scores.masked_fill(~nothing_to_see, float("-inf")).softmax(-1)[0, 0])
average = scores.masked_fill(~nothing_to_see, -1e9).softmax(-1) @ v
print("plain with -1e9, row 2 is the mean of V:", torch.allclose(average[0, 0, 1], v[0, 0].mean(0)))
assert torch.isnan(scores.masked_fill(~nothing_to_see, float("-inf")).softmax(-1)).any()
assert torch.allclose(average[0, 0, 1], v[0, 0].mean(0))

torch_mha = nn.MultiheadAttention(8, 2, batch_first=True)
tokens = torch.randn(1, 3, 8)
_, torch_weights = torch_mha(tokens, tokens, tokens, key_padding_mask=torch.ones(1, 3, dtype=torch.bool))
print("nn.MultiheadAttention weights with every key padded:", torch_weights[0, 0])
assert torch.isnan(torch_weights).all()

q.requires_grad_(True)
out, our_weights = attention(q, k, v, nothing_to_see, return_weights=True)
out.sum().backward()
print("multihead: output", out[0, 0, 1], "weights", our_weights[0, 0, 1], "gradient", q.grad[0, 0, 1])
assert not out[0, 0, 1].any() and not our_weights[0, 0, 1].any() and not q.grad[0, 0, 1].any()

# %% [markdown]
# ### 7.5 The two mask polarities of PyTorch
#
# `torch.nn.functional.scaled_dot_product_attention` reads a boolean mask as `True` = attend;
# `torch.nn.MultiheadAttention` reads `attn_mask` and `key_padding_mask` as `True` = **ignore**. The same mask
# passed to both gives opposite attention, without any error. The library has one polarity everywhere and
# translates at the boundary: `MultiHeadAttention.from_torch(m)` copies the weights, and a PyTorch mask is passed
# to it negated (`mask=~attn_mask`).

# %%
allowed = torch.tensor([[True, True, False], [False, True, True], [True, False, True]])  # True = may attend
copied = MultiHeadAttention.from_torch(torch_mha)
ours = copied(tokens, mask=allowed)
heads_view = tokens[:, None]  # (1, 1, 3, 8): one head, for the functional forms
sdpa = F.scaled_dot_product_attention(heads_view, heads_view, heads_view, attn_mask=allowed)
print("SDPA vs multihead.torch.attention, same mask:", largest_difference(sdpa, attention(*[heads_view] * 3, allowed)))
theirs, _ = torch_mha(tokens, tokens, tokens, attn_mask=allowed)  # read as "True = ignore"
theirs_negated, _ = torch_mha(tokens, tokens, tokens, attn_mask=~allowed)
print("nn.MultiheadAttention with the same mask vs multihead:", largest_difference(theirs, ours))
print("nn.MultiheadAttention with the mask negated vs multihead:", largest_difference(theirs_negated, ours))
assert largest_difference(sdpa, attention(*[heads_view] * 3, allowed)) < 1e-6
assert largest_difference(theirs, ours) > 1e-3 and largest_difference(theirs_negated, ours) < 1e-6

# %% [markdown]
# ### 7.6 Causal alignment with a KV cache
#
# When decoding with a cache, the new queries are the *last* positions of the sequence: `Lq` new tokens attend
# `Lk ≥ Lq` keys. A lower-triangular mask anchored at the top left (`torch.tril(ones(Lq, Lk))`, or
# `scaled_dot_product_attention(..., is_causal=True)`) lets the newest token see only the first keys. The causal
# mask must be anchored at the bottom right: query `i` may attend key `j` iff `j ≤ i + Lk − Lq`.

# %%
print("top-left, 2 new queries over 5 keys:\n", torch.ones(2, 5).tril().int())
print("bottom-right (multihead.torch.causal_mask(2, 5)):\n", causal_mask(2, 5).int())

decoder_attention = MultiHeadAttention(64, 4).eval()
sequence = torch.randn(1, 6, 64)
full = decoder_attention(sequence, causal=True)  # the whole sequence at once

plain_steps = []
for t in range(6):  # plain decoding: project everything so far, SDPA's top-left causal
    b = 1
    q = decoder_attention.q_proj(sequence[:, t : t + 1]).view(b, 1, 4, 16).transpose(1, 2)
    k = decoder_attention.k_proj(sequence[:, : t + 1]).view(b, t + 1, 4, 16).transpose(1, 2)
    v = decoder_attention.v_proj(sequence[:, : t + 1]).view(b, t + 1, 4, 16).transpose(1, 2)
    step = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, 1, 64)
    plain_steps.append(decoder_attention.out_proj(step))
cache = KVCache()
our_steps = [decoder_attention(sequence[:, t : t + 1], cache=cache, causal=True) for t in range(6)]
print("plain step-by-step vs full:", largest_difference(torch.cat(plain_steps, 1), full))
print("multihead with KVCache vs full:", largest_difference(torch.cat(our_steps, 1), full))
assert largest_difference(torch.cat(plain_steps, 1), full) > 1e-2
assert largest_difference(torch.cat(our_steps, 1), full) < 1e-5

# %% [markdown]
# ## 8. The same layer in Keras
#
# `multihead.keras` has the same parts with the same names for Keras 3 (TensorFlow by default). Weights are saved
# in one safetensors format keyed like the PyTorch state dict, so a layer trained in one framework loads into the
# other and gives the same outputs.

# %%
from multihead.app.console import framework_notices_filtered

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no INFO or WARNING lines from TensorFlow
with framework_notices_filtered():  # nor the notices it prints while it loads, which that setting cannot silence
    import keras

from multihead import keras as mk
from multihead.io import load_weights, save_weights

save_weights(decoder_attention, OUT / "attention.safetensors")
keras_attention = mk.MultiHeadAttention(4)
load_weights(keras_attention, OUT / "attention.safetensors")
keras_out = keras_attention(keras.ops.convert_to_tensor(sequence.numpy()), causal=True)
print("Keras vs PyTorch:", largest_difference(keras.ops.convert_to_numpy(keras_out), full))
assert largest_difference(keras.ops.convert_to_numpy(keras_out), full) < 1e-5

# %% [markdown]
# ## 9. Real language: German to English on Multi30k
#
# The `dates` task is generated; real sentences are not. Multi30k (Elliott et al., 2016) holds 29,000 image
# descriptions in German with their English translations, 1,014 for validation and 1,000 for testing: small enough
# to learn from on a laptop, real enough to need everything above. Get it from https://github.com/multi30k/dataset
# (`data/task1/raw`: `train`, `val` and `test_2016_flickr`, `.de` and `.en`, gzipped) and set the environment
# variable `MULTI30K` to that folder (by default this looks in `../shared/data/multi30k`). Without it, the cell
# says so and trains on a tiny made-up corpus instead, so that everything below still runs.
#
# Training is the command line's own recipe (`multihead train --data ... --minutes 5`): one byte-pair vocabulary
# of 8,000 subwords learned on both languages, a 3+3-layer Transformer with `d_model = 256`, batches of 4,096
# tokens, label smoothing and the warm-up schedule. Five minutes here; the tests train a few steps, so there the
# translations are still poor.

# %%
import gzip

from multihead.app.corpus import read_lines
from multihead.app.evaluate import score
from multihead.decoding import SearchOptions

DATA = Path(os.environ.get("MULTI30K", "../shared/data/multi30k"))
names = ["train.de", "train.en", "val.de", "val.en"]
if all((DATA / f"{name}.gz").exists() for name in names):
    corpus = {name: DATA / f"{name}.gz" for name in names}
    print(f"Multi30k from {DATA}")
else:
    print(f"no Multi30k in {DATA}: a tiny made-up corpus instead (see above for how to get Multi30k)")
    subjects = [("der Hund", "the dog"), ("die Katze", "the cat"), ("das Kind", "the child"), ("der Mann", "the man")]
    verbs = [("läuft", "runs"), ("schläft", "sleeps"), ("spielt", "plays"), ("singt", "sings")]
    adverbs = [("schnell", "fast"), ("heute", "today"), ("hier", "here"), ("gern", "gladly")]
    pairs = [(f"{s} {v} {a}.", f"{ts} {tv} {ta}.") for s, ts in subjects for v, tv in verbs for a, ta in adverbs]
    (OUT / "tiny").mkdir(exist_ok=True)
    corpus = {name: OUT / "tiny" / f"{name}.gz" for name in names}
    for name, path in corpus.items():
        lines = pairs[1::5] if name.startswith("val") else pairs
        path.write_bytes(gzip.compress("".join(p[name.endswith(".en")] + "\n" for p in lines).encode()))

run = OUT / "multi30k"
result = train(
    TrainOptions(
        out=str(run), data=[str(corpus["train.de"]), str(corpus["train.en"])],
        valid=[str(corpus["val.de"]), str(corpus["val.en"])], steps=STEPS, minutes=5.0, eval_examples=200,
        resume=run.exists(),
    )
)  # fmt: skip
print(f"validation BLEU after {result.step} steps: {result.evaluation['bleu']:.2f}")


# %% [markdown]
# Subwords: the vocabulary keeps frequent words whole and splits rare ones into pieces it knows, so that nothing
# is out of vocabulary. `▁` marks the start of a word; joining the pieces gives the sentence back.

# %%
translator = Translator(run)
sentence = read_lines(corpus["val.de"], "val.de")[0]
ids, unknown = translator.source.encode(sentence)
print(sentence)
print(" | ".join(translator.source.pieces(ids)))
assert unknown or translator.source.decode(ids) == sentence  # the pieces put back together are the sentence


# %% [markdown]
# Translation, batched: sentences of similar length go together, and the search drops each sentence from the batch
# as soon as it ends. Each decoding step is the model's own forward pass over its KV cache, one new word per
# sentence, and a search chooses the words from the step's probabilities, as a `SearchOptions` says. Greedy search
# takes the most probable word at each step; beam search keeps the 4 best partial translations and ranks finished
# ones by log-probability divided by length^0.6, so that longer translations are not penalised for being longer;
# sampling draws each word from the most probable few (what back-translation uses to vary its synthetic sources),
# each sentence from a generator seeded by `seed` and its place in the input, so the same seed gives the same
# translations. The command line's `--beam 4` and `--sampling-topk 10 --seed 0` make these options.
#
# A model trained only a few steps has not learnt to end a sentence: each search goes on to the length limit,
# by default the longest training target or twice the source plus 10 tokens, whichever is more. `max_length` caps
# that (`--max-length` on the command line): here at the longest source's length plus 10, more than any translation
# of these sentences needs (in Multi30k a translation is about as long as its source), so that a trained model
# translates them as without it.
#
# BLEU is computed by sacreBLEU on detokenized, cased text with its standard `13a` tokenization: scores computed
# on one's own tokenization are not comparable between papers, and sacreBLEU prints a signature (the references,
# case, tokenization, version) that says exactly how a score was computed. Report it with every score.

# %%
sources = read_lines(corpus["val.de"], "val.de")[:200]
references = read_lines(corpus["val.en"], "val.en")[:200]
longest = max(len(translator.source.encode(source)[0]) for source in sources)
cap = longest + 10
print(f"translations capped at {cap} tokens (by default at most {translator.limit(longest)})")
greedy = translator.translate(sources, search=SearchOptions(max_length=cap))
beam = translator.translate(sources, search=SearchOptions(beam_size=4, length_penalty=0.6, max_length=cap))
sampled = translator.translate(sources[:3], search=SearchOptions(sampling_topk=10, seed=0))
for source, one, four, drawn, wanted in list(zip(sources, greedy, beam, sampled, references, strict=False)):
    print(f"{source}\n  greedy: {one}\n  beam 4: {four}\n  sampled: {drawn}\n  reference: {wanted}")
for name, hypotheses in (("greedy", greedy), ("beam 4", beam)):
    scores = score(hypotheses, references)
    print(f"{name}: BLEU {scores['bleu']:.2f} ({scores['signature']['bleu']})")
    assert scores["signature"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


# %% [markdown]
# The cross-attention of a real sentence, subwords merged into words (a source word's column is the sum of its
# subwords' columns, a target word's row the mean of its subwords' rows). What to look for in a trained model:
# an alignment close to the diagonal where the word order is the same; German verbs that come at the end of a clause
# ("..., der auf einer Bank sitzt") attended to when the English verb is written, early; heads that rest on the
# final full stop or on the end token when there is nothing to align with. Each layer and head differs: some look
# at one word, some spread over the sentence.
#
# `make multi30k` trains the recipe for 30 minutes and scores test_2016_flickr: 38.4 cased BLEU greedy on two CPU
# cores (docs/translation.md has the figures, the recipe and how each choice was made).

# %%
translation = translator.attention(sources[1])
path = plot_cross_attention(translation, OUT / "multi30k_attention.png")
print(f"{translation.source!r} -> {translation.target!r}")
print(f"figure: {path}")


# %% [markdown]
# ## Where next
#
# - `README.md` lists the whole API; `docs/performance.md` how fast each path is and why.
# - `multihead train --task reverse|sort|numbers|numbers-to-words|copy|dates`, or `--data your.tsv`, then
#   `multihead translate DIR --plot attention.png "text"`.
