"""The KV cache's bookkeeping (``multihead.cache``), shared by both front ends: which keys a call attends, when the
memory is reused, what a call is refused, and that a preallocated cache holds what a growing one holds.

It runs over NumPy arrays (``conftest.NumpyKVCache``, written for these tests) and over the PyTorch ``KVCache``.

Notation: B batch, Hkv key/value heads, L cached length, n new tokens, Dk/Dv head dims.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import numpy as np
import pytest
import torch

from conftest import NumpyKVCache
from multihead.cache import (
    DecoderCache,
    KVCacheBase,
    attended,
    check_decoder_cache,
    kept_sources,
    memory_rows,
    reuses_memory,
)
from multihead.torch import KVCache, Transformer
from multihead.torch.attention import Staging

FRONT_ENDS = {
    "numpy": (NumpyKVCache, np.asarray),
    "torch": (KVCache, lambda x: torch.from_numpy(np.asarray(x))),
}


@pytest.fixture(params=list(FRONT_ENDS))
def front_end(request: pytest.FixtureRequest) -> tuple[type[KVCacheBase], Callable]:
    return FRONT_ENDS[request.param]


def keys_values(batch: int, new: int, seed: int, kv_heads: int = 2, dk: int = 3, dv: int = 5) -> tuple:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, kv_heads, new, dk)), rng.normal(size=(batch, kv_heads, new, dv))


def numpy_of(x: object) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def test_self_attention_attends_everything_cached_plus_the_new_tokens(front_end) -> None:
    cache_type, tensor = front_end
    cache = cache_type()
    assert not reuses_memory(cache, self_attention=True)
    assert cache.key_length(self_attention=True, new=3) == 3
    assert cache.key_length(self_attention=True, new=None) is None  # not known before the call says
    chunks = [keys_values(2, n, seed) for seed, n in enumerate([3, 1, 2])]
    for index, (k, v) in enumerate(chunks):
        before = cache.length
        assert cache.key_length(self_attention=True, new=k.shape[2]) == before + k.shape[2]
        keys, values = attended(cache, True, lambda k=k, v=v: (tensor(k), tensor(v)))
        np.testing.assert_array_equal(numpy_of(keys), np.concatenate([c[0] for c in chunks[: index + 1]], axis=2))
        np.testing.assert_array_equal(numpy_of(values), np.concatenate([c[1] for c in chunks[: index + 1]], axis=2))
        assert not reuses_memory(cache, self_attention=True)
    assert cache.length == 6


def test_cross_attention_projects_the_memory_once_then_reuses_it(front_end) -> None:
    cache_type, tensor = front_end
    cache = cache_type()
    memory = keys_values(2, 7, seed=0)
    projections = []

    def project() -> tuple:
        projections.append(True)
        return tensor(memory[0]), tensor(memory[1])

    assert not reuses_memory(cache, self_attention=False)
    assert cache.key_length(self_attention=False, new=7) == 7
    for _ in range(3):
        keys, values = attended(cache, False, project)
        np.testing.assert_array_equal(numpy_of(keys), memory[0])
        np.testing.assert_array_equal(numpy_of(values), memory[1])
        assert reuses_memory(cache, self_attention=False)
        assert cache.key_length(self_attention=False, new=99) == 7  # the memory kept, whatever the call brings
    assert len(projections) == 1
    assert cache.length == 7


@pytest.mark.parametrize("capacity", [6, 9])
def test_a_preallocated_cache_holds_what_a_growing_one_holds(front_end, capacity: int) -> None:
    cache_type, tensor = front_end
    growing, preallocated = cache_type(), cache_type(capacity)
    for seed, n in enumerate([2, 1, 3]):
        k, v = keys_values(3, n, seed)
        grown = growing.append(tensor(k), tensor(v))
        written = preallocated.append(tensor(k), tensor(v))
        for a, b in zip(grown, written, strict=True):
            np.testing.assert_array_equal(numpy_of(a), numpy_of(b))
        assert preallocated.length == growing.length
    rows = np.array([2, 0, 0])
    growing.reorder(rows)
    preallocated.reorder(rows)
    np.testing.assert_array_equal(numpy_of(preallocated.keys), numpy_of(growing.keys))
    np.testing.assert_array_equal(numpy_of(preallocated.values), numpy_of(growing.values))
    assert numpy_of(preallocated.keys).shape == (3, 2, 6, 3)  # only the cached positions, never the spare ones
    # A reordered buffer (only its filled positions copied) goes on taking tokens up to its capacity.
    k, v = keys_values(3, capacity - 6, seed=7)
    for a, b in zip(growing.append(tensor(k), tensor(v)), preallocated.append(tensor(k), tensor(v)), strict=True):
        np.testing.assert_array_equal(numpy_of(a), numpy_of(b))
    assert preallocated.length == capacity


def test_a_preallocated_torch_cache_writes_in_place() -> None:
    cache = KVCache(capacity=8)
    cache.append(*(torch.from_numpy(x) for x in keys_values(1, 3, seed=0)))
    address = cache.keys.data_ptr()
    for seed in range(1, 5):
        cache.append(*(torch.from_numpy(x) for x in keys_values(1, 1, seed)))
        assert cache.keys.data_ptr() == address  # no reallocation per step
    assert cache.length == 7


def test_a_preallocated_cache_reordered_step_after_step_holds_its_rows(front_end) -> None:
    """Beam search's pattern: a token, a reorder (fewer rows once a sentence has left, more when beams open), a token;
    the torch cache copies the rows that change alone, in place (``[1, 1]``: row 0 takes row 1's; ``[0, 1]``: nothing
    moves), in new buffers only when the rows grow."""
    cache_type, tensor = front_end
    cache = cache_type(capacity=10)
    expected_keys, expected_values = keys_values(4, 1, seed=0)
    cache.append(tensor(expected_keys), tensor(expected_values))
    buffers = []
    reorders = [[1, 1, 3, 0], [3, 2, 0, 0], [1, 0], [1, 1], [0, 1], [1, 0], [0, 0, 1, 1, 1], [4, 2, 3, 0, 0]]
    for seed, rows in enumerate(np.array(rows) for rows in reorders):
        buffers.append(cache._keys)
        cache.reorder(rows)
        expected_keys, expected_values = expected_keys[rows], expected_values[rows]
        k, v = keys_values(len(rows), 1, seed=seed + 1)
        cache.append(tensor(k), tensor(v))
        expected_keys = np.concatenate([expected_keys, k], axis=2)
        expected_values = np.concatenate([expected_values, v], axis=2)
        np.testing.assert_array_equal(numpy_of(cache.keys), expected_keys)
        np.testing.assert_array_equal(numpy_of(cache.values), expected_values)
    if cache_type is KVCache:  # in place until the rows grow
        first, grown = buffers[0].data_ptr(), buffers[-1].data_ptr()
        assert first != grown
        assert [buffer.data_ptr() for buffer in buffers] == [first] * 7 + [grown]
        assert cache._keys.data_ptr() == grown


def test_a_decoders_caches_move_rows_through_one_staging_buffer_that_later_moves_reuse() -> None:
    """PyTorch's caches read the rows a reorder moves through a buffer that a decoder's self-attention caches share
    (``Transformer.new_cache``): step after step, more tokens cached, every layer's keys and values (of two head
    sizes) move through the same memory, grown only when more rows move than it holds (to a power of two), where a
    buffer of each move's own size, growing with the length, left the heap a new hole at every step. The rows are
    those a copy gives."""
    model = Transformer(11, 11, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=3, d_ff=16)
    caches = model.new_cache(capacity=9)
    assert all(cache.staging is caches.self_attention[0].staging for cache in caches.self_attention)
    grown = []

    class Counted(Staging):  # records each time its memory is replaced
        def __setattr__(self, name: str, value: object) -> None:
            grown.append(name)
            super().__setattr__(name, value)

    staging = Counted()
    for cache in caches.self_attention:
        cache.staging = staging
    expected = [keys_values(6, 1, seed=layer) for layer in range(3)]
    for cache, (k, v) in zip(caches.self_attention, expected, strict=True):
        cache.append(torch.from_numpy(k), torch.from_numpy(v))
    reorders = [[1, 0, 3, 2, 4, 5], [0, 0, 1, 1, 4, 5], [5, 4, 3, 2, 1, 0], [0, 1, 2, 3, 5, 4], [2, 2, 2, 3, 4, 5]]
    memory = []
    for step, rows in enumerate(np.array(rows) for rows in reorders):
        caches.reorder(rows, same_sources=True)
        memory.append(staging.memory.data_ptr())
        for layer, cache in enumerate(caches.self_attention):
            k, v = keys_values(6, 1, seed=10 * step + layer + 10)
            cache.append(torch.from_numpy(k), torch.from_numpy(v))
            keys, values = expected[layer]
            expected[layer] = (np.concatenate([keys[rows], k], axis=2), np.concatenate([values[rows], v], axis=2))
            np.testing.assert_array_equal(cache.keys.numpy(), expected[layer][0])
            np.testing.assert_array_equal(cache.values.numpy(), expected[layer][1])
    # 4 rows move, then 4 (the same memory), then all 6 (grown: at most the cache's rows), then 2 and 2.
    assert memory[0] == memory[1] != memory[2] == memory[3] == memory[4]
    assert len(grown) == 1 + 2  # made empty, then grown once a size: keys (head size 3) use the values' room (5)
    assert staging.memory.numel() == 6 * 2 * 9 * 5  # rows, heads, capacity, the larger head size


def test_buffers_a_growing_reorder_leaves_are_let_go(front_end) -> None:
    """Beam search's first reorder opens each sentence's beams: the smaller buffers it leaves can serve no later
    reorder, and are not held beside the new ones (a quarter of the cache, kept for steps, before)."""
    cache_type, tensor = front_end
    cache = cache_type(capacity=6)
    cache.append(*(tensor(x) for x in keys_values(2, 1, seed=0)))
    left = weakref.ref(cache._keys), weakref.ref(cache._values)
    cache.reorder(np.array([0, 0, 1, 1]))
    gc.collect()
    assert [ref() for ref in left] == [None, None]
    np.testing.assert_array_equal(numpy_of(cache.keys), keys_values(2, 1, seed=0)[0][[0, 0, 1, 1]])


def test_reorder_keeps_rows_and_reset_empties(front_end) -> None:
    cache_type, tensor = front_end
    cache = cache_type()
    k, v = keys_values(3, 2, seed=1)
    cache.append(tensor(k), tensor(v))
    cache.reorder(np.array([1, 1, 0]))
    np.testing.assert_array_equal(numpy_of(cache.keys), k[[1, 1, 0]])
    np.testing.assert_array_equal(numpy_of(cache.values), v[[1, 1, 0]])
    assert cache.length == 2
    cache.reset()
    assert cache.length == 0
    assert cache.keys is None
    assert cache.values is None


# --- what check_call refuses, before anything is projected ---------------------------------------------------


def filled(cache_type: type[KVCacheBase], tensor: Callable, capacity: int | None = None) -> KVCacheBase:
    cache = cache_type(capacity)
    cache.append(*(tensor(x) for x in keys_values(2, 3, seed=0)))
    return cache


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            dict(self_attention=True, batch=2, new=2, kv_heads=2, key_dim=3, value_dim=5),
            r"`cache`: KVCache capacity 4 exceeded: 3",
        ),
        (
            dict(self_attention=True, batch=3, new=1, kv_heads=2, key_dim=3, value_dim=5),
            r"`cache` holds keys.*this call brings B=3",
        ),
        (dict(self_attention=True, batch=2, new=1, kv_heads=4, key_dim=3, value_dim=5), r"Hkv=4"),
        (dict(self_attention=True, batch=2, new=1, kv_heads=2, key_dim=4, value_dim=5), r"Dk=4"),
        (dict(self_attention=True, batch=2, new=1, kv_heads=2, key_dim=3, value_dim=6), r"Dv=6"),
        (dict(self_attention=False, batch=5, new=7, kv_heads=2, key_dim=3, value_dim=5), r"batch of 2.*batch of 5"),
    ],
    ids=["capacity", "batch", "kv-heads", "key-dim", "value-dim", "memory-batch"],
)
def test_check_call_refuses_what_the_cache_cannot_serve(front_end, call: dict, match: str) -> None:
    cache_type, tensor = front_end
    cache = filled(cache_type, tensor, capacity=4)
    keys = numpy_of(cache.keys).copy()
    with pytest.raises(ValueError, match=match):
        cache.check_call(**call)
    assert cache.length == 3
    np.testing.assert_array_equal(numpy_of(cache.keys), keys)


def test_check_call_accepts_what_the_cache_can_serve(front_end) -> None:
    cache_type, tensor = front_end
    cache = filled(cache_type, tensor, capacity=4)
    cache.check_call(True, batch=2, new=1, kv_heads=2, key_dim=3, value_dim=5)  # exactly fills the capacity
    cache.check_call(False, batch=2, new=11, kv_heads=2, key_dim=3, value_dim=5)  # reuse: only the batch counts
    cache_type().check_call(True, batch=9, new=100, kv_heads=1, key_dim=1, value_dim=1)  # empty, growing
    assert cache.length == 3


def test_append_refuses_like_check_call(front_end) -> None:
    cache_type, tensor = front_end
    cache = filled(cache_type, tensor, capacity=4)
    with pytest.raises(ValueError, match=r"capacity 4 exceeded: 3 cached \+ 2 new"):
        cache.append(*(tensor(x) for x in keys_values(2, 2, seed=1)))
    with pytest.raises(ValueError, match=r"received new keys of shape \(2, 4, 1, 3\)"):
        cache.append(*(tensor(x) for x in keys_values(2, 1, seed=1, kv_heads=4)))
    assert cache.length == 3


# --- DecoderCache ---------------------------------------------------------------------------------------------


def test_decoder_cache_keeps_one_cache_per_layer_and_reorders_them_all(front_end) -> None:
    cache_type, tensor = front_end
    decoder_cache = DecoderCache(2, cache_type, capacity=5)
    assert decoder_cache.length == 0
    assert [c.capacity for c in decoder_cache.self_attention] == [5, 5]
    assert [c.capacity for c in decoder_cache.cross_attention] == [None, None]  # the memory is appended once
    for layer in range(2):
        decoder_cache.self_attention[layer].append(*(tensor(x) for x in keys_values(3, 2, seed=layer)))
        decoder_cache.cross_attention[layer].append(*(tensor(x) for x in keys_values(3, 4, seed=10 + layer)))
    assert decoder_cache.length == 2
    decoder_cache.reorder(np.array([2, 1, 2]))
    for layer in range(2):
        expected_self, expected_cross = keys_values(3, 2, seed=layer)[0], keys_values(3, 4, seed=10 + layer)[0]
        np.testing.assert_array_equal(numpy_of(decoder_cache.self_attention[layer].keys), expected_self[[2, 1, 2]])
        np.testing.assert_array_equal(numpy_of(decoder_cache.cross_attention[layer].keys), expected_cross[[2, 1, 2]])
    assert DecoderCache(0, cache_type).length == 0


def test_a_decoder_cache_reordered_within_the_same_sources_keeps_the_memory(front_end) -> None:
    cache_type, tensor = front_end
    decoder_cache = DecoderCache(1, cache_type, capacity=5)
    decoder_cache.self_attention[0].append(*(tensor(x) for x in keys_values(4, 2, seed=0)))
    memory = keys_values(4, 3, seed=1)[0]
    decoder_cache.cross_attention[0].append(tensor(memory), tensor(memory))
    decoder_cache.reorder(np.array([1, 1, 3, 2]), same_sources=True)
    np.testing.assert_array_equal(
        numpy_of(decoder_cache.self_attention[0].keys), keys_values(4, 2, seed=0)[0][[1, 1, 3, 2]]
    )
    np.testing.assert_array_equal(numpy_of(decoder_cache.cross_attention[0].keys), memory)  # not moved


@pytest.mark.parametrize(
    "sources",
    [[0, 0, 0, 1, 1, 1], [2, 0, 1], [1, 0, 1, 1, 2, 0], [0], [0, 1, 2], [3, 3, 1, 0, 2, 2, 2, 0]],
    ids=["beams-in-order", "one-row-each-moved", "uneven-mixed", "one", "one-row-each", "uneven-in-order"],
)
def test_memory_rows_lay_each_slots_rows_out_as_one_sequence(sources: list[int]) -> None:
    """Every row has a place of its own in its slot's part of the grid, the grid names it there, and a slot's rows
    keep their order; rows that already are the grid in order need no gathering, and none at all when row ``i``
    reads slot ``i``."""
    rows = np.asarray(sources, dtype=np.int64)
    slots = int(rows.max()) + 1
    made = memory_rows(rows, slots, np.asarray)
    if made is None:
        np.testing.assert_array_equal(rows, np.arange(slots))
        return
    counts = np.bincount(rows, minlength=slots)
    assert (made.slots, made.width) == (slots, counts.max())
    if made.grid is None:
        assert made.place is None
        np.testing.assert_array_equal(rows, np.repeat(np.arange(slots), made.width))
        return
    assert made.grid.shape == (slots * made.width,)
    assert made.place.shape == (len(rows),)
    assert len(set(made.place.tolist())) == len(rows)  # a place each
    np.testing.assert_array_equal(made.place // made.width, rows)  # in its slot's part
    np.testing.assert_array_equal(made.grid[made.place], np.arange(len(rows)))  # which names it
    for slot in range(slots):
        mine = np.flatnonzero(rows == slot)
        assert (np.diff(made.place[mine]) > 0).all()  # in row order


def test_memory_rows_of_no_rows_is_empty() -> None:
    made = memory_rows(np.zeros(0, dtype=np.int64), 0, np.asarray)
    assert made is not None
    assert (made.slots, made.width, made.grid, made.place) == (0, 0, None, None)


def test_kept_sources_keeps_the_slots_still_read_in_the_order_rows_first_read_them() -> None:
    live, renamed = kept_sources(np.array([3, 3, 1, 3, 0]))
    np.testing.assert_array_equal(live, [3, 1, 0])
    np.testing.assert_array_equal(renamed, [0, 0, 1, 0, 2])
    live, renamed = kept_sources(np.zeros(0, dtype=np.int64))
    assert live.shape == renamed.shape == (0,)


def test_a_decoder_cache_keeps_the_memory_slots_it_is_told_and_says_how_rows_read_them(front_end) -> None:
    cache_type, tensor = front_end
    decoder_cache = DecoderCache(2, cache_type, capacity=5)
    assert decoder_cache.shares_memory is cache_type.shares_memory
    memory = keys_values(4, 3, seed=1)[0]
    for cache in decoder_cache.cross_attention:
        cache.append(tensor(memory), tensor(memory))
    rows = memory_rows(np.array([0, 0, 1, 1]), 2, tensor)
    decoder_cache.keep_memory(np.array([3, 1]), rows)
    for cache in decoder_cache.cross_attention:
        np.testing.assert_array_equal(numpy_of(cache.keys), memory[[3, 1]])
        assert cache.memory_rows is rows
    decoder_cache.keep_memory(None, rows)  # all kept, as they are
    np.testing.assert_array_equal(numpy_of(decoder_cache.cross_attention[0].keys), memory[[3, 1]])
    decoder_cache.cross_attention[0].reset()
    assert decoder_cache.cross_attention[0].memory_rows is None


def test_check_decoder_cache() -> None:
    check_decoder_cache(None, 3)
    check_decoder_cache(DecoderCache(3, NumpyKVCache), 3)
    with pytest.raises(TypeError, match=r"`cache` must be a DecoderCache or None, received NumpyKVCache"):
        check_decoder_cache(NumpyKVCache(), 3)
    with pytest.raises(ValueError, match=r"one KV cache per decoder layer \(3\), received 2"):
        check_decoder_cache(DecoderCache(2, NumpyKVCache), 3)
