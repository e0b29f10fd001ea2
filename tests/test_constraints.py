"""Lexical constraints (:mod:`multihead.constraints`) in the engine's beam search: against an exhaustive search of
toy models, narrow beams that still hold every phrase, and bad constraints refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from multihead.constraints import Constraints, Phrase
from multihead.decoding import SearchOptions
from multihead.engine import Engine, generate, n_best_search
from test_decoding import (
    EOS,
    PAD,
    A,
    ArraySession,
    B,
    C,
    exhaustive_ranking,
    spec,
    two_token_model,
)


def holds(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(phrase)]) == phrase for i in range(len(tokens) - len(phrase) + 1))


PHRASES = [[(A,)], [(B, C)], [(A,), (C,)], [(C, C)], [(B, A), (A, B)]]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("phrases", PHRASES, ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_a_beam_as_wide_as_every_hypothesis_finds_the_exhaustive_constrained_best(
    seed: int, phrases: list[tuple[int, ...]], alpha: float
) -> None:
    """Up to 4 tokens: at most 108 candidates a step, so 128 beams keep every hypothesis alive whatever its bank; the
    best is the exhaustive search's best among the hypotheses that hold every phrase."""
    step = two_token_model(seed)
    ranking = [(rank, tokens) for rank, tokens in exhaustive_ranking(step, 4, alpha)
               if all(holds(tokens, phrase) for phrase in phrases)]  # fmt: skip
    generation = spec(SearchOptions(beam_size=128, length_penalty=alpha, n_best=3))
    (found,) = n_best_search(ArraySession(step), 1, generation, max_len=4, constraints=[phrases])
    assert [tokens.tolist() for _, tokens in found] == [tokens for _, tokens in ranking[:3]]
    np.testing.assert_allclose([rank for rank, _ in found], [rank for rank, _ in ranking[:3]], rtol=1e-5)


