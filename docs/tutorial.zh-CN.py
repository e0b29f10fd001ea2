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
# # 注意力机制，一步一步来
#
# 本教程沿着《Attention Is All You Need》（Vaswani 等，2017），
# 从单个注意力头一直讲到一个训练好的翻译模型。每一步都写两遍：
# 一遍按论文的写法用 PyTorch 手写，一遍用 `multihead`；
# 两者都与 `multihead.reference`（一个朴素的 NumPy float64 实现）逐一核对。
# 形状沿用论文的设定：`d_model = 512`，`h = 8` 个头，`d_k = d_v = 64`。
#
# 这是英文原版 `docs/tutorial.py` 的简体中文译本，
# 同样是 jupytext "percent" 格式的脚本。可以直接运行它
# （`.venv/bin/python docs/tutorial.zh-CN.py`），
# 也可以用 `make notebooks` 生成笔记本，然后打开 `docs/tutorial.zh-CN.ipynb`。
# 图片写入 `runs/tutorial/`（环境变量 `MULTIHEAD_TUTORIAL_OUT` 可以改变这个目录；
# `MULTIHEAD_TUTORIAL_STEPS` 设置第 6 和第 9 部分的训练步数，默认为 1500，第 9 部分最多训练 5 分钟；
# `MULTI30K` 指定 Multi30k 所在的文件夹）。
# 在两个 CPU 核心上运行约 8 分钟（第 6 部分的训练约 2 分钟，第 9 部分 5 分钟），
# 设 `MULTIHEAD_TUTORIAL_STEPS=20` 时约 2 分钟。
# 正文对每一步计算的说法都由代码里的 `assert` 检查，测试会把本教程从头到尾运行一遍（用这 20 步），
# 因此它不会与库的实际行为脱节。
# 代码、代码注释和打印输出都保留英文，与英文版一字不差，这样两个版本运行的是同一份代码。
#
# 记号：`B` 批大小，`L` 序列长度（`Lq` 为查询数，`Lk` 为键数），`h` 头数，
# `d_k`/`d_v` 每个头的维度。

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
# ## 1. 五步实现缩放点积注意力
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{QK^\top}{\sqrt{d_k}}\right)V$$
#
# 每个查询都与每个键做比较（点积），得分乘以 $1/\sqrt{d_k}$ 进行缩放，
# 查询不允许看到的位置被掩蔽，softmax 把每一行得分变成和为 1 的权重，
# 输出就是值向量的加权平均。
# 函数式接口的布局是 `(B, h, L, d)`：批、头、长度、每个头的维度。

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
# 为什么要除以 $\sqrt{d_k}$？若各分量的方差为 1，两个 `d_k` 维向量的点积方差为 `d_k`：
# `d_k = 64` 时标准差为 8。这么大的得分会把 softmax 推入饱和区，
# 几乎全部权重都落在一个键上，梯度随之消失。
# 除以 $\sqrt{d_k}$ 之后，得分的离散程度回到 1 左右。

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
# ## 2. 多头注意力：投影、拆分成头、计算注意力、拼接、再投影
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)W^O,\quad
# \mathrm{head}_i = \mathrm{Attention}(QW_i^Q, KW_i^K, VW_i^V)$$
#
# `h` 个投影 $W_i^Q$ 就是同一个 `Linear(d_model, h·d_k)` 按行分出的块：
# 第 `i` 个头拥有 `q_proj` 的第 `i·d_k:(i+1)·d_k` 行。
# 拆分成头只是一次 reshape：`(B, L, h·d_k) → (B, L, h, d_k) → (B, h, L, d_k)`。
# 下面先用模块自己的权重手工计算，再调用模块本身。

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
# 同一个模块还能做交叉注意力（查询来自一个序列，键和值来自另一个长度不同的序列），
# 以及分组查询注意力（GQA），即若干个查询头共享同一个键/值头（`num_kv_heads`）：

# %%
memory = torch.randn(B, 9, d_model, dtype=torch.float64)  # an encoder output of length 9
print("cross-attention       ", tuple(mha(x, memory).shape))
gqa = MultiHeadAttention(d_model, h, num_kv_heads=2)
print("GQA k_proj            ", tuple(gqa.k_proj.weight.shape), "(2 key/value heads of 64 for 8 query heads)")

