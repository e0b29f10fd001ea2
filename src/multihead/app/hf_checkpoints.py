"""A Hugging Face checkpoint as Transformers' ``save_pretrained`` writes it, and what every family of
:mod:`multihead.app.families` reads alike: the files, read and checked, each refusal naming its file
(:class:`CheckpointFiles`); the keys of ``config.json`` every family shares and the generation config
(:func:`read_config`, :func:`model_ids`); the run's default search (:func:`default_search`); the weights under
the names of Transformers' BART family, which Marian, M2M100 and NLLB-200 share (:func:`checkpoint_weights`); and
the SentencePiece model of a ``tokenizer.json`` that Transformers made from one (:func:`sentencepiece_of`).

Keys that change nothing the model computes (the Hub's bookkeeping, training-only dropouts) are not read; keys no
family knows are named in a warning, and so are search options ``multihead``'s search does not apply.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multihead import schema
from multihead.app.console import UserError
from multihead.app.tokenizers import SentencePieceTokenizer
from multihead.config import TransformerConfig
from multihead.decoding import SearchOptions
from multihead.positional import sinusoidal_positions

CONFIG, GENERATION, TOKENIZER_CONFIG = "config.json", "generation_config.json", "tokenizer_config.json"
SAFETENSORS, PICKLED = "model.safetensors", "pytorch_model.bin"
EXAMPLE = "Helsinki-NLP/opus-mt-de-en"

ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
"""Transformers' activations and ours (Transformers' ``gelu`` is the exact erf GELU, as ours is)."""
REQUIRED = (
    "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings", "pad_token_id",
    "decoder_start_token_id", "eos_token_id",
)  # fmt: skip
SAME = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_layers", "num_hidden_layers"))  # fmt: skip
"""Pairs of keys multihead has one value for."""
ENCODER_DECODER: dict[str, tuple[Any, str]] = {
    "is_encoder_decoder": (True, "an encoder-decoder"),
    "is_decoder": (False, "an encoder-decoder"),
}
EVERY_HEAD: dict[str, tuple[Any, str]] = {"pruned_heads": ({}, "every attention head")}
"""Keys every family fixes (see :attr:`ConfigKeys.fixed`)."""
UNREAD = {
    "_name_or_path", "_num_labels", "architectures", "transformers_version", "torch_dtype", "dtype", "id2label",
    "label2id", "num_labels", "problem_type", "classif_dropout", "classifier_dropout", "init_std",
    "gradient_checkpointing", "use_cache", "encoder_layerdrop", "decoder_layerdrop", "attention_dropout",
    "activation_dropout", "bos_token_id", "unk_token_id", "sep_token_id", "tokenizer_class", "prefix",
    "task_specific_params", "output_attentions", "output_hidden_states", "return_dict", "torchscript",
    "use_bfloat16", "chunk_size_feed_forward", "tie_encoder_decoder", "finetuning_task", "extra_pos_embeddings",
    "add_cross_attention", "cross_attention_hidden_size", "tf_legacy_loss", "_from_model_config",
}  # fmt: skip
"""Keys that change nothing the model computes: bookkeeping, training-only settings (layer drop, the dropouts of
attention and activations), the positions' offset of learned embeddings (ours are sinusoidal)."""
SEARCH = {
    "early_stopping", "temperature", "top_k", "top_p", "typical_p", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "renormalize_logits", "remove_invalid_values", "num_beam_groups", "diversity_penalty",
    "cache_implementation", "return_legacy_cache",
}  # fmt: skip
"""Generation keys that say how to search, which ``translate``'s own options say (sampling), and what to return: not
read (``early_stopping`` and ``renormalize_logits``: see :mod:`multihead.app.pretrained`)."""
DEFAULT_SEARCH = {"num_beams": "beam_size", "length_penalty": "length_penalty"}
"""Generation keys of the search Transformers' ``generate`` makes by default, which an imported run makes by default
too (:func:`default_search`), and our names of them."""
TRANSFORMERS_SEARCH = {"num_beams": 1, "length_penalty": 1.0}
"""Transformers' defaults of those keys."""
LIMITS = {"max_length": ("max_new_tokens", "max_length", 1), "min_length": ("min_new_tokens", "min_length", 0)}
"""Our length limits, and the generation keys that set them: a count of the tokens generated, or of those and the
decoder's start token (which Transformers reads unless the first is set); the least value of ours."""
HEURISTICS = {
    "do_sample": False, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "exponential_decay_length_penalty": None,
}  # fmt: skip
"""Generation heuristics multihead's search does not apply, and the values that turn them off."""
USED_GENERATION = {
    "bad_words_ids", "decoder_start_token_id", "pad_token_id", "eos_token_id", "forced_bos_token_id",
    "forced_eos_token_id", *DEFAULT_SEARCH, *(key for keys in LIMITS.values() for key in keys[:2]),
}  # fmt: skip
BART_LAYER = {
    schema.SELF_ATTENTION: "self_attn", schema.CROSS_ATTENTION: "encoder_attn",
    **dict(zip(schema.FEED_FORWARD, ("fc1", "fc2"), strict=True)),
}  # fmt: skip
"""BART's names of our layers' parts; its projections are named as ours."""
BART_NORMS = {
    schema.ENCODER: ("self_attn_layer_norm", "final_layer_norm"),
    schema.DECODER: ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
}
"""BART's LayerNorms of an encoder and a decoder layer, in our order (:func:`multihead.schema.norms`)."""
BART_STACKS = {schema.ENCODER: "encoder", schema.DECODER: "decoder"}
POSITIONS_TOLERANCE = 1e-4  # float32 tables computed in other ways differ by ~1e-7; learned ones by far more


