"""Compiled generation for the Keras :class:`~multihead.keras.Transformer`: one traced program per decoding step.

Eager decoding (``multihead.keras.transformer._Decoding``) dispatches every operation of every step, which on
TensorFlow costs about 2 ms per ``Dense`` call, and on JAX compiles every operation anew for every new cache length.
Here a step (embedding, every decoder layer, the output projection, the log-softmax) is traced once into one
program over fixed shapes (``tf.function`` on TensorFlow, XLA optional: ``TF_JIT_COMPILE``; ``jax.jit`` on JAX,
weights passed in through a ``keras.StatelessScope``) and runs as one call per step:

- the self-attention cache of each layer is a buffer ``(N, Hkv, C, D)`` of capacity ``C``; a step writes its keys
  and values at its position, a tensor (so the program is not traced again at the next step), and attends over
  the whole buffer with a validity mask (keys ``0..position``);
- the cross-attention keys and values are projected from the encoder memory once, by a start program that also
  encodes the source;
- beam search's reordering waits for the next step, whose program gathers every buffer by the rows kept;
- without the cache (``use_cache=False``) a step rewrites one position of a ``(N, C)`` token buffer and recomputes
  every position: causal self-attention keeps later positions from changing the step's logits.

The programs are kept per model, capacity and mode, so later ``generate`` calls reuse them (``tf.function`` traces
again for a second batch size or source length, then generalises; JAX and XLA compile once per shape).

Notation: B batch, N = B (greedy) or B * beam_size rows, Ls source length, C capacity, E d_model, V vocabulary,
Hkv key/value heads, Dk/Dv head dims.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from keras import backend, ops

from multihead import decoding
from multihead.keras.masks import Tensor

COMPILED_BACKENDS = ("tensorflow", "jax")
"""Backends with compiled generation; on the torch backend generation runs eagerly."""
TF_JIT_COMPILE = False
"""Whether the TensorFlow programs are compiled by XLA (``jit_compile=True``). Measured on the benchmark's model
(docs/performance.md), XLA makes a step about 20% faster but the first call slower (9.4 s against 6.6 s), and it
compiles again for every new batch size and source length, where a ``tf.function`` traced with
``reduce_retracing`` serves them all after its second shape. Set it to True for generation at fixed shapes."""
CAPACITY_STEP = 16
"""Capacities are rounded up to a multiple of this, so that nearby ``max_len`` share one program."""

State = tuple[Any, ...]


class _SelfBuffer:
    """One layer's self-attention cache inside a traced step: a ``(N, Hkv, C, D)`` buffer for keys and one for
    values, written at ``position``; the attention reads all of it, masked to the positions written so far."""

    def __init__(self, keys: Tensor, values: Tensor, position: Tensor) -> None:
        self.keys, self.values, self.position = keys, values, position

    def keys_and_values(self, self_attention: bool, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple:
        k, v = project()  # (N, Hkv, 1, D)
        start = _start(self.position, 2, 4)
        self.keys = ops.slice_update(self.keys, start, k)  # (N, Hkv, C, Dk)
        self.values = ops.slice_update(self.values, start, v)  # (N, Hkv, C, Dv)
        return self.keys, self.values


def _start(position: Tensor, axis: int, rank: int) -> tuple[Tensor, ...]:
    """Start indices of a slice at ``position`` on ``axis``, all of the position's integer type (JAX refuses a mix,
    which Python's 0 becomes when 64-bit types are enabled)."""
    zero = ops.zeros_like(position)
    return tuple(position if index == axis else zero for index in range(rank))