# %% [markdown]
# ## 3. 掩码：填充掩码与前瞻掩码，以及为什么 `True` 表示“可以关注”
#
# Transformer 中有两种掩码。**填充掩码**遮住那些为了把短句补齐到批内长度而填充的位置；
# 它每个序列一行，形状为 `(B, Lk)`，在查询和头这两个维度上广播。
# **前瞻掩码（因果掩码）**让解码器看不到未来：只有当 `j ≤ i` 时，查询 `i` 才能关注键 `j`。
# 两者都是布尔张量，`True` 表示“这个查询可以关注这个键”，组合时取逻辑与（AND）。
#
# 为什么采用这种极性？它读起来就是它所表达的那句话；
# `scaled_dot_product_attention`、Keras 的 `attention_mask` 和 JAX 都采用这种约定；
# 而且全为 `True` 的掩码就表示“不做掩蔽”。
# （`torch.nn.MultiheadAttention` 采用相反的极性，见下文的常见错误。）

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
# 填充掩码让被填充的键不可见：带填充的序列在真实位置上得到的结果，
# 与不带填充的同一序列完全相同。

# %%
padded = mha(x, key_mask=key_padding)
alone = mha(x[1:, :4])  # sequence 1 without its two padding positions
print("real positions, padded vs alone:", largest_difference(padded[1, :4], alone[0]))
assert largest_difference(padded[1, :4], alone[0]) < 1e-12

# %% [markdown]
# ## 4. 层归一化与前馈网络
#
# 每个子层的输出都与该子层的输入相加，再做归一化：`LayerNorm(x + Sublayer(x))`。
# 层归一化把每个位置的 `d_model` 个特征重新缩放到均值 0、方差 1，
# 再乘以可学习的增益、加上可学习的偏置。
# 逐位置前馈网络是两个线性层，中间夹一个 ReLU：`max(0, xW₁ + b₁)W₂ + b₂`，
# 内部维度为 `d_ff = 2048`。

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
# ## 5. 编码器块
#
# 一个编码器层先做自注意力，再做前馈网络，两者各自包在残差连接和 LayerNorm 之中
# （即论文中的“后归一化”（post-norm）；`norm_first=True` 则给出大多数现代模型采用的
# 前归一化（pre-norm）变体）。

# %%
encoder_layer = EncoderLayer(d_model, h, 2048, dropout=0.0).double().eval()
after_attention = encoder_layer.norm1(x + encoder_layer.self_attn(x, key_mask=key_padding))  # (B, L, d_model)
by_hand = encoder_layer.norm2(after_attention + encoder_layer.feed_forward(after_attention))  # (B, L, d_model)
print("encoder layer by hand vs EncoderLayer:", largest_difference(by_hand, encoder_layer(x, key_mask=key_padding)))
assert largest_difference(by_hand, encoder_layer(x, key_mask=key_padding)) < 1e-12

# %% [markdown]
# ## 6. 在 `dates` 任务上训练完整的 Transformer
#
# 内置的 `dates` 任务要求模型把各种写法的日期
# （“21 November 2026”“Tue Mar 9 2021”“the 4th of July 1976”）改写成 `YYYY-MM-DD`。
# 数据是程序生成的，无需下载，并留出 1000 个样例用于评估。
# `multihead.app.training` 在这个任务上训练一个编码器-解码器 Transformer
# （编码器和解码器各 2 层，`d_model = 128`）；命令行
# `multihead train --task dates --steps 1500 --out runs/dates` 做的是同一件事。
# 在两个 CPU 核心上大约需要两分钟；训练完成后，模型能把至少 98% 的留出日期完全转换正确
# （测试只训练几步，所以那时的翻译仍然是错的）。
# 如果运行目录已经存在，训练会从其中最新的检查点继续。

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
# 模型看的是哪里？解码器的交叉注意力权重告诉我们，每个输出字符分别取自哪些输入字符。
# 训练之后，负责读取年份的那些头在写出年份时盯着年份的各位数字，
# 随后转向月份和日期。

