"""Scaled dot-product attention for Keras 3, on any backend.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + mask) V

Paths, one set of rules (those of :mod:`multihead.masks`, as the PyTorch front end follows them), tested to agree;
``implementation`` chooses:

- ``"explicit"``: matmul-softmax-matmul in ``keras.ops``; the only path that returns the weights or drops out
  (with Keras' seeded random ops);
- ``"fused"``: the backend's fused kernel: PyTorch's ``scaled_dot_product_attention`` (adapted to our rules by
  :mod:`multihead.sdpa`, as the PyTorch front end uses it) on the torch backend; ``jax.nn.dot_product_attention``
  on JAX (float32 and half inputs, adapted to our rules: see ``_jax_fused``); TensorFlow has none;
- ``"blocked"``: the scores a block at a time, so the ``Lq × Lk`` score matrix never exists at once and memory
  grows linearly with length (Keras' own layer materialises every score): keys in blocks with an online softmax
  (running max and sum); on TensorFlow (boolean mask or none), queries in chunks, each chunk's softmax over all
  keys at once, whose probabilities a gradient tape keeps up to ``KEPT_SCORES`` of them, and beyond them the
  gradient recomputes chunk by chunk (``_tf_query_chunks``);
- ``"auto"``: explicit for weights and dropout; otherwise, on torch (``AUTO_FUSED_BACKENDS``), fused except for small
  inference on the CPU (:func:`multihead.sdpa.small_inference`, where the explicit math is faster); elsewhere
  blocked beyond ``KEY_BLOCK`` keys, explicit below.

On JAX the explicit and blocked paths run as jitted programs.

The public function checks its arguments; ``_attention`` is the unchecked path the layers call.

Notation: B batch, H query heads, Hkv key/value heads (H % Hkv == 0), Lq query length, Lk key length,
Dk query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import keras
from keras import backend, ops

from multihead import masks
from multihead.checks import check_attention
from multihead.keras.masks import open_dead_rows, restrict
from multihead.keras.tensors import OPS, Tensor, causal_window, dtype_kind
from multihead.validation import check_flag

__all__ = ["IMPLEMENTATIONS", "KEY_BLOCK", "attention"]

IMPLEMENTATIONS = ("auto", "explicit", "fused", "blocked")

KEY_BLOCK = 1024
"""The key length above which the blocked path is taken, and its largest block."""
BLOCK_SCORES = 2**23
"""Scores per block (32 MiB of float32), which bounds the blocked path's working memory whatever the length: the
blocks run one after the other (a TensorFlow graph with a float mask runs up to 10 at once). Larger blocks were
slower, smaller ones no faster (docs/performance.md)."""
KEPT_SCORES = 2**27
"""On TensorFlow's blocked path, up to this many probabilities (512 MiB of float32: B=1, H=8, L=4096) are kept for
the gradient, which then costs the explicit path's four products; beyond, or with an unknown batch size, the
backward pass recomputes them chunk by chunk (a fifth product) and memory stays linear in length. Kept, they cost
memory only where a gradient is taken (docs/performance.md: time and memory both ways)."""


def block_size(batch: int | None, heads: int, length: int) -> int:
    """Keys per block for ``length`` queries (or, on TensorFlow, queries per chunk for ``length`` keys): a power of
    two from 64 to ``KEY_BLOCK`` giving about ``BLOCK_SCORES`` scores per block."""
    size = KEY_BLOCK
    while size > 64 and (batch or 1) * heads * length * size > BLOCK_SCORES:
        size //= 2
    return size


def query_chunk(batch: int | None, heads: int, lq: int, lk: int) -> int:
    """Queries per chunk on TensorFlow's blocked path: ``Lq`` in as many chunks as ``block_size`` rows need, evened
    out, so that padding the last chunk costs fewer rows than there are chunks."""
    chunks = -(-lq // block_size(batch, heads, lk))
    return -(-lq // chunks)


def _check_backend(q: Tensor, k: Tensor, implementation: str) -> None:
    """What a path needs of the backend and the inputs beyond the shared checks."""
    if implementation == "fused" and backend.backend() not in FUSED_BACKENDS:
        raise ValueError(
            f"`implementation`='fused' needs a backend with a fused attention kernel {FUSED_BACKENDS}, "
            f"received the {backend.backend()} backend"
        )
    if implementation == "fused" and not _fused_dtype_ok(backend.standardize_dtype(q.dtype)):
        raise ValueError(
            "`implementation`='fused' on the jax backend needs float32 or half inputs (jax.nn.dot_product_attention "
            "computes the softmax in float32), received float64; use 'explicit', 'blocked' or 'auto'"
        )
    if implementation == "blocked" and (q.shape[2] is None or k.shape[2] is None):
        raise ValueError(
            f"`implementation`='blocked' needs static lengths Lq and Lk, received q.shape={tuple(q.shape)}, "
            f"k.shape={tuple(k.shape)}"
        )


def _rank4(mask: Tensor, dtype: str) -> Tensor:
    """A mask as ``(B|1, H|1, Lq|1, Lk|1)``; a float mask in ``dtype``."""
    mask = ops.convert_to_tensor(mask)
    for _ in range(4 - len(mask.shape)):
        mask = ops.expand_dims(mask, 0)
    return mask if dtype_kind(mask) == "bool" else ops.cast(mask, dtype)


def _compute_dtype(dtype: str) -> str:
    """Scores and softmax run in float32 for half inputs, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