class CheckpointFiles:
    """The files of the checkpoint in ``directory``, read and checked, each refusal naming the file."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.name = directory, name
        self.weights_name = ""
        self.stored: dict[str, str] = {}  # a weight's name less "model." -> as the file names it
        self.notes: list[str] = []  # warnings, given once everything is checked (a refusal is one line)

    def where(self, file: str) -> str:
        return f"{file} of {self.name}"

    def refuse(self, file: str, problem: str) -> UserError:
        return UserError(f"{self.where(file)} {problem}")

    def json(self, file: str) -> dict[str, Any]:
        path = self.directory / file
        if not path.is_file():
            raise UserError(
                f"{self.name!r} holds no {file}: it is not a Hugging Face checkpoint (as save_pretrained writes one, "
                f"or a Hub name such as {EXAMPLE})"
            )
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise self.refuse(file, f"is not readable JSON ({error})") from None
        if not isinstance(values, dict):
            raise self.refuse(file, f"is a JSON {type(values).__name__}, not an object")
        return values

    def tokenizer_config(self) -> dict[str, Any]:
        return self.json(TOKENIZER_CONFIG) if (self.directory / TOKENIZER_CONFIG).is_file() else {}

    def require(self, *names: str) -> None:
        """Refuse a checkpoint that lacks one of the tokenizer's files ``names``."""
        for file in names:
            if not (self.directory / file).is_file():
                raise UserError(f"{self.name!r} holds no {file}, which its tokenizer reads")

    def tensors(self) -> dict[str, np.ndarray]:
        """The weights as float32 NumPy arrays, by the file's names less the ``model.`` prefix."""
        found = {name for name in (SAFETENSORS, PICKLED) if (self.directory / name).is_file()}
        if not found:
            sharded = [name for name in (f"{SAFETENSORS}.index.json", f"{PICKLED}.index.json")
                       if (self.directory / name).is_file()]  # fmt: skip
            what = f"weights in shards ({sharded[0]}), which import does not read" if sharded else "no weights"
            raise UserError(f"{self.name!r} holds {what}: it needs {SAFETENSORS} or {PICKLED}")
        self.weights_name = SAFETENSORS if SAFETENSORS in found else PICKLED
        read = self._safetensors if self.weights_name == SAFETENSORS else self._pickled
        tensors = read(self.directory / self.weights_name)
        arrays = {}
        for name, array in tensors.items():
            if array.dtype.kind != "f":
                raise self.refuse(self.weights_name, f"stores {name!r} as {array.dtype}, not as floating point")
            arrays[name.removeprefix("model.")] = np.ascontiguousarray(array, dtype=np.float32)
            self.stored[name.removeprefix("model.")] = name
        return arrays

    def _safetensors(self, path: Path) -> dict[str, np.ndarray]:
        import safetensors
        import safetensors.numpy

        try:
            return safetensors.numpy.load_file(path)
        except (safetensors.SafetensorError, ValueError, TypeError, OSError) as error:
            raise self.refuse(path.name, f"is not a readable safetensors file ({error})") from None

    def _pickled(self, path: Path) -> dict[str, np.ndarray]:
        try:
            import torch
        except ImportError:
            raise self.refuse(path.name, f"is PyTorch's format, which needs PyTorch (or give {SAFETENSORS})") from None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch.load raises whatever unpickling met
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise self.refuse(path.name, f"is not a readable PyTorch weights file ({reason})") from None
        if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
            raise self.refuse(path.name, "is not a state dict of tensors")
        return {
            name: tensor.numpy() if not tensor.is_floating_point() else tensor.detach().float().numpy()
            for name, tensor in state.items()
        }


