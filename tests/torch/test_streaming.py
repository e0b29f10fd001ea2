"""Continuous batching in the library (``multihead.torch.streaming.Stream``, the engine over PyTorch's joining rows)
on small random models: sentences that join a running batch at random steps get what ``generate`` gives each of them
alone, whatever their search, processing or ensemble.

Notation: B batch, Ls source length.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import cast

import numpy as np
import pytest
import torch

from multihead import engine
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.engine import Engine, Ensemble
from multihead.torch import Transformer
from multihead.torch.streaming import Stream, StreamRows

PAD, BOS, EOS = 0, 1, 2
SPECIALS = Specials(pad=PAD, bos=BOS, eos=EOS)


def spec(search: SearchOptions, **kwargs: object) -> Generation:
    return Generation(SPECIALS, search=search, **kwargs)  # type: ignore[arg-type]


def model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(20, 23, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                       pad_id=PAD).double().eval()  # fmt: skip


def ended(stream: Engine) -> dict[object, list[int]]:
    """One step of ``stream``: the tokens of the sentences that ended, by owner."""
    return {finished.owner: finished.tokens.tolist() for finished in stream.step()}


def sources(count: int) -> list[list[int]]:
    rng = random.Random(count)
    return [[rng.randrange(3, 20) for _ in range(rng.randrange(1, 9))] for _ in range(count)]


@pytest.mark.parametrize(
    ("search", "rows"),
    [
        (SearchOptions(), 3),
        (SearchOptions(), 64),
        (SearchOptions(sampling_topk=0, sampling_temperature=2.0, seed=1), 3),
    ],
    ids=["greedy-3-rows", "greedy-64-rows", "sampled-3-rows"],
)
def test_each_sentence_gets_what_generate_gives_it_alone(search: SearchOptions, rows: int) -> None:
    """Sentences with limits of their own join at random steps (a sampled one with its own key); each gets the tokens
    ``generate`` gives its source alone with that limit and key, up to its EOS."""
    transformer, texts = model(), sources(12)
    limits = [3 + index % 7 for index in range(len(texts))]
    stream = Stream(transformer, rows=rows, generation=spec(search))
    rng, pending, got = random.Random(0), list(range(len(texts))), {}
    while pending or len(stream):
        while pending and rng.random() < 0.5:
            index = pending.pop(0)
            stream.add(texts[index], index, limit=limits[index], key=index)
        got.update(ended(stream))
    assert sorted(got) == list(range(len(texts)))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=limits[index])
            alone = engine.generate(session, 1, spec(search), max_len=limits[index], keys=[index])[0].tolist()
        expected = alone[: alone.index(EOS) + 1] if EOS in alone else alone
        assert got[index] == expected, index
    if search.strategy.draws:
        greedy = Stream(transformer, rows=rows, generation=spec(SearchOptions()))
        for index, ids in enumerate(texts):
            greedy.add(ids, index, limit=limits[index])
        answers = {}
        while len(greedy):
            answers.update(ended(greedy))
        assert answers != got  # it did sample


def test_a_stream_refuses_what_it_cannot_decode() -> None:
    with pytest.raises(ValueError, match="`rows` must be a positive int"):
        Stream(model(), rows=0, generation=spec(SearchOptions()))
    with pytest.raises(TypeError, match="`generation` must be a Generation, received SearchOptions"):
        Stream(model(), rows=4, generation=SearchOptions())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`forced` must be a target token \(< 23\), received 23"):
        Stream(model(), rows=4, generation=spec(SearchOptions(), forced=(23,)))


def test_max_length_caps_every_sentence() -> None:
    transformer = model()
    with torch.no_grad():
        transformer.output_proj.bias[EOS] = -1e9  # no sentence ends before its limit
    stream = Stream(transformer, rows=4, generation=spec(SearchOptions(max_length=2)))
    for index, ids in enumerate(sources(3)):
        stream.add(ids, index, limit=5)
    got = {}
    while len(stream):
        got.update(ended(stream))
    assert [len(tokens) for _, tokens in sorted(got.items())] == [2, 2, 2]


@pytest.mark.parametrize(
    "generation",
    [
        spec(SearchOptions(min_length=3)),
        spec(SearchOptions(min_length=3, sampling_topk=0, seed=2)),
        spec(SearchOptions(min_length=3), forced=(7, 8), banned=(5, 6)),
        spec(SearchOptions(min_length=3, sampling_topk=0, seed=2), forced=(9,), banned=(5,)),
    ],
    ids=["greedy", "sampled", "greedy-forced-banned", "sampled-forced-banned"],
)
def test_each_sentence_is_processed_at_its_own_length(generation: Generation) -> None:
    """Sentences joining at random steps sit at lengths of their own: each is held from EOS until it has made
    ``min_length`` tokens, starts with the forced tokens and never takes a banned one, as ``generate`` processes it
    alone (where EOS is likely from the first step)."""
    search = generation.search
    transformer, texts = model(), sources(10)
    with torch.no_grad():
        transformer.output_proj.bias[EOS] += 4.0
    stream = Stream(transformer, rows=3, generation=generation)
    rng, pending, got = random.Random(1), list(range(len(texts))), {}
    while pending or len(stream):
        while pending and rng.random() < 0.5:
            index = pending.pop(0)
            stream.add(texts[index], index, limit=8, key=index)
        got.update(ended(stream))
    free = spec(SearchOptions(sampling_topk=search.sampling_topk, seed=search.seed))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            alone, unheld = (
                engine.generate(
                    transformer.decoding_session(torch.tensor([ids]), max_len=8), 1, options, max_len=8, keys=[index]
                )[0].tolist()
                for options in (generation, free)
            )  # fmt: skip
        assert got[index] == alone[: alone.index(EOS) + 1], index
        assert got[index].index(EOS) >= 3
        assert got[index][: len(generation.forced)] == list(generation.forced)
        assert not set(got[index]) & set(generation.banned)
        assert unheld.index(EOS) < 3  # without it, EOS comes early


@pytest.mark.parametrize("search", [SearchOptions(), SearchOptions(sampling_topk=0, seed=3)], ids=["greedy", "sampled"])
def test_each_sentence_may_force_tokens_of_its_own(search: SearchOptions) -> None:
    """Sentences into different languages share the stream: each starts with its own forced tokens (or the
    generation's, ``None``) and gets what ``generate`` gives it alone with those."""
    transformer, texts = model(), sources(12)
    own: list[tuple[int, ...] | None] = [(7,), (8, 9), None, (10,)] * 3
    stream = Stream(transformer, rows=4, generation=spec(search, forced=(11,), banned=(5,)))
    rng, pending, got = random.Random(2), list(range(len(texts))), {}
    while pending or len(stream):
        while pending and rng.random() < 0.5:
            index = pending.pop(0)
            stream.add(texts[index], index, limit=8, key=index, forced=own[index])
        got.update(ended(stream))
    for index, ids in enumerate(texts):
        forced = (11,) if own[index] is None else own[index]
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=8)
            alone = engine.generate(session, 1, spec(search, forced=forced, banned=(5,)), max_len=8, keys=[index])
        expected = alone[0].tolist()
        assert got[index] == (expected[: expected.index(EOS) + 1] if EOS in expected else expected), index
        assert tuple(got[index][: len(forced)]) == forced
    with pytest.raises(ValueError, match=r"`forced` must be a target token \(< 23\), received 30"):
        stream.add(texts[0], 0, limit=8, forced=(30,))
    with pytest.raises(ValueError, match=r"`banned` holds \[5\], which `forced` makes"):
        stream.add(texts[0], 0, limit=8, forced=(5,))