class _MemoryBuffer:
    """One layer's cross-attention keys and values, projected from the memory by the start program; never
    projected again (so the decoder needs no memory tensor)."""

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values

    def keys_and_values(self, self_attention: bool, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple:
        return self.keys, self.values


class _Buffers:
    """What the decoder reads as its cache inside a traced step (a :class:`multihead.cache.DecoderCache` in
    shape): per layer a self-attention buffer and the projected memory; ``length`` is the step's position."""

    def __init__(self, position: Tensor, self_keys: list, self_values: list, memory_keys: list, memory_values: list):
        self.length = position
        self.self_attention = [_SelfBuffer(k, v, position) for k, v in zip(self_keys, self_values, strict=True)]
        self.cross_attention = [_MemoryBuffer(k, v) for k, v in zip(memory_keys, memory_values, strict=True)]


def _gather(state: State, rows: Tensor | None) -> State:
    """Rows ``rows`` of every tensor in ``state`` (``None`` entries stay)."""
    if rows is None:
        return state
    return keras.tree.map_structure(lambda x: None if x is None else ops.take(x, rows, axis=0), state)


def _programs(model: Any, use_cache: bool, capacity: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The start and step programs of ``model`` for this mode and capacity, traced on first use and kept in the
    model's ``generation_programs``."""
    key = (use_cache, capacity, TF_JIT_COMPILE)
    if key not in model.generation_programs:
        start, step = (_cached if use_cache else _recomputed)(model, capacity)
        model.generation_programs[key] = (_compile(model, start), _compile(model, step))
    return model.generation_programs[key]


def _cached(model: Any, capacity: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Start and step with a fixed-capacity KV cache. State: ``(self_keys, self_values, memory_keys,
    memory_values, memory_key_mask)``, lists per layer of ``(N, Hkv, C|Ls, D)`` and the ``(N, Ls)`` mask."""
    layers = model.decoder.blocks

    def start(src: Tensor, src_key_mask: Tensor | None) -> State:
        memory = model._encode(src, src_key_mask, False)  # (N, Ls, E)
        batch = ops.shape(src)[0]
        projected = [layer.cross_attn._project_keys_values(memory, memory) for layer in layers]

        def empty(dim: int, attn: Any) -> Tensor:
            return ops.zeros((batch, attn.num_kv_heads, capacity, dim), dtype=memory.dtype)  # (N, Hkv, C, D)

        self_keys = [empty(layer.self_attn.head_dim, layer.self_attn) for layer in layers]
        self_values = [empty(layer.self_attn.value_head_dim, layer.self_attn) for layer in layers]
        return self_keys, self_values, [k for k, _ in projected], [v for _, v in projected], src_key_mask

    def step(token: Tensor, position: Tensor, rows: Tensor | None, state: State) -> tuple[Tensor, State]:
        self_keys, self_values, memory_keys, memory_values, memory_key_mask = _gather(state, rows)
        buffers = _Buffers(position, self_keys, self_values, memory_keys, memory_values)
        written = ops.expand_dims(ops.arange(capacity) <= position, 0)  # (1, C): the keys written so far
        hidden = model._decode_hidden(token, None, memory_key_mask, written, buffers, False, False)  # (N, 1, E)
        state = (
            [b.keys for b in buffers.self_attention],
            [b.values for b in buffers.self_attention],
            memory_keys,
            memory_values,
            memory_key_mask,
        )
        return _log_probs(model, hidden[:, 0]), state

    return start, step


def _recomputed(model: Any, capacity: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Start and step without a cache. State: ``(tokens (N, C), memory (N, Ls, E), memory_key_mask (N, Ls))``."""

    def start(src: Tensor, src_key_mask: Tensor | None) -> State:
        memory = model._encode(src, src_key_mask, False)  # (N, Ls, E)
        return ops.zeros((ops.shape(src)[0], capacity), dtype="int32"), memory, src_key_mask

    def step(token: Tensor, position: Tensor, rows: Tensor | None, state: State) -> tuple[Tensor, State]:
        tokens, memory, memory_key_mask = _gather(state, rows)
        tokens = ops.slice_update(tokens, _start(position, 1, 2), token)  # (N, C)
        hidden = model._decode_hidden(tokens, memory, memory_key_mask, None, None, False, False)  # (N, C, E)
        return _log_probs(model, ops.take(hidden, position, axis=1)), (tokens, memory, memory_key_mask)

    return start, step


def _log_probs(model: Any, hidden: Tensor) -> Tensor:
    """``hidden (N, E)`` → next-token log-probabilities ``(N, V)`` in float32."""
    return ops.log_softmax(ops.cast(model.output_proj(hidden), "float32"), axis=-1)


def _compile(model: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    if backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=TF_JIT_COMPILE, reduce_retracing=True)
    import jax

    variables = model.variables

    def stateless(values: list, *args: Any) -> Any:
        # Keras variables cannot be read as values inside jax.jit: they come in as arguments.
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return fn(*args)

    program = jax.jit(stateless)
    return lambda *args: program([v.value for v in variables], *args)


def capacity_for(max_len: int, model_max_len: int) -> int:
    """Positions ``0..max_len - 1`` rounded up to a multiple of ``CAPACITY_STEP``, within the model's ``max_len``."""
    return min(-(-max_len // CAPACITY_STEP) * CAPACITY_STEP, model_max_len)


class CompiledDecoding(decoding.DecodingSession):
    """One compiled ``generate`` call.

    Its buffers keep a fixed number of rows, so that the step program keeps its shapes: the rows the search asks
    about (``live``, in its order) are some of them. A reorder that keeps as many rows as the buffers hold (beam
    search) waits for the next step, whose program gathers them (``pending``); one that keeps fewer, distinct rows
    (greedy search dropping finished sentences) only narrows ``live``, and those rows go on being computed, which
    costs less than a program for every new batch size; one that keeps more (beam search's first expansion, from
    B to B * beam_size rows) gathers the buffers at once, eagerly.
    """

    def __init__(self, model: Any, src: Tensor, src_key_mask: Tensor | None, use_cache: bool, max_len: int) -> None:
        super().__init__(None, None, None)
        start, self._program = _programs(model, use_cache, capacity_for(max_len, model.config.max_len))
        self._state = start(src, src_key_mask)
        self._live = np.arange(int(src.shape[0]))  # (n,): the buffer row of each row the search holds
        self._size = len(self._live)
        self._pending: np.ndarray | None = None  # (size,): the rows the next step gathers first

    def step(self, prefix: np.ndarray) -> np.ndarray:
        tokens = np.zeros((self._size, 1), dtype="int32")
        tokens[self._live, 0] = prefix[:, -1]  # rows the search no longer asks about read token 0
        position = ops.convert_to_tensor(np.int32(prefix.shape[1] - 1))
        rows = None if self._pending is None else ops.convert_to_tensor(self._pending.astype("int32"))
        log_probs, self._state = self._program(ops.convert_to_tensor(tokens), position, rows, self._state)
        self._pending = None
        return np.asarray(ops.convert_to_numpy(log_probs))[self._live]

    def reorder(self, rows: np.ndarray) -> None:
        kept = self._live[rows]  # buffer rows, as the next step will see them
        if len(kept) == self._size:
            self._pending = kept if self._pending is None else self._pending[kept]
            self._live = np.arange(self._size)
        elif len(kept) < self._size and len(np.unique(kept)) == len(kept):
            self._live = kept
        else:
            gathered = kept if self._pending is None else self._pending[kept]
            self._state = _gather(self._state, ops.convert_to_tensor(gathered.astype("int32")))
            self._live, self._size, self._pending = np.arange(len(kept)), len(kept), None
