"""KV-cache decoding and the encoder-decoder Transformer, Keras front end, against the PyTorch one.

Runs under every Keras backend. Notation: B batch, Ls/Lt source/target length, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import torch

from conftest import filtered_distribution
from keras_helpers import BACKEND, numpy, tensor
from multihead import decoding
from multihead import keras as mk
from multihead import torch as mt
from multihead.io import load_model, load_weights, save_model, save_weights
from multihead.keras import generation
from multihead.keras.generation import COMPILED_BACKENDS

PAD, BOS, EOS = 0, 1, 2
SMALL = dict(d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64)
RNG = np.random.default_rng(0)


def pair(tmp_path: Path, **overrides) -> tuple[mt.Transformer, mk.Transformer]:
    """A torch model and a Keras model holding the same weights (through one safetensors file)."""
    torch.manual_seed(0)
    options = {**SMALL, **overrides}
    torch_model = mt.Transformer(20, 23, **options).eval()
    keras_model = mk.Transformer(20, 23, **options)
    save_weights(torch_model, tmp_path / "w.safetensors")
    load_weights(keras_model, tmp_path / "w.safetensors")
    return torch_model, keras_model


def token_array(batch: int, length: int, vocab: int = 20) -> np.ndarray:
    return RNG.integers(3, vocab, size=(batch, length)).astype("int32")


def torch_logits(model: mt.Transformer, src: np.ndarray, tgt: np.ndarray, **masks) -> np.ndarray:
    with torch.no_grad():
        masks = {name: torch.from_numpy(m) for name, m in masks.items()}
        return model(torch.from_numpy(src).long(), torch.from_numpy(tgt).long(), **masks).numpy()


@pytest.mark.parametrize(
    "options",
    [{}, {"norm_first": True, "activation": "gelu"}, {"pad_id": PAD},
     {"norm_first": True, "positions": "fairseq", "first_position": 2}],
    ids=["post-norm", "pre-norm-gelu", "pad-id", "pre-norm-fairseq-positions-from-2"],
)  # fmt: skip
def test_same_logits_as_torch_with_shared_weights(tmp_path: Path, options: dict) -> None:
    torch_model, keras_model = pair(tmp_path, **options)
    src, tgt = token_array(3, 7), token_array(3, 6, vocab=23)
    src[0, 5:] = PAD
    masks = {} if "pad_id" in options else {"src_key_mask": src != PAD}
    keras_out = keras_model(tensor(src), tensor(tgt), **{k: tensor(v) for k, v in masks.items()})
    np.testing.assert_allclose(numpy(keras_out), torch_logits(torch_model, src, tgt, **masks), atol=1e-5)


def test_same_generations_as_torch(tmp_path: Path) -> None:
    torch_model, keras_model = pair(tmp_path)
    src = token_array(3, 7)
    for beam_size in (1, 3):
        expected = torch_model.generate(
            torch.from_numpy(src).long(), max_len=8, bos_id=BOS, eos_id=EOS, beam_size=beam_size
        )
        got = keras_model.generate(tensor(src), max_len=8, bos_id=BOS, eos_id=EOS, beam_size=beam_size)
        np.testing.assert_array_equal(got, expected.numpy())


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_same_samples_as_torch_and_reproducible(tmp_path: Path, compiled: bool) -> None:
    """Sampling with one seed gives PyTorch's tokens (each sentence draws from its own seeded generator on the host,
    from the same probabilities up to float rounding), again and again; top-k 1 gives greedy's."""
    if compiled and BACKEND not in COMPILED_BACKENDS:
        pytest.skip(f"generation on the {BACKEND} backend is eager only")
    torch_model, keras_model = pair(tmp_path)
    src = token_array(5, 7)
    search = decoding.SearchOptions(sampling_topk=0, sampling_topp=0.95, sampling_temperature=1.3, seed=9)
    args = dict(max_len=9, bos_id=BOS, eos_id=EOS)
    expected = torch_model.generate(torch.from_numpy(src).long(), search=search, **args).numpy()
    got = keras_model.generate(tensor(src), search=search, compiled=compiled, **args)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(keras_model.generate(tensor(src), search=search, compiled=compiled, **args), got)
    greedy = keras_model.generate(tensor(src), compiled=compiled, **args)
    assert got.tolist() != greedy.tolist()