# %%
translation = translator.attention("21 November 2026")
path = plot_cross_attention(translation, OUT / "dates_attention.png")
print(f"figure: {path}")

# %% [markdown]
# ## 7. 注意力代码中的常见错误
#
# 下面的每个错误都先用一个很小的朴素实现来展示（正如它在那些被广泛转抄的教程里出现的样子），
# 再给出本库在同一输入上的行为。
#
# ### 7.1 在 `forward`（或 Keras 的 `call`）中创建投影层
#
# 在前向传播中创建的层，每次调用都是一个新的、随机初始化的层：
# 它不是模块的参数，优化器永远看不到它，而且同一个输入每次得到的输出都不一样。


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
# ### 7.2 用 `d_model` 而不是 `d_k` 做缩放
#
# 缩放因子是 $1/\sqrt{d_k}$，其中 `d_k` 是每个头的维度（64），而不是模型维度（512）。
# 除以 $\sqrt{512}$ 会让每个头的权重平坦得多：模型仍然能够学习，
# 但它的起点是一种“哪里都不特别关注”的注意力，输出也不再是论文中的那个结果。

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
# ### 7.3 半精度下的 `-1e9`
#
# float16 能表示的最大值是 65504。用 `-1e9` 填充被掩蔽的得分，要么直接报错，
# 要么（当掩码以浮点张量的形式加到得分上时）溢出为 `-inf`，
# 于是整行都被掩蔽的那一行就变成 NaN。本库从不把填充常数写进半精度张量：
# 得分和 softmax 都以 float32 计算，被掩蔽的位置直接剔除，结果再转换回原来的类型。

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
# ### 7.4 整行被掩蔽
#
# 如果一个查询的所有键都被掩蔽（左填充批次中被填充的查询行、长度为零的句子、
# 其中空无一物的滑动窗口），就没有可供归一化的权重。
# 用 `-inf` 时，朴素的 softmax 会计算 0 除以 0，返回 NaN，NaN 随后沿梯度扩散开来；
# 用 `-1e9` 时，它会悄无声息地返回所有值向量的平均。
# `torch.nn.MultiheadAttention` 在要求返回权重时给出 NaN。
# 本库明确规定了结果：在每条计算路径上，输出为 0、权重为 0、梯度为 0。

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
# ### 7.5 PyTorch 的两种掩码极性
#
# `torch.nn.functional.scaled_dot_product_attention` 把布尔掩码理解为 `True` = 关注；
# `torch.nn.MultiheadAttention` 则把 `attn_mask` 和 `key_padding_mask` 理解为 `True` = **忽略**。
# 同一个掩码分别传给两者，得到的注意力恰好相反，而且不会有任何报错。
# 本库处处只用一种极性，只在边界处做转换：`MultiHeadAttention.from_torch(m)` 复制权重，
# PyTorch 的掩码则取反后再传给它（`mask=~attn_mask`）。

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
# ### 7.6 使用 KV 缓存时的因果对齐
#
# 带缓存解码时，新的查询是序列的*最后*几个位置：`Lq` 个新词元关注 `Lk ≥ Lq` 个键。
# 以左上角为锚点的下三角掩码（`torch.tril(ones(Lq, Lk))`，
# 或 `scaled_dot_product_attention(..., is_causal=True)`）只让最新的词元看到最前面的几个键。
# 因果掩码必须以右下角为锚点：查询 `i` 可以关注键 `j`，当且仅当 `j ≤ i + Lk − Lq`。

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
# ## 8. Keras 中的同一个层
#
# `multihead.keras` 为 Keras 3（默认使用 TensorFlow 后端）提供同样的组件，名字也相同。
# 权重以同一种 safetensors 格式保存，键名与 PyTorch 的 state dict 一致，
# 因此在一个框架中训练的层可以加载到另一个框架中，并给出相同的输出。

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
# ## 9. 真实语言：在 Multi30k 上学习德译英
#
# `dates` 任务的数据是生成的，真实句子则不然。Multi30k（Elliott 等，2016）收录了 29,000 条德语图片描述及其英文
# 译文，另有 1,014 条验证句和 1,000 条测试句：小到可以在笔记本电脑上训练，又真实到需要用上前面的一切。
# 从 https://github.com/multi30k/dataset 获取（`data/task1/raw` 中的 `train`、`val`、`test_2016_flickr` 的
# `.de` 与 `.en` 的 gzip 文件），并把环境变量 `MULTI30K` 设为该文件夹（默认查找 `../shared/data/multi30k`）。
# 找不到时，本单元会说明，并改用一个极小的自制语料训练，使下面的内容仍能运行。
#
# 训练用的是命令行自己的配方（`multihead train --data ... --minutes 5`）：在两种语言上共同学习一个 8,000
# 个子词的字节对词表，3+3 层、`d_model = 256` 的 Transformer，每批 4,096 个词元，标签平滑与预热学习率。
# 这里训练五分钟；测试只训练几步，所以那里的译文仍然很差。

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
# 子词：词表保留常见词的完整形式，把罕见词拆成已知的片段，因此不会有词表外的词。`▁` 表示一个词的开头；
# 把片段拼回去就得到原句。

