"""``multihead export``: a run's checkpoint as a CTranslate2 model directory, with its tokenizer and a README; or as an
int8 run of multihead's own (``--format multihead``, :func:`multihead.app.runs.save_int8_run`).

The model is described with ``ctranslate2.specs.TransformerSpec`` and our weights are put in its places: each
self-attention's query, key and value projections fused into one matrix (the cross-attention's key and value into
another), post-norm (``pre_norm=False``) unless the run is pre-norm, our own sinusoid table as the position encodings
(CTranslate2's built-in one lays sines and cosines out differently), embeddings scaled by ``sqrt(d_model)`` unless the
model says not to. The decoder starts from the target tokenizer's start token (``<bos>``; an imported Marian model's
``<pad>``); a token the run's generation bans gets an output bias of ``BANNED``, so CTranslate2 never chooses it either;
tokens it forces first (a language code) are each call's ``target_prefix``, as the README says. Sentences trained here
carry no BOS or EOS; an imported Marian model's sources end with ``</s>``. ``ctranslate2`` is the ``export`` extra.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from multihead import schema
from multihead.app.console import UserError
from multihead.app.runs import WEIGHTS, Checkpoint, open_checkpoint, save_int8_run
from multihead.app.tokenizers import (
    SentencePieceTokenizer,
    SubwordTokenizer,
    Tokenizer,
    sentencepiece_files,
    subword_file,
)
from multihead.config import LAYER_NORM_EPS
from multihead.files import write_directory
from multihead.io import read_weights
from multihead.positional import sinusoidal_positions

FORMATS = ("ctranslate2", "multihead")
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
OWN_QUANTIZATIONS = ("int8",)
"""What ``--format multihead`` stores a run's weights in (a float32 run is the run itself)."""
README = "README.md"
MAX_POSITIONS = 1024
BANNED = -1e4
"""The output bias of a token that is never generated: its probability is 0 in float32 and float16 alike."""
GLOSSARY_NOTE = (
    "Glossaries (`multihead translate --glossary FILE`) need multihead's own decoding: CTranslate2 has no lexically "
    "constrained decoding (`translate_batch` takes no terms a translation must hold; `target_prefix` only fixes how "
    "it begins), so this model translates as if there were no glossary. Where terms must be held, translate with "
    "`multihead translate` or `multihead serve`.\n\n"
)
"""What the README says of glossaries, which CTranslate2 cannot express."""


def _ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            "export --format ctranslate2 needs the ctranslate2 package: pip install 'multihead[export]' (or pip "
            "install ctranslate2)"
        ) from None
    return ctranslate2


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's symbols by id, as CTranslate2 names them (it reads ``<bos>``, ``<eos>``, ``<unk>`` by name)."""
    return tokenizer.pieces(range(len(tokenizer)))


def _linear(spec: Any, weights: dict[str, np.ndarray], *names: str) -> None:
    """``spec`` holds the ``nn.Linear`` layers ``names`` fused along their outputs."""
    spec.weight = np.concatenate([weights[f"{name}.{schema.WEIGHT}"] for name in names])
    spec.bias = np.concatenate([weights[f"{name}.{schema.BIAS}"] for name in names])


def _norm(spec: Any, weights: dict[str, np.ndarray], name: str) -> None:
    spec.gamma, spec.beta = weights[f"{name}.{schema.WEIGHT}"], weights[f"{name}.{schema.BIAS}"]


def _attention(spec: Any, weights: dict[str, np.ndarray], name: str, *, self_attention: bool) -> None:
    q, k, v, out = (f"{name}.{projection}" for projection in schema.ATTENTION)
    if self_attention:
        _linear(spec.linear[0], weights, q, k, v)
    else:
        _linear(spec.linear[0], weights, q)
        _linear(spec.linear[1], weights, k, v)
    _linear(spec.linear[-1], weights, out)