def test_sampled_first_tokens_follow_the_models_probabilities() -> None:
    """As the PyTorch front end's test: 2,000 first tokens from a model whose probabilities are known (output
    projection zero, its bias the logits), each frequency within 5 standard deviations of the filtered
    distribution's."""
    keras.utils.set_random_seed(0)
    model = mk.Transformer(20, 23, **SMALL)
    model.build()
    logits = np.random.default_rng(3).normal(size=23).astype("float32") * 1.5
    model.output_proj.kernel.assign(np.zeros((SMALL["d_model"], 23), "float32"))
    model.output_proj.bias.assign(logits)
    search = decoding.SearchOptions(sampling_topk=5, sampling_topp=0.8, sampling_temperature=0.7, seed=5)
    draws = 2000
    out = model.generate(tensor(token_array(draws, 3)), max_len=1, bos_id=BOS, eos_id=EOS, search=search)
    frequencies = np.bincount(out[:, 0], minlength=23) / draws
    probs = np.exp(logits - logits.max()).astype(np.float64)
    expected = filtered_distribution(probs / probs.sum(), 5, 0.8, 0.7)
    assert (np.abs(frequencies - expected) <= 5 * np.sqrt(expected * (1 - expected) / draws)).all()
    assert (frequencies[expected == 0] == 0).all()


def test_a_length_limit_per_row_as_torch(tmp_path: Path) -> None:
    """``max_len`` one per row gives the tokens PyTorch gives, where the limits bind (the torch front end's tests
    show them equal to each row searched alone)."""
    torch_model, keras_model = pair(tmp_path)
    with torch.no_grad():
        torch_model.output_proj.bias[EOS] = -1e9
    keras_model.output_proj.bias.assign(numpy(keras_model.output_proj.bias) - 1e9 * (np.arange(23) == EOS))
    src, limits = token_array(3, 7), [2, 8, 5]
    for beam_size in (1, 3):
        expected = torch_model.generate(
            torch.from_numpy(src).long(), max_len=limits, bos_id=BOS, eos_id=EOS, beam_size=beam_size
        )
        got = keras_model.generate(tensor(src), max_len=limits, bos_id=BOS, eos_id=EOS, beam_size=beam_size)
        np.testing.assert_array_equal(got, expected.numpy())
        assert [int((row != EOS).sum()) for row in got] == limits  # pad_id: EOS here


@pytest.mark.parametrize("capacity", [None, 8], ids=["growing", "preallocated"])
def test_cached_decode_equals_full_decode(tmp_path: Path, capacity: int | None) -> None:
    _, model = pair(tmp_path, norm_first=True)
    src, tgt = tensor(token_array(2, 7)), token_array(2, 6, vocab=23)
    full = numpy(model(src, tensor(tgt)))
    memory = model.encode(src)
    cache = model.new_cache(capacity)
    steps = [numpy(model.decode(tensor(tgt[:, t : t + 1]), memory, cache=cache)) for t in range(6)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)


@pytest.mark.parametrize("options", [{}, {"norm_first": True, "pad_id": PAD}], ids=["post-norm", "pre-norm-padded"])
def test_decoding_steps_give_the_log_probs_of_full_decoding(tmp_path: Path, options: dict) -> None:
    """The eager steps (the memory projected into the cache once, then one token per row through the decoder's step
    path) give the log-probabilities of teacher-forced calls on the whole prefix, also after beam-style reordering
    that repeats and drops rows."""
    _, model = pair(tmp_path, **options)
    src = token_array(3, 7)
    src[0, 4:] = PAD
    key_mask = src != PAD
    model.build()
    memory = model.encode(tensor(src), src_key_mask=tensor(key_mask))
    session = decoding.DecodingSession(model.decoder_steps(), memory, tensor(key_mask), model.new_cache())
    prefix, rows = np.full((3, 1), BOS), np.arange(3)
    for step in range(6):
        full = numpy(model(tensor(src[rows]), tensor(prefix.astype("int32")), src_key_mask=tensor(key_mask[rows])))
        expected = full[:, -1] - np.log(np.exp(full[:, -1]).sum(-1, keepdims=True))
        np.testing.assert_allclose(numpy(session.step(prefix[:, -1])), expected, rtol=0, atol=2e-5)
        if step == 2:  # rows 2, 0, 0 go on, as beam search may keep them
            order = np.array([2, 0, 0])
            session.keep(order)
            prefix, rows = prefix[order], rows[order]
        prefix = np.concatenate([prefix, token_array(3, 1, vocab=23)], 1)


COMPILED = pytest.mark.skipif(
    BACKEND not in COMPILED_BACKENDS, reason=f"generation on the {BACKEND} backend is eager only"
)