def test_room_says_how_many_would_join_by_the_rule_sentences_wait_by() -> None:
    """``room(available)``: the rows left when nothing decodes or ``available`` are a quarter of the rows decoding;
    none else, each such step counted, until ``JOIN_AFTER`` steps have passed."""
    from multihead.torch.streaming import JOIN_AFTER

    transformer = model()
    with torch.no_grad():
        transformer.output_proj.bias[EOS] = -1e9  # no sentence ends
    stream = Stream(transformer, rows=16, generation=spec(SearchOptions()))
    texts = sources(16)
    assert stream.room(20) == 16  # nothing decoding: as many as fit
    for index in range(8):
        stream.add(texts[index], index, limit=30)
    stream.step()
    assert (len(stream), stream.room(1)) == (8, 0)  # one is less than a quarter of 8
    for _ in range(JOIN_AFTER - 1):
        stream.step()
        assert stream.room(1) == 0
    stream.step()
    assert stream.room(1) == 8  # waited long enough: the rows left
    assert stream.room(2) == 8  # a quarter of 8
    stream.add(texts[8], 8, limit=30, search=SearchOptions(beam_size=3))  # waiting, its beam's rows taken
    assert stream.room(100) == 5


STRATEGIES = {
    "greedy": SearchOptions(),
    "sampled": SearchOptions(sampling_topk=0, sampling_temperature=1.5, seed=5),
    "beam": SearchOptions(beam_size=3, length_penalty=0.6),
    "n-best": SearchOptions(beam_size=3, n_best=2),
}
PROCESSING = {
    "plain": {},
    "banned-forced-min-length": {"banned": (5,), "forced": (7,)},
    "ensemble": {},
}


