"""Compiled generation for the Keras :class:`~multihead.keras.Transformer`: one traced program per decoding step.

Eager decoding (:class:`multihead.decoding.DecodingSession`) dispatches every operation of every step, which on
TensorFlow costs milliseconds per ``Dense`` call, and on JAX compiles every operation anew for every new cache length.
Here a step (the model's own decoding steps, ``model.decoder_steps()``: embedding, every decoder layer's step path,
the output projection, the log-softmax) is traced once into one program over fixed shapes, compiled by XLA, and runs
as one call per step:

- the self-attention cache of each layer is a buffer ``(N, Hkv, C, D)`` of capacity ``C``; a step writes its keys
  and values at its position, a tensor (so the program is not traced again at the next step), and attends over
  the whole buffer with a validity mask (keys ``0..position``);
- the cross-attention keys and values are projected from the encoder memory once, by a start program that also
  encodes the source;
- beam search's reordering waits for the next step, whose program gathers the self-attention buffers by the rows
  kept, and the projected memory and its mask too when a sentence has left (the beams of one sentence share them);
- without the cache (``use_cache=False``) a step rewrites one position of a ``(N, C)`` token buffer and recomputes
  every position: causal self-attention keeps later positions from changing the step's logits.

Between steps the state (buffers, projected memory, mask) stays where the program writes it: on TensorFlow in
``tf.Variable``s that the step program (``tf.function(jit_compile=True)``, called through its concrete function)
updates in place, since passing a dozen tensors in and out of an XLA program costs nearly as much as the step's
arithmetic; on JAX as arrays
donated to the next ``jax.jit`` call, which may then update them in place (weights passed in through a
``keras.StatelessScope``).

XLA compiles a program once per shape, so shapes come in few sizes: the rows of a batch are filled up to a power of
two, source lengths to a multiple of ``SOURCE_STEP`` (the filling masked out) and capacities to a multiple of
``CAPACITY_STEP``. The programs are kept per model, capacity and mode, so later ``generate`` calls reuse them and
their compilations.

Notation: B batch, N = B (greedy) or B * beam_size rows, Ls source length, C capacity, E d_model, V vocabulary,
Hkv key/value heads, Dk/Dv head dims.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import keras
import numpy as np
from keras import backend, ops

from multihead.cache import StepCache
from multihead.config import TransformerConfig
from multihead.keras.tensors import Tensor

COMPILED_BACKENDS = ("tensorflow", "jax")
"""Backends with compiled generation; on the torch backend generation runs eagerly."""
CAPACITY_STEP = 16
"""Capacities are rounded up to a multiple of this, so that nearby ``max_len`` share one program."""
SOURCE_STEP = 16
"""Source lengths are filled up to a multiple of this (masked), so that nearby lengths share one compilation."""

State = tuple[Any, ...]


class Generating(Protocol):
    """What compiled generation uses of a Keras :class:`~multihead.keras.Transformer`: its public parts."""

    config: TransformerConfig
    variables: list[keras.Variable]
    generation_programs: dict[tuple, Any]
    """The start program and the steps of each mode and capacity, kept between ``generate`` calls."""

    def encode(self, src: Tensor, src_key_mask: Tensor | None = None, training: bool | None = None) -> Tensor: ...

    def decoder_steps(self) -> Any:
        """A :class:`multihead.keras.transformer.DecoderSteps`."""
        ...


class _Buffer(StepCache):
    """Keys and values inside a traced step, as a layer's attention reads them."""

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self._keys, self._values = keys, values

    @property
    def keys(self) -> Tensor:
        return self._keys

    @property
    def values(self) -> Tensor:
        return self._values


class _SelfBuffer(_Buffer):
    """One layer's self-attention cache inside a traced step: a ``(N, Hkv, C, D)`` buffer for keys and one for
    values, written at ``position`` (a scalar tensor); the attention reads all of it, its key mask leaving out the
    positions not written yet."""

    def __init__(self, keys: Tensor, values: Tensor, position: Tensor) -> None:
        super().__init__(keys, values)
        self._position = position

    @property
    def length(self) -> Tensor:
        return self._position

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``keys (N, Hkv, 1, Dk)`` and ``values (N, Hkv, 1, Dv)`` at the position; the whole buffers."""
        start = _start(self._position, 2, 4)
        self._keys = ops.slice_update(self._keys, start, keys)  # (N, Hkv, C, Dk)
        self._values = ops.slice_update(self._values, start, values)  # (N, Hkv, C, Dv)
        return self._keys, self._values


def _start(position: Tensor, axis: int, rank: int) -> tuple[Tensor, ...]:
    """Start indices of a slice at ``position`` on ``axis``, all of the position's integer type (JAX refuses a mix,
    which Python's 0 becomes when 64-bit types are enabled)."""
    zero = ops.zeros_like(position)
    return tuple(position if index == axis else zero for index in range(rank))


