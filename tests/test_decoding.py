"""Greedy and beam search, and the generation driver (shared by both front ends), on toy models whose answers are
known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import NumpyKVCache
from multihead.cache import DecoderCache
from multihead.config import TransformerConfig
from multihead.decoding import (
    DecodingSession,
    beam_search,
    check_generation_args,
    generate,
    greedy_search,
    resolve_pad_id,
)

BOS, EOS, PAD, A, B, C = 0, 1, 2, 3, 4, 5


def table_model(table: dict[tuple[int, ...], dict[int, float]], vocab: int = 6):
    """A step function: next-token probabilities looked up by the prefix after BOS (default: EOS)."""

    def step(prefix: np.ndarray) -> np.ndarray:
        out = np.full((len(prefix), vocab), -np.inf)
        for row, tokens in enumerate(prefix):
            for token, p in table.get(tuple(tokens[1:]), {EOS: 1.0}).items():
                out[row, token] = np.log(p)
        return out

    return step


# Greedy takes A (0.6) and then can only continue badly; beam search finds B C (0.4 * 0.9).
TRAP = {(): {A: 0.6, B: 0.4}, (A,): {B: 0.3, C: 0.3, EOS: 0.4}, (B,): {C: 0.9, EOS: 0.1}, (B, C): {EOS: 1.0}}


def test_greedy_follows_the_argmax_and_pads_after_eos() -> None:
    table = {(): {A: 0.9, EOS: 0.1}, (A,): {B: 0.8, EOS: 0.2}, (A, B): {EOS: 1.0}}
    other = {(): {EOS: 1.0}}
    step = table_model(table)
    out = greedy_search(step, 1, max_len=10, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(out, [[A, B, EOS]])

    def two_rows(prefix: np.ndarray) -> np.ndarray:
        return np.concatenate([step(prefix[:1]), table_model(other)(prefix[1:])])

    out = greedy_search(two_rows, 2, max_len=10, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(out, [[A, B, EOS], [EOS, PAD, PAD]])


def test_greedy_stops_at_max_len() -> None:
    step = table_model({(A,) * n: {A: 1.0} for n in range(20)})
    assert greedy_search(step, 3, max_len=4, bos_id=BOS, eos_id=EOS, pad_id=PAD).shape == (3, 4)


def test_beam_search_finds_what_greedy_misses() -> None:
    step = table_model(TRAP)
    greedy = greedy_search(step, 1, max_len=5, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(greedy, [[A, EOS]])  # probability 0.24
    beam = beam_search(step, lambda rows: None, 1, beam_size=2, max_len=5, bos_id=BOS, eos_id=EOS, pad_id=PAD,
                       length_penalty=0.0)  # fmt: skip
    np.testing.assert_array_equal(beam, [[B, C, EOS]])  # probability 0.36


def test_beam_size_one_is_greedy() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 6, 6, 6))  # next token depends on the last two tokens

    def step(prefix: np.ndarray) -> np.ndarray:
        rows = logits[np.arange(len(prefix)), prefix[:, -1], prefix[:, max(-2, -prefix.shape[1])]]
        return rows - np.log(np.exp(rows).sum(-1, keepdims=True))

    args = dict(max_len=8, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(
        beam_search(step, lambda rows: None, 4, beam_size=1, **args), greedy_search(step, 4, **args)
    )


def test_beam_search_reorders_the_model_state() -> None:
    orders = []
    step = table_model(TRAP)
    beam_search(step, orders.append, 1, beam_size=2, max_len=5, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    assert orders
    assert all(len(rows) == 2 and set(rows) <= {0, 1} for rows in orders)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0, 1, 2, 1, 1.0), "`max_len` must be a positive int, received 0"),
        ((9, 0, 1, 2, 1, 1.0), "`max_len` must be at most the model's max_len=8 positions, received 9"),
        ((5, -1, 1, 2, 1, 1.0), "`bos_id` must be a non-negative int, received -1"),
        ((5, 0, 12, 2, 1, 1.0), "`eos_id` must be < tgt_vocab=12, received eos_id=12"),
        ((5, 0, 1, 2, 0, 1.0), "`beam_size` must be a positive int, received 0"),
        ((5, 0, 1, 2, 2, float("inf")), "`length_penalty` must be finite, received inf"),
    ],
)
def test_generation_args_are_checked(args: tuple, message: str) -> None:
    config = TransformerConfig(10, 12, d_model=8, num_heads=2, max_len=8)
    with pytest.raises(ValueError, match=message):
        check_generation_args(*args, config)


def test_pad_id_defaults_to_the_configs_then_to_eos() -> None:
    with_pad, without_pad = TransformerConfig(10, 12, pad_id=3), TransformerConfig(10, 12)
    assert resolve_pad_id(5, with_pad, eos_id=1) == 5
    assert resolve_pad_id(None, with_pad, eos_id=1) == 3
    assert resolve_pad_id(None, without_pad, eos_id=1) == 1


# --- the generation driver ---------------------------------------------------------------------------------

# TRAP, where beam search's answer goes on after B C: beams swap rows on the way there, so a cache whose rows did
# not follow them would look up A C instead and stop. Source 1 has its own answer: sources mixed up would show.
DEEP = {**TRAP, (B, C): {A: 1.0}, (B, C, A): {EOS: 1.0}}
OTHER = {(): {C: 0.7, A: 0.3}, (C,): {A: 0.6, EOS: 0.4}, (C, A): {EOS: 1.0}, (A,): {EOS: 1.0}}


class TableSteps:
    """A toy model's decoding steps (a :class:`multihead.decoding.Steps`): ``memory`` row ``i`` holds the id of the
    source it decodes, and each source has its own table (:func:`table_model`). With a cache, the source ids go into
    the cross-attention cache of a one-layer :class:`DecoderCache`, the self-attention cache keeps the tokens decoded
    so far as its keys, and each step brings only the new ones, as a Transformer's does: the caches' rows must follow
    the beams for the prefixes and sources they rebuild to be right."""

    def __init__(self, tables: list[dict]) -> None:
        self.tables = [table_model(table) for table in tables]
        self.memories: list[np.ndarray] = []  # the sources decoded at every step

    def project_memory(self, memory: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        sources = memory[:, None, None, None].astype(np.float64)  # (N, 1, 1, 1)
        return [(sources, sources)]

    def step(self, tokens: np.ndarray, cache: DecoderCache, memory_key_mask: np.ndarray | None) -> np.ndarray:
        new = tokens[:, None, :, None].astype(np.float64)  # (N, 1, n, 1): one "key" per token
        keys, _ = cache.self_attention[0].append(new, new)
        sources = cache.cross_attention[0].keys[:, 0, 0, 0].astype(np.int64)
        return self.log_probs(keys[:, 0, :, 0].astype(np.int64), sources)  # every prefix, rebuilt from the cache

    def recompute(self, prefix: np.ndarray, memory: np.ndarray, memory_key_mask: np.ndarray | None) -> np.ndarray:
        return self.log_probs(prefix, memory)

    def log_probs(self, prefixes: np.ndarray, sources: np.ndarray) -> np.ndarray:
        self.memories.append(sources.copy())
        return np.concatenate([self.tables[source](row[None]) for source, row in zip(sources, prefixes, strict=True)])

    def take(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return x[rows]

    def tensor(self, array: np.ndarray) -> np.ndarray:
        return array

    def numpy(self, x: np.ndarray) -> np.ndarray:
        return x


class TableSession(DecodingSession):
    """The driver's session over :class:`TableSteps`, recording every reorder."""

    def __init__(self, tables: list[dict], use_cache: bool) -> None:
        cache = DecoderCache(1, NumpyKVCache) if use_cache else None
        batch = len(tables)
        super().__init__(TableSteps(tables), np.arange(batch), np.ones((batch, 3), dtype=bool), cache)
        self.taken: list[np.ndarray] = []  # the rows of every reorder

    @property
    def memories(self) -> list[np.ndarray]:
        return self.steps.memories

    def reorder(self, rows: np.ndarray) -> None:
        self.taken.append(np.asarray(rows).copy())
        super().reorder(rows)


