"""Models trained elsewhere, imported as runs: Hugging Face Marian checkpoints (OPUS-MT's ``Helsinki-NLP/opus-mt-*``)
and M2M100 checkpoints (``facebook/m2m100_418M``'s architecture, and NLLB-200's).

``multihead import SOURCE RUN`` reads a checkpoint as Transformers' ``save_pretrained`` writes it, from a directory
or, given a Hub name, from the Hugging Face Hub (``huggingface_hub.snapshot_download``, which reuses the local
Hugging Face cache), and writes a run directory whose one checkpoint, ``step-0000000``, ``translate``, ``evaluate``,
``score``, ``serve`` and ``export`` read as any run's. It computes what Transformers' ``MarianMTModel`` computes:

- ``config.json``: the sizes; ``activation_function`` ``swish`` (our ``silu``), ``relu`` or ``gelu``;
  ``scale_embedding``; ``share_encoder_decoder_embeddings`` (one vocabulary, one embedding matrix, which is also the
  output layer's: our ``tie_embeddings``) or two vocabularies (the target embedding is the output layer's when
  ``tie_word_embeddings``: our ``tie_output``); ``pad_token_id``, ``decoder_start_token_id`` (Marian starts the
  decoder from its pad), ``eos_token_id``; ``max_position_embeddings`` (the longest sequence); ``dropout``. Keys
  absent take ``MarianConfig``'s defaults, as Transformers does.
- ``generation_config.json`` (else the generation keys of ``config.json``): ``bad_words_ids`` of single tokens (OPUS-MT
  bans its pad) become the tokens generation never chooses, ``forced_bos_token_id`` the token every translation
  starts with (a multilingual model's target language), and ``forced_eos_token_id`` the EOS a translation that
  reaches its length limit ends with: the run's generation spec (``banned``, ``forced``, ``eos_at_limit``). Its
  ``num_beams``, ``length_penalty`` and length limits become the run's default search (:func:`default_search`).
- the weights, ``model.safetensors`` (read without unpickling anything) or else ``pytorch_model.bin`` (read with
  ``torch.load(weights_only=True)``, which unpickles tensors only), stored as float32 under our names. Tied matrices
  that the file leaves out are filled from their tie; a missing ``final_logits_bias`` is zeros, as Transformers
  makes it; stored sinusoidal position tables are checked, not kept (they are computed).
- the tokenizer: ``source.spm`` and ``target.spm`` with ``vocab.json`` (and ``target_vocab.json`` when
  ``tokenizer_config.json`` says ``separate_vocabs``), which give the ids ``MarianTokenizer`` gives; the source side
  ends every text with EOS, as ``MarianTokenizer`` does.

Whatever the model computes that multihead cannot compute exactly is refused in one line naming the key and its value
(pre-norm layers, a LayerNorm after the embeddings or after the last layer, learned positions, other activations,
different sizes for the encoder and the decoder, an output layer of its own beside a shared vocabulary, bans of
token sequences, weights with no place in our model...), and nothing is written. Keys that
change nothing the model computes (the Hub's bookkeeping, training-only dropouts) are not read; keys this module does
not know are named in a warning. Search options ``multihead``'s search does not apply (``do_sample``,
``no_repeat_ngram_size``, ``repetition_penalty``, ``suppress_tokens``...) are named in a warning too.

Generation then differs from Transformers' ``generate`` in beam search only: unless ``renormalize_logits`` is set,
Transformers bans the pad after the softmax, leaving the others' probabilities as they were, where multihead (and
CTranslate2) ban it before the softmax, so that they sum to 1: beam scores differ by ``log(1 - p(pad))``, nothing for
a model that never learnt to write its pad; and with its default ``early_stopping=False`` it may stop a sentence
before a longer hypothesis that would rank higher, which multihead still finds (as ``early_stopping="never"``
does).

An M2M100 checkpoint (``model_type`` ``m2m_100``) is read the same way, as Transformers'
``M2M100ForConditionalGeneration`` computes it: pre-norm layers with a LayerNorm after each stack (``norm_first``),
fairseq's sinusoids counted from the pad id + 1 (``positions="fairseq"``, ``first_position``), one vocabulary tied to
the output layer, the decoder starting from EOS. Its tokenizer is ``M2M100Tokenizer``'s: ``sentencepiece.bpe.model``
and ``vocab.json``'s pieces, then a ``__xx__`` code of each of its languages (``language_codes``), then its made-up
words. It translates between many languages; the run translates one pair, ``--langs SRC TGT`` (else the tokenizer's
``src_lang`` and ``tgt_lang``): every source starts with the code of SRC, every translation with the code of TGT (the
run's forced token, Transformers' ``forced_bos_token_id``). An NLLB-200 checkpoint is an M2M100 one whose
``tokenizer_config.json`` names ``NllbTokenizer``: its ids are ``tokenizer.json``'s (the model's pieces and the added
tokens, its ``deu_Latn`` codes among them), the embedding's rows beyond them made-up words; without
``sentencepiece.bpe.model`` (Transformers 5 saves ``tokenizer.json`` alone) its SentencePiece model is made from
``tokenizer.json`` (:func:`sentencepiece_of`). A multilingual OPUS-MT
model (target codes such as ``>>fra<<`` in its vocabulary) gets its sources opened with the code of the run's target
(:func:`marian_target_code`). Another pair of such a model's languages: :func:`multihead.app.translate.language_pair`.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from multihead import schema
from multihead.app.console import UserError, warn
from multihead.app.languages import CODE, COMMON, M2M100_CODES, LanguageTokens, code_token
from multihead.app.runs import check_new_run, save_imported_run
from multihead.app.tokenizers import SentencePieceTokenizer, Tokenizer
from multihead.config import TransformerConfig
from multihead.decoding import Generation, SearchOptions, Specials
from multihead.positional import sinusoidal_positions

CONFIG, GENERATION, TOKENIZER_CONFIG = "config.json", "generation_config.json", "tokenizer_config.json"
SAFETENSORS, PICKLED = "model.safetensors", "pytorch_model.bin"
SOURCE_SPM, TARGET_SPM, VOCABULARY, TARGET_VOCABULARY = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
M2M100_SPM, TOKENIZER_JSON = "sentencepiece.bpe.model", "tokenizer.json"
FILES = (CONFIG, GENERATION, TOKENIZER_CONFIG, SOURCE_SPM, TARGET_SPM, VOCABULARY, TARGET_VOCABULARY, M2M100_SPM,
         TOKENIZER_JSON)  # fmt: skip
"""What a Hub download fetches besides the weights (one weights file: the safetensors one where the model has it)."""
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
EXAMPLE = "Helsinki-NLP/opus-mt-de-en"
NAMED_PAIR = re.compile(r"(?P<opus>opus-mt-(?:tc-(?:big-)?)?)?(?<![^-_])(?P<source>[a-z]{2,3})[-_](?:to[-_])?"
                        r"(?P<target>[a-z]{2,3})$")  # fmt: skip
"""The language pair at the end of a model's name: ``opus-mt-de-en``, ``opus-mt-tc-big-en-fr``, ``marian-en-to-fr``."""

ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
"""Marian's activations and ours (Transformers' ``gelu`` is the exact erf GELU, as ours is)."""
DEFAULTS = {
    "activation_function": "gelu", "scale_embedding": False, "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True, "dropout": 0.1, "decoder_vocab_size": None,
}  # fmt: skip
"""Transformers' ``MarianConfig`` defaults of the keys an older ``config.json`` may lack."""
REQUIRED = (
    "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings", "pad_token_id",
    "decoder_start_token_id", "eos_token_id",
)  # fmt: skip
FIXED = {
    "is_encoder_decoder": (True, "an encoder-decoder"),
    "is_decoder": (False, "an encoder-decoder"),
    "normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
    "encoder_normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
    "decoder_normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
    "normalize_embedding": (False, "no LayerNorm on the embeddings"),
    "layernorm_embedding": (False, "no LayerNorm on the embeddings"),
    "add_final_layer_norm": (False, "no LayerNorm after the last layer"),
    "static_position_embeddings": (True, "the sinusoidal position table"),
    "add_bias_logits": (False, "Marian's output layer"),
    "pruned_heads": ({}, "every attention head"),
}
"""Keys of ``config.json`` whose value must be the one given, which is what multihead computes."""
SAME = (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_layers", "num_hidden_layers"))  # fmt: skip
"""Pairs of keys multihead has one value for."""
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
attention and activations), the positions' offset of learned embeddings (Marian's are sinusoidal)."""
SEARCH = {
    "early_stopping", "temperature", "top_k", "top_p", "typical_p", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "renormalize_logits", "remove_invalid_values", "num_beam_groups", "diversity_penalty",
    "cache_implementation", "return_legacy_cache",
}  # fmt: skip
"""Generation keys that say how to search, which ``translate``'s own options say (sampling), and what to return: not
read (``early_stopping`` and ``renormalize_logits``: see above)."""
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
M2M100_DEFAULTS = {"activation_function": "relu", "scale_embedding": True, "tie_word_embeddings": True, "dropout": 0.1}
"""Transformers' ``M2M100Config`` defaults of the keys multihead reads that a ``config.json`` may lack."""
M2M100_FIXED = {key: FIXED[key] for key in ("is_encoder_decoder", "is_decoder", "pruned_heads")} | {
    "tie_word_embeddings": (True, "one vocabulary whose embedding matrix is also the output layer's"),
}
"""Keys of an M2M100 ``config.json`` whose value must be the one given, which is what multihead computes."""
MADE_UP = "madeupword{:04d}"
"""fairseq's names of the ids an M2M100 dictionary pads itself with after its language codes."""
POSITIONS_TOLERANCE = 1e-4  # float32 tables computed in other ways differ by ~1e-7; learned ones by far more