# --- the config and the generation config ------------------------------------------------------------------


@dataclass(frozen=True)
class ModelIds:
    """The ids the model itself fixes: its pad, the token its decoder starts from, its end of sentence; and those its
    generation config bans and forces first, and whether it forces EOS at the length limit."""

    pad: int
    start: int
    eos: int
    banned: tuple[int, ...] = ()
    forced: tuple[int, ...] = ()
    eos_at_limit: bool = False


@dataclass(frozen=True)
class ConfigKeys:
    """How a family's ``config.json`` is read beside the keys every family shares (:data:`REQUIRED`, :data:`SAME`):
    Transformers' defaults of the keys a file may lack (its config class's), the keys whose value must be the one
    given with what that value means (what multihead computes), and more keys that must be true or false."""

    defaults: dict[str, Any]
    fixed: dict[str, tuple[Any, str]]
    flags: tuple[str, ...] = ()


def read_config(hf: dict[str, Any], keys: ConfigKeys, files: CheckpointFiles) -> dict[str, Any]:
    """``config.json``'s values over ``keys.defaults``, checked: ``keys.fixed`` at their values, the
    :data:`REQUIRED` ids and sizes whole numbers, the :data:`SAME` pairs equal, ``scale_embedding``,
    ``tie_word_embeddings`` and ``keys.flags`` true or false, the activation one multihead computes."""
    model = hf.get("model_type")
    for key, (expected, meaning) in keys.fixed.items():
        if key in hf and hf[key] != expected:
            raise files.refuse(CONFIG, f"has {key}={hf[key]!r}: multihead imports {model} models with {key}="
                               f"{expected!r} only ({meaning})")  # fmt: skip
    values = {**keys.defaults, **hf}
    missing = [key for key in REQUIRED if key not in values]
    if missing:
        raise files.refuse(CONFIG, f"lacks {missing}")
    eos = values["eos_token_id"]
    values["eos_token_id"] = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos  # one EOS, listed
    for key in REQUIRED:
        check_int(files, CONFIG, key, values[key], minimum=0)
    for first, second in SAME:
        if second in values and values[first] != values[second]:
            raise files.refuse(CONFIG, f"has {first}={values[first]!r} and {second}={values[second]!r}: multihead's "
                               "Transformer has one value for both")  # fmt: skip
    for key in ("scale_embedding", "tie_word_embeddings", *keys.flags):
        if not isinstance(values[key], bool):
            raise files.refuse(CONFIG, f"has {key}={values[key]!r}, not true or false")
    if values["activation_function"] not in ACTIVATIONS:
        raise files.refuse(CONFIG, f"has activation_function={values['activation_function']!r}: multihead computes "
                           "swish (SiLU), relu and gelu (the exact erf GELU) only")  # fmt: skip
    return values


