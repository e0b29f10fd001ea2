"""Continuous batching in the library (``multihead.torch.streaming.Stream``) on a small random model: sentences that
join a running batch at random steps get what ``generate`` gives each of them alone, greedy and sampled.

Notation: B batch, Ls source length.
"""

from __future__ import annotations

import random

import pytest
import torch

from multihead import decoding
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.torch import Transformer
from multihead.torch.streaming import Stream

PAD, BOS, EOS = 0, 1, 2
SPECIALS = Specials(pad=PAD, bos=BOS, eos=EOS)


def spec(search: SearchOptions, **kwargs: object) -> Generation:
    return Generation(SPECIALS, search=search, **kwargs)  # type: ignore[arg-type]


def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(20, 23, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                       pad_id=PAD).double().eval()  # fmt: skip


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
        got.update(stream.step())
    assert sorted(got) == list(range(len(texts)))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=limits[index])
            alone = decoding.generate(session, 1, spec(search), max_len=limits[index], keys=[index])[0].tolist()
        expected = alone[: alone.index(EOS) + 1] if EOS in alone else alone
        assert got[index] == expected, index
    if search.strategy.draws:
        greedy = Stream(transformer, rows=rows, generation=spec(SearchOptions()))
        for index, ids in enumerate(texts):
            greedy.add(ids, index, limit=limits[index])
        answers = {}
        while len(greedy):
            answers.update(greedy.step())
        assert answers != got  # it did sample


def test_a_stream_takes_one_row_a_sentence() -> None:
    with pytest.raises(ValueError, match="beam search"):
        Stream(model(), rows=4, generation=spec(SearchOptions(beam_size=2)))
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
        got.update(stream.step())
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
        got.update(stream.step())
    free = spec(SearchOptions(sampling_topk=search.sampling_topk, seed=search.seed))
    for index, ids in enumerate(texts):
        with torch.inference_mode():
            alone, unheld = (
                decoding.generate(
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
        got.update(stream.step())
    for index, ids in enumerate(texts):
        forced = (11,) if own[index] is None else own[index]
        with torch.inference_mode():
            session = transformer.decoding_session(torch.tensor([ids]), max_len=8)
            alone = decoding.generate(session, 1, spec(search, forced=forced, banned=(5,)), max_len=8, keys=[index])
        expected = alone[0].tolist()
        assert got[index] == (expected[: expected.index(EOS) + 1] if EOS in expected else expected), index
        assert tuple(got[index][: len(forced)]) == forced
    with pytest.raises(ValueError, match=r"`forced` must be a target token \(< 23\), received 30"):
        stream.add(texts[0], 0, limit=8, forced=(30,))
    with pytest.raises(ValueError, match=r"`banned` holds \[5\], which `forced` makes"):
        stream.add(texts[0], 0, limit=8, forced=(5,))


def test_room_says_how_many_would_join_by_the_rule_sentences_wait_by() -> None:
    """``room(available)``: all that fit when nothing decodes or a quarter of the rows decoding joins; none else,
    each such step counted, until ``JOIN_AFTER`` steps have passed."""
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
    assert (len(stream.sentences), stream.room(1)) == (8, 0)  # one is less than a quarter of 8
    for _ in range(JOIN_AFTER - 1):
        stream.step()
        assert stream.room(1) == 0
    stream.step()
    assert stream.room(1) == 1  # waited long enough
    assert stream.room(2) == 2  # a quarter of 8
    assert stream.room(100) == 8  # the rows left