@COMPILED
@pytest.mark.parametrize(
    ("beam_size", "use_cache", "batch"),
    [(1, True, 3), (1, False, 3), (3, True, 3), (3, False, 3), (1, True, 4), (2, True, 4)],
    ids=["greedy-cache", "greedy-recompute", "beam-cache", "beam-recompute", "greedy-4-rows", "beam-8-rows"],
)
def test_compiled_generation_gives_the_eager_tokens(
    tmp_path: Path, beam_size: int, use_cache: bool, batch: int
) -> None:
    """Compiled steps (XLA; fixed-capacity buffers, reordering inside the program) against eager steps, with a padded
    source: 7 source positions filled up to 16, 3 rows up to 4 (and 3 beams of 3 up to 16 rows), 9 tokens in a
    capacity of 16, so the last buffer positions stay unwritten."""
    _, model = pair(tmp_path, pad_id=PAD)
    src = token_array(batch, 7)
    src[1, 4:] = PAD
    options = dict(max_len=9, bos_id=BOS, eos_id=EOS, beam_size=beam_size, use_cache=use_cache)
    eager = model.generate(tensor(src), compiled=False, **options)
    assert (eager[:, 3:] != EOS).any()  # not a search that ended at once
    np.testing.assert_array_equal(model.generate(tensor(src), compiled=True, **options), eager)


@COMPILED
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_compiled_greedy_chosen_inside_the_program_gives_the_eager_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_cache: bool
) -> None:
    """On an accelerator the step program chooses each greedy token (on the CPU the host does, from the
    log-probabilities): forced here, with rows that end at different steps."""
    monkeypatch.setattr(generation, "chooses_on_host", lambda: False)
    chosen, argmax = [], generation.CompiledDecoding.argmax

    def recorded(session: generation.CompiledDecoding, scores: generation.Scores) -> np.ndarray:
        chosen.append(scores.best is not None)
        return argmax(session, scores)

    monkeypatch.setattr(generation.CompiledDecoding, "argmax", recorded)
    _, model = pair(tmp_path, pad_id=PAD)
    src = token_array(4, 7)
    options = dict(max_len=[9, 3, 6, 9], bos_id=BOS, eos_id=EOS, use_cache=use_cache)
    eager = model.generate(tensor(src), compiled=False, **options)
    np.testing.assert_array_equal(model.generate(tensor(src), compiled=True, **options), eager)
    assert chosen
    assert all(chosen)


@COMPILED
def test_compiled_generation_builds_what_an_eager_call_left_unbuilt() -> None:
    """An eager call builds the layers it reaches, not the model: compiling afterwards must not build them again."""
    keras.utils.set_random_seed(0)
    model = mk.Transformer(20, 23, **SMALL)
    src = tensor(token_array(2, 5))
    eager = model.generate(src, max_len=5, bos_id=BOS, eos_id=EOS, compiled=False)
    np.testing.assert_array_equal(model.generate(src, max_len=5, bos_id=BOS, eos_id=EOS, compiled=True), eager)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tracing counts are tf.function's")
def test_compiled_step_is_traced_once_and_kept(tmp_path: Path) -> None:
    _, model = pair(tmp_path)
    src = tensor(token_array(2, 5))
    first = model.generate(src, max_len=9, bos_id=BOS, eos_id=EOS, compiled=True)
    [(_, step)] = model.generation_programs.values()
    traced = step.experimental_get_tracing_count()
    # One trace for 2 rows, and one for 1 row if a sentence ended before the other (the buffers shrink to a power of
    # two).
    ends = {row.index(EOS) if EOS in row else None for row in np.asarray(first).tolist()}
    assert traced == (2 if len(ends) > 1 else 1)
    again = model.generate(src, max_len=12, bos_id=BOS, eos_id=EOS, compiled=True)  # the same capacity, 16
    assert len(model.generation_programs) == 1
    assert step.experimental_get_tracing_count() == traced
    np.testing.assert_array_equal(again[:, : first.shape[1]], first)
    # A batch of 3 and a source of 11 fill up to another shape (4 rows, 16 positions): one more trace at least.
    model.generate(tensor(token_array(3, 11)), max_len=9, bos_id=BOS, eos_id=EOS, compiled=True)
    assert step.experimental_get_tracing_count() > traced


def test_compiled_generation_is_refused_where_there_is_none(tmp_path: Path) -> None:
    _, model = pair(tmp_path)
    src = tensor(token_array(2, 5))
    with pytest.raises(TypeError, match=r"`compiled` must be True or False"):
        model.generate(src, max_len=4, bos_id=BOS, eos_id=EOS, compiled="yes")
    if BACKEND not in COMPILED_BACKENDS:
        with pytest.raises(ValueError, match=rf"`compiled`=True needs one of the backends.*the {BACKEND} backend"):
            model.generate(src, max_len=4, bos_id=BOS, eos_id=EOS, compiled=True)