def model_ids(
    values: dict[str, Any], generation: dict[str, Any] | None, keys: ConfigKeys, files: CheckpointFiles
) -> ModelIds:
    """The ids of the model whose config :func:`read_config` read into ``values``, and the tokens its generation
    config (``config.json``'s generation keys without one) bans, and forces first, and whether a translation that
    reaches the length limit ends with EOS (``forced_eos_token_id``); its ids must agree with the model's. Keys of
    either file that neither every family's tables nor ``keys`` know are named in a warning."""
    file = GENERATION if generation is not None else CONFIG
    settings = generation if generation is not None else values
    for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
        if key in settings and settings[key] not in (values[key], [values[key]]):
            raise files.refuse(GENERATION, f"has {key}={settings[key]!r} but {CONFIG} {values[key]!r}: which one "
                               "the model was trained with is unknown")  # fmt: skip
    forced = settings.get("forced_bos_token_id")
    if forced is not None:
        check_int(files, file, "forced_bos_token_id", forced, minimum=0)
    eos_at_limit = settings.get("forced_eos_token_id")
    if eos_at_limit not in (None, values["eos_token_id"], [values["eos_token_id"]]):
        raise files.refuse(file, f"has forced_eos_token_id={eos_at_limit!r}: multihead ends a translation at its "
                           f"length limit with the model's EOS only, {values['eos_token_id']}")  # fmt: skip
    bad = settings.get("bad_words_ids") or []
    if not isinstance(bad, list) or not all(isinstance(words, list) and len(words) == 1 for words in bad):
        raise files.refuse(file, f"has bad_words_ids={bad!r}: multihead bans single tokens only ([[id], ...])")
    banned = [words[0] for words in bad]
    for token in banned:
        check_int(files, file, "bad_words_ids", token, minimum=0)
    applied = [f"{key}={settings[key]!r}" for key, off in HEURISTICS.items()
               if settings.get(key) not in (off, None, [], {})]  # fmt: skip
    if applied:
        files.notes.append(f"{files.where(file)} sets {', '.join(applied)}, which multihead's search does not apply: "
                           "its translations may differ from Transformers' generate")  # fmt: skip
    generic = UNREAD | SEARCH | set(HEURISTICS) | USED_GENERATION
    if generation is not None:
        _warn_unknown(files, GENERATION, set(generation) - generic)
    _warn_unknown(files, CONFIG, set(values) - generic - set(keys.defaults) - set(REQUIRED) - set(keys.fixed)
                  - {"model_type", "num_hidden_layers"})  # fmt: skip
    return ModelIds(values["pad_token_id"], values["decoder_start_token_id"], values["eos_token_id"], tuple(banned),
                    () if forced is None else (forced,), eos_at_limit is not None)  # fmt: skip


def default_search(hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles) -> dict[str, Any]:
    """The search Transformers' ``generate`` makes by default with the generation config (``config.json``'s
    generation keys without one), as :class:`SearchOptions` values: its beams and length penalty (Transformers'
    defaults where it sets none), and the length limits it sets. The run's commands search so unless told
    otherwise."""
    file = GENERATION if generation is not None else CONFIG
    settings = generation if generation is not None else hf
    values = {key: settings.get(key, default) for key, default in TRANSFORMERS_SEARCH.items()}
    check_int(files, file, "num_beams", values["num_beams"], minimum=1)
    penalty = values["length_penalty"]
    if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not math.isfinite(penalty):
        raise files.refuse(file, f"has length_penalty={penalty!r}, not a finite number")
    search = {DEFAULT_SEARCH[key]: value for key, value in values.items()}
    for ours, (generated, counted, least) in LIMITS.items():
        key = generated if settings.get(generated) is not None else counted
        if settings.get(key) is not None:
            check_int(files, file, key, settings[key], minimum=0)
            search[ours] = max(least, settings[key] - (key == counted))  # the decoder's start token is no token of ours
    try:
        SearchOptions(**search)
    except ValueError as error:
        raise files.refuse(file, f"describes no search multihead can run: {error}") from None
    return search


