"""Continuous batching on Keras (``multihead.keras.streaming.StreamRows`` under the engine): sentences that join a
running batch at random steps get what the Keras model's own ``generate`` gives each of them alone, whatever their
search, and what the PyTorch stream gives them with the same weights.

Notation: Ls source length.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from multihead import engine
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.engine import Engine
from multihead.keras import Transformer
from multihead.keras.streaming import StreamRows

pytestmark = pytest.mark.keras

PAD, BOS, EOS = 0, 1, 2
SPECIALS = Specials(pad=PAD, bos=BOS, eos=EOS)
SEARCHES = {
    "greedy": SearchOptions(),
    "sampled": SearchOptions(sampling_topk=0, seed=3),
    "beam": SearchOptions(beam_size=3),
}


def model() -> Transformer:
    import keras

    keras.utils.set_random_seed(0)
    transformer = Transformer(20, 23, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64,
                              pad_id=PAD)  # fmt: skip
    transformer.build()
    bias = transformer.output_proj.bias
    bias.assign(np.where(np.arange(23) == EOS, 2.0, 0.0).astype(bias.dtype))  # EOS likely within a few steps
    return transformer


@pytest.mark.parametrize("search", SEARCHES.values(), ids=list(SEARCHES))
def test_each_sentence_gets_what_generate_gives_it_alone(search: SearchOptions) -> None:
    transformer = model()
    generation = Generation(SPECIALS, search=search, banned=(5,), forced=(7,))
    rng = random.Random(4)
    texts = [[rng.randrange(3, 20) for _ in range(rng.randrange(1, 9))] for _ in range(7)]
    limits = [3 + index % 5 for index in range(len(texts))]
    stream: Engine[int] = Engine(StreamRows(transformer, pad=PAD), generation, capacity=8)
    pending, got = list(range(len(texts))), {}
    while pending or len(stream):
        while pending and rng.random() < 0.5:
            index = pending.pop(0)
            stream.add(texts[index], index, limit=limits[index], key=index)
        got.update({finished.owner: finished.tokens.tolist() for finished in stream.step()})
    assert sorted(got) == list(range(len(texts)))
    for index, ids in enumerate(texts):
        src = np.array([ids], dtype="int32")
        if search.strategy.draws:  # drawing with its own key, as row `index` of a batch would
            session = transformer.decoding_session(src, max_len=limits[index], compiled=False)
            alone = engine.generate(session, 1, generation, max_len=limits[index], keys=[index])[0].tolist()
        else:
            alone = transformer.generate(src, max_len=limits[index], generation=generation)[0].tolist()
        assert got[index] == (alone[: alone.index(EOS) + 1] if EOS in alone else alone), index


def holds(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i : i + len(phrase)]) == phrase for i in range(len(tokens) - len(phrase) + 1))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_constrained_sentences_hold_their_phrases_in_batch_and_stream(compiled: bool) -> None:
    """A batch's sentences with phrases to hold (greedy, so a beam of one more than their phrases) beside sentences
    without: the Keras stream gives each what the batch gives it, eagerly and compiled where the backend compiles, and
    every constrained translation holds its phrases."""
    import keras

    if compiled and keras.backend.backend() == "torch":
        pytest.skip("the torch backend has no compiled generation")
    transformer, rng = model(), random.Random(5)
    texts = [[rng.randrange(3, 20) for _ in range(rng.randrange(1, 9))] for _ in range(6)]
    phrases = [[], [(9,)], [(11, 12)], [], [(4,), (17, 3)], [(21,)]]
    limit, generation = 10, Generation(SPECIALS, search=SearchOptions(), banned=(5,))
    src = np.full((len(texts), max(map(len, texts))), PAD, dtype="int32")
    for row, ids in enumerate(texts):
        src[row, : len(ids)] = ids
    session = transformer.decoding_session(src, max_len=limit, compiled=compiled)
    batch = engine.generate(session, len(texts), generation, max_len=limit, constraints=phrases)
    stream: Engine[int] = Engine(StreamRows(transformer, pad=PAD), generation, capacity=32)
    for index, ids in enumerate(texts):
        stream.add(ids, index, limit=limit, constraints=phrases[index])
    got: dict[int, list[int]] = {}
    while len(stream):
        got.update({finished.owner: finished.tokens.tolist() for finished in stream.step()})
    for index, own in enumerate(phrases):
        tokens = batch[index].tolist()
        tokens = tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens
        assert got[index] == tokens, index
        assert all(holds(tokens, phrase) for phrase in own), (index, own, tokens)