@dataclass(frozen=True)
class Imported:
    """What ``multihead import`` wrote: the run, its model and tokenizers, and the languages it recorded."""

    run: Path
    source_name: str
    family: str  # "Marian", "M2M100" or "NLLB-200"
    config: TransformerConfig
    generation: Generation
    search: dict[str, Any]  # the run's default search: SearchOptions values
    source: Tokenizer
    target: Tokenizer
    langs: list[str] | None
    parameters: int


def import_pretrained(source_name: str, run: Path, *, langs: Sequence[str] | None = None) -> Imported:
    """Import the Marian checkpoint ``source_name`` (a directory, or a Hub name such as ``Helsinki-NLP/opus-mt-de-en``)
    as the new run directory ``run``; ``langs`` (``[source, target]``) is recorded, by default read from the model's
    name. A :class:`UserError` in one line, nothing written, for what cannot be imported."""
    check_new_run(run, "RUN", "import")  # before a download
    directory = checkpoint_directory(source_name)
    files = CheckpointFiles(directory, source_name)
    hf = files.json(CONFIG)
    generation = files.json(GENERATION) if (directory / GENERATION).is_file() else None
    if hf.get("model_type") == "m2m_100":
        config, ids = m2m100_config(hf, generation, files)
        langs = list(langs) if langs is not None else m2m100_langs(files)
        source, target, ids, langs = many_to_many_tokenizers(files, config, ids, langs)
    else:
        config, ids = transformer_config(hf, generation, files)
        source, target = marian_tokenizers(files, config, ids)
    weights = marian_weights(files.tensors(), config, files)
    search = default_search(hf, generation, files)
    try:
        spec = Generation(target.specials, banned=ids.banned, forced=ids.forced, eos_at_limit=ids.eos_at_limit)
        spec.check(config.tgt_vocab)
    except ValueError as error:
        raise files.refuse(GENERATION if generation is not None else CONFIG, f"describes no generation multihead "
                           f"can run: {error}") from None  # fmt: skip
    langs = list(langs) if langs is not None else default_langs(source_name, directory, hf, files.tokenizer_config())
    if hf.get("model_type") != "m2m_100":
        marian_target_code(files, source, target, langs)
    for note in files.notes:
        warn(note)
    record = {"source": source_name, "config": hf, "generation_config": generation, "weights": files.weights_name}
    # No --vocab-size made the vocabulary; --joint-vocab: one for both sides, tied as ours are.
    options = {"task": None, "data": None, "tokenizer": SentencePieceTokenizer.kind, "vocab_size": None,
               "joint": config.tie_embeddings, "langs": langs, "imported": source_name, "search": search}  # fmt: skip
    save_imported_run(run, config=config, generation=spec, weights=weights, tokenizers=(source, target),
                      options=options, record=record)  # fmt: skip
    parameters = sum({id(array): array.size for array in weights.values()}.values())  # a tied matrix once
    family = "Marian" if hf.get("model_type") != "m2m_100" else "NLLB-200" if is_nllb(files) else "M2M100"
    return Imported(run, source_name, family, config, spec, search, source, target, langs, parameters)