SEARCH = dict(max_len=6, bos_id=BOS, eos_id=EOS, pad_id=PAD)


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_generate_greedy_decodes_each_source_from_its_own_state(use_cache: bool) -> None:
    session = TableSession([DEEP, OTHER], use_cache)
    out = generate(session, 2, **SEARCH)
    np.testing.assert_array_equal(out, [[A, EOS, PAD], [C, A, EOS]])  # greedy's (0.24)
    # Greedy search reorders only to drop the rows that have ended: source 0 after its second step.
    assert [rows.tolist() for rows in session.taken] == [[1]]
    assert [memory.tolist() for memory in session.memories] == [[0, 1], [0, 1], [1]]


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_generate_beam_search_reorders_the_session_with_the_beams(use_cache: bool) -> None:
    k = 2
    session = TableSession([DEEP, OTHER], use_cache)
    out = generate(session, 2, beam_size=k, length_penalty=0.0, **SEARCH)
    np.testing.assert_array_equal(out, [[B, C, A, EOS], [C, A, EOS, PAD]])  # beam search's answer (0.36)
    expected = beam_search(table_model(DEEP), lambda rows: None, 1, beam_size=k, length_penalty=0.0, **SEARCH)
    np.testing.assert_array_equal(out[:1], expected)

    # First the sources are laid out as beams (row b * k + j is beam j of source b), then each step's rows.
    np.testing.assert_array_equal(session.taken[0], [0, 0, 1, 1])
    assert len(session.taken) > 1
    for rows in session.taken[1:]:
        assert rows.shape == (2 * k,)
        for b in range(2):
            assert set(rows[b * k : (b + 1) * k]) <= set(range(b * k, (b + 1) * k)), rows  # beams stay home
    assert all(np.array_equal(memory, [0, 0, 1, 1]) for memory in session.memories)
    assert session.memory_key_mask.shape == (4, 3)  # the key mask follows the memory
    if use_cache:
        assert session.cache.self_attention[0].keys.shape[0] == 2 * k