def _stack(
    spec: Any, weights: dict[str, np.ndarray], stack: str, embedding: str, table: np.ndarray, *, scale: bool
) -> None:
    """An encoder or decoder: embeddings (scaled when ``scale``), positions, layers (their LayerNorms in our order:
    after self-attention, then cross-attention in a decoder, then the feed-forward block) and a pre-norm stack's final
    LayerNorm."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings  # the encoder's: a list
    embeddings.weight = weights[f"{embedding}.{schema.WEIGHT}"]
    spec.scale_embeddings = scale
    spec.position_encodings.encodings = table
    for index, layer in enumerate(spec.layer):
        name = schema.layer(stack, index)
        norms = [f"{name}.{norm}" for norm in schema.norms(stack)]  # self-attention's, [cross-attention's,] the FFN's
        _attention(layer.self_attention, weights, f"{name}.{schema.SELF_ATTENTION}", self_attention=True)
        _norm(layer.self_attention.layer_norm, weights, norms[0])
        if stack == schema.DECODER:
            _attention(layer.attention, weights, f"{name}.{schema.CROSS_ATTENTION}", self_attention=False)
            _norm(layer.attention.layer_norm, weights, norms[1])
        first, second = (f"{name}.{schema.FEED_FORWARD_BLOCK}.{linear}" for linear in schema.FEED_FORWARD)
        _linear(layer.ffn.linear_0, weights, first)
        _linear(layer.ffn.linear_1, weights, second)
        _norm(layer.ffn.layer_norm, weights, norms[-1])
    if f"{stack}.{schema.STACK_NORM}.{schema.WEIGHT}" in weights:
        _norm(spec.layer_norm, weights, f"{stack}.{schema.STACK_NORM}")


def _spec(checkpoint: Checkpoint, weights: dict[str, np.ndarray]) -> Any:
    from ctranslate2.specs import common_spec, transformer_spec

    config = checkpoint.config
    activations = {
        "relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU, "silu": common_spec.Activation.SWISH,
    }  # fmt: skip
    spec = transformer_spec.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers), config.num_heads, pre_norm=config.norm_first,
        activation=activations[config.activation],
    )  # fmt: skip
    # CTranslate2 reads up to 1024 source tokens and writes up to 256 by default: the sinusoids go on that far (the
    # model trained on at most max_len positions, as `multihead translate` keeps to).
    table = sinusoidal_positions(max(config.max_len, MAX_POSITIONS), config.d_model, config.positions,
                                 config.first_position)  # fmt: skip
    table = table.astype(np.float32)
    _stack(spec.encoder, weights, schema.ENCODER, schema.SOURCE_EMBEDDING, table, scale=config.scale_embeddings)
    _stack(spec.decoder, weights, schema.DECODER, schema.TARGET_EMBEDDING, table, scale=config.scale_embeddings)
    _linear(spec.decoder.projection, weights, schema.OUTPUT)
    if checkpoint.generation.banned:
        spec.decoder.projection.bias = spec.decoder.projection.bias.copy()
        spec.decoder.projection.bias[list(checkpoint.generation.banned)] = BANNED
    specials, target = checkpoint.generation.specials, checkpoint.target
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = target.pieces(
        [specials.unk, specials.bos, specials.eos]
    )
    spec.config.decoder_start_token = target.pieces([specials.bos])[0]
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(vocabulary(checkpoint.source))
    spec.register_target_vocabulary(vocabulary(checkpoint.target))
    return spec


def _tokenizer_files(checkpoint: Checkpoint) -> list[str]:
    """The files of the run's tokenizers that a CTranslate2 user needs, source's first: subword vocabularies, or
    SentencePiece models (their vocabularies are CTranslate2's own)."""
    source, target = checkpoint.source, checkpoint.target
    files = []
    for side, tokenizer, other in (("source", source, target), ("target", target, source)):
        if isinstance(tokenizer, SubwordTokenizer):
            files.append(subword_file(side, source is target))
        elif isinstance(tokenizer, SentencePieceTokenizer):
            files.append(sentencepiece_files(side, tokenizer, other)[0])
    return list(dict.fromkeys(files))


def _forced_note(checkpoint: Checkpoint) -> str:
    """What the README says of the tokens the run forces first, if it forces any."""
    forced = checkpoint.target.pieces(list(checkpoint.generation.forced))
    if not forced:
        return ""
    return (
        f"Every translation starts with {forced} (what the run forces first): give `target_prefix=[{forced}]` (one "
        "per sentence) to `translate_batch`, and leave those pieces out of the text. CTranslate2 scores them with "
        "the model's probability where `multihead translate` gives them probability 1: with a length penalty, beam "
        "search may rank its hypotheses otherwise.\n\n"
    )


def _unexported_note(checkpoint: Checkpoint) -> str:
    """What ``multihead translate`` does that the exported model does not: its sentences and its guard, and EOS forced
    at the length limit where the run forces it."""
    note = (
        "`multihead translate` cuts each text into sentences before the model and searches again a translation that "
        "looks as if it lost or invented words; `translate_batch` translates each input as it is given: give it "
        "sentences."
    )
    if checkpoint.generation.eos_at_limit:
        note += (
            " The run ends a translation that reaches its length limit with EOS (Transformers' "
            "`forced_eos_token_id`), which CTranslate2 does not: there its translation stops without one."
        )
    return note + "\n\n"


def _readme(checkpoint: Checkpoint, files: list[str], quantization: str | None) -> str:
    subword = isinstance(checkpoint.source, SubwordTokenizer)
    package = " tokenizers" if subword else ""
    if isinstance(checkpoint.source, SentencePieceTokenizer):
        package = " sentencepiece"
        source, target = files[0], files[-1]
        eos = checkpoint.source.pieces([checkpoint.source.specials.eos])[0]
        first = checkpoint.source.pieces(checkpoint.source.prefix)
        forced = checkpoint.target.pieces(list(checkpoint.generation.forced))
        lines = [
            "import ctranslate2, sentencepiece",
            'translator = ctranslate2.Translator(".", device="cpu")  # this directory',
            f'source = sentencepiece.SentencePieceProcessor(model_file="{source}")',
            f'target = sentencepiece.SentencePieceProcessor(model_file="{target}")',
            f'pieces = {f"{first} + " if first else ""}source.encode("Zwei Hunde spielen im Schnee.", out_type=str) '
            f'+ ["{eos}"]  # ends with EOS{", opens with a language code" if first else ""}',
            f"result = translator.translate_batch([pieces]{f', target_prefix=[{forced}]' if forced else ''})",
            f"print(target.decode(result[0].hypotheses[0]{f'[{len(forced)}:]' if forced else ''}))",
        ]
    elif subword:
        source, target = files[0], files[-1]
        load = f'source = target = tokenizers.Tokenizer.from_file("{source}")'
        if source != target:
            load = f'source, target = (tokenizers.Tokenizer.from_file(f) for f in ("{source}", "{target}"))'
        lines = [
            "import ctranslate2, tokenizers",
            'translator = ctranslate2.Translator(".", device="cpu")  # this directory',
            load,
            'result = translator.translate_batch([source.encode("Zwei Hunde spielen im Schnee.").tokens])',
            "print(target.decode([target.token_to_id(piece) for piece in result[0].hypotheses[0]]))",
        ]
    else:
        split = "list(text)" if checkpoint.source.kind == "char" else "text.split()"
        join = '"".join' if checkpoint.target.kind == "char" else '" ".join'
        lines = [
            "import ctranslate2",
            'translator = ctranslate2.Translator(".", device="cpu")  # this directory',
            'text = "21 November 2026"',
            f"result = translator.translate_batch([{split}])",
            f"print({join}(result[0].hypotheses[0]))",
        ]
    stored = quantization or "float32"
    return (
        f"# A multihead model for CTranslate2\n\nExported by `multihead export` from checkpoint "
        f"`{checkpoint.path.name}` of `{checkpoint.path.parents[1].name}`, weights stored as {stored}. Translate "
        f"with `pip install ctranslate2{package}`:\n\n```python\n"
        + "\n".join(lines)
        + "\n```\n\n"
        + _forced_note(checkpoint)
        + _unexported_note(checkpoint)
        + GLOSSARY_NOTE
        + "`translate_batch` takes `beam_size` (CTranslate2's default is 2, `multihead translate`'s 1), "
        "`length_penalty` (CTranslate2's default is 1, `multihead translate`'s 0.6), `max_decoding_length` and "
        "`min_decoding_length` (`multihead translate`'s `--max-length` and `--min-length`); the "
        "model trained on at most "
        f"{checkpoint.config.max_len} positions, which `multihead translate` keeps to. `ctranslate2.Translator` takes "
        "`compute_type`, such as `int8` on the CPU.\n"
    )


def export(
    run: str | Path, out: str | Path, *, checkpoint: str | None, quantization: str | None, format: str = "ctranslate2"
) -> Path:
    """Write the run's checkpoint as a CTranslate2 model into ``out`` (a new directory): model, vocabularies, the
    tokenizer files and a README; written whole into a temporary directory, then moved into place.
    ``format="multihead"``: as a new run whose weights are stored in ``quantization`` (``"int8"``)."""
    if format == "multihead" and quantization not in OWN_QUANTIZATIONS:
        raise UserError(
            f"--format multihead writes a run stored in {' or '.join(OWN_QUANTIZATIONS)}: add --quantization int8 "
            f"(received {quantization or 'none'}; a float32 run is the run itself)"
        )
    if format == "ctranslate2":
        _ctranslate2()
    out = Path(out)
    if out.exists():
        raise UserError(f"{str(out)!r} exists: export writes a new directory; choose another OUT or remove it")
    found, weights = open_checkpoint(Path(run), checkpoint, lambda c: read_weights(c.path / WEIGHTS))
    if format == "multihead":
        return save_int8_run(Path(run), found, weights, out)
    spec = _spec(found, weights)
    spec.validate()
    spec.optimize(quantization=quantization)
    files = _tokenizer_files(found)

    def fill(staging: Path) -> None:
        spec.save(str(staging))
        for name in files:
            shutil.copyfile(found.path / name, staging / name)
        (staging / README).write_text(_readme(found, files, quantization), encoding="utf-8")

    out.parent.mkdir(parents=True, exist_ok=True)
    write_directory(out, fill, prefix=f".{out.name}.tmp-")
    return out