def earned(tokens: list[int], phrase: tuple[int, ...]) -> int:
    """The tokens of ``phrase`` that ``tokens`` have written: all of it where they hold it, else the longest start of
    it they end with."""
    if holds(tokens, phrase):
        return len(phrase)
    return max((n for n in range(1, len(phrase)) if n <= len(tokens) and tuple(tokens[-n:]) == phrase[:n]), default=0)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize(("held", "preferred"), [([], [(A, B)]), ([], [(C,), (B, A)]), ([(B,)], [(A, C)])], ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_preferred_phrases_rank_as_the_exhaustive_search_with_their_bonus(
    seed: int, held: list[tuple[int, ...]], preferred: list[tuple[int, ...]], alpha: float
) -> None:
    """A preferred phrase's bonus (1.5 a token written of it, whole or ending the hypothesis before its EOS) joins
    each hypothesis' rank, beside its log-probability over its length to the penalty; the beam as wide as every
    hypothesis finds the exhaustive search's best three among those that hold the phrases to hold."""
    step = two_token_model(seed)
    ranking = []
    for rank, tokens in exhaustive_ranking(step, 4, alpha):
        body = tokens[:-1] if tokens[-1] == EOS else tokens
        if all(holds(tokens, phrase) for phrase in held):
            bonus = sum(1.5 * earned(body, phrase) for phrase in preferred)
            ranking.append((rank + bonus, tokens))  # the bonus beside the log-probability, not divided by length
    ranking.sort(key=lambda hypothesis: -hypothesis[0])
    phrases = [*held, *(Phrase(phrase, bonus=1.5) for phrase in preferred)]
    generation = spec(SearchOptions(beam_size=128, length_penalty=alpha, n_best=3))
    (found,) = n_best_search(ArraySession(step), 1, generation, max_len=4, constraints=[phrases])
    assert [tokens.tolist() for _, tokens in found] == [tokens for _, tokens in ranking[:3]]
    np.testing.assert_allclose([rank for rank, _ in found], [rank for rank, _ in ranking[:3]], rtol=1e-5)


@pytest.mark.parametrize("phrases", [[(A,)], [(B, C)], [(A,), (C, C)]], ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_what_may_follow_a_phrase_is_what_the_exhaustive_search_lets_follow_it(
    seed: int, phrases: list[tuple[int, ...]]
) -> None:
    """Each phrase followed, where a hypothesis first holds it whole, only by B or by the end (EOS, or none): the
    wide beam's three best are the exhaustive search's among the hypotheses that hold every phrase so."""
    step = two_token_model(seed)
    follows = np.zeros(6, dtype=bool)
    follows[B] = True

    def followed(tokens: list[int], phrase: tuple[int, ...]) -> bool:
        first = next(i for i in range(len(tokens)) if tuple(tokens[i : i + len(phrase)]) == phrase) + len(phrase)
        return first == len(tokens) or tokens[first] in (B, EOS)

    ranking = [(rank, tokens) for rank, tokens in exhaustive_ranking(step, 4, 0.6)
               if all(holds(tokens, phrase) and followed(tokens, phrase) for phrase in phrases)]  # fmt: skip
    generation = spec(SearchOptions(beam_size=128, length_penalty=0.6, n_best=3))
    given = [[Phrase(phrase, followed_by=follows) for phrase in phrases]]
    (found,) = n_best_search(ArraySession(step), 1, generation, max_len=4, constraints=given)
    assert [tokens.tolist() for _, tokens in found] == [tokens for _, tokens in ranking[:3]]


def test_a_preferred_phrase_changes_only_what_its_bonus_outweighs() -> None:
    """A bonus of almost nothing leaves greedy search's translation as it was; a large one writes the phrase."""
    for seed in range(6):
        step = two_token_model(seed)
        generation = spec(SearchOptions())
        alone = generate(ArraySession(step), 1, generation, max_len=6)[0].tolist()
        slight = generate(ArraySession(step), 1, generation, max_len=6, constraints=[[Phrase((C, A), bonus=1e-6)]])
        strong = generate(ArraySession(step), 1, generation, max_len=6, constraints=[[Phrase((C, A), bonus=50.0)]])
        assert slight[0, : len(alone)].tolist() == alone
        assert holds(strong[0].tolist(), (C, A)), (seed, strong[0].tolist())


@pytest.mark.parametrize("phrases", PHRASES, ids=str)
def test_greedy_and_narrow_beams_hold_every_phrase(phrases: list[tuple[int, ...]]) -> None:
    """A greedy request runs the constrained beam at one beam more than its phrases; beside unconstrained sentences
    in the same batch, which get what they get alone."""
    for seed, beam in itertools.product(range(6), (1, 2)):
        step = two_token_model(seed)
        generation = spec(SearchOptions(beam_size=beam))
        alone = generate(ArraySession(step), 1, generation, max_len=8)
        both = generate(ArraySession(step), 2, generation, max_len=8,
                        constraints=[phrases, []])  # fmt: skip
        tokens = both[0].tolist()
        assert all(holds(tokens, phrase) for phrase in phrases), (seed, beam, tokens)
        np.testing.assert_array_equal(both[1, : alone.shape[1]], alone[0])
        assert (both[1, alone.shape[1] :] == PAD).all()


def test_phrases_the_limit_leaves_no_room_for_together_end_with_the_best_beam() -> None:
    """Two phrases of two tokens that share none, and a limit of three: no hypothesis holds both, so the best beam
    ends unfinished."""
    step = two_token_model(0)
    out = generate(ArraySession(step), 1, spec(SearchOptions(beam_size=2)), max_len=3, constraints=[[(A, B), (C, C)]])
    assert len(out[0]) == 3
    assert EOS not in out[0].tolist()


def test_bad_constraints_are_refused_in_one_line() -> None:
    step = two_token_model(0)
    with pytest.raises(ValueError, match=r"constraint 0 must be a non-empty sequence of token ids, received \(\)"):
        Constraints([()])
    with pytest.raises(ValueError, match=r"constraint 1 must hold token ids \(ints >= 0\), received \[-1\]"):
        Constraints([(A,), (-1,)])
    with pytest.raises(ValueError, match=r"constraint 1's bonus must be a number > 0, received -1.0"):
        Constraints([(A,), Phrase((B,), bonus=-1.0)])
    with pytest.raises(ValueError, match=r"constraint 0: followed_by applies to a phrase to hold, not to one with a"):
        Constraints([Phrase((B,), bonus=1.0, followed_by=np.ones(6, dtype=bool))])
    with pytest.raises(ValueError, match=r"constraint 0's followed_by must be a 1-D bool array \(one a token\), rec"):
        Constraints([Phrase((B,), followed_by=np.ones(6))])
    with pytest.raises(TypeError, match="`constraints` must be a sequence of token id sequences, received 'ab'"):
        Constraints("ab")  # type: ignore[arg-type]
    engine: Engine[int] = Engine(ArraySession(step), spec(SearchOptions(sampling_topk=3)), vocab=6)
    with pytest.raises(ValueError, match="constraints need greedy or beam search, not sampling"):
        engine.hold([0], np.array([4]), np.array([0]), [[(A,)]])
    engine = Engine(ArraySession(step), spec(SearchOptions()), vocab=6)
    with pytest.raises(ValueError, match=r"constraint \[3, 9\] holds an id past the vocabulary \(6 ids\)"):
        engine.hold([0], np.array([4]), np.array([0]), [[(A, 9)]])
    with pytest.raises(ValueError, match=r"constraint \[3\]'s followed_by has 5 entries, not one for each of the 6"):
        engine.hold([0], np.array([4]), np.array([0]), [[Phrase((A,), followed_by=np.ones(5, dtype=bool))]])
    engine = Engine(ArraySession(step), spec(SearchOptions(), banned=(C,)), vocab=6)
    with pytest.raises(ValueError, match=r"constraint \[3, 5\] holds \[5\], which no translation may hold \(banned"):
        engine.hold([0], np.array([4]), np.array([0]), [[(A, C)]])
    with pytest.raises(ValueError, match=r"constraint \[1\] holds \[1\], which no translation may hold"):
        engine.hold([0], np.array([4]), np.array([0]), [[(EOS,)]])
    with pytest.raises(
        ValueError, match=r"constraint \[3, 4, 5\] is 3 tokens, more than the 2 this sentence's limit of 2"
    ):
        Engine(ArraySession(step), spec(SearchOptions()), vocab=6).hold([0], np.array([2]), np.array([0]),
                                                                     [[(A,), (A, B, C)]])  # fmt: skip


def test_progress_is_what_the_hypothesis_holds_and_the_longest_start_it_ends_with() -> None:
    """The progress the search tracks token by token (with each phrase's fall-back table) equals its definition,
    computed afresh from the whole hypothesis, for random hypotheses over few ids (so phrases overlap, repeat and
    restart)."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        phrases = [tuple(rng.integers(3, 6, size=rng.integers(1, 5)).tolist()) for _ in range(rng.integers(1, 4))]
        tokens = rng.integers(3, 6, size=rng.integers(0, 10)).tolist()
        met = tuple(holds(tokens, phrase) for phrase in phrases)
        ends = range(1, len(tokens) + 1)  # the lengths of the hypothesis' ends
        partial = tuple(
            0 if whole else max((n for n in ends if n < len(phrase) and tuple(tokens[-n:]) == phrase[:n]), default=0)
            for phrase, whole in zip(phrases, met, strict=True)
        )
        progress = Constraints(phrases).of(tokens)
        assert (progress.met, progress.partial) == (met, partial), (phrases, tokens)


def test_the_terminology_guides_library_example_holds_its_phrases() -> None:
    """docs/terminology.md's library example runs as printed, and its translations hold what they must: each
    sentence's phrases, (17, 18) followed by an id of 20 or more or by the end."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "terminology.md").read_text(encoding="utf-8")
    (block,) = [part.split("```", 1)[0] for part in text.split("```python\n")[1:]]
    space: dict = {}
    exec(compile(block, "docs/terminology.md", "exec"), space)
    first, _, third = (row.tolist() for row in space["tokens"])
    at = next(i for i in range(len(first) - 1) if first[i : i + 2] == [17, 18]) + 2
    assert at == len(first) or first[at] >= 20 or first[at] == 2, first
    assert holds(third, (9,)), third
