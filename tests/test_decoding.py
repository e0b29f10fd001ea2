"""Greedy and beam search, and the generation driver (shared by both front ends), on toy models whose answers are
known by construction, and beam search against an exhaustive search."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from conftest import NumpyKVCache, filtered_distribution
from multihead.cache import DecoderCache
from multihead.checks import check_generate_call
from multihead.config import TransformerConfig
from multihead.decoding import (
    SEARCHES,
    DecodingSession,
    Generation,
    SearchOptions,
    Specials,
    process,
    search_options,
)
from multihead.engine import _stay, generate, n_best_search

BOS, EOS, PAD, A, B, C = 0, 1, 2, 3, 4, 5
SPECIALS = Specials(pad=PAD, bos=BOS, eos=EOS)


def spec(search: SearchOptions, **kwargs: Any) -> Generation:
    """The tables' generation, searching as ``search`` says."""
    return Generation(SPECIALS, search=search, **kwargs)


def table_model(table: dict[tuple[int, ...], dict[int, float]], vocab: int = 6):
    """A step function: next-token probabilities looked up by the prefix after BOS (default: EOS)."""

    def step(prefix: np.ndarray) -> np.ndarray:
        out = np.full((len(prefix), vocab), -np.inf)
        for row, tokens in enumerate(prefix):
            for token, p in table.get(tuple(tokens[1:]), {EOS: 1.0}).items():
                out[row, token] = np.log(p)
        return out

    return step


def numpy_argmax(log_probs: np.ndarray) -> np.ndarray:
    return log_probs.argmax(axis=-1)