class _MemoryBuffer(_Buffer):
    """One layer's cross-attention keys and values, projected from the memory by the start program."""

    @property
    def length(self) -> int:
        return int(self._keys.shape[2])

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        raise TypeError("the projected memory is written once, by the start program")


class _Buffers:
    """What the decoder's forward pass reads as its cache inside a traced step (a
    :class:`multihead.cache.DecoderCaches`): per layer a self-attention buffer and the projected memory; ``length``
    is the step's position."""

    def __init__(self, position: Tensor, self_keys: list, self_values: list, memory_keys: list, memory_values: list):
        self.length = position
        self.self_attention = [_SelfBuffer(k, v, position) for k, v in zip(self_keys, self_values, strict=True)]
        self.cross_attention = [_MemoryBuffer(k, v) for k, v in zip(memory_keys, memory_values, strict=True)]


def _gather(state: State, rows: Tensor | None) -> State:
    """Rows ``rows`` of every tensor in ``state`` (``None`` entries stay)."""
    if rows is None:
        return state
    return keras.tree.map_structure(lambda x: None if x is None else ops.take(x, rows, axis=0), state)


def _programs(model: Generating, use_cache: bool, capacity: int) -> tuple[Callable[..., State], Steps]:
    """The start program and the steps of ``model`` for this mode and capacity, traced on first use and kept in
    the model's ``generation_programs``."""
    key = (use_cache, capacity)
    if key not in model.generation_programs:
        start, step = (_cached if use_cache else _recomputed)(model, capacity)
        step = (_without_choice if chooses_on_host() else _choosing)(step)
        if backend.backend() == "tensorflow":
            import tensorflow as tf

            model.generation_programs[key] = (tf.function(start, jit_compile=True), _VariableSteps(step))
        else:
            model.generation_programs[key] = (_jax_program(model, start), _DonatedSteps(model, step))
    return model.generation_programs[key]


def _choosing(step: Callable[..., tuple[Tensor, State]]) -> Callable[..., tuple[tuple[Tensor, Tensor], State]]:
    """``step`` that also gives each row's most probable token ``(N,)``, chosen inside the program, so that on an
    accelerator only the ids need leave it (an eager ``argmax`` would cost on TensorFlow a fifth of a whole
    compiled step of a small model)."""

    def run(*args: Any, **kwargs: Any) -> tuple[tuple[Tensor, Tensor], State]:
        log_probs, state = step(*args, **kwargs)
        return (log_probs, ops.argmax(log_probs, axis=-1)), state

    return run


def _without_choice(step: Callable[..., tuple[Tensor, State]]) -> Callable[..., tuple[tuple[Tensor, None], State]]:
    """``step`` whose tokens are chosen on the host (:class:`Scores`)."""

    def run(*args: Any, **kwargs: Any) -> tuple[tuple[Tensor, None], State]:
        log_probs, state = step(*args, **kwargs)
        return (log_probs, None), state

    return run


def chooses_on_host() -> bool:
    """Whether a greedy step's token is chosen on the host: on the CPU, NumPy's ``argmax`` over the log-probabilities
    (already in host memory) is faster than one inside the program; on an accelerator the program chooses, and only
    the ids leave it."""
    return keras.distribution.list_devices()[0].lower().startswith("cpu")