# --- where the checkpoint is ------------------------------------------------------------------------------


def checkpoint_directory(source_name: str) -> Path:
    """The directory holding the checkpoint ``source_name`` names: itself, or a Hub model's files downloaded into the
    Hugging Face cache (or found there)."""
    path = Path(source_name)
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"SOURCE {source_name!r} is a file: give the directory that holds the model's {CONFIG}")
    if not HUB_NAME.match(source_name):
        raise UserError(f"SOURCE {source_name!r} is not a directory, nor a Hugging Face Hub name such as {EXAMPLE}")
    return _download(source_name)


def _download(name: str) -> Path:
    """The Hub model ``name``'s files (its weights in one format), downloaded or from the local cache."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise UserError(
            f"SOURCE {name!r} is not a directory; to download it from the Hugging Face Hub, install huggingface_hub "
            "(pip install 'multihead[app]'), or import a directory that holds the model"
        ) from None
    instead = (f"download it on a machine with network (hf download {name} --local-dir DIR), copy DIR here and run "
               "multihead import DIR RUN")  # fmt: skip
    try:
        directory = Path(snapshot_download(name, allow_patterns=[*FILES, SAFETENSORS]))
        if not (directory / SAFETENSORS).is_file():  # an older model: its weights pickled only
            directory = Path(snapshot_download(name, allow_patterns=[*FILES, PICKLED]))
    except GatedRepoError:
        raise UserError(
            f"{name} on the Hugging Face Hub is gated: accept its terms there and log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise UserError(
            f"the Hugging Face Hub has no model {name} (or it is private: log in with hf auth login); check the name, "
            f"such as {EXAMPLE}"
        ) from None
    except LocalEntryNotFoundError:
        raise UserError(f"cannot download {name}: the Hugging Face Hub cannot be reached from here (no network, or "
                        f"HF_HUB_OFFLINE is set) and it is not in the local cache; {instead}") from None  # fmt: skip
    except (HfHubHTTPError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"cannot download {name} from the Hugging Face Hub ({reason}); {instead}") from None
    return directory


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
                f"{self.name!r} holds no {file}: it is not a Hugging Face Marian checkpoint (as save_pretrained writes "
                f"one, or a Hub name such as {EXAMPLE})"
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

    def tensors(self) -> dict[str, np.ndarray]:
        """The weights as float32 NumPy arrays, by Marian's names less the ``model.`` prefix."""
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


# --- the model ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarianIds:
    """The ids the model itself fixes: its pad, the token its decoder starts from, its end of sentence; and those its
    generation config bans and forces first, and whether it forces EOS at the length limit."""

    pad: int
    start: int
    eos: int
    banned: tuple[int, ...] = ()
    forced: tuple[int, ...] = ()
    eos_at_limit: bool = False