def numpy_top_k(
    log_probs: np.ndarray, scores: np.ndarray, beam: int, count: int, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A :meth:`multihead.decoding.Steps.top_k` in NumPy: ties keep the lower index, as the frameworks' do."""
    log_probs = log_probs if rows is None else log_probs[rows]
    added = (log_probs + scores[:, None]).reshape(-1, beam * log_probs.shape[-1])  # (S, beam*V)
    indices = np.argsort(-added, axis=-1, kind="stable")[:, :count]
    return np.take_along_axis(added, indices, axis=-1).astype(np.float32), indices


def numpy_log_probs_at(log_probs: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """A :meth:`multihead.decoding.Choices.log_probs_at` in NumPy."""
    return log_probs[rows][:, tokens].astype(np.float32)


class ArraySession:
    """:class:`multihead.engine.Rows` over a NumPy step function of the whole prefix; it records the rows of every
    reorder and passes only the rows still held to ``step``."""

    def __init__(self, step: Callable[[np.ndarray], np.ndarray]) -> None:
        self._step, self.orders = step, []
        self.prefix = np.zeros((0, 0), dtype=np.int64)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.prefix = tokens[:, None] if not self.prefix.size else np.concatenate([self.prefix, tokens[:, None]], 1)
        return self._step(self.prefix)

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        self.orders.append(np.asarray(rows).copy())
        self.prefix = self.prefix[rows]

    argmax = staticmethod(numpy_argmax)
    top_k = staticmethod(numpy_top_k)
    log_probs_at = staticmethod(numpy_log_probs_at)


def greedy_search(session: Any, batch: int, *, max_len: Any, specials: Specials) -> np.ndarray:
    return generate(session, batch, Generation(specials), max_len=max_len)


def beam_search(
    session: Any, batch: int, *, beam_size: int, max_len: Any, specials: Specials, length_penalty: float = 1.0
) -> np.ndarray:
    search = SearchOptions(beam_size=beam_size, length_penalty=length_penalty)
    return generate(session, batch, Generation(specials, search=search), max_len=max_len)


def beam_search_n_best(
    session: Any, batch: int, *, n: int, beam_size: int, max_len: Any, specials: Specials, length_penalty: float = 1.0
) -> list[list[tuple[float, np.ndarray]]]:
    search = SearchOptions(beam_size=beam_size, n_best=n, length_penalty=length_penalty)
    return n_best_search(session, batch, Generation(specials, search=search), max_len=max_len)


def sample_search(
    session: Any, batch: int, options: SearchOptions, *, max_len: Any, specials: Specials, keys: Any = None
) -> np.ndarray:
    return generate(session, batch, Generation(specials, search=options), max_len=max_len, keys=keys)


# Greedy takes A (0.6) and then can only continue badly; beam search finds B C (0.4 * 0.9).
TRAP = {(): {A: 0.6, B: 0.4}, (A,): {B: 0.3, C: 0.3, EOS: 0.4}, (B,): {C: 0.9, EOS: 0.1}, (B, C): {EOS: 1.0}}


def test_greedy_follows_the_argmax_and_pads_after_eos() -> None:
    table = {(): {A: 0.9, EOS: 0.1}, (A,): {B: 0.8, EOS: 0.2}, (A, B): {EOS: 1.0}}
    other = {(): {EOS: 1.0}}
    step = table_model(table)
    out = greedy_search(ArraySession(step), 1, max_len=10, specials=SPECIALS)
    np.testing.assert_array_equal(out, [[A, B, EOS]])

    def two_rows(prefix: np.ndarray) -> np.ndarray:
        return np.concatenate([step(prefix[:1]), table_model(other)(prefix[1:])])

    out = greedy_search(ArraySession(two_rows), 2, max_len=10, specials=SPECIALS)
    np.testing.assert_array_equal(out, [[A, B, EOS], [EOS, PAD, PAD]])


def test_greedy_stops_at_max_len() -> None:
    step = table_model({(A,) * n: {A: 1.0} for n in range(20)})
    assert greedy_search(ArraySession(step), 3, max_len=4, specials=SPECIALS).shape == (3, 4)


def test_beam_search_finds_what_greedy_misses() -> None:
    step = table_model(TRAP)
    greedy = greedy_search(ArraySession(step), 1, max_len=5, specials=SPECIALS)
    np.testing.assert_array_equal(greedy, [[A, EOS]])  # probability 0.24
    beam = beam_search(ArraySession(step), 1, beam_size=2, max_len=5, specials=SPECIALS,
                       length_penalty=0.0)  # fmt: skip
    np.testing.assert_array_equal(beam, [[B, C, EOS]])  # probability 0.36


def two_token_model(seed: int, vocab: int = 6) -> Callable[[np.ndarray], np.ndarray]:
    """Random next-token log-probabilities that depend on the last two tokens; BOS and PAD are never produced."""
    logits = np.random.default_rng(seed).normal(size=(vocab, vocab, vocab)) * 2
    logits[..., [BOS, PAD]] = -np.inf

    def step(prefix: np.ndarray) -> np.ndarray:
        rows = logits[prefix[:, -1], prefix[:, max(-2, -prefix.shape[1])]]
        return rows - np.log(np.exp(rows).sum(-1, keepdims=True))

    return step


@pytest.mark.parametrize("seed", range(6))
def test_beam_size_one_without_a_length_penalty_is_greedy(seed: int) -> None:
    """One beam stops when its finished hypothesis outranks the continuation: greedy's choice at every step. (With a
    length penalty, a continuation may still outrank it later, and one beam goes on looking.)"""
    step = two_token_model(seed)
    args = dict(max_len=8, specials=SPECIALS)
    beam = beam_search(ArraySession(step), 1, beam_size=1, length_penalty=0.0, **args)
    greedy = greedy_search(ArraySession(step), 1, **args)
    np.testing.assert_array_equal(beam, greedy[:, : beam.shape[1]])
    assert (greedy[:, beam.shape[1] :] == PAD).all()


def exhaustive_ranking(
    step: Callable[[np.ndarray], np.ndarray], max_len: int, alpha: float
) -> list[tuple[float, list]]:
    """Every possible hypothesis of a one-source model, best first: each sequence of at most ``max_len`` tokens that
    ends at its first EOS or at ``max_len`` and has a finite score, with its rank (log-probability / length **
    alpha) and tokens; equal ranks in the order of the sequences' lengths, then of their tokens."""
    vocab = step(np.array([[BOS]])).shape[-1]
    words = [t for t in range(vocab) if t not in (BOS, PAD, EOS)]
    found: list[tuple[float, list]] = []
    for length in range(1, max_len + 1):
        for body in itertools.product(words, repeat=length - 1):
            for last in (EOS, *(words if length == max_len else [])):
                tokens = [*body, last]
                prefix = np.array([[BOS, *tokens]])
                score = sum(step(prefix[:, : i + 1])[0, tokens[i]] for i in range(length))
                if np.isfinite(score):
                    found.append((score / length**alpha, tokens))
    return sorted(found, key=lambda hypothesis: -hypothesis[0])


def exhaustive_best(step: Callable[[np.ndarray], np.ndarray], max_len: int, alpha: float) -> tuple[float, list]:
    """The best hypothesis of :func:`exhaustive_ranking`: its rank and tokens."""
    return exhaustive_ranking(step, max_len, alpha)[0]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(4))
def test_a_beam_as_wide_as_every_hypothesis_finds_the_exhaustive_best(seed: int, alpha: float) -> None:
    """Three tokens and EOS, up to 4 tokens: at most 108 candidates a step, so 128 beams keep every hypothesis alive,
    and the early stop must not cut off the best one."""
    step = two_token_model(seed)
    rank, tokens = exhaustive_best(step, 4, alpha)
    found = beam_search(ArraySession(step), 1, beam_size=128, max_len=4, specials=SPECIALS,
                        length_penalty=alpha)  # fmt: skip
    assert found[0, : len(tokens)].tolist() == tokens
    assert (found[0, len(tokens) :] == PAD).all()
    assert rank > -np.inf


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_narrow_beams_find_real_hypotheses_ranked_no_higher_than_the_exhaustive_best(
    alpha: float,
) -> None:
    for seed in range(6):
        step = two_token_model(seed)
        best_rank, _ = exhaustive_best(step, 5, alpha)
        found = beam_search(ArraySession(step), 1, beam_size=3, max_len=5, specials=SPECIALS,
                            length_penalty=alpha)[0].tolist()  # fmt: skip
        tokens = found[: found.index(EOS) + 1] if EOS in found else found
        assert EOS in found or len(found) == 5  # a hypothesis ends at EOS or at max_len
        assert all(token == PAD for token in found[len(tokens) :])
        prefix = np.array([[BOS, *tokens]])
        score = sum(step(prefix[:, : i + 1])[0, tokens[i]] for i in range(len(tokens)))
        assert np.isfinite(score)  # every token possible
        assert score / len(tokens) ** alpha <= best_rank + 1e-9


# --- the n best ----------------------------------------------------------------------------------------------


def n_best(step: Callable[[np.ndarray], np.ndarray], n: int, beam_size: int, max_len: int, alpha: float) -> list:
    """The ``n`` best hypotheses of a one-source model's beam search, as (rank, token list) pairs."""
    found = beam_search_n_best(ArraySession(step), 1, n=n, beam_size=beam_size, max_len=max_len,
                               specials=SPECIALS, length_penalty=alpha)  # fmt: skip
    return [(rank, tokens.tolist()) for rank, tokens in found[0]]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_beams_as_wide_as_every_hypothesis_find_the_exhaustive_n_best(seed: int, alpha: float) -> None:
    """Three tokens and EOS: up to 3 tokens, at most 36 candidates a step (40 hypotheses in all), up to 4 at most 108
    (121 in all); beams that wide keep every hypothesis alive, and the early stop must not cut off any of the n best.
    """
    step = two_token_model(seed)
    for max_len, beam_size in ((3, 36), (3, 50), (4, 108), (4, 128)):
        ranking = exhaustive_ranking(step, max_len, alpha)
        for n in (1, 2, 7, 30):
            found = n_best(step, n, beam_size, max_len, alpha)
            assert [tokens for _, tokens in found] == [tokens for _, tokens in ranking[:n]], (max_len, beam_size, n)
            np.testing.assert_allclose([rank for rank, _ in found], [rank for rank, _ in ranking[:n]], rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_narrow_beams_find_n_distinct_real_hypotheses_that_extend_the_fewer_best(alpha: float) -> None:
    """The beams do not depend on ``n``, and each search is exact over the hypotheses they make: the ``n`` best begin
    with the ``m < n`` best. Each is a possible hypothesis, ranked as its tokens score, and no two are the same."""
    max_len = 6
    for seed in range(6):
        step = two_token_model(seed)
        for beam_size in (2, 3, 5):
            found = {n: n_best(step, n, beam_size, max_len, alpha) for n in range(1, beam_size + 1)}
            for n, hypotheses in found.items():
                assert len(hypotheses) == n
                assert hypotheses[: n - 1] == found.get(n - 1, [])
                assert len({tuple(tokens) for _, tokens in hypotheses}) == n
                ranks = [rank for rank, _ in hypotheses]
                assert ranks == sorted(ranks, reverse=True)
                for rank, tokens in hypotheses:
                    assert EOS not in tokens[:-1]
                    assert tokens[-1] == EOS or len(tokens) == max_len
                    prefix = np.array([[BOS, *tokens]])
                    score = sum(step(prefix[:, : i + 1])[0, tokens[i]] for i in range(len(tokens)))
                    assert rank == pytest.approx(score / len(tokens) ** alpha, rel=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_the_one_best_is_beam_search_step_for_step(alpha: float) -> None:
    args = dict(max_len=6, specials=SPECIALS, length_penalty=alpha)
    for seed in range(6):
        step = two_token_model(seed)
        for beam_size in (1, 2, 3):
            plain, one = ArraySession(step), ArraySession(step)
            expected = beam_search(plain, 1, beam_size=beam_size, **args)[0]
            ((_, tokens),) = beam_search_n_best(one, 1, n=1, beam_size=beam_size, **args)[0]
            np.testing.assert_array_equal(expected[: len(tokens)], tokens)
            assert (expected[len(tokens) :] == PAD).all()
            assert len(one.orders) == len(plain.orders)  # as many steps, and the same reorders
            assert all((a == b).all() for a, b in zip(one.orders, plain.orders, strict=True))


def test_n_best_ask_at_most_beam_size() -> None:
    with pytest.raises(ValueError, match="a beam at least as wide: received `n_best`=3 with `beam_size`=2"):
        beam_search_n_best(ArraySession(table_model(TRAP)), 1, n=3, beam_size=2, max_len=4, specials=SPECIALS)
    with pytest.raises(ValueError, match="`n_best` must be a positive int, received 0"):
        beam_search_n_best(ArraySession(table_model(TRAP)), 1, n=0, beam_size=2, max_len=4, specials=SPECIALS)


def test_beam_search_reorders_the_model_state_and_drops_finished_sentences() -> None:
    """Sentence 0 ends at once (its only hypothesis is EOS, which no continuation can outrank); sentence 1 goes on:
    from then on only its beams are computed."""
    ends = table_model({(): {EOS: 1.0}})
    never_ends = np.full(6, -np.inf)
    never_ends[[A, B]] = np.log(0.5)  # whatever came before

    def step(prefix: np.ndarray) -> np.ndarray:
        return np.stack([ends(row[None])[0] if source == 0 else never_ends
                         for source, row in zip(session.sources, prefix, strict=True)])  # fmt: skip

    session = ArraySession(step)
    session.sources = np.array([0, 1])  # one row per sentence for the first step
    original = session.keep

    def keep(rows: np.ndarray, *, same_sources: bool = False) -> None:
        original(rows)
        assert not same_sources or (session.sources[rows] == session.sources).all()
        session.sources = session.sources[rows]

    session.keep = keep
    out = beam_search(session, 2, beam_size=2, max_len=5, specials=SPECIALS)
    np.testing.assert_array_equal(out[0], [EOS, PAD, PAD, PAD, PAD])
    assert len(session.orders) == 4  # after steps 1 to 4; step 5 reaches max_len
    assert session.orders[0].tolist() == [1, 1]  # sentence 1's row becomes its two beams; sentence 0 has left
    assert all(len(rows) == 2 and set(rows) <= {0, 1} for rows in session.orders[1:])  # then of its own two
    assert (session.sources == 1).all()
    assert set(out[1].tolist()) <= {A, B}  # max_len reached: the best unfinished beam


def test_new_beams_stay_in_their_parents_places_where_they_can() -> None:
    """Each parent's best child takes the parent's place; the other children take the free places in order."""
    parents = np.array([[0, 0, 1, 2], [3, 3, 3, 3], [1, 0, 3, 2], [2, 2, 0, 0]])  # per sentence, best beam first
    order = _stay(parents)
    assert order.tolist() == [[0, 2, 3, 1], [1, 2, 3, 0], [1, 0, 3, 2], [2, 1, 0, 3]]
    assert (np.take_along_axis(parents, order, axis=1) == np.arange(4)).sum(axis=1).tolist() == [3, 1, 4, 2]


def checked(config: TransformerConfig, max_len: object, bos_id: object, eos_id: object, pad_id: object, **kwargs: Any):
    """What a model's ``generate`` checks of its loose keywords: the spec they make, and the longest limit."""
    return check_generate_call(config, None, max_len=max_len, src=kwargs.get("src"), bos_id=bos_id, eos_id=eos_id,
                               pad_id=pad_id, beam_size=1, length_penalty=1.0, search=None)  # fmt: skip


def generation_of(config: TransformerConfig, generation: Generation | None, **loose: Any) -> Generation:
    return check_generate_call(config, generation, max_len=1, src=None, **loose)[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0, 1, 2), "`max_len` must be a positive int, received 0"),
        ((9, 0, 1, 2), "`max_len` must be at most the model's max_len=8 positions, received 9"),
        ((5, -1, 1, 2), "`bos_id` must be a non-negative int, received -1"),
        ((5, 0, 12, 2), "`eos_id` must be < tgt_vocab=12, received eos_id=12"),
        (([3, 9], 0, 1, 2), "`max_len` must be at most the model's max_len=8 positions, received 9"),
        ((np.array([3, 0]), 0, 1, 2), r"`max_len` must be positive ints, received 0 in \[3, 0\]"),
        (([3, 4, 5], 0, 1, 2), "`max_len` gives one limit per row: src has 2 rows, received 3 limits"),
    ],
)
def test_generation_args_are_checked(args: tuple, message: str) -> None:
    config = TransformerConfig(10, 12, d_model=8, num_heads=2, max_len=8)
    with pytest.raises(ValueError, match=message):
        checked(config, *args, src=np.zeros((2, 5), dtype=np.int64))