def test_generate_with_beam_size_one_is_greedy_and_lays_out_no_beams() -> None:
    session = TableSession([DEEP, OTHER], use_cache=True)
    np.testing.assert_array_equal(
        generate(session, 2, beam_size=1, **SEARCH), generate(TableSession([DEEP, OTHER], False), 2, **SEARCH)
    )
    assert [rows.tolist() for rows in session.taken] == [[1]]  # only the ended row leaves


def test_greedy_drops_ended_rows_only_once_a_quarter_have_ended() -> None:
    """Rows leave the model's state in groups (each reorder copies the cache), and their answers stay the same."""
    ends = {(): {EOS: 1.0}}
    long = {(A,) * n: {A: 1.0} for n in range(10)}
    tables = [ends] + [long] * 7  # one of eight rows ends at once: below a quarter, it stays
    session = TableSession(tables, use_cache=True)
    out = generate(session, 8, **SEARCH)
    assert session.taken == []
    np.testing.assert_array_equal(out[0], [EOS, PAD, PAD, PAD, PAD, PAD])
    np.testing.assert_array_equal(out[1:], np.full((7, 6), A))
    session = TableSession([ends, ends, long, long], use_cache=True)  # half end: they leave
    out = generate(session, 4, **SEARCH)
    assert [rows.tolist() for rows in session.taken] == [[2, 3]]
    np.testing.assert_array_equal(out[2:], np.full((2, 6), A))