def transformer_config(
    hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
) -> tuple[TransformerConfig, MarianIds]:
    """Our config of the Marian model ``config.json`` (``hf``) and ``generation_config.json`` describe, every value
    we cannot represent refused; and the ids the model fixes."""
    if hf.get("model_type") != "marian":
        raise files.refuse(CONFIG, f"has model_type={hf.get('model_type')!r}: multihead imports Marian models "
                           "(model_type 'marian', as OPUS-MT's) and M2M100 models ('m2m_100')")  # fmt: skip
    values = _read_config(hf, DEFAULTS, FIXED, ("share_encoder_decoder_embeddings",), files)
    activation = values["activation_function"]
    shared, tied = values["share_encoder_decoder_embeddings"], values["tie_word_embeddings"]
    if shared and not tied:
        raise files.refuse(CONFIG, "has tie_word_embeddings=False with share_encoder_decoder_embeddings=True: "
                           "multihead ties one vocabulary's output layer to its embeddings")  # fmt: skip
    vocab, decoder_vocab = values["vocab_size"], values["decoder_vocab_size"]
    if decoder_vocab is not None:
        _check_int(files, CONFIG, "decoder_vocab_size", decoder_vocab, minimum=1)
        if shared and decoder_vocab != vocab:
            raise files.refuse(CONFIG, f"has decoder_vocab_size={decoder_vocab} and vocab_size={vocab}, but "
                               "share_encoder_decoder_embeddings=True gives both sides one vocabulary")  # fmt: skip
    ids = MarianIds(values["pad_token_id"], values["decoder_start_token_id"], values["eos_token_id"],
                    *_generation(values, generation, files))  # fmt: skip
    try:
        config = TransformerConfig(
            src_vocab=vocab, tgt_vocab=vocab if shared or decoder_vocab is None else decoder_vocab,
            d_model=values["d_model"], num_heads=values["encoder_attention_heads"],
            num_encoder_layers=values["encoder_layers"], num_decoder_layers=values["decoder_layers"],
            d_ff=values["encoder_ffn_dim"], dropout=values["dropout"], activation=ACTIVATIONS[activation],
            max_len=values["max_position_embeddings"], pad_id=ids.pad, tie_embeddings=shared, positions="halves",
            scale_embeddings=values["scale_embedding"], tie_output=not shared and tied,
        )  # fmt: skip
    except (TypeError, ValueError) as error:
        raise files.refuse(CONFIG, f"describes no model multihead can build: {error}") from None
    return config, ids


def _read_config(
    hf: dict[str, Any],
    defaults: dict[str, Any],
    fixed: dict[str, tuple[Any, str]],
    flags: Sequence[str],
    files: CheckpointFiles,
) -> dict[str, Any]:
    """``config.json``'s values over ``defaults``, checked: ``fixed`` keys at their values, the ``REQUIRED`` ids and
    sizes whole numbers, the ``SAME`` pairs equal, ``scale_embedding``, ``tie_word_embeddings`` and ``flags`` true or
    false, the activation one multihead computes."""
    model = hf.get("model_type")
    for key, (expected, meaning) in fixed.items():
        if key in hf and hf[key] != expected:
            raise files.refuse(CONFIG, f"has {key}={hf[key]!r}: multihead imports {model} models with {key}="
                               f"{expected!r} only ({meaning})")  # fmt: skip
    values = {**defaults, **hf}
    missing = [key for key in REQUIRED if key not in values]
    if missing:
        raise files.refuse(CONFIG, f"lacks {missing}")
    eos = values["eos_token_id"]
    values["eos_token_id"] = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos  # one EOS, listed
    for key in REQUIRED:
        _check_int(files, CONFIG, key, values[key], minimum=0)
    for first, second in SAME:
        if second in values and values[first] != values[second]:
            raise files.refuse(CONFIG, f"has {first}={values[first]!r} and {second}={values[second]!r}: multihead's "
                               "Transformer has one value for both")  # fmt: skip
    for key in ("scale_embedding", "tie_word_embeddings", *flags):
        if not isinstance(values[key], bool):
            raise files.refuse(CONFIG, f"has {key}={values[key]!r}, not true or false")
    if values["activation_function"] not in ACTIVATIONS:
        raise files.refuse(CONFIG, f"has activation_function={values['activation_function']!r}: multihead computes "
                           "swish (SiLU), relu and gelu (the exact erf GELU) only")  # fmt: skip
    return values


def m2m100_config(
    hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
) -> tuple[TransformerConfig, MarianIds]:
    """Our config of the M2M100 model ``config.json`` (``hf``) and ``generation_config.json`` describe (pre-norm
    layers with a LayerNorm after each stack, fairseq's sinusoids counted from the pad id + 1, one vocabulary tied
    to the output layer), every value we cannot represent refused; and the ids the model fixes."""
    values = _read_config(hf, M2M100_DEFAULTS, M2M100_FIXED, (), files)
    ids = MarianIds(values["pad_token_id"], values["decoder_start_token_id"], values["eos_token_id"],
                    *_generation(values, generation, files))  # fmt: skip
    try:
        config = TransformerConfig(
            src_vocab=values["vocab_size"], tgt_vocab=values["vocab_size"], d_model=values["d_model"],
            num_heads=values["encoder_attention_heads"], num_encoder_layers=values["encoder_layers"],
            num_decoder_layers=values["decoder_layers"], d_ff=values["encoder_ffn_dim"], dropout=values["dropout"],
            activation=ACTIVATIONS[values["activation_function"]], norm_first=True,
            max_len=values["max_position_embeddings"], pad_id=ids.pad, tie_embeddings=True, positions="fairseq",
            first_position=ids.pad + 1, scale_embeddings=values["scale_embedding"],
        )  # fmt: skip
    except (TypeError, ValueError) as error:
        raise files.refuse(CONFIG, f"describes no model multihead can build: {error}") from None
    return config, ids