def test_greedy_with_cache_equals_without_and_beam_one_is_greedy(tmp_path: Path) -> None:
    _, model = pair(tmp_path)
    src = tensor(token_array(3, 7))
    greedy = model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS)
    np.testing.assert_array_equal(model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS, use_cache=False), greedy)
    np.testing.assert_array_equal(model.generate(src, max_len=10, bos_id=BOS, eos_id=EOS, beam_size=1), greedy)


def test_decoder_is_causal(tmp_path: Path) -> None:
    _, model = pair(tmp_path)
    src, tgt = tensor(token_array(2, 7)), token_array(2, 8, vocab=23)
    changed = tgt.copy()
    changed[:, 5:] = token_array(2, 3, vocab=23)
    np.testing.assert_allclose(
        numpy(model(src, tensor(changed)))[:, :5], numpy(model(src, tensor(tgt)))[:, :5], atol=1e-6
    )


def test_source_padding_never_changes_real_positions(tmp_path: Path) -> None:
    _, model = pair(tmp_path)
    src, tgt = token_array(1, 5), tensor(token_array(1, 6, vocab=23))
    padded = np.concatenate([src, np.full((1, 4), 7, "int32")], 1)
    key_mask = tensor(np.array([[True] * 5 + [False] * 4]))
    np.testing.assert_allclose(
        numpy(model(tensor(padded), tgt, src_key_mask=key_mask)), numpy(model(tensor(src), tgt)), atol=1e-5
    )


def test_saved_model_reloads_in_either_front_end(tmp_path: Path) -> None:
    torch_model, keras_model = pair(tmp_path, pad_id=PAD, norm_first=True)
    src, tgt = token_array(2, 6), token_array(2, 5, vocab=23)
    expected = torch_logits(torch_model, src, tgt)
    save_model(torch_model, tmp_path / "from-torch")
    reloaded = load_model(tmp_path / "from-torch", framework="keras")
    np.testing.assert_allclose(numpy(reloaded(tensor(src), tensor(tgt))), expected, atol=1e-5)
    save_model(keras_model, tmp_path / "from-keras")
    np.testing.assert_allclose(torch_logits(load_model(tmp_path / "from-keras"), src, tgt), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"`framework` must be one of \('torch', 'keras'\), received 'jax'"):
        load_model(tmp_path / "from-keras", framework="jax")


def test_trains_with_fit() -> None:
    keras.utils.set_random_seed(0)
    model = mk.Transformer(13, 13, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=64,
                           dropout=0.0, pad_id=PAD)  # fmt: skip
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    src = RNG.integers(3, 13, size=(256, 6)).astype("int32")
    target = np.concatenate([src[:, ::-1], np.full((256, 1), EOS, "int32")], 1)
    tgt_in = np.concatenate([np.full((256, 1), BOS, "int32"), target[:, :-1]], 1)
    history = model.fit((src, tgt_in), target, batch_size=32, epochs=6, verbose=0)
    assert history.history["loss"][-1] < 0.6 * history.history["loss"][0]


def test_layer_configs_round_trip() -> None:
    for layer in (
        mk.PositionalEncoding(16, max_len=40, dropout=0.1),
        mk.FeedForward(16, 32, dropout=0.1, activation="gelu"),
        mk.EncoderLayer(16, 4, 32, dropout=0.2, norm_first=True),
        mk.DecoderLayer(16, 4, 32, activation="gelu"),
        mk.Encoder(2, 16, 4, 32),
        mk.Decoder(3, 16, 2, 32, norm_first=True),
        mk.Transformer(10, 11, **SMALL, pad_id=0),
    ):
        assert type(layer).from_config(layer.get_config()).get_config() == layer.get_config()


def test_parts_validate() -> None:
    with pytest.raises(ValueError, match=r"`activation` must be one of"):
        mk.FeedForward(8, 16, activation="tanh")
    with pytest.raises(ValueError, match=r"positions 38..41 exceed max_len=40"):
        mk.PositionalEncoding(8, max_len=40)(tensor(np.zeros((1, 4, 8), "float32")), offset=38)
    with pytest.raises(ValueError, match=r"d_model=30, num_heads=4"):
        mk.Transformer(10, 10, d_model=30, num_heads=4)
    with pytest.raises(TypeError, match="`src` must hold integer token ids"):
        mk.Transformer(10, 10, **SMALL).encode(tensor(np.zeros((1, 3), "float32")))


