"""Greedy and beam search (shared by both front ends) on toy models whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from multihead.config import TransformerConfig
from multihead.decoding import beam_search, check_generation_args, greedy_search

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