@pytest.mark.parametrize("max_len", [[], [[3, 4]], [3.0, 4.0], [True, False], "34", 4.0, True, None, {3: 4}])
def test_a_length_limit_is_an_int_or_one_int_per_row(max_len: object) -> None:
    config = TransformerConfig(10, 12, d_model=8, num_heads=2, max_len=8)
    with pytest.raises(TypeError, match="`max_len` must be an int"):
        checked(config, max_len, 0, 1, 2)


def test_the_longest_length_limit_is_what_a_session_needs() -> None:
    config = TransformerConfig(10, 12, d_model=8, num_heads=2, max_len=8)
    assert checked(config, 5, 0, 1, 2)[1] == 5
    assert checked(config, (3, 7, 2), 0, 1, 2, src=np.zeros((3, 4)))[1] == 7


def test_pad_id_defaults_to_the_configs_then_to_eos() -> None:
    with_pad, without_pad = TransformerConfig(10, 12, pad_id=3), TransformerConfig(10, 12)
    assert checked(with_pad, 4, 0, 1, 5)[0].specials == Specials(pad=5, bos=0, eos=1)
    assert checked(with_pad, 4, 0, 1, None)[0].specials.pad == 3
    assert checked(without_pad, 4, 0, 1, None)[0].specials.pad == 1