@pytest.mark.parametrize("processing", PROCESSING, ids=list(PROCESSING))
@pytest.mark.parametrize("strategy", STRATEGIES, ids=list(STRATEGIES))
def test_every_search_streams_as_it_generates(strategy: str, processing: str) -> None:
    """Every strategy, with bans, forced tokens and a minimum length or as an ensemble of two models: sentences
    joining a stream at random steps (each with its own limit and key) get the hypotheses that the batch search gives
    each alone, with the same ranks."""
    search = STRATEGIES[strategy]
    if processing == "banned-forced-min-length":
        search = replace(search, min_length=2)
    generation = spec(search, **PROCESSING[processing])  # type: ignore[arg-type]
    models = [model(), model(seed=1)] if processing == "ensemble" else [model()]
    with torch.no_grad():
        for each in models:
            each.output_proj.bias[EOS] += 2.0  # EOS likely early, held back by min_length
    mean = models[0].decoder_steps().mean_log_probs

    def rows() -> engine.Rows:
        members = [StreamRows(each, None, pad=PAD) for each in models]
        return Ensemble(members, mean) if len(members) > 1 else members[0]

    stream: Engine[int] = Engine(rows(), generation, capacity=7)
    texts = sources(9)
    limits = [2 + index % 6 for index in range(len(texts))]
    rng, pending, got = random.Random(3), list(range(len(texts))), {}
    while pending or len(stream):
        while pending and rng.random() < 0.4:
            index = pending.pop(0)
            stream.add(texts[index], index, limit=limits[index], key=index)
        got.update({finished.owner: finished.hypotheses for finished in stream.step()})
    assert sorted(got) == list(range(len(texts)))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            sessions = [each.decoding_session(torch.tensor([ids]), max_len=limits[index]) for each in models]
            alone = Ensemble(sessions, mean) if len(sessions) > 1 else sessions[0]
            if search.beam_size > 1:
                expected = engine.n_best_search(alone, 1, generation, max_len=limits[index])[0]
            else:
                found = engine.generate(alone, 1, generation, max_len=limits[index], keys=[index])
                tokens = found[0].tolist()
                expected = [(None, tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens)]
        assert [hypothesis.tolist() for _, hypothesis in got[index]] == [np.asarray(t).tolist() for _, t in expected], (
            index
        )
        if search.beam_size > 1:
            np.testing.assert_allclose([rank for rank, _ in got[index]], [rank for rank, _ in expected], rtol=1e-5)


def test_sentences_of_different_searches_share_a_stream() -> None:
    """Greedy, sampled and beam-search sentences decode side by side, each as its own search says alone."""
    transformer, texts = model(), sources(12)
    stream = Stream(transformer, rows=16, generation=spec(SearchOptions()))
    searches = [SearchOptions(), SearchOptions(beam_size=4), SearchOptions(sampling_topk=3, seed=4)] * 4
    for index, ids in enumerate(texts):
        stream.add(ids, index, limit=7, key=index, search=searches[index])
    got: dict[object, list[int]] = {}
    while len(stream):
        got.update(ended(stream))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=7)
            alone = engine.generate(session, 1, spec(searches[index]), max_len=7, keys=[index])[0].tolist()
        assert got[index] == (alone[: alone.index(EOS) + 1] if EOS in alone else alone), index