def check_int(files: CheckpointFiles, file: str, key: str, value: Any, *, minimum: int) -> None:
    """Refuse ``file``'s ``key`` unless its ``value`` is a whole number of at least ``minimum`` (0 or 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive whole number" if minimum else "a whole number, 0 or more"
        raise files.refuse(file, f"has {key}={value!r}, not {kind}")


def _warn_unknown(files: CheckpointFiles, file: str, keys: set[str]) -> None:
    if keys:
        files.notes.append(
            f"{files.where(file)} has keys multihead does not know, left unread: {', '.join(sorted(keys))} (if "
            "they change what the model computes, its translations will differ from Transformers')"
        )


# --- the weights -------------------------------------------------------------------------------------------


def bart_weight_names(config: TransformerConfig) -> dict[str, str]:
    """Our name of every layer weight -> Transformers' BART family's (less ``model.``): the layers' parts, and the
    LayerNorm after each stack of a pre-norm model (M2M100's)."""
    names = {}
    for stack, count in ((schema.ENCODER, config.num_encoder_layers), (schema.DECODER, config.num_decoder_layers)):
        attentions = [schema.SELF_ATTENTION] + ([schema.CROSS_ATTENTION] if stack == schema.DECODER else [])
        parts = {f"{a}.{p}": f"{BART_LAYER[a]}.{p}" for a in attentions for p in schema.ATTENTION}
        parts |= {f"{schema.FEED_FORWARD_BLOCK}.{linear}": BART_LAYER[linear] for linear in schema.FEED_FORWARD}
        parts |= dict(zip(schema.norms(stack), BART_NORMS[stack], strict=True))
        for index in range(count):
            ours, theirs = schema.layer(stack, index), f"{BART_STACKS[stack]}.layers.{index}"
            for part, bart in parts.items():
                for leaf in (schema.WEIGHT, schema.BIAS):
                    names[f"{ours}.{part}.{leaf}"] = f"{theirs}.{bart}.{leaf}"
        if config.norm_first:  # the LayerNorm after the stack
            for leaf in (schema.WEIGHT, schema.BIAS):
                names[f"{stack}.{schema.STACK_NORM}.{leaf}"] = f"{BART_STACKS[stack]}.layer_norm.{leaf}"
    return names


def checkpoint_weights(
    tensors: dict[str, np.ndarray], config: TransformerConfig, files: CheckpointFiles, *, names: dict[str, str],
    family: str,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The weights by our names (each tied matrix one array under each of its names, as ``multihead.io`` saves them),
    every weight of the file placed, checked against the config: the layers' by ``names`` (ours -> the file's, as
    the checkpoint's ``family`` names them), the embeddings, output layer and position tables by BART's names."""
    file = files.weights_name
    tensors = dict(tensors)

    def shown(name: str) -> str:
        """``name`` as the file has it, or as Transformers would save it."""
        return files.stored.get(name, name if name in ("lm_head.weight", "final_logits_bias") else f"model.{name}")

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise files.refuse(file, f"lacks the weight {shown(name)!r}")
        array = tensors.pop(name)
        if array.shape != shape:
            raise files.refuse(file, f"has {shown(name)!r} of shape {array.shape}, where {CONFIG} makes it {shape}")
        return array

    def tie(tied: Sequence[str], shape: tuple[int, ...]) -> np.ndarray:
        """One matrix stored under any of the names ``tied`` (tied copies left out or equal)."""
        present = [name for name in tied if name in tensors] or [tied[0]]  # none: the first is missing
        arrays = [take(name, shape) for name in present]
        differing = [name for name, array in zip(present, arrays, strict=True) if not np.array_equal(array, arrays[0])]
        if differing:
            raise files.refuse(file, f"has {shown(present[0])!r} and {shown(differing[0])!r}, which the model ties, "
                               "different")  # fmt: skip
        return arrays[0]

    d, shapes = config.d_model, schema.weight_shapes(config)
    weights = {ours: take(theirs, shapes[ours]) for ours, theirs in names.items()}
    source_shape, target_shape = (config.src_vocab, d), (config.tgt_vocab, d)
    if config.tie_embeddings:
        shared = tie(["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"],
                     source_shape)  # fmt: skip
        source, target, output = shared, shared, shared
    else:
        source = take("encoder.embed_tokens.weight", source_shape)
        if config.tie_output:
            target = output = tie(["decoder.embed_tokens.weight", "lm_head.weight"], target_shape)
        else:
            target, output = take("decoder.embed_tokens.weight", target_shape), take("lm_head.weight", target_shape)
    tensors.setdefault("final_logits_bias", np.zeros((1, config.tgt_vocab), np.float32))  # as Transformers makes it
    bias = take("final_logits_bias", (1, config.tgt_vocab))
    for stack in ("encoder", "decoder"):
        _check_positions(tensors.pop(f"{stack}.embed_positions.weight", None), stack, config, files)
    if tensors:
        unplaced = sorted(map(shown, tensors))
        raise files.refuse(file, f"holds weights multihead's Transformer has no place for: {unplaced[:4]} (a "
                           f"variant of {family} it cannot import)")  # fmt: skip
    return {
        f"{schema.SOURCE_EMBEDDING}.{schema.WEIGHT}": source, f"{schema.TARGET_EMBEDDING}.{schema.WEIGHT}": target,
        **weights, f"{schema.OUTPUT}.{schema.WEIGHT}": output, f"{schema.OUTPUT}.{schema.BIAS}": bias[0],
    }  # fmt: skip


def _check_positions(table: np.ndarray | None, stack: str, config: TransformerConfig, files: CheckpointFiles) -> None:
    """A stored position table (``embed_positions.weight``, Marian's) must be the sinusoidal one that multihead
    computes."""
    if table is None:
        return
    name = f"model.{stack}.embed_positions.weight"
    expected = sinusoidal_positions(config.max_len, config.d_model, "halves")
    if table.shape != expected.shape:
        raise files.refuse(files.weights_name, f"has {name!r} of shape {table.shape}, where {CONFIG} makes it "
                           f"{expected.shape}")  # fmt: skip
    error = float(np.max(np.abs(table - expected)))
    if error > POSITIONS_TOLERANCE:
        raise files.refuse(files.weights_name, f"has {name!r} {error:.3g} away from the sinusoidal table: learned "
                           "positions, which multihead does not import")  # fmt: skip


# --- the tokenizer ------------------------------------------------------------------------------------------


def sentencepiece_of(settings: dict[str, Any], specials: Sequence[str]) -> bytes:
    """A SentencePiece BPE model (its bytes) that cuts a text as the BPE model of ``tokenizer.json`` (``settings``)
    does, where Transformers made that from a SentencePiece model: the same character map and whitespace rules, and
    the vocabulary's pieces but ``specials``, each scored by the rank of its first merge. SentencePiece merges the
    pair that makes the best-scored piece, Transformers the pair first in its merges, which are every pair of pieces
    that make a piece, a piece's pairs together: so each makes the same merges. ``ValueError`` saying what differs
    from such a tokenizer."""
    from sentencepiece import sentencepiece_model_pb2

    model_pb2: Any = sentencepiece_model_pb2  # protobuf's generated classes, which have no type hints

    model, normalizer, words = settings["model"], settings.get("normalizer") or {}, settings.get("pre_tokenizer") or {}
    unk = model.get("unk_token")
    plain = {"type": "BPE", "dropout": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
             "fuse_unk": True, "byte_fallback": False}  # fmt: skip
    for key, value in plain.items():
        if model.get(key, value) != value:
            raise ValueError(f"its model has {key}={model.get(key)!r}, not {value!r}")
    prefix = words.get("prepend_scheme") == "always" or words.get("add_prefix_space") is True
    if words.get("type") != "Metaspace" or words.get("replacement") != SentencePieceTokenizer.MARK or not prefix:
        raise ValueError(f"its pre_tokenizer is {words!r}, not a Metaspace that marks every word and the first")
    steps = normalizer.get("normalizers", [normalizer]) if normalizer.get("type") == "Sequence" else [normalizer]
    charsmap = [step["precompiled_charsmap"] for step in steps if step.get("type") == "Precompiled"]
    spaces = {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}
    if [step for step in steps if step and step.get("type") != "Precompiled" and step != spaces] or len(charsmap) > 1:
        raise ValueError(f"its normalizer is {normalizer!r}, not a character map and the joining of spaces")
    vocabulary = {piece: index for piece, index in model["vocab"].items() if piece not in specials}
    inner = [piece for piece in vocabulary if SentencePieceTokenizer.MARK in piece[1:]]
    if inner:
        raise ValueError(f"its pieces {inner[:3]} hold a word mark past their start")
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]
    pairs = {(piece[:cut], piece[cut:]) for piece in vocabulary for cut in range(1, len(piece))}
    made = [left + right for left, right in merges]
    rank = {piece: index for index, piece in enumerate(dict.fromkeys(made))}  # in the order of their first merges
    together = all(rank[piece] >= rank[before] for before, piece in itertools.pairwise(made))
    if set(merges) != {(left, right) for left, right in pairs if left in vocabulary and right in vocabulary} or not (
        together
    ):
        raise ValueError("its merges are not every pair of pieces that makes a piece, a piece's pairs together")
    proto = model_pb2.ModelProto()
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.BPE
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id, proto.trainer_spec.unk_piece = -1, unk
    proto.normalizer_spec.name = "nmt_nfkc" if charsmap else "identity"
    proto.normalizer_spec.precompiled_charsmap = base64.b64decode(charsmap[0]) if charsmap else b""
    proto.normalizer_spec.add_dummy_prefix = proto.normalizer_spec.escape_whitespaces = True
    proto.normalizer_spec.remove_extra_whitespaces = spaces in steps
    kinds = model_pb2.ModelProto.SentencePiece
    for piece, kind in ((unk, kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)):
        proto.pieces.add(piece=piece, score=0.0, type=kind)
    for piece in sorted(vocabulary, key=vocabulary.__getitem__):
        proto.pieces.add(piece=piece, score=-float(rank.get(piece, len(rank))), type=kinds.NORMAL)
    proto.trainer_spec.vocab_size = len(proto.pieces)
    return proto.SerializeToString()