def _cached(model: Generating, capacity: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Start and step with a fixed-capacity KV cache. State: ``(self_keys, self_values, memory_keys,
    memory_values, memory_key_mask)``, lists per layer of ``(N, Hkv, C|Ls, D)`` and the ``(N, Ls)`` mask."""
    steps = model.decoder_steps()

    def start(src: Tensor, src_key_mask: Tensor | None) -> State:
        memory = model.encode(src, src_key_mask=src_key_mask, training=False)  # (N, Ls, E)
        projected = steps.project_memory(memory)
        self_keys, self_values = steps.empty_self_caches(ops.shape(src)[0], capacity, memory.dtype)
        return self_keys, self_values, [k for k, _ in projected], [v for _, v in projected], src_key_mask

    def step(
        token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None, state: State
    ) -> tuple[Tensor, State]:
        self_keys, self_values = _gather(state[:2], rows)
        memory_keys, memory_values, memory_key_mask = _gather(state[2:], source_rows)
        buffers = _Buffers(position, self_keys, self_values, memory_keys, memory_values)
        written = ops.expand_dims(ops.arange(capacity) <= position, 0)  # (1, C): the keys written so far
        log_probs = steps.step(token, buffers, memory_key_mask, self_key_mask=written)  # (N, V)
        state = (
            [b.keys for b in buffers.self_attention],
            [b.values for b in buffers.self_attention],
            memory_keys,
            memory_values,
            memory_key_mask,
        )
        return log_probs, state

    return start, step


def _recomputed(model: Generating, capacity: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Start and step without a cache. State: ``(tokens (N, C), memory (N, Ls, E), memory_key_mask (N, Ls))``."""
    steps = model.decoder_steps()

    def start(src: Tensor, src_key_mask: Tensor | None) -> State:
        memory = model.encode(src, src_key_mask=src_key_mask, training=False)  # (N, Ls, E)
        return ops.zeros((ops.shape(src)[0], capacity), dtype="int32"), memory, src_key_mask

    def step(
        token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None, state: State
    ) -> tuple[Tensor, State]:
        (tokens,) = _gather(state[:1], rows)
        memory, memory_key_mask = _gather(state[1:], source_rows)
        tokens = ops.slice_update(tokens, _start(position, 1, 2), token)  # (N, C)
        return steps.recompute(tokens, memory, memory_key_mask, position), (tokens, memory, memory_key_mask)

    return start, step


def _jax_program(
    model: Generating, fn: Callable[..., Any], donate_argnames: tuple[str, ...] = ()
) -> Callable[..., Any]:
    """``fn`` in ``jax.jit``: Keras variables cannot be read as values inside it, so they come in as arguments."""
    import jax

    variables = model.variables

    def stateless(values: list, *args: Any, **kwargs: Any) -> Any:
        with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
            return fn(*args, **kwargs)

    program = jax.jit(stateless, donate_argnames=donate_argnames)
    return lambda *args, **kwargs: program([v.value for v in variables], *args, **kwargs)


class Steps:
    """The step program of one mode and capacity and the state it works on: :meth:`load` a state, then each call
    runs one step on it (``token (N, 1)``, ``position``, the rows of the target's state to gather first and those of
    the source's, ``(N,)`` each or ``None``) and returns the log-probabilities ``(N, V)`` and each row's most
    probable token ``(N,)`` (``None`` where the host chooses: :func:`chooses_on_host`)."""

    def load(self, state: State) -> None:
        raise NotImplementedError

    @property
    def state(self) -> State:
        raise NotImplementedError

    def __call__(
        self, token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError


class _VariableSteps(Steps):
    """TensorFlow: the state in ``tf.Variable``s, one set per state shape (kept for the next ``generate`` call with
    those shapes), and per set and kind of call (with rows to gather or not) one concrete function of the step
    compiled by XLA, which reads the variables and writes back what the step changed."""

    def __init__(self, step: Callable[..., tuple[Tensor, State]]) -> None:
        self.step = step
        self.slots: dict[tuple, tuple[State, dict[tuple[bool, bool], Callable[..., Tensor]]]] = {}
        self.current: tuple[State, dict[tuple[bool, bool], Callable[..., Tensor]]] | None = None

    def load(self, state: State) -> None:
        import tensorflow as tf

        shapes = tuple((tuple(x.shape), x.dtype) for x in tf.nest.flatten(state))
        if shapes in self.slots:
            for variable, value in zip(tf.nest.flatten(self.slots[shapes][0]), tf.nest.flatten(state), strict=True):
                variable.assign(value)
        else:
            self.slots[shapes] = (tf.nest.map_structure(lambda x: tf.Variable(x, trainable=False), state), {})
        self.current = self.slots[shapes]

    def _loaded(self) -> tuple[State, dict[tuple[bool, bool], Callable[..., Tensor]]]:
        if self.current is None:
            raise RuntimeError("no state loaded")
        return self.current

    @property
    def state(self) -> State:
        import tensorflow as tf

        return tf.nest.map_structure(lambda variable: variable.value(), self._loaded()[0])

    def __call__(
        self, token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        import tensorflow as tf

        variables, programs = self._loaded()
        gathers = (rows is not None, source_rows is not None)
        if gathers not in programs:

            def run(
                token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None
            ) -> tuple[Tensor, Tensor | None]:
                state = tf.nest.map_structure(lambda variable: variable.read_value(), variables)
                outputs, changed = self.step(token, position, rows, source_rows, state)
                for variable, before, after in zip(*map(tf.nest.flatten, (variables, state, changed)), strict=True):
                    if after is not before:
                        variable.assign(after)
                return outputs

            programs[gathers] = tf.function(run, jit_compile=True).get_concrete_function(
                token, position, rows, source_rows
            )
        return programs[gathers](token, position, rows, source_rows)

    def experimental_get_tracing_count(self) -> int:
        """Steps traced so far, for every state shape."""
        return sum(len(programs) for _, programs in self.slots.values())


class _DonatedSteps(Steps):
    """JAX: the state as arrays passed to the step program and donated, so that XLA may update them in place."""

    def __init__(self, model: Generating, step: Callable[..., tuple[Tensor, State]]) -> None:
        self.program = _jax_program(model, step, donate_argnames=("state",))
        self._state: State | None = None

    def load(self, state: State) -> None:
        self._state = state

    @property
    def state(self) -> State:
        if self._state is None:
            raise RuntimeError("no state loaded")
        return self._state

    def __call__(
        self, token: Tensor, position: Tensor, rows: Tensor | None, source_rows: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        outputs, self._state = self.program(token, position, rows, source_rows, state=self._state)
        return outputs


def rows_for(batch: int) -> int:
    """The rows a program holds for ``batch`` rows: the next power of two (0 for none)."""
    return 1 << (batch - 1).bit_length() if batch > 0 else 0


def capacity_for(max_len: int, model_max_len: int) -> int:
    """Positions ``0..max_len - 1`` rounded up to a multiple of ``CAPACITY_STEP``, within the model's ``max_len``."""
    return min(-(-max_len // CAPACITY_STEP) * CAPACITY_STEP, model_max_len)


class Scores(NamedTuple):
    """What a compiled step gives the search: the log-probabilities ``(R, V)`` of every buffer row and their most
    probable tokens ``(R,)`` when the program chose them (:func:`chooses_on_host`), of which the search asks about
    rows ``live`` ``(N,)``, in its order."""

    log_probs: Tensor
    best: Tensor | None
    live: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.live), int(self.log_probs.shape[-1])

    def rows(self) -> Tensor:
        """The log-probabilities of the rows asked about, ``(N, V)``."""
        if len(self.live) == int(self.log_probs.shape[0]) and (self.live == np.arange(len(self.live))).all():
            return self.log_probs
        return ops.take(self.log_probs, ops.convert_to_tensor(self.live.astype("int32")), axis=0)


class CompiledDecoding:
    """One compiled ``generate`` call (:class:`multihead.engine.Rows` of its sources).

    Its buffers keep a number of rows that is a power of two, so that the step program keeps its shapes: the rows the
    search asks about (``live``, in its order) are some of them, the others are filling. A reorder that keeps rows
    for another power of two (beam search's expansion from B to B * beam_size rows after the first step; half of the
    rows or fewer once sentences have ended) gathers the buffers at once, eagerly, into that many rows (a program
    for each power of two, not for every batch size). Otherwise, a reorder that keeps fewer, distinct rows (greedy
    search dropping finished sentences) only narrows ``live``, and those rows go on being computed; one that keeps as
    many rows or repeats some (beam search) waits for the next step, whose program gathers them (``pending``).
    """

    def __init__(
        self, model: Generating, src: Tensor, src_key_mask: Tensor | None, use_cache: bool, max_len: int
    ) -> None:
        start, self._steps = _programs(model, use_cache, capacity_for(max_len, model.config.max_len))
        self._choices = model.decoder_steps()  # top_k, eagerly on the step's log-probabilities
        self._steps.load(start(*_filled_source(src, src_key_mask)))
        self._live = np.arange(int(src.shape[0]))  # (n,): the buffer row of each row the search holds
        self._size = rows_for(len(self._live))
        self._pending: np.ndarray | None = None  # (size,): the rows the next step gathers first
        self._pending_sources = False  # whether it gathers the source's state (memory, mask) by them too
        self._position = 0  # the position of the next step's tokens

    def step(self, tokens: np.ndarray) -> Scores:
        """Log-probabilities of every row's next token after its newest, ``tokens (N,)``; every row is at the same
        position, the steps taken so far."""
        filled = np.zeros((self._size, 1), dtype="int32")
        filled[self._live, 0] = tokens  # rows the search no longer asks about read token 0
        position = ops.convert_to_tensor(np.int32(self._position))
        self._position += 1
        rows = None if self._pending is None else ops.convert_to_tensor(self._pending.astype("int32"))
        log_probs, best = self._steps(
            ops.convert_to_tensor(filled), position, rows, rows if self._pending_sources else None
        )
        self._pending, self._pending_sources = None, False
        return Scores(log_probs, best, self._live)

    def argmax(self, log_probs: Scores) -> np.ndarray:
        if log_probs.best is None:
            return np.asarray(ops.convert_to_numpy(log_probs.log_probs))[log_probs.live].argmax(axis=-1)
        return np.asarray(ops.convert_to_numpy(log_probs.best))[log_probs.live].astype(np.int64)

    def top_k(
        self, log_probs: Scores, scores: np.ndarray, beam: int, count: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._choices.top_k(log_probs.rows(), scores, beam, count, rows)

    def log_probs_at(self, log_probs: Scores, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self._choices.log_probs_at(log_probs.rows(), rows, tokens)

    def suppress(self, log_probs: Scores, tokens: np.ndarray, rows: np.ndarray | None = None) -> Scores:
        """The search's rows, ``tokens`` impossible (renormalised), their best chosen again."""
        return Scores(self._choices.suppress(log_probs.rows(), tokens, rows), None, np.arange(len(log_probs.live)))

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        kept = self._live[rows]  # buffer rows, as the next step will see them
        if rows_for(len(kept)) != self._size:  # another power of two: the buffers are gathered at once
            gathered = kept if self._pending is None else self._pending[kept]
            self._size = rows_for(len(gathered))
            rows = ops.convert_to_tensor(_filled_rows(gathered, self._size).astype("int32"))
            self._steps.load(_gather(self._steps.state, rows))
            self._live, self._pending, self._pending_sources = np.arange(len(kept)), None, False
        elif len(kept) < len(self._live) and len(np.unique(kept)) == len(kept):
            self._live = kept
        else:
            filled = _filled_rows(kept, self._size)
            self._pending = filled if self._pending is None else self._pending[filled]
            # Row i's source stays in buffer row i only if search row i was there (``live`` not narrowed).
            in_place = (self._live == np.arange(len(self._live))).all()
            self._pending_sources |= not (same_sources and in_place)
            self._live = np.arange(len(kept))


def _filled_rows(rows: np.ndarray, size: int) -> np.ndarray:
    """``rows`` followed by copies of the first up to ``size`` entries."""
    return np.concatenate([rows, np.repeat(rows[:1], size - len(rows))])


def _filled_source(src: Tensor, src_key_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """``src (B, Ls)`` and its key mask (all real when ``None``), filled up to ``rows_for(B)`` rows and a multiple of
    ``SOURCE_STEP`` positions with masked-out token 0: ``(R, S)`` each. Filled rows attend nothing."""
    tokens = np.asarray(ops.convert_to_numpy(src))
    batch, length = tokens.shape
    mask = np.ones((batch, length), bool) if src_key_mask is None else np.asarray(ops.convert_to_numpy(src_key_mask))
    shape = (rows_for(batch), -(-length // SOURCE_STEP) * SOURCE_STEP)
    filled_tokens, filled_mask = np.zeros(shape, tokens.dtype), np.zeros(shape, bool)
    filled_tokens[:batch, :length], filled_mask[:batch, :length] = tokens, mask
    return ops.convert_to_tensor(filled_tokens), ops.convert_to_tensor(filled_mask)