FRAMEWORK_HOOKS = {
    mt.Transformer: {"forward", "INFERENCE_FORMS"},  # nn.Module's, and the forms multihead.torch.layouts lays out
    mk.Transformer: {"build", "call", "get_config", "build_from_state", "state_children", "tensor_arguments"},  # Keras'
}  # and multihead.io's state protocol for Keras
"""What each front end's Transformer defines for its framework rather than for its users."""


def test_both_front_ends_transformers_have_the_same_public_methods() -> None:
    def public(cls: type) -> set[str]:
        names = {name for base in cls.__mro__ if base.__module__.startswith("multihead") for name in vars(base)}
        return {name for name in names if not name.startswith("_")} - FRAMEWORK_HOOKS[cls]

    assert public(mk.Transformer) == public(mt.Transformer)
    assert {"generate", "decoding_session", "decoder_steps", "from_config"} <= public(mt.Transformer)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize(
    "options",
    [{}, {"beam_size": 3, "length_penalty": 0.6}, {"sampling_topk": 0, "seed": 4}],
    ids=["greedy", "beam", "sampled"],
)
@pytest.mark.parametrize(
    "spec",
    [{}, {"forced": (7, 8), "banned": (4, 5, 6)}],
    ids=["min-length", "min-length-forced-banned"],
)
def test_a_generation_spec_as_torch(tmp_path: Path, compiled: bool, options: dict, spec: dict) -> None:
    """A :class:`~multihead.decoding.Generation` (``min_length`` holding EOS back, forced first tokens, banned ones)
    generates in Keras' searches as in PyTorch's (same weights, EOS made likely from the first step): the same
    tokens, none ending before ``min_length``, each starting with the forced tokens, none banned."""
    if compiled and BACKEND not in COMPILED_BACKENDS:
        pytest.skip(f"generation on the {BACKEND} backend is eager only")
    torch_model, keras_model = pair(tmp_path)
    with torch.no_grad():
        torch_model.output_proj.bias[EOS] += 4.0
    keras_model.output_proj.bias.assign(numpy(keras_model.output_proj.bias) + 4.0 * (np.arange(23) == EOS))
    specials = decoding.Specials(pad=EOS, bos=BOS, eos=EOS)
    held = decoding.Generation(specials, search=decoding.SearchOptions(**options, min_length=3), **spec)
    src = token_array(4, 7)
    expected = torch_model.generate(torch.from_numpy(src).long(), max_len=8, generation=held).numpy()
    got = keras_model.generate(tensor(src), max_len=8, generation=held, compiled=compiled)
    np.testing.assert_array_equal(got, expected)
    assert all(EOS not in row[:3] for row in got.tolist())
    assert (got[:, : len(held.forced)] == held.forced).all()
    assert not np.isin(got, held.banned).any()
    free = keras_model.generate(tensor(src), max_len=8, bos_id=BOS, eos_id=EOS, compiled=compiled,
                                search=decoding.SearchOptions(**options))  # fmt: skip
    assert any(EOS in row[:3] for row in free.tolist())


@pytest.mark.parametrize(
    "options",
    [{}, {"norm_first": True}, {"tie_embeddings": True}, {"tie_output": True}],
    ids=["post-norm", "pre-norm", "tied", "tied-output"],
)
def test_both_front_ends_weights_are_the_declared_schema(options: dict) -> None:
    """Every weight of either front end's Transformer has the name and shape :func:`multihead.schema.weight_shapes`
    declares, and no other; the weights either ties into one are those :func:`multihead.schema.tied` declares."""
    from multihead.config import TransformerConfig
    from multihead.io import _aliases
    from multihead.keras.state import KerasAdapter
    from multihead.schema import tied, weight_shapes
    from multihead.torch.state import TorchAdapter

    vocab = 17 if "tie_embeddings" in options else 13
    config = TransformerConfig(vocab, 17, d_model=8, num_heads=2, num_encoder_layers=2, num_decoder_layers=1, d_ff=12,
                               **options)  # fmt: skip
    declared = weight_shapes(config)
    torch_shapes = {name: tuple(t.shape) for name, t in mt.Transformer.from_config(config).state_dict().items()}
    keras_model = mk.Transformer.from_config(config)
    keras_model.build()
    keras_shapes = {name: tuple(array.shape) for name, array in KerasAdapter(keras_model).export().items()}
    assert torch_shapes == declared
    assert keras_shapes == declared
    torch_model = mt.Transformer.from_config(config)
    for adapter in (TorchAdapter(torch_model), KerasAdapter(keras_model)):
        assert sorted(map(sorted, _aliases(adapter))) == sorted(map(sorted, tied(config)))