def _generation(
    values: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """The tokens the generation config (``config.json``'s generation keys without one) bans, and forces first, and
    whether a translation that reaches the length limit ends with EOS (``forced_eos_token_id``); its ids must agree
    with the model's."""
    file = GENERATION if generation is not None else CONFIG
    settings = generation if generation is not None else values
    for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
        if key in settings and settings[key] not in (values[key], [values[key]]):
            raise files.refuse(GENERATION, f"has {key}={settings[key]!r} but {CONFIG} {values[key]!r}: which one "
                               "the model was trained with is unknown")  # fmt: skip
    forced = settings.get("forced_bos_token_id")
    if forced is not None:
        _check_int(files, file, "forced_bos_token_id", forced, minimum=0)
    eos_at_limit = settings.get("forced_eos_token_id")
    if eos_at_limit not in (None, values["eos_token_id"], [values["eos_token_id"]]):
        raise files.refuse(file, f"has forced_eos_token_id={eos_at_limit!r}: multihead ends a translation at its "
                           f"length limit with the model's EOS only, {values['eos_token_id']}")  # fmt: skip
    bad = settings.get("bad_words_ids") or []
    if not isinstance(bad, list) or not all(isinstance(words, list) and len(words) == 1 for words in bad):
        raise files.refuse(file, f"has bad_words_ids={bad!r}: multihead bans single tokens only ([[id], ...])")
    banned = [words[0] for words in bad]
    for token in banned:
        _check_int(files, file, "bad_words_ids", token, minimum=0)
    applied = [f"{key}={settings[key]!r}" for key, off in HEURISTICS.items()
               if settings.get(key) not in (off, None, [], {})]  # fmt: skip
    if applied:
        files.notes.append(f"{files.where(file)} sets {', '.join(applied)}, which multihead's search does not apply: "
                           "its translations may differ from Transformers' generate")  # fmt: skip
    generic = UNREAD | SEARCH | set(HEURISTICS) | USED_GENERATION
    if generation is not None:
        _warn_unknown(files, GENERATION, set(generation) - generic)
    _warn_unknown(files, CONFIG, set(values) - generic - set(DEFAULTS) - set(REQUIRED) - set(FIXED)
                  - {"model_type", "num_hidden_layers"})  # fmt: skip
    return tuple(banned), () if forced is None else (forced,), eos_at_limit is not None


def default_search(hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles) -> dict[str, Any]:
    """The search Transformers' ``generate`` makes by default with the generation config (``config.json``'s
    generation keys without one), as :class:`SearchOptions` values: its beams and length penalty (Transformers'
    defaults where it sets none), and the length limits it sets. The run's commands search so unless told
    otherwise."""
    file = GENERATION if generation is not None else CONFIG
    settings = generation if generation is not None else hf
    values = {key: settings.get(key, default) for key, default in TRANSFORMERS_SEARCH.items()}
    _check_int(files, file, "num_beams", values["num_beams"], minimum=1)
    penalty = values["length_penalty"]
    if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not math.isfinite(penalty):
        raise files.refuse(file, f"has length_penalty={penalty!r}, not a finite number")
    search = {DEFAULT_SEARCH[key]: value for key, value in values.items()}
    for ours, (generated, counted, least) in LIMITS.items():
        key = generated if settings.get(generated) is not None else counted
        if settings.get(key) is not None:
            _check_int(files, file, key, settings[key], minimum=0)
            search[ours] = max(least, settings[key] - (key == counted))  # the decoder's start token is no token of ours
    try:
        SearchOptions(**search)
    except ValueError as error:
        raise files.refuse(file, f"describes no search multihead can run: {error}") from None
    return search


def _check_int(files: CheckpointFiles, file: str, key: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive whole number" if minimum else "a whole number, 0 or more"
        raise files.refuse(file, f"has {key}={value!r}, not {kind}")


def _warn_unknown(files: CheckpointFiles, file: str, keys: set[str]) -> None:
    if keys:
        files.notes.append(
            f"{files.where(file)} has keys multihead does not know, left unread: {', '.join(sorted(keys))} (if "
            "they change what the model computes, its translations will differ from Transformers')"
        )


MARIAN_LAYER = {
    schema.SELF_ATTENTION: "self_attn", schema.CROSS_ATTENTION: "encoder_attn",
    **dict(zip(schema.FEED_FORWARD, ("fc1", "fc2"), strict=True)),
}  # fmt: skip
"""Marian's names of our layers' parts; its projections are named as ours (Transformers' BART family)."""
MARIAN_NORMS = {
    schema.ENCODER: ("self_attn_layer_norm", "final_layer_norm"),
    schema.DECODER: ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
}
"""Marian's LayerNorms of an encoder and a decoder layer, in our order (:func:`multihead.schema.norms`)."""
MARIAN_STACKS = {schema.ENCODER: "encoder", schema.DECODER: "decoder"}


def _layer_names(config: TransformerConfig) -> dict[str, str]:
    """Our name of every layer weight -> Marian's (less ``model.``)."""
    names = {}
    for stack, count in ((schema.ENCODER, config.num_encoder_layers), (schema.DECODER, config.num_decoder_layers)):
        attentions = [schema.SELF_ATTENTION] + ([schema.CROSS_ATTENTION] if stack == schema.DECODER else [])
        parts = {f"{a}.{p}": f"{MARIAN_LAYER[a]}.{p}" for a in attentions for p in schema.ATTENTION}
        parts |= {f"{schema.FEED_FORWARD_BLOCK}.{linear}": MARIAN_LAYER[linear] for linear in schema.FEED_FORWARD}
        parts |= dict(zip(schema.norms(stack), MARIAN_NORMS[stack], strict=True))
        for index in range(count):
            ours, theirs = schema.layer(stack, index), f"{MARIAN_STACKS[stack]}.layers.{index}"
            for part, marian in parts.items():
                for leaf in (schema.WEIGHT, schema.BIAS):
                    names[f"{ours}.{part}.{leaf}"] = f"{theirs}.{marian}.{leaf}"
        if config.norm_first:  # the LayerNorm after the stack (M2M100's)
            for leaf in (schema.WEIGHT, schema.BIAS):
                names[f"{stack}.{schema.STACK_NORM}.{leaf}"] = f"{MARIAN_STACKS[stack]}.layer_norm.{leaf}"
    return names


def marian_weights(
    tensors: dict[str, np.ndarray], config: TransformerConfig, files: CheckpointFiles
) -> dict[str, np.ndarray]:
    """The weights by our names (each tied matrix one array under each of its names, as ``multihead.io`` saves them),
    every Marian weight placed, checked against the config."""
    file = files.weights_name
    tensors = dict(tensors)

    def shown(name: str) -> str:
        """``name`` as the file has it, or as ``MarianMTModel`` would save it."""
        return files.stored.get(name, name if name in ("lm_head.weight", "final_logits_bias") else f"model.{name}")

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise files.refuse(file, f"lacks the weight {shown(name)!r}")
        array = tensors.pop(name)
        if array.shape != shape:
            raise files.refuse(file, f"has {shown(name)!r} of shape {array.shape}, where {CONFIG} makes it {shape}")
        return array

    def tie(names: Sequence[str], shape: tuple[int, ...]) -> np.ndarray:
        """One matrix stored under any of ``names`` (tied copies left out or equal)."""
        present = [name for name in names if name in tensors] or [names[0]]  # none: the first is missing
        arrays = [take(name, shape) for name in present]
        differing = [name for name, array in zip(present, arrays, strict=True) if not np.array_equal(array, arrays[0])]
        if differing:
            raise files.refuse(file, f"has {shown(present[0])!r} and {shown(differing[0])!r}, which the model ties, "
                               "different")  # fmt: skip
        return arrays[0]

    d, shapes = config.d_model, schema.weight_shapes(config)
    weights = {ours: take(theirs, shapes[ours]) for ours, theirs in _layer_names(config).items()}
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
                           "variant of Marian it cannot import)")  # fmt: skip
    return {
        f"{schema.SOURCE_EMBEDDING}.{schema.WEIGHT}": source, f"{schema.TARGET_EMBEDDING}.{schema.WEIGHT}": target,
        **weights, f"{schema.OUTPUT}.{schema.WEIGHT}": output, f"{schema.OUTPUT}.{schema.BIAS}": bias[0],
    }  # fmt: skip


def _check_positions(table: np.ndarray | None, stack: str, config: TransformerConfig, files: CheckpointFiles) -> None:
    """A stored position table must be the sinusoidal one that multihead computes."""
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


# --- the tokenizers and the languages ---------------------------------------------------------------------


def _token_text(value: Any, default: str) -> str:
    """A special token's text in ``tokenizer_config.json``: a string, or an added token's ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


def marian_tokenizers(
    files: CheckpointFiles, config: TransformerConfig, ids: MarianIds
) -> tuple[SentencePieceTokenizer, SentencePieceTokenizer]:
    """The source and target tokenizers, whose specials are the model's (checked against each vocabulary)."""
    settings = files.tokenizer_config()
    separate = settings.get("separate_vocabs", False)
    if not isinstance(separate, bool):
        raise files.refuse(TOKENIZER_CONFIG, f"has separate_vocabs={separate!r}, not true or false")
    texts = {
        "eos": _token_text(settings.get("eos_token"), "</s>"), "unk": _token_text(settings.get("unk_token"), "<unk>"),
        "pad": _token_text(settings.get("pad_token"), "<pad>"),
    }  # fmt: skip
    sides = {
        "source": (SOURCE_SPM, VOCABULARY, config.src_vocab, True),
        "target": (TARGET_SPM, TARGET_VOCABULARY if separate else VOCABULARY, config.tgt_vocab, False),
    }
    made = []
    for side, (model, vocabulary, size, append_eos) in sides.items():
        for file in (model, vocabulary):
            if not (files.directory / file).is_file():
                raise UserError(f"{files.name!r} holds no {file}, the {side} side of its tokenizer")
        pieces = files.json(vocabulary)
        for special, model_id in (("eos", ids.eos), ("pad", ids.pad)):
            if pieces.get(texts[special]) != model_id:
                raise files.refuse(vocabulary, f"gives {texts[special]!r} the id {pieces.get(texts[special])!r}, but "
                                   f"{CONFIG} {model_id}: the tokenizer does not fit the model")  # fmt: skip
        unk = pieces.get(texts["unk"])
        if isinstance(unk, bool) or not isinstance(unk, int):
            raise files.refuse(vocabulary, f"has no {texts['unk']!r}, which reads the pieces it lacks")
        specials = Specials(pad=ids.pad, bos=ids.start, eos=ids.eos, unk=unk)
        try:
            tokenizer = SentencePieceTokenizer.from_files(
                files.directory / model, files.directory / vocabulary, append_eos=append_eos, specials=specials
            )
        except ValueError as error:
            raise UserError(str(error)) from None
        if len(tokenizer) != size:
            raise files.refuse(vocabulary, f"has {len(tokenizer)} pieces, the model's {side} vocabulary {size}")
        made.append(tokenizer)
    return made[0], made[1]


def marian_target_code(
    files: CheckpointFiles, source: SentencePieceTokenizer, target: SentencePieceTokenizer, langs: list[str] | None
) -> None:
    """A multilingual OPUS-MT model's sources open with their target language's code (``>>cmn_Hans<<``), as
    ``MarianTokenizer``'s users write it: the source tokenizer's prefix becomes the code of ``langs[1]`` (``zh``:
    the first Simplified Chinese code), if the model has one; else a warning says how to choose one."""
    tokens = LanguageTokens.of(source.vocabulary, target.vocabulary)
    if tokens is None or tokens.forced_target:
        return
    try:
        if langs is None:
            raise ValueError("the run's languages are not recorded")
        code = tokens.choose(langs[1], target=True)
    except ValueError as error:
        files.notes.append(f"{files.name!r} writes in {len(tokens.targets)} languages, chosen by a code that opens "
                           f"the source ({', '.join(list(tokens.targets)[:4])}...); {error}: give translate "
                           "--target-lang CODE, or open each source with >>CODE<<")  # fmt: skip
        return
    source.prefix = [tokens.targets[code]]


def m2m100_langs(files: CheckpointFiles) -> list[str]:
    """The pair a many-to-many run translates when ``--langs`` names none: its tokenizer's ``src_lang`` and
    ``tgt_lang``."""
    settings = files.tokenizer_config()
    pair = [settings.get("src_lang"), settings.get("tgt_lang")]
    if not _codes(pair):
        raise UserError(f"{files.name!r} is a many-to-many model and names no pair: give --langs SRC TGT (two of its "
                        "languages, such as de en)")  # fmt: skip
    return [str(code) for code in pair]


def is_nllb(files: CheckpointFiles) -> bool:
    """Whether an M2M100 checkpoint's tokenizer is NLLB-200's (``NllbTokenizer``), not ``M2M100Tokenizer``."""
    return str(files.tokenizer_config().get("tokenizer_class", "")).startswith("Nllb")


def m2m100_vocabulary(files: CheckpointFiles, config: TransformerConfig) -> dict[str, int]:
    """``M2M100Tokenizer``'s ids: ``vocab.json``'s pieces, then a ``__xx__`` code of each of its languages, then its
    made-up words."""
    settings = files.tokenizer_config()
    family = settings.get("language_codes", "m2m100")
    if family not in M2M100_CODES:
        raise files.refuse(TOKENIZER_CONFIG, f"has language_codes={family!r}: multihead knows "
                           f"{sorted(M2M100_CODES)}")  # fmt: skip
    madeup = settings.get("num_madeup_words", 8)
    _check_int(files, TOKENIZER_CONFIG, "num_madeup_words", madeup, minimum=0)
    _require(files, M2M100_SPM, VOCABULARY)
    pieces = files.json(VOCABULARY)
    codes = M2M100_CODES[family]
    vocabulary = {**pieces, **{code_token(code): len(pieces) + index for index, code in enumerate(codes)}}
    vocabulary |= {MADE_UP.format(index): len(pieces) + len(codes) + index for index in range(madeup)}
    if len(vocabulary) != config.tgt_vocab:
        raise files.refuse(VOCABULARY, f"has {len(pieces)} pieces, which with {len(codes)} language codes and "
                           f"{madeup} made-up words make {len(vocabulary)} ids, not the model's "
                           f"{config.tgt_vocab}")  # fmt: skip
    return vocabulary


def nllb_vocabulary(files: CheckpointFiles, config: TransformerConfig) -> dict[str, int]:
    """``NllbTokenizer``'s ids, as ``tokenizer.json`` gives them: its model's pieces (``<s>``, ``<pad>``, ``</s>``,
    ``<unk>``, then SentencePiece's pieces one id on) and its added tokens (the ``deu_Latn`` codes, ``<mask>``); ids
    the model has beyond them (NLLB-200's embedding has two more rows) are made-up words."""
    if files.tokenizer_config().get("legacy_behaviour"):
        raise files.refuse(TOKENIZER_CONFIG, "has legacy_behaviour=true (the source's language code after its "
                           "EOS): multihead reads NLLB's sources as Transformers does by default, code "
                           "first")  # fmt: skip
    _require(files, TOKENIZER_JSON)
    settings = files.json(TOKENIZER_JSON)
    model, added = settings.get("model"), settings.get("added_tokens", [])
    if not isinstance(model, dict) or not isinstance(model.get("vocab"), dict) or not isinstance(added, list):
        raise files.refuse(TOKENIZER_JSON, "holds no vocabulary (a model's 'vocab' of pieces and ids, and "
                           "'added_tokens')")  # fmt: skip
    try:
        vocabulary = {**model["vocab"], **{token["content"]: token["id"] for token in added}}
    except (KeyError, TypeError):
        raise files.refuse(TOKENIZER_JSON, "has an added token without its 'content' and 'id'") from None
    size = len(vocabulary)
    if size > config.tgt_vocab:
        raise files.refuse(TOKENIZER_JSON, f"has {size} ids, more than the model's {config.tgt_vocab}")
    return vocabulary | {MADE_UP.format(index): size + index for index in range(config.tgt_vocab - size)}


def many_to_many_sentencepiece(files: CheckpointFiles) -> bytes:
    """The SentencePiece model of an M2M100 or NLLB-200 tokenizer: ``sentencepiece.bpe.model``, or, for an NLLB-200
    checkpoint without one (Transformers 5 saves ``tokenizer.json`` alone), one made from ``tokenizer.json``
    (:func:`sentencepiece_of`)."""
    if (files.directory / M2M100_SPM).is_file() or not is_nllb(files):
        _require(files, M2M100_SPM)
        return (files.directory / M2M100_SPM).read_bytes()
    settings = files.json(TOKENIZER_JSON)
    try:
        return sentencepiece_of(settings, [token["content"] for token in settings["added_tokens"] if token["special"]])
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise files.refuse(TOKENIZER_JSON, f"is not the BPE model of a SentencePiece one, which multihead makes when "
                           f"there is no {M2M100_SPM}: {error}") from None  # fmt: skip


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


def _require(files: CheckpointFiles, *names: str) -> None:
    for file in names:
        if not (files.directory / file).is_file():
            raise UserError(f"{files.name!r} holds no {file}, which its tokenizer reads")


def many_to_many_tokenizers(
    files: CheckpointFiles, config: TransformerConfig, ids: MarianIds, langs: Sequence[str]
) -> tuple[SentencePieceTokenizer, SentencePieceTokenizer, MarianIds, list[str]]:
    """The tokenizers of an M2M100 or NLLB-200 model (:func:`m2m100_vocabulary`, :func:`nllb_vocabulary`), the
    source side's texts starting with the code of ``langs[0]`` and ending with EOS; ``ids`` forcing the code of
    ``langs[1]`` first, as ``forced_bos_token_id`` does; and ``langs`` as the codes clients know (``deu_Latn``:
    ``de``)."""
    vocabulary = (nllb_vocabulary if is_nllb(files) else m2m100_vocabulary)(files, config)
    file = TOKENIZER_JSON if is_nllb(files) else VOCABULARY
    tokens = LanguageTokens.of(vocabulary, vocabulary)
    if tokens is None or not tokens.forced_target:
        raise files.refuse(file, "holds no language codes (M2M100's __de__, NLLB's deu_Latn)")
    try:
        codes = [tokens.choose(code, target=side == 1) for side, code in enumerate(langs)]
    except ValueError as error:
        raise UserError(f"--langs {' '.join(langs)}: {files.name!r}: {error}") from None
    for special, model_id in (("</s>", ids.eos), ("<pad>", ids.pad)):
        if vocabulary.get(special) != model_id:
            raise files.refuse(file, f"gives {special!r} the id {vocabulary.get(special)!r}, but {CONFIG} "
                               f"{model_id}: the tokenizer does not fit the model")  # fmt: skip
    unk = vocabulary.get("<unk>")
    if isinstance(unk, bool) or not isinstance(unk, int):
        raise files.refuse(file, "has no '<unk>', which reads the pieces it lacks")
    specials = Specials(pad=ids.pad, bos=ids.start, eos=ids.eos, unk=unk)
    model = many_to_many_sentencepiece(files)
    try:
        source = SentencePieceTokenizer(model, vocabulary, append_eos=True, specials=specials,
                                        prefix=(tokens.sources[codes[0]],))  # fmt: skip
        target = SentencePieceTokenizer(model, vocabulary, append_eos=False, specials=specials)
    except ValueError as error:
        raise files.refuse(M2M100_SPM, f"is no SentencePiece model of this vocabulary: {error}") from None
    public = [tokens.public(code, target=side == 1) for side, code in enumerate(codes)]
    return source, target, replace(ids, forced=(tokens.targets[codes[1]],)), public


def default_langs(
    source_name: str, directory: Path, hf: dict[str, Any], tokenizer_config: dict[str, Any]
) -> list[str] | None:
    """``[source, target]`` from the model's name, given or as ``config.json`` recorded it: OPUS-MT's
    ``opus-mt-de-en`` (de, en), or a name ending in two common languages (``...-en-fr``, ``...-en-to-fr``); else
    ``tokenizer_config.json``'s ``source_lang`` and ``target_lang``; ``None`` where none names two language codes."""
    for name in (source_name, directory.name, hf.get("_name_or_path")):
        if not isinstance(name, str):
            continue
        found = NAMED_PAIR.search(name.rstrip("/").rsplit("/", 1)[-1])
        if found is not None:
            pair = [found["source"], found["target"]]
            if _codes(pair) and (found["opus"] or all(code in COMMON for code in pair)):
                return pair
    pair = [tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang")]
    return pair if _codes(pair) else None


def _codes(pair: Sequence[Any]) -> bool:
    """Two different language codes."""
    return all(isinstance(code, str) and CODE.match(code) for code in pair) and pair[0] != pair[1]