def _scale(q: Tensor, scale: float | None, compute: str) -> float | Tensor:
    """A Python float where possible: ``ops.cast(float, "float64")`` would round it through float32 first."""
    if scale is not None:
        return scale
    dk = q.shape[-1]
    return 1.0 / math.sqrt(dk) if dk is not None else ops.rsqrt(ops.cast(ops.shape(q)[-1], compute))


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    # Key/value head j serves query heads j*G .. (j+1)*G - 1.
    return ops.repeat(x, groups, axis=1) if groups > 1 else x  # (B, H, Lk, D)


def _one_program_on_jax(*static: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """On the jax backend, run the decorated path as one jitted program, compiled once per shapes and values of the
    ``static`` arguments. Op by op, eager JAX compiles every operation anew for every new shape, and a ``fori_loop``
    at every call: tens of milliseconds each. Inside a caller's own ``jax.jit`` the program is inlined."""

    def decorate(path: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(path)
        def run(*args: Any, **kwargs: Any) -> Any:
            if backend.backend() != "jax":
                return path(*args, **kwargs)
            return _jax_jitted(path, static)(*args, **kwargs)

        return run

    return decorate


@functools.cache
def _jax_jitted(path: Callable[..., Any], static: tuple[str, ...]) -> Callable[..., Any]:
    import jax

    return jax.jit(path, static_argnames=static)


def _explicit(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
    seed: int | keras.random.SeedGenerator | None,
) -> tuple[Tensor, Tensor]:
    """Matmul-softmax-matmul: ``(out, weights)``. With dropout it runs op by op (its seed generator's state moves
    on at every call)."""
    if dropout > 0.0:
        return _explicit_math(q, k, v, mask, causal, scale, dropout, seed)
    return _explicit_without_dropout(q, k, v, mask, causal, scale)


@_one_program_on_jax("causal", "scale")
def _explicit_without_dropout(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float | None
) -> tuple[Tensor, Tensor]:
    return _explicit_math(q, k, v, mask, causal, scale, 0.0, None)


def _explicit_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float | None,
    dropout: float,
    seed: int | keras.random.SeedGenerator | None,
) -> tuple[Tensor, Tensor]:
    dtype = backend.standardize_dtype(q.dtype)
    compute = _compute_dtype(dtype)
    lq, lk = ops.shape(q)[2], ops.shape(k)[2]
    if mask is not None:
        mask = _rank4(mask, dtype)
    if causal:
        mask = restrict(mask, causal_window(lq, lk))
    mask, live = open_dead_rows(mask)

    groups = q.shape[1] // k.shape[1]
    k = ops.cast(_repeat_kv(k, groups), compute)  # (B, H, Lk, Dk)
    v = ops.cast(_repeat_kv(v, groups), compute)  # (B, H, Lk, Dv)
    # einsum, not matmul: on the torch backend Keras' matmul computes float64 in float32.
    scores = ops.einsum("bhqd,bhkd->bhqk", ops.cast(q, compute), k) * _scale(q, scale, compute)  # (B, H, Lq, Lk)
    if mask is not None and dtype_kind(mask) == "bool":
        scores = ops.where(mask, scores, ops.cast(float("-inf"), compute))
    elif mask is not None:
        scores = scores + ops.cast(mask, compute)
    # A softmax over one key is exactly 1 (Keras warns on a size-1 softmax axis, which decoding hits at step 1).
    weights = ops.ones_like(scores) if scores.shape[-1] == 1 else ops.softmax(scores, axis=-1)
    if live is not None:
        weights = ops.where(live, weights, ops.zeros_like(weights))
    dropped = keras.random.dropout(weights, dropout, seed=seed) if dropout > 0.0 else weights
    out = ops.einsum("bhqk,bhkd->bhqd", dropped, v)  # (B, H, Lq, Dv)
    return ops.cast(out, dtype), ops.cast(weights, dtype)


@_one_program_on_jax("causal", "scale", "block", "recompute")
def _blocked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    causal: bool,
    scale: float | None,
    block: int | None = None,
    recompute: bool | None = None,
) -> Tensor:
    """The scores a block at a time; needs static ``Lq`` and ``Lk``.

    On TensorFlow without a float mask, queries in chunks of ``block`` rows (``_tf_query_chunks``), whose gradient
    recomputes the probabilities when ``recompute`` (by default: beyond ``KEPT_SCORES`` of them, or with an unknown
    batch size); otherwise keys in blocks of ``block`` with an online softmax (``_blocked_forward``), padded to a
    whole number of blocks, the padding masked. By default, blocks of about ``BLOCK_SCORES`` scores
    (``block_size``, ``query_chunk``).
    """
    dtype = backend.standardize_dtype(q.dtype)
    compute = _compute_dtype(dtype)
    batch, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if lk == 0:  # no key: every row is fully masked (and a loop of no blocks would still be traced on JAX)
        return ops.zeros((batch, heads, lq, v.shape[3]), dtype=dtype)
    groups = heads // k.shape[1]
    k = ops.cast(_repeat_kv(k, groups), compute)  # (B, H, Lk, Dk)
    v = ops.cast(_repeat_kv(v, groups), compute)  # (B, H, Lk, Dv)
    q = ops.cast(q, compute) * _scale(q, scale, compute)  # (B, H, Lq, Dk)
    if mask is not None:
        mask = _rank4(mask, dtype)
    if backend.backend() == "tensorflow" and (mask is None or dtype_kind(mask) == "bool"):
        if recompute is None:
            recompute = batch is None or batch * heads * lq * lk > KEPT_SCORES
        chunk = block or query_chunk(batch, heads, lq, lk)
        return ops.cast(_tf_query_chunks(q, k, v, mask, causal, chunk, recompute), dtype)

    block = block or block_size(batch, heads, lq)
    padding = -(-lk // block) * block - lk

    def pad_keys(x: Tensor, axis: int, value: float | bool) -> Tensor:
        widths = [[0, 0]] * len(x.shape)
        widths[axis] = [0, padding]
        return ops.pad(x, widths, constant_values=value) if padding else x

    k, v = pad_keys(k, 2, 0.0), pad_keys(v, 2, 0.0)  # (B, H, whole blocks, D)
    if mask is not None and mask.shape[-1] != 1:
        mask = pad_keys(mask, 3, False if dtype_kind(mask) == "bool" else float("-inf"))  # (.., whole blocks)
    return ops.cast(_blocked_forward(q, k, v, mask, causal, lk, block), dtype)


def _block_scores(
    q: Tensor, k_block: Tensor, mask: Tensor | None, causal: bool, lk: int, start: Tensor, block: int
) -> tuple[Tensor, Tensor]:
    """Scaled scores of the keys ``start .. start + block - 1`` ``(B, H, Lq, block)``, a float mask added, and
    which of them each query may attend (bool, broadcastable to the scores)."""
    scores = ops.einsum("bhqd,bhkd->bhqk", q, k_block)  # (B, H, Lq, block)
    allowed = ops.expand_dims(start + ops.arange(block), 0) < lk  # (1, block): the keys' padding masked
    if causal:
        allowed = ops.logical_and(allowed, causal_window(q.shape[2], lk, first_key=start, keys=block))  # (Lq, block)
    if mask is not None:
        block_mask = mask
        if mask.shape[-1] != 1:
            block_mask = ops.slice(mask, (0, 0, 0, start), (*mask.shape[:3], block))
        if dtype_kind(block_mask) == "bool":
            allowed = ops.logical_and(allowed, block_mask)
        else:
            scores = scores + ops.cast(block_mask, scores.dtype)
    return scores, allowed


def _key_block(x: Tensor, start: Tensor, block: int) -> Tensor:
    return ops.slice(x, (0, 0, start, 0), (ops.shape(x)[0], ops.shape(x)[1], block, x.shape[3]))  # (B, H, block, D)


def _finite(x: Tensor) -> Tensor:
    """``x`` with ``-inf`` (a row that has seen no allowed key) replaced by 0, so that ``exp(s - x)`` is 0, not NaN."""
    return ops.where(ops.isinf(x), ops.zeros_like(x), x)


def _blocked_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, lk: int, block: int) -> Tensor:
    """``out (B, H, Lq, Dv)`` from scaled ``q`` and keys/values padded to whole blocks.

    Per query row it keeps the running max ``m`` of the scores seen so far, the running sum ``l`` of
    ``exp(score - m)`` and the running ``acc = Σ exp(score - m) · v``, rescaling both when ``m`` grows. A row
    that has seen no allowed key keeps ``m = -inf`` and ``l = acc = 0``, so a fully masked row ends at zero.

    The blocks run in a ``fori_loop``, not an unrolled Python loop: in a TensorFlow graph nothing would order
    unrolled blocks, and the executor computes them all at once, which is the whole score matrix again.
    """
    minus_inf = ops.cast(float("-inf"), q.dtype)

    def step(index: Tensor, state: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        m, total, acc = state
        start = index * block
        scores, allowed = _block_scores(q, _key_block(k, start, block), mask, causal, lk, start, block)
        scores = ops.where(allowed, scores, minus_inf)
        # The running max only shifts the exponents: the output does not depend on it, so no gradient goes through
        # it (the terms would cancel; through a max over -inf entries, XLA:CPU without optimisations makes them NaN).
        block_max = ops.stop_gradient(ops.max(scores, axis=-1, keepdims=True))
        m_new = ops.where(block_max > m, block_max, m)  # not ops.maximum: on torch it returns float32
        shift = _finite(m_new)
        p = ops.exp(scores - shift)  # (B, H, Lq, block)
        rescale = ops.exp(m - shift)
        total = total * rescale + ops.sum(p, axis=-1, keepdims=True)
        acc = acc * rescale + ops.einsum("bhqk,bhkd->bhqd", p, _key_block(v, start, block))
        return m_new, total, acc

    batch, heads, lq = ops.shape(q)[0], ops.shape(q)[1], q.shape[2]
    row_shape = (batch, heads, lq, 1)
    state = (
        ops.full(row_shape, float("-inf"), dtype=q.dtype),  # m: (B, H, Lq, 1)
        ops.zeros(row_shape, dtype=q.dtype),  # total: (B, H, Lq, 1)
        ops.zeros((batch, heads, lq, v.shape[3]), dtype=q.dtype),  # acc: (B, H, Lq, Dv)
    )
    _, total, acc = ops.fori_loop(0, k.shape[2] // block, step, state)
    return acc / ops.where(total > 0, total, ops.ones_like(total))  # (B, H, Lq, Dv)


def _tf_query_chunks(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, chunk: int, recompute: bool
) -> Tensor:
    """TensorFlow's blocked path: queries in chunks of ``chunk`` rows, each chunk's softmax over all keys at once,
    from scaled ``q``, keys/values with one head per query head and a boolean mask or none; a fully masked row has
    probabilities ``P = 0``, hence zero output and gradients.

    The chunks run one after the other in a loop. Without ``recompute``, TensorFlow differentiates the loop, which
    keeps every chunk's ``P`` for the backward pass (``Lq × Lk`` in all, but only where a gradient is taken). With
    ``recompute``, the gradient goes chunk by chunk too, the probabilities recomputed (FlashAttention's backward
    pass, by query rows): with ``D = rowsum(dO ∘ O)``, ``dS = P ∘ (dO Vᵀ - D)``, ``dQ = dS K``, and
    ``dK += dSᵀ Q``, ``dV += Pᵀ dO`` over the chunks. Nothing ``Lq × Lk`` exists then, only ``chunk × Lk`` per
    chunk.

    Why not key blocks with an online softmax here: TensorFlow's fused softmax and oneDNN's matmuls on whole rows
    are faster than key blocks compiled as an XLA cluster (XLA:CPU's matmuls are slower than oneDNN's; without XLA,
    a graph runs the online softmax's elementwise operations one by one, slower still): docs/performance.md.
    """
    chunks = _QueryChunks(q, k, mask, causal, chunk)
    attend = chunks.recomputed if recompute else chunks.attend
    return attend(chunks.pad_rows(q, 0.0), k, v)[:, :, : q.shape[2]]


class _QueryChunks:
    """The loops of :func:`_tf_query_chunks` over ``count`` chunks of ``chunk`` query rows (the last one padded)."""

    def __init__(self, q: Tensor, k: Tensor, mask: Tensor | None, causal: bool, chunk: int) -> None:
        import tensorflow as tf

        self.tf = tf
        self.lq, self.lk, self.causal, self.chunk = q.shape[2], k.shape[2], causal, chunk
        self.count = -(-self.lq // chunk)
        self.padding = self.count * chunk - self.lq
        self.mask = (
            self.pad_rows(mask, True) if mask is not None and mask.shape[2] != 1 else mask
        )  # (.., count*chunk, .)

    def pad_rows(self, x: Tensor, value: float | bool) -> Tensor:
        if not self.padding:
            return x
        return self.tf.pad(x, [[0, 0], [0, 0], [0, self.padding], [0, 0]], constant_values=value)

    def rows(self, x: Tensor, index: Tensor) -> Tensor:
        return self.tf.slice(x, [0, 0, index * self.chunk, 0], [-1, -1, self.chunk, -1])  # (B, H, chunk, .)

    def probabilities(self, q_rows: Tensor, k: Tensor, index: Tensor) -> Tensor:
        tf = self.tf
        scores = tf.matmul(q_rows, k, transpose_b=True)  # (B, H, chunk, Lk)
        mask = self.mask
        allowed = self.rows(mask, index) if mask is not None and mask.shape[2] != 1 else mask
        if self.causal:
            window = causal_window(self.lq, self.lk, first_query=index * self.chunk, queries=self.chunk)
            allowed = restrict(allowed, window)
        allowed, live = open_dead_rows(allowed)
        if allowed is not None:
            scores = tf.where(allowed, scores, tf.constant(float("-inf"), scores.dtype))
        weights = tf.nn.softmax(scores)
        return weights if live is None else tf.where(live, weights, tf.zeros_like(weights))

    def loop(self, body: Callable[..., tuple], *state: Any) -> tuple:
        # One chunk at a time: by default a graph's while loop runs 10 iterations at once, 10x the memory.
        count = self.count
        return self.tf.while_loop(lambda index, *_: index < count, body, (0, *state), parallel_iterations=1)[1:]

    def joined(self, chunks: Any) -> Tensor:
        tf = self.tf
        stacked = chunks.stack()  # (count, B, H, chunk, D)
        shape = (tf.shape(stacked)[1], stacked.shape[2], self.count * self.chunk, stacked.shape[4])
        return tf.reshape(tf.transpose(stacked, [1, 2, 0, 3, 4]), shape)  # (B, H, count*chunk, D)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The output ``(B, H, count*chunk, Dv)``; differentiated by TensorFlow, which keeps each chunk's ``P``."""

        def forward(index: Tensor, outs: Any) -> tuple[Tensor, Any]:
            return index + 1, outs.write(index, self.tf.matmul(self.probabilities(self.rows(q, index), k, index), v))

        (outs,) = self.loop(forward, self.tf.TensorArray(q.dtype, size=self.count))
        return self.joined(outs)

    def recomputed(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """:meth:`attend` with a gradient that recomputes the probabilities chunk by chunk."""

        @self.tf.custom_gradient
        def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Callable[[Tensor], tuple[Tensor, ...]]]:
            out = self.attend(q, k, v)
            return out, lambda d_out: self.gradient(q, k, v, out, d_out)

        return attend(q, k, v)

    def gradient(self, q: Tensor, k: Tensor, v: Tensor, out: Tensor, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        tf = self.tf
        row_dot = tf.reduce_sum(d_out * out, axis=-1, keepdims=True)  # D: (B, H, count*chunk, 1)

        def backward(index: Tensor, d_q: Any, d_k: Tensor, d_v: Tensor) -> tuple[Tensor, Any, Tensor, Tensor]:
            q_rows, d_rows = self.rows(q, index), self.rows(d_out, index)
            weights = self.probabilities(q_rows, k, index)  # (B, H, chunk, Lk)
            d_scores = weights * (tf.matmul(d_rows, v, transpose_b=True) - self.rows(row_dot, index))
            d_k = d_k + tf.matmul(d_scores, q_rows, transpose_a=True)
            d_v = d_v + tf.matmul(weights, d_rows, transpose_a=True)
            return index + 1, d_q.write(index, tf.matmul(d_scores, k)), d_k, d_v

        d_q, d_k, d_v = self.loop(
            backward, tf.TensorArray(q.dtype, size=self.count), tf.zeros_like(k), tf.zeros_like(v)
        )
        return self.joined(d_q), d_k, d_v


def _blocks_pay(q: Tensor, k: Tensor) -> bool:
    """Whether ``"auto"`` takes the blocked path: beyond ``KEY_BLOCK`` keys, for memory."""
    return q.shape[2] is not None and k.shape[2] is not None and k.shape[2] > KEY_BLOCK


FUSED_BACKENDS = ("torch", "jax")
"""Backends with a fused attention kernel that gives exactly our results (on JAX after the adaptations of
``_jax_fused``, and not for float64, whose softmax that kernel computes in float32)."""
AUTO_FUSED_BACKENDS = ("torch",)
"""Backends whose kernel ``"auto"`` takes. Not JAX: without an explicit ``implementation="cudnn"`` (GPU only),
``jax.nn.dot_product_attention`` is XLA's own matmul-softmax-matmul, in a ``(B, L, H, D)`` layout that costs two
transposes and a vmap over head groups: slower than the explicit path on CPU (docs/performance.md)."""


def _fused_dtype_ok(dtype: str) -> bool:
    return backend.backend() != "jax" or dtype != "float64"


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    causal: bool,
    scale: float | None,
    dropout: float,
    return_weights: bool,
    seed: int | keras.random.SeedGenerator | None,
    implementation: str,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`attention` on checked arguments; ``dropout`` is 0 outside training."""
    path = _auto_path(q, k, v, dropout, return_weights) if implementation == "auto" else implementation
    if path == "explicit":
        out, weights = _explicit(q, k, v, mask, causal, scale, dropout, seed)
        return (out, weights) if return_weights else out
    # The blocked loop needs at least one score per block; nor does a kernel have work: an empty batch or query
    # sequence takes the explicit math.
    if q.shape[0] == 0 or q.shape[2] == 0:
        return _explicit(q, k, v, mask, causal, scale, 0.0, None)[0]
    if path == "fused":
        return _fused(q, k, v, mask, causal, scale)
    return _blocked(q, k, v, mask, causal, scale)


def _auto_path(q: Tensor, k: Tensor, v: Tensor, dropout: float, return_weights: bool) -> str:
    """The path ``"auto"`` takes (see the module's docstring)."""
    if return_weights or dropout > 0.0:
        return "explicit"
    if backend.backend() in AUTO_FUSED_BACKENDS:
        from multihead import sdpa  # the torch backend: its tensors are torch tensors

        return "explicit" if sdpa.small_inference(q, k, v, dropout) else "fused"
    return "blocked" if _blocks_pay(q, k) else "explicit"


def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float | None) -> Tensor:
    """The backend's fused kernel (see ``FUSED_BACKENDS``)."""
    mask = None if mask is None else _rank4(mask, backend.standardize_dtype(q.dtype))
    q, k, v = (ops.convert_to_tensor(x) for x in (q, k, v))
    if backend.backend() == "jax":
        return _jax_fused(q, k, v, mask, causal, _scale(q, scale, "float32"))
    from multihead import sdpa

    return sdpa.fused(q, k, v, mask, causal=causal, scale=scale, dropout=0.0, ops=OPS)


def _jax_fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float) -> Tensor:
    """``jax.nn.dot_product_attention``, adapted where its rules differ from ours:

    - its layout is ``(B, L, H, D)``: transposed in and out;
    - it needs ``Dv == Dk``: the narrower side is padded with zeros (exact: zeros add nothing to a dot product; the
      scale is the real one) and the output cut back to ``Dv``;
    - its ``is_causal`` is top-left aligned, and a fully masked row gets a finite fill and comes out as the mean of
      the values (a float mask, its ``bias``, would give a row of ``-inf``, NaN through the softmax): as for every
      kernel, :func:`multihead.masks.for_kernel` puts our causal rule into the mask unless ``Lq == Lk``, opens dead
      rows and gives the ``live`` mask that zeroes them, and their gradients;
    - half inputs are computed in float32 and the result cast back, as on our other paths: with float16 the kernel's
      mixed-precision matmul fails to compile on CPU inside ``jax.jit``, and with bfloat16 it rounds the
      probabilities to bfloat16 before multiplying the values.

    What it shares with ours: ``True`` = attend, masks broadcast over heads, grouped-query heads (query head ``h``
    reads key/value head ``h // (H / Hkv)``). Not float64: its softmax runs in float32 whatever the input. The
    call is jitted, so that in eager code it is one program rather than a dozen dispatched operations.
    """
    mask, kernel_causal, live = masks.for_kernel(mask, causal, q, k, OPS)
    bool_mask = mask if mask is not None and dtype_kind(mask) == "bool" else None
    bias = mask if mask is not None and bool_mask is None else None
    return _jax_attention_program()(q, k, v, bool_mask, bias, live, kernel_causal, scale)


@functools.cache
def _jax_attention_program() -> Any:
    import jax

    def run(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        live: Tensor | None,
        is_causal: bool,
        scale: float,
    ) -> Tensor:
        dtype = q.dtype
        dk, dv = q.shape[3], v.shape[3]
        width = max(dk, dv)

        def widen(x: Tensor) -> Tensor:
            if x.shape[3] == width:
                return x
            return jax.numpy.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[3])))  # (B, heads, L, width)

        q, k, v = (jax.numpy.swapaxes(widen(x.astype("float32")), 1, 2) for x in (q, k, v))  # (B, L, heads, W)
        bias = None if bias is None else bias.astype("float32")
        out = jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal)  # (B, Lq, H, W)
        out = jax.numpy.swapaxes(out, 1, 2)[..., :dv]  # (B, H, Lq, Dv)
        if live is not None:
            out = jax.numpy.where(live, out, jax.numpy.zeros((), out.dtype))
        return out.astype(dtype)

    return jax.jit(run, static_argnames=("is_causal", "scale"))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout: float = 0.0,
    return_weights: bool = False,
    training: bool = False,
    seed: int | keras.random.SeedGenerator | None = None,
    implementation: str = "auto",
) -> Tensor | tuple[Tensor, Tensor]:
    """Scaled dot-product attention.

    Args:
        q: ``(B, H, Lq, Dk)``.
        k: ``(B, Hkv, Lk, Dk)``; ``H`` must be a multiple of ``Hkv`` (grouped-query attention: key/value head
            ``j`` serves query heads ``j*H/Hkv .. (j+1)*H/Hkv - 1``).
        v: ``(B, Hkv, Lk, Dv)``.
        mask: broadcastable to ``(B, H, Lq, Lk)``. Boolean: ``True`` = attend. Floating: added to the scores
            (``0`` keeps, ``-inf`` removes). Integer masks are rejected.
        causal: bottom-right aligned causal masking (query ``i`` sees key ``j`` iff ``j <= i + Lk - Lq``),
            combined with ``mask`` by AND.
        scale: multiplies the scores; default ``1/sqrt(Dk)``.
        dropout: probability of dropping an attention weight, applied only when ``training`` is true.
        return_weights: also return the per-head weights ``(B, H, Lq, Lk)`` (before dropout).
        training: whether dropout applies.
        seed: an int or a ``keras.random.SeedGenerator`` for the dropout.
        implementation: ``"auto"`` (default), ``"explicit"``, ``"fused"`` or ``"blocked"`` (see the module's
            docstring). Only ``"explicit"`` (and ``"auto"``) return weights or drop out.

    Returns:
        ``out (B, H, Lq, Dv)`` in the inputs' dtype, or ``(out, weights)``. Query rows that may attend no key
        give zero output and zero weights, with zero gradients.

    Example:
        >>> import numpy as np
        >>> q = k = v = np.random.randn(2, 8, 5, 64).astype("float32")
        >>> tuple(attention(q, k, v, causal=True).shape)
        (2, 8, 5, 64)
    """
    scale = check_attention(
        q, k, v, mask, OPS, causal=causal, scale=scale, dropout=dropout, return_weights=return_weights,
        implementation=implementation, implementations=IMPLEMENTATIONS,
    )  # fmt: skip
    _check_backend(q, k, implementation)
    check_flag("training", training)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, keras.random.SeedGenerator))):
        raise TypeError(f"`seed` must be None, an int or a keras.random.SeedGenerator, received {seed!r}")
    dropout = dropout if training else 0.0
    if dropout > 0.0 and implementation in ("fused", "blocked"):
        raise ValueError(f"`implementation`={implementation!r} cannot drop out; use 'explicit' or 'auto'")
    return _attention(
        q, k, v, mask, causal=causal, scale=scale, dropout=dropout, return_weights=return_weights, seed=seed,
        implementation=implementation,
    )  # fmt: skip