def test_a_sentences_rows_read_its_memory_held_once() -> None:
    """Beam-search and greedy sentences in one stream: the memory is held once per sentence being searched (slots
    packed at the front, as many as sentences), however many beams read it, and each sentence gets what it gets
    alone."""
    transformer, texts = model(), sources(6)
    stream = Stream(transformer, rows=32, generation=spec(SearchOptions()))
    searches = [SearchOptions(beam_size=4), SearchOptions()] * 3
    for index, ids in enumerate(texts):
        stream.add(ids, index, limit=8, search=searches[index])
    rows_of = cast(StreamRows, stream.rows)
    got: dict[object, list[int]] = {}
    held = []  # each step's (rows, slots in use, slots the buffer holds)
    while len(stream):
        got.update(ended(stream))
        assert len(rows_of.sources) == len(set(rows_of.slots.tolist()))  # every slot in use read, packed
        held.append((len(rows_of.slots), len(rows_of.sources), rows_of.memory.buffer.shape[1]))
    assert max(rows for rows, _, _ in held) == 15
    assert max(buffer for _, _, buffer in held) == 8
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=8)
            alone = engine.generate(session, 1, spec(searches[index]), max_len=8)[0].tolist()
        assert got[index] == (alone[: alone.index(EOS) + 1] if EOS in alone else alone), index


def phrases_of(count: int) -> list[list[tuple[int, ...]]]:
    """Each sentence's constraints: none, or one or two phrases of one or two target ids (not 5, which the test's
    generation bans)."""
    rng = random.Random(count + 1)
    ids = [token for token in range(3, 23) if token != 5]
    return [[tuple(rng.choice(ids) for _ in range(rng.randrange(1, 3))) for _ in range(rng.randrange(0, 3))]
            for _ in range(count)]  # fmt: skip


def holds(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(phrase)]) == phrase for i in range(len(tokens) - len(phrase) + 1))


@pytest.mark.parametrize("search", [SearchOptions(), SearchOptions(beam_size=3)], ids=["greedy", "beam-3"])
def test_constrained_sentences_hold_their_phrases_in_batch_and_stream(search: SearchOptions) -> None:
    """Sentences with phrases to hold beside sentences without: the stream gives each what the batch gives it, every
    constrained translation holds its phrases, and the unconstrained ones get what they get with no constraint in the
    batch at all."""
    transformer, texts, phrases = model(), sources(8), phrases_of(8)
    limit, generation = 12, spec(search, banned=(5,))
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in texts], batch_first=True, padding_value=PAD)
    with torch.inference_mode():
        batch = engine.generate(transformer.decoding_session(src, max_len=limit), len(texts), generation,
                                max_len=limit, constraints=phrases)  # fmt: skip
        free = engine.generate(transformer.decoding_session(src, max_len=limit), len(texts), generation, max_len=limit)
    stream = Stream(transformer, rows=16, generation=generation)
    for index, ids in enumerate(texts):
        stream.add(ids, index, limit=limit, constraints=phrases[index])
    got: dict[object, list[int]] = {}
    while len(stream):
        got.update(ended(stream))
    for index, own in enumerate(phrases):
        tokens = batch[index].tolist()
        tokens = tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens
        assert got[index] == tokens, index
        assert all(holds(tokens, phrase) for phrase in own), (index, own, tokens)
        if not own:
            width = max(len(tokens), 1)
            assert free[index, :width].tolist() == tokens, index
    assert any(not all(holds(row.tolist(), phrase) for phrase in own) for row, own in zip(free, phrases, strict=True))


def test_an_ensemble_holds_its_phrases_and_of_one_model_twice_is_that_model() -> None:
    """Constrained beam search over an ensemble: of a model and itself it gives the model's own n-best lists (the
    mean of equal log-probabilities is each), ranks included; of two models every hypothesis holds its phrases."""
    first, second, texts, phrases = model(), model(seed=1), sources(6), phrases_of(6)
    generation, limit = spec(SearchOptions(beam_size=3, n_best=2), banned=(5,)), 10
    mean = first.decoder_steps().mean_log_probs
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in texts], batch_first=True, padding_value=PAD)

    def search(*members: torch.nn.Module) -> list[list[tuple[float, np.ndarray]]]:
        sessions = [each.decoding_session(src, max_len=limit) for each in members]
        rows = Ensemble(sessions, mean) if len(sessions) > 1 else sessions[0]
        return engine.n_best_search(rows, len(texts), generation, max_len=limit, constraints=phrases)

    with torch.inference_mode():
        alone, twice, pair = search(first), search(first, first), search(first, second)
    for index, own in enumerate(phrases):
        assert [t.tolist() for _, t in twice[index]] == [t.tolist() for _, t in alone[index]], index
        np.testing.assert_allclose([r for r, _ in twice[index]], [r for r, _ in alone[index]], rtol=1e-5)
        assert pair[index], index
        assert all(holds(t.tolist(), phrase) for _, t in pair[index] for phrase in own), index