def test_generate_takes_the_spec_or_its_keywords_not_both() -> None:
    config = TransformerConfig(10, 12, d_model=8, num_heads=2, max_len=8)
    spec = Generation(Specials(pad=2, bos=0, eos=1), banned=(4,), forced=(5,), search=SearchOptions(beam_size=3))
    assert generation_of(config, spec, bos_id=None, eos_id=None, pad_id=None, beam_size=1, length_penalty=1.0,
                         search=None) is spec  # fmt: skip
    loose = {"bos_id": None, "eos_id": None, "pad_id": None, "beam_size": 1, "length_penalty": 1.0, "search": None}
    for name, value in (("bos_id", 0), ("pad_id", 2), ("beam_size", 2), ("length_penalty", 0.6),
                        ("search", SearchOptions())):  # fmt: skip
        with pytest.raises(ValueError, match=f"give the generation once: .*received generation and \\['{name}'\\]"):
            generation_of(config, spec, **{**loose, name: value})
    with pytest.raises(TypeError, match=r"needs `generation`, or `bos_id` and `eos_id`: received neither \['eos_id'\]"):
        generation_of(config, None, **{**loose, "bos_id": 0})
    with pytest.raises(TypeError, match="`generation` must be a Generation or None, received dict"):
        generation_of(config, {"specials": {}}, **loose)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`forced` must be a target token \(< 12\), received 12"):
        generation_of(config, Generation(forced=(12,)), **loose)


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"banned": 3}, TypeError, "`banned` must be a list of token ids, received 3"),
        ({"forced": "ab"}, TypeError, "`forced` must be a list of token ids, received 'ab'"),
        ({"forced": [-1]}, ValueError, "`forced` must be a non-negative int, received -1"),
        ({"banned": [True]}, TypeError, "`banned` must be an int, received True of type bool"),
        ({"banned": [4, 5], "forced": [5]}, ValueError, r"`banned` holds \[5\], which `forced` makes every"),
        ({"banned": [2]}, ValueError, "`banned` holds the EOS 2: no translation could end"),
        ({"specials": {"pad": 0}}, TypeError, "`specials` must be a Specials, received dict"),
        ({"search": None}, TypeError, "`search` must be a SearchOptions, received NoneType"),
    ],
)
def test_a_generation_spec_is_checked_when_made(values: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Generation(**values)


def test_a_generation_spec_round_trips_through_json() -> None:
    spec = Generation(Specials(pad=5, bos=5, eos=0, unk=1), banned=[5], forced=[7, 8],
                      search=SearchOptions(beam_size=4, length_penalty=0.6, n_best=2, min_length=3))  # fmt: skip
    assert (spec.banned, spec.forced) == ((5,), (7, 8))  # lists kept as tuples
    assert Generation.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert Generation.from_dict({"forced": [3]}) == Generation(forced=(3,))  # the rest: defaults
    with pytest.raises(ValueError, match=r"unknown generation keys \['bad_words_ids'\]"):
        Generation.from_dict({"bad_words_ids": [[3]]})
    with pytest.raises(TypeError, match="a generation spec must be a JSON object, received list"):
        Generation.from_dict([])
    with pytest.raises(TypeError, match="`search` must be a JSON object, received 4"):
        Generation.from_dict({"search": 4})


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
        self.taken: list[np.ndarray] = []  # the rows of every take

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
        self.taken.append(rows)
        return x[rows]

    def tensor(self, array: np.ndarray) -> np.ndarray:
        return array

    argmax = staticmethod(numpy_argmax)
    top_k = staticmethod(numpy_top_k)
    log_probs_at = staticmethod(numpy_log_probs_at)

    @staticmethod
    def suppress(log_probs: np.ndarray, tokens: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        out = log_probs.copy()
        out[slice(None) if rows is None else rows[:, None], tokens] = -np.inf
        with np.errstate(invalid="ignore"):  # a row of a hypothesis with no chance left stays so
            out = out - np.logaddexp.reduce(out, axis=-1, keepdims=True)  # renormalised
        return np.where(np.isnan(out), -np.inf, out)


class TableSession(DecodingSession):
    """The engine's rows over :class:`TableSteps`, recording every reorder."""

    def __init__(self, tables: list[dict], use_cache: bool) -> None:
        cache = DecoderCache(1, NumpyKVCache) if use_cache else None
        batch = len(tables)
        super().__init__(TableSteps(tables), np.arange(batch), np.ones((batch, 3), dtype=bool), cache)
        self.taken: list[np.ndarray] = []  # the rows of every reorder
        self.same_sources: list[bool] = []  # and whether it said the rows kept their sources

    @property
    def memories(self) -> list[np.ndarray]:
        return self.steps.memories

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        self.taken.append(np.asarray(rows).copy())
        self.same_sources.append(same_sources)
        super().keep(rows, same_sources=same_sources)


SEARCH = dict(max_len=6)


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_generate_greedy_decodes_each_source_from_its_own_state(use_cache: bool) -> None:
    session = TableSession([DEEP, OTHER], use_cache)
    out = generate(session, 2, spec(SearchOptions()), **SEARCH)
    np.testing.assert_array_equal(out, [[A, EOS, PAD], [C, A, EOS]])  # greedy's (0.24)
    # Greedy search reorders only to drop the rows that have ended: source 0 after its second step.
    assert [rows.tolist() for rows in session.taken] == [[1]]
    assert [memory.tolist() for memory in session.memories] == [[0, 1], [0, 1], [1]]


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_generate_beam_search_reorders_the_session_with_the_beams(use_cache: bool) -> None:
    k = 2
    session = TableSession([DEEP, OTHER], use_cache)
    out = generate(session, 2, spec(SearchOptions(beam_size=k, length_penalty=0.0)), **SEARCH)
    np.testing.assert_array_equal(out, [[B, C, A, EOS], [C, A, EOS, PAD]])  # beam search's answer (0.36)
    expected = beam_search(
        ArraySession(table_model(DEEP)), 1, beam_size=k, length_penalty=0.0, specials=SPECIALS, **SEARCH
    )
    np.testing.assert_array_equal(out[:1, : expected.shape[1]], expected)

    # The first step computes one row per source; then each source's row holds its first beam and its other beams
    # take new rows after those (rows b and B + b*(k-1) + j - 1), then each step's rows.
    np.testing.assert_array_equal(session.taken[0], [0, 1, 0, 1])
    assert not session.same_sources[0]
    assert session.memories[0].tolist() == [0, 1]
    assert len(session.taken) > 1
    sources = np.array([0, 1, 0, 1])  # each row's source
    for rows, same_sources in zip(session.taken[1:], session.same_sources[1:], strict=True):
        assert rows.shape in ((2 * k,), (k,))
        assert same_sources == (len(rows) == len(sources))  # said exactly when no source left
        if same_sources:
            assert (sources[rows] == sources).all(), rows  # beams stay among their source's rows
        else:  # a source has ended and left: its rows are no longer computed
            assert len(set(sources[rows])) == 1, rows
        sources = sources[rows]
    assert set(sources) == {0}  # source 1's answer is shorter: it leaves first
    assert [memory.tolist() for memory in session.memories][-1] == [0, 0]
    assert all(memory.tolist() in ([0, 1, 0, 1], [0, 0]) for memory in session.memories[1:])
    # The source's state (memory or its projection, key mask) moves only when the beams are made and when a source
    # leaves; the reorders among a source's beams leave it where it is.
    moves = session.same_sources.count(False)
    assert moves == 2
    assert len(session.steps.taken) == moves * (1 if use_cache else 2)  # the key mask, and the memory if not cached
    assert session.memory_key_mask.shape == (k, 3)  # the key mask follows the memory
    if use_cache:
        assert session.cache.self_attention[0].keys.shape[0] == k


def test_generate_with_beam_size_one_is_greedy_and_lays_out_no_beams() -> None:
    session = TableSession([DEEP, OTHER], use_cache=True)
    np.testing.assert_array_equal(
        generate(session, 2, spec(SearchOptions(beam_size=1)), **SEARCH),
        generate(TableSession([DEEP, OTHER], False), 2, spec(SearchOptions()), **SEARCH),
    )
    assert [rows.tolist() for rows in session.taken] == [[1]]  # only the ended row leaves


def test_greedy_drops_ended_rows_only_once_a_quarter_have_ended() -> None:
    """Rows leave the model's state in groups (each reorder copies the cache), and their answers stay the same."""
    ends = {(): {EOS: 1.0}}
    long = {(A,) * n: {A: 1.0} for n in range(10)}
    tables = [ends] + [long] * 7  # one of eight rows ends at once: below a quarter, it stays
    session = TableSession(tables, use_cache=True)
    out = generate(session, 8, spec(SearchOptions()), **SEARCH)
    assert session.taken == []
    np.testing.assert_array_equal(out[0], [EOS, PAD, PAD, PAD, PAD, PAD])
    np.testing.assert_array_equal(out[1:], np.full((7, 6), A))
    session = TableSession([ends, ends, long, long], use_cache=True)  # half end: they leave
    out = generate(session, 4, spec(SearchOptions()), **SEARCH)
    assert [rows.tolist() for rows in session.taken] == [[2, 3]]
    np.testing.assert_array_equal(out[2:], np.full((2, 6), A))


@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
def test_n_best_of_a_batch_are_each_sentences_own(use_cache: bool) -> None:
    """Sentences stop at different steps and leave the state; each keeps the n best of its own beams."""
    tables = [DEEP, OTHER, {(): {EOS: 1.0}}]  # the last has one hypothesis: it gives just that one
    search = dict(n=3, beam_size=3, max_len=6, specials=SPECIALS, length_penalty=0.0)
    found = beam_search_n_best(TableSession(tables, use_cache), 3, **search)
    for table, hypotheses in zip(tables, found, strict=True):
        alone = beam_search_n_best(ArraySession(table_model(table)), 1, **search)[0]
        assert [(rank, tokens.tolist()) for rank, tokens in hypotheses] == [
            (rank, tokens.tolist()) for rank, tokens in alone
        ]
    assert [[tokens.tolist() for _, tokens in hypotheses] for hypotheses in found] == [
        [[B, C, A, EOS], [A, EOS], [A, B, EOS]],  # 0.36, 0.24, 0.18 (A C EOS, as likely, comes after)
        [[C, A, EOS], [A, EOS], [C, EOS]],  # 0.42, 0.3, 0.28
        [[EOS]],
    ]


# --- search options and sampling -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"beam_size": 0}, ValueError, "`beam_size` must be a positive int, received 0"),
        ({"length_penalty": float("inf")}, ValueError, "`length_penalty` must be finite, received inf"),
        ({"length_penalty": "0.6"}, TypeError, "`length_penalty` must be a float, received '0.6'"),
        ({"sampling_topk": -1}, ValueError, "`sampling_topk` must be a non-negative int, received -1"),
        ({"sampling_topk": 0, "sampling_topp": 0.0}, ValueError, r"`sampling_topp` must be in \(0, 1\], received 0.0"),
        ({"sampling_topk": 0, "sampling_topp": 1.5}, ValueError, r"`sampling_topp` must be in \(0, 1\], received 1.5"),
        ({"sampling_topk": 0, "sampling_temperature": 0.0}, ValueError, "`sampling_temperature` must be > 0"),
        ({"sampling_topk": 0, "sampling_temperature": -1.0}, ValueError, "`sampling_temperature` must be > 0"),
        ({"sampling_topk": 5, "beam_size": 4}, ValueError, r"takes no beams, received `beam_size`=4"),
        ({"sampling_temperature": 0.5}, ValueError, "`sampling_topk`=1 .* does not do"),
        ({"sampling_topp": 0.9}, ValueError, "`sampling_topk`=1 .* does not do"),
        ({"seed": -3, "sampling_topk": 0}, ValueError, "`seed` must be a non-negative int, received -3"),
        ({"max_length": 0}, ValueError, "`max_length` must be a positive int, received 0"),
        ({"min_length": -1}, ValueError, "`min_length` must be a non-negative int, received -1"),
        ({"min_length": 4, "max_length": 3}, ValueError, "`min_length`=4 is above `max_length`=3: no translation"),
        ({"n_best": 3, "beam_size": 2}, ValueError, "n-best lists come from a beam at least as wide"),
    ],
)
def test_search_options_are_checked_when_made(options: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        SearchOptions(**options)


def test_the_strategy_follows_from_the_options() -> None:
    assert SearchOptions().strategy is SEARCHES["greedy"]
    assert SearchOptions(beam_size=4, n_best=2).strategy is SEARCHES["beam"]
    assert SearchOptions(sampling_topk=0).strategy is SEARCHES["sample"]
    sampled = SearchOptions(sampling_topk=10, sampling_topp=0.9, sampling_temperature=0.7, seed=3)
    assert sampled.strategy is SEARCHES["sample"]
    assert set(SEARCHES) == {"greedy", "beam", "sample"}
    # What each asks of its callers: a stream decodes one row a sentence; draws are seeded per sentence.
    assert [(s.name, s.one_row, s.draws) for s in SEARCHES.values()] == [
        ("greedy", True, False),
        ("sample", True, True),
        ("beam", False, False),
    ]


def test_loose_beam_arguments_or_search_options_not_both() -> None:
    assert search_options(None, beam_size=3, length_penalty=0.6) == SearchOptions(beam_size=3, length_penalty=0.6)
    options = SearchOptions(sampling_topk=0)
    assert search_options(options) is options
    with pytest.raises(ValueError, match="give the search once"):
        search_options(options, beam_size=2)
    with pytest.raises(TypeError, match="`search` must be a SearchOptions"):
        search_options({"beam_size": 2})


PROBS = np.array([0.02, 0.3, 0.05, 0.25, 0.18, 0.12, 0.08])  # token 0 is BOS: never taken in these tests


@pytest.mark.parametrize(
    ("top_k", "top_p", "temperature"),
    [(0, 1.0, 1.0), (3, 1.0, 1.0), (0, 0.6, 1.0), (0, 1.0, 0.5), (0, 1.0, 2.0), (4, 0.7, 0.8), (1, 1.0, 1.0)],
    ids=["all", "top-3", "top-p-0.6", "temperature-0.5", "temperature-2", "top-4-p-0.7-t-0.8", "top-1"],
)
def test_sampled_frequencies_follow_the_filtered_distribution(top_k: int, top_p: float, temperature: float) -> None:
    """20,000 first tokens drawn from a model whose next-token probabilities are known: each token's frequency within
    5 standard deviations of its probability under the filters (a token filtered out never drawn)."""
    draws = 20_000
    log_probs = np.log(PROBS)

    def step(prefix: np.ndarray) -> np.ndarray:
        return np.tile(log_probs, (len(prefix), 1))

    options = SearchOptions(sampling_topk=top_k, sampling_topp=top_p, sampling_temperature=temperature, seed=7)
    tokens = sample_search(ArraySession(step), draws, options, max_len=1, specials=SPECIALS)
    frequencies = np.bincount(tokens[:, 0], minlength=len(PROBS)) / draws
    expected = filtered_distribution(PROBS, top_k, top_p, temperature)
    bound = 5 * np.sqrt(expected * (1 - expected) / draws)
    assert (np.abs(frequencies - expected) <= bound).all(), (frequencies, expected)
    assert (frequencies[expected == 0] == 0).all()


def test_sampling_from_the_most_probable_token_is_greedy_search() -> None:
    """``sampling_topk=1`` on the sampling path (greedy's options choose greedy search itself) takes greedy's tokens,
    whatever the seed."""
    for seed in range(4):
        step = two_token_model(seed)
        args = dict(max_len=8, specials=SPECIALS)
        greedy = greedy_search(ArraySession(step), 5, **args)
        sampled = sample_search(ArraySession(step), 5, SearchOptions(sampling_topk=1, seed=seed), **args)
        np.testing.assert_array_equal(sampled, greedy)


def test_each_sentence_draws_from_its_own_seeded_generator() -> None:
    """The same seed and keys give the same tokens; a sentence's tokens depend on its key, not on its row or on the
    sentences sampled with it; another seed gives others."""
    step = two_token_model(3, vocab=12)
    options = SearchOptions(sampling_topk=0, seed=11)
    args = dict(max_len=10, specials=SPECIALS)
    together = sample_search(ArraySession(step), 6, options, **args)
    np.testing.assert_array_equal(sample_search(ArraySession(step), 6, options, **args), together)
    alone = sample_search(ArraySession(step), 1, options, keys=[4], **args)
    np.testing.assert_array_equal(alone[0], together[4, : alone.shape[1]])
    reversed_rows = sample_search(ArraySession(step), 6, options, keys=np.arange(6)[::-1], **args)
    np.testing.assert_array_equal(reversed_rows[::-1, : together.shape[1]], together[:, : reversed_rows.shape[1]])
    assert len({tuple(row) for row in together.tolist()}) > 1  # rows drew differently
    other = sample_search(ArraySession(step), 6, replace(options, seed=12), **args)
    assert other.tolist() != together.tolist()


def test_a_fresh_seed_without_one() -> None:
    step = two_token_model(3, vocab=12)
    args = dict(max_len=10, specials=SPECIALS)
    runs = {
        tuple(sample_search(ArraySession(step), 4, SearchOptions(sampling_topk=0), **args).ravel()) for _ in range(5)
    }
    assert len(runs) > 1


def test_generate_caps_every_limit_at_max_length_and_refuses_n_best_lists() -> None:
    session = TableSession([{(A,) * n: {A: 1.0} for n in range(10)}] * 2, use_cache=True)
    out = generate(session, 2, spec(SearchOptions(max_length=3)), **{**SEARCH, "max_len": [6, 2]})
    np.testing.assert_array_equal(out, [[A, A, A], [A, A, PAD]])
    with pytest.raises(ValueError, match="n-best lists"):
        generate(TableSession([DEEP], True), 1, spec(SearchOptions(beam_size=2, n_best=2)), **SEARCH)


# EOS is likely early; held back until two tokens are made, its probability goes to the others (renormalised).
EARLY = {(): {EOS: 0.7, A: 0.2, B: 0.1}, (A,): {EOS: 0.6, B: 0.3, C: 0.1}, (B,): {EOS: 0.5, C: 0.5},
         (A, B): {EOS: 0.9, C: 0.1}, (A, C): {EOS: 1.0}, (B, C): {EOS: 0.8, A: 0.2}}  # fmt: skip
HELD = {(): {A: 2 / 3, B: 1 / 3}, (A,): {B: 0.75, C: 0.25}, (B,): {C: 1.0},
        (A, B): {EOS: 0.9, C: 0.1}, (A, C): {EOS: 1.0}, (B, C): {EOS: 0.8, A: 0.2}}  # fmt: skip


# EARLY with A banned: its probability goes to the others.
UNBANNED = {(): {EOS: 0.875, B: 0.125}, (B,): {EOS: 0.5, C: 0.5}, (B, C): {EOS: 1.0}}
# EARLY with B forced first: the first step certain.
FORCED = {(): {B: 1.0}, (B,): {EOS: 0.5, C: 0.5}, (B, C): {EOS: 0.8, A: 0.2}}
# EARLY with B forced first, A banned and EOS held back for 2 tokens, all at once.
ALL = {(): {B: 1.0}, (B,): {C: 1.0}, (B, C): {EOS: 1.0}}
PROCESSED = {
    "min-length": (EARLY, {"search": {"min_length": 2}}, HELD),
    "banned": (EARLY, {"banned": (A,)}, UNBANNED),
    "forced": (EARLY, {"forced": (B,)}, FORCED),
    "all": (EARLY, {"banned": (A,), "forced": (B,), "search": {"min_length": 2}}, ALL),
}


@pytest.mark.parametrize(
    "options",
    [{}, {"beam_size": 3, "length_penalty": 0.6}, {"beam_size": 3, "n_best": 3}, {"sampling_topk": 0, "seed": 5}],
    ids=["greedy", "beam", "n-best", "sampled"],
)
@pytest.mark.parametrize("use_cache", [False, True], ids=["no-cache", "cache"])
@pytest.mark.parametrize("processing", PROCESSED, ids=list(PROCESSED))
def test_every_search_sees_the_processed_steps(options: dict, use_cache: bool, processing: str) -> None:
    """Every strategy searches a model whose steps a spec processes (``min_length`` holding EOS back, banned tokens,
    forced ones) as it searches the model whose steps give those probabilities themselves, renormalised: the same
    tokens and scores."""
    table, settings, expected_table = PROCESSED[processing]
    search = SearchOptions(**options, **settings.get("search", {}))
    processed = Generation(SPECIALS, search=search, **{k: v for k, v in settings.items() if k != "search"})
    written = spec(SearchOptions(**options))
    if search.n_best > 1:
        found = n_best_search(TableSession([table], use_cache), 1, processed, max_len=6)
        expected = n_best_search(TableSession([expected_table], use_cache), 1, written, max_len=6)
        assert [[(round(s, 5), t.tolist()) for s, t in hyps] for hyps in found] == [
            [(round(s, 5), t.tolist()) for s, t in hyps] for hyps in expected
        ]
        return
    out = generate(TableSession([table, table], use_cache), 2, processed, **SEARCH)
    expected = generate(TableSession([expected_table] * 2, use_cache), 2, written, **SEARCH)
    np.testing.assert_array_equal(out, expected)
    if processed.forced:
        assert (out[:, : len(processed.forced)] == processed.forced).all()
    assert A not in out if processed.banned else True
    assert all(list(row).index(EOS) >= search.min_length for row in out)
    if not written.search.strategy.draws:
        assert generate(TableSession([table], use_cache), 1, written, **SEARCH)[0, 0] == EOS  # unprocessed: at once


def test_a_step_is_processed_row_by_row_at_each_rows_length() -> None:
    """What a stream whose rows sit at different lengths gets: each row processed at its own length."""
    generation = Generation(SPECIALS, banned=(A,), forced=(B, C), search=SearchOptions(min_length=3))
    log_probs = np.log(np.full((4, 6), 1 / 6))
    out = process(TableSteps([]), log_probs, np.array([0, 1, 2, 3]), generation)
    finite = [np.flatnonzero(np.isfinite(row)).tolist() for row in out]
    assert finite == [[B], [C], [BOS, PAD, B, C], [BOS, EOS, PAD, B, C]]  # forced, forced, no EOS yet, all but A
    np.testing.assert_allclose(np.exp(out).sum(axis=1), 1.0)
    assert process(TableSteps([]), log_probs, np.array([5]), Generation(SPECIALS)) is log_probs  # nothing to do