# %%
translator = Translator(run)
sentence = read_lines(corpus["val.de"], "val.de")[0]
ids, unknown = translator.source.encode(sentence)
print(sentence)
print(" | ".join(translator.source.pieces(ids)))
assert unknown or translator.source.decode(ids) == sentence  # the pieces put back together are the sentence


# %% [markdown]
# 批量翻译：长度相近的句子放在同一批，每句一结束就离开批次。每一步解码就是模型自身在 KV 缓存上的前向计算，
# 每句一个新词；搜索按 `SearchOptions` 的设置从这一步的概率中选词。贪心搜索每一步取概率最大的词；束搜索保留 4 个
# 最好的部分译文，并按对数概率除以长度的 0.6 次方为完成的译文排序，使较长的译文不因更长而吃亏；采样从最可能的
# 几个词中抽取每个词（回译用它让合成的源句多样），每句的随机数生成器由 `seed` 和该句在输入中的位置决定，
# 同样的种子给出同样的译文。命令行的 `--beam 4` 和 `--sampling-topk 10 --seed 0` 就是这些选项。
#
# 只训练了几步的模型还没学会结束句子：每次搜索都会一直走到长度上限，默认是训练中最长的目标句与源句两倍加 10 个
# 词元两者中较大的那个。`max_length` 可以限制它（命令行上是 `--max-length`）：这里取最长源句的长度加 10，
# 比这些句子的任何译文所需的都多（Multi30k 中译文与源句长度相当），所以训练好的模型的译文不受它影响。
#
# BLEU 由 sacreBLEU 在去分词、区分大小写的文本上用标准的 `13a` 分词计算：用各自分词算出的分数在论文之间无法
# 比较，而 sacreBLEU 会打印一个签名（参考译文数、大小写、分词方式、版本），准确说明分数是怎样算出的。
# 报告分数时请一并给出签名。

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
# 一个真实句子的交叉注意力，子词合并为词（源词一列是其子词各列之和，目标词一行是其子词各行的平均）。
# 训练好的模型中值得看的：语序相同处，对齐接近对角线；德语从句末尾的动词（"..., der auf einer Bank sitzt"）
# 在英文动词较早写出时就被关注；无可对齐时，有些头停在句末句号或结束符上。每一层、每个头都不同：有的只看
# 一个词，有的分散在整句上。
#
# `make multi30k` 按配方训练 30 分钟并在 test_2016_flickr 上评分：在两个 CPU 核上贪心解码得到 38.4 的
# 区分大小写 BLEU（docs/translation.md 给出了各项数据、配方以及每个选择的由来）。

# %%
translation = translator.attention(sources[1])
path = plot_cross_attention(translation, OUT / "multi30k_attention.png")
print(f"{translation.source!r} -> {translation.target!r}")
print(f"figure: {path}")


# %% [markdown]
# ## 接下来
#
# - `README.md` 列出了完整的 API（中文概览见 `README.zh-CN.md`）；
#   `docs/performance.md` 介绍每条路径有多快，以及为什么。
# - `multihead train --task reverse|sort|numbers|numbers-to-words|copy|dates`，或 `--data your.tsv`，
#   然后 `multihead translate DIR --plot attention.png "text"`。
