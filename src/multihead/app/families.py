"""The families of checkpoints ``multihead import`` reads, one class each, and their registry, :data:`FAMILIES`.

A checkpoint's family is the registered one of its ``config.json``'s ``model_type`` whose tokenizer class its
``tokenizer_config.json`` names (:func:`family_of`): NLLB-200 is an ``m2m_100`` model with an ``NllbTokenizer``. A
family (:class:`Family`) reads the config into ours, checking it against its own tables (:class:`ConfigKeys`),
makes the tokenizers of the run's languages, and names the weights; what every family reads alike is in
:mod:`multihead.app.hf_checkpoints`. A new family is a class here and an entry in :data:`FAMILIES`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from multihead.app.console import UserError
from multihead.app.hf_checkpoints import (
    ACTIVATIONS,
    CONFIG,
    ENCODER_DECODER,
    EVERY_HEAD,
    TOKENIZER_CONFIG,
    CheckpointFiles,
    ConfigKeys,
    ModelIds,
    bart_weight_names,
    check_int,
    model_ids,
    read_config,
    sentencepiece_of,
)
from multihead.app.languages import CODE, COMMON, M2M100_CODES, LanguageTokens, code_token
from multihead.app.tokenizers import SentencePieceTokenizer
from multihead.config import TransformerConfig
from multihead.decoding import Specials

SOURCE_SPM, TARGET_SPM, VOCABULARY, TARGET_VOCABULARY = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
M2M100_SPM, TOKENIZER_JSON = "sentencepiece.bpe.model", "tokenizer.json"
NAMED_PAIR = re.compile(r"(?P<opus>opus-mt-(?:tc-(?:big-)?)?)?(?<![^-_])(?P<source>[a-z]{2,3})[-_](?:to[-_])?"
                        r"(?P<target>[a-z]{2,3})$")  # fmt: skip
"""The language pair at the end of a model's name: ``opus-mt-de-en``, ``opus-mt-tc-big-en-fr``, ``marian-en-to-fr``."""
MADE_UP = "madeupword{:04d}"
"""fairseq's names of the ids an M2M100 dictionary pads itself with after its language codes."""


@dataclass(frozen=True)
class Tokenizers:
    """A checkpoint's tokenizers, the ids the model fixes with the target code it forces (a many-to-many model's), and
    the languages the run records, as clients know them."""

    source: SentencePieceTokenizer
    target: SentencePieceTokenizer
    ids: ModelIds
    langs: list[str] | None


class Family(Protocol):
    """A family of checkpoints ``multihead import`` reads."""

    name: str  # as import reports it: "Marian"
    model_type: str  # its config.json's model_type
    tokenizer_class: str  # how its tokenizer_config.json's tokenizer_class starts; "" for any
    files: tuple[str, ...]  # its tokenizer's files, which a Hub download fetches

    def config(
        self, hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
    ) -> tuple[TransformerConfig, ModelIds]:
        """Our config of the model ``config.json`` (``hf``) and ``generation_config.json`` describe, every value we
        cannot represent refused; and the ids the model fixes."""
        ...

    def tokenizers(
        self,
        files: CheckpointFiles,
        hf: dict[str, Any],
        config: TransformerConfig,
        ids: ModelIds,
        langs: Sequence[str] | None,
    ) -> Tokenizers:
        """The source and target tokenizers, whose specials are the model's, of the run that translates ``langs``
        (``--langs``), else the pair the checkpoint names (``None`` where it names none)."""
        ...

    def weight_names(self, config: TransformerConfig) -> dict[str, str]:
        """Our name of every layer weight -> the checkpoint's (less ``model.``)."""
        ...


class BartNames:
    """A family whose weights have the names of Transformers' BART family (:func:`bart_weight_names`)."""

    def weight_names(self, config: TransformerConfig) -> dict[str, str]:
        """Our name of every layer weight -> BART's (less ``model.``)."""
        return bart_weight_names(config)


# --- Marian ------------------------------------------------------------------------------------------------


class Marian(BartNames):
    """Transformers' ``MarianMTModel`` and ``MarianTokenizer`` (OPUS-MT's ``Helsinki-NLP/opus-mt-*``).

    - ``config.json``: the sizes; ``activation_function`` ``swish`` (our ``silu``), ``relu`` or ``gelu``;
      ``scale_embedding``; ``share_encoder_decoder_embeddings`` (one vocabulary, one embedding matrix, which is also
      the output layer's: our ``tie_embeddings``) or two vocabularies (the target embedding is the output layer's
      when ``tie_word_embeddings``: our ``tie_output``); ``pad_token_id``, ``decoder_start_token_id`` (Marian starts
      the decoder from its pad), ``eos_token_id``; ``max_position_embeddings`` (the longest sequence); ``dropout``.
      Keys absent take ``MarianConfig``'s defaults, as Transformers does. Post-norm layers with no LayerNorm after
      the embeddings or the last layer, sinusoidal positions (a stored table is checked, not kept).
    - the tokenizer: ``source.spm`` and ``target.spm`` with ``vocab.json`` (and ``target_vocab.json`` when
      ``tokenizer_config.json`` says ``separate_vocabs``), which give the ids ``MarianTokenizer`` gives; the source
      side ends every text with EOS, as ``MarianTokenizer`` does. A multilingual OPUS-MT model (target codes such as
      ``>>fra<<`` in its vocabulary) gets its sources opened with the code of the run's target
      (:meth:`target_code`).
    - the languages, where ``--langs`` names none: from the model's name or its tokenizer's settings
      (:func:`default_langs`).
    """

    name, model_type, tokenizer_class = "Marian", "marian", ""
    files: tuple[str, ...] = (SOURCE_SPM, TARGET_SPM, VOCABULARY, TARGET_VOCABULARY)
    keys = ConfigKeys(
        defaults={
            "activation_function": "gelu",
            "scale_embedding": False,
            "share_encoder_decoder_embeddings": True,
            "tie_word_embeddings": True,
            "dropout": 0.1,
            "decoder_vocab_size": None,
        },
        fixed={
            **ENCODER_DECODER,
            "normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
            "encoder_normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
            "decoder_normalize_before": (False, "post-norm layers, a LayerNorm after each residual sum"),
            "normalize_embedding": (False, "no LayerNorm on the embeddings"),
            "layernorm_embedding": (False, "no LayerNorm on the embeddings"),
            "add_final_layer_norm": (False, "no LayerNorm after the last layer"),
            "static_position_embeddings": (True, "the sinusoidal position table"),
            "add_bias_logits": (False, "Marian's output layer"),
            **EVERY_HEAD,
        },
        flags=("share_encoder_decoder_embeddings",),
    )
    """``MarianConfig``'s defaults of the keys an older ``config.json`` may lack, and the values Marian's keys must
    have."""

    def config(
        self, hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
    ) -> tuple[TransformerConfig, ModelIds]:
        values = read_config(hf, self.keys, files)
        shared, tied = values["share_encoder_decoder_embeddings"], values["tie_word_embeddings"]
        if shared and not tied:
            raise files.refuse(CONFIG, "has tie_word_embeddings=False with share_encoder_decoder_embeddings=True: "
                               "multihead ties one vocabulary's output layer to its embeddings")  # fmt: skip
        vocab, decoder_vocab = values["vocab_size"], values["decoder_vocab_size"]
        if decoder_vocab is not None:
            check_int(files, CONFIG, "decoder_vocab_size", decoder_vocab, minimum=1)
            if shared and decoder_vocab != vocab:
                raise files.refuse(CONFIG, f"has decoder_vocab_size={decoder_vocab} and vocab_size={vocab}, but "
                                   "share_encoder_decoder_embeddings=True gives both sides one vocabulary")  # fmt: skip
        ids = model_ids(values, generation, self.keys, files)
        try:
            config = TransformerConfig(
                src_vocab=vocab, tgt_vocab=vocab if shared or decoder_vocab is None else decoder_vocab,
                d_model=values["d_model"], num_heads=values["encoder_attention_heads"],
                num_encoder_layers=values["encoder_layers"], num_decoder_layers=values["decoder_layers"],
                d_ff=values["encoder_ffn_dim"], dropout=values["dropout"],
                activation=ACTIVATIONS[values["activation_function"]], max_len=values["max_position_embeddings"],
                pad_id=ids.pad, tie_embeddings=shared, positions="halves", scale_embeddings=values["scale_embedding"],
                tie_output=not shared and tied,
            )  # fmt: skip
        except (TypeError, ValueError) as error:
            raise files.refuse(CONFIG, f"describes no model multihead can build: {error}") from None
        return config, ids

    def tokenizers(
        self,
        files: CheckpointFiles,
        hf: dict[str, Any],
        config: TransformerConfig,
        ids: ModelIds,
        langs: Sequence[str] | None,
    ) -> Tokenizers:
        pair = list(langs) if langs is not None else default_langs(files, hf)
        settings = files.tokenizer_config()
        separate = settings.get("separate_vocabs", False)
        if not isinstance(separate, bool):
            raise files.refuse(TOKENIZER_CONFIG, f"has separate_vocabs={separate!r}, not true or false")
        texts = {
            "eos": _token_text(settings.get("eos_token"), "</s>"),
            "unk": _token_text(settings.get("unk_token"), "<unk>"),
            "pad": _token_text(settings.get("pad_token"), "<pad>"),
        }
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
                    raise files.refuse(vocabulary, f"gives {texts[special]!r} the id {pieces.get(texts[special])!r}, "
                                       f"but {CONFIG} {model_id}: the tokenizer does not fit the model")  # fmt: skip
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
        prefix = self.target_code(files, made[0], made[1], pair)
        return Tokenizers(made[0].with_prefix(prefix) if prefix else made[0], made[1], ids, pair)

    @staticmethod
    def target_code(
        files: CheckpointFiles, source: SentencePieceTokenizer, target: SentencePieceTokenizer, langs: list[str] | None
    ) -> tuple[int, ...]:
        """A multilingual OPUS-MT model's sources open with their target language's code (``>>cmn_Hans<<``), as
        ``MarianTokenizer``'s users write it: the source tokenizer's prefix, the code of ``langs[1]`` (``zh``: the
        first Simplified Chinese code), if the model has one; else none, and a warning says how to choose one."""
        tokens = LanguageTokens.of(source.vocabulary, target.vocabulary)
        if tokens is None or tokens.forced_target:
            return ()
        try:
            if langs is None:
                raise ValueError("the run's languages are not recorded")
            code = tokens.choose(langs[1], target=True)
        except ValueError as error:
            files.notes.append(f"{files.name!r} writes in {len(tokens.targets)} languages, chosen by a code that "
                               f"opens the source ({', '.join(list(tokens.targets)[:4])}...); {error}: give translate "
                               "--target-lang CODE, or open each source with >>CODE<<")  # fmt: skip
            return ()
        return (tokens.targets[code],)


def _token_text(value: Any, default: str) -> str:
    """A special token's text in ``tokenizer_config.json``: a string, or an added token's ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else default


def default_langs(files: CheckpointFiles, hf: dict[str, Any]) -> list[str] | None:
    """``[source, target]`` from the model's name, given or as ``config.json`` recorded it: OPUS-MT's
    ``opus-mt-de-en`` (de, en), or a name ending in two common languages (``...-en-fr``, ``...-en-to-fr``); else
    ``tokenizer_config.json``'s ``source_lang`` and ``target_lang``; ``None`` where none names two language codes."""
    for name in (files.name, files.directory.name, hf.get("_name_or_path")):
        if not isinstance(name, str):
            continue
        found = NAMED_PAIR.search(name.rstrip("/").rsplit("/", 1)[-1])
        if found is not None:
            pair = [found["source"], found["target"]]
            if _codes(pair) and (found["opus"] or all(code in COMMON for code in pair)):
                return pair
    settings = files.tokenizer_config()
    pair = [settings.get("source_lang"), settings.get("target_lang")]
    return pair if _codes(pair) else None


def _codes(pair: Sequence[Any]) -> bool:
    """Two different language codes."""
    return all(isinstance(code, str) and CODE.match(code) for code in pair) and pair[0] != pair[1]


# --- M2M100 and NLLB-200 -----------------------------------------------------------------------------------


class M2M100(BartNames):
    """Transformers' ``M2M100ForConditionalGeneration`` and ``M2M100Tokenizer`` (``facebook/m2m100_418M``):
    pre-norm layers with a LayerNorm after each stack (``norm_first``), fairseq's sinusoids counted from the pad id + 1
    (``positions="fairseq"``, ``first_position``), one vocabulary tied to the output layer, the decoder starting from
    EOS. Its tokenizer: ``sentencepiece.bpe.model`` and ``vocab.json``'s pieces, then a ``__xx__`` code of each of its
    languages (``language_codes``), then its made-up words (:meth:`vocabulary`). It translates between many
    languages; the run translates one pair, ``--langs SRC TGT`` (else the tokenizer's ``src_lang`` and ``tgt_lang``):
    every source starts with the code of SRC, every translation with the code of TGT (the run's forced token,
    Transformers' ``forced_bos_token_id``)."""

    name, model_type, tokenizer_class = "M2M100", "m2m_100", ""
    files: tuple[str, ...] = (M2M100_SPM, VOCABULARY)
    vocabulary_file = VOCABULARY  # the file whose ids the vocabulary's refusals name
    keys = ConfigKeys(
        defaults={"activation_function": "relu", "scale_embedding": True, "tie_word_embeddings": True, "dropout": 0.1},
        fixed={
            **ENCODER_DECODER,
            **EVERY_HEAD,
            "tie_word_embeddings": (True, "one vocabulary whose embedding matrix is also the output layer's"),
        },
    )
    """``M2M100Config``'s defaults of the keys multihead reads that a ``config.json`` may lack, and the values its keys
    must have."""

    def config(
        self, hf: dict[str, Any], generation: dict[str, Any] | None, files: CheckpointFiles
    ) -> tuple[TransformerConfig, ModelIds]:
        values = read_config(hf, self.keys, files)
        ids = model_ids(values, generation, self.keys, files)
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

    def languages(self, files: CheckpointFiles, langs: Sequence[str] | None) -> list[str]:
        """The run's pair: ``langs``, else the tokenizer's ``src_lang`` and ``tgt_lang``."""
        if langs is not None:
            return list(langs)
        settings = files.tokenizer_config()
        pair = [settings.get("src_lang"), settings.get("tgt_lang")]
        if not _codes(pair):
            raise UserError(f"{files.name!r} is a many-to-many model and names no pair: give --langs SRC TGT (two of "
                            "its languages, such as de en)")  # fmt: skip
        return [str(code) for code in pair]

    def vocabulary(self, files: CheckpointFiles, config: TransformerConfig) -> dict[str, int]:
        """``M2M100Tokenizer``'s ids: ``vocab.json``'s pieces, then a ``__xx__`` code of each of its languages, then
        its made-up words."""
        settings = files.tokenizer_config()
        family = settings.get("language_codes", "m2m100")
        if family not in M2M100_CODES:
            raise files.refuse(TOKENIZER_CONFIG, f"has language_codes={family!r}: multihead knows "
                               f"{sorted(M2M100_CODES)}")  # fmt: skip
        madeup = settings.get("num_madeup_words", 8)
        check_int(files, TOKENIZER_CONFIG, "num_madeup_words", madeup, minimum=0)
        files.require(M2M100_SPM, VOCABULARY)
        pieces = files.json(VOCABULARY)
        codes = M2M100_CODES[family]
        vocabulary = {**pieces, **{code_token(code): len(pieces) + index for index, code in enumerate(codes)}}
        vocabulary |= {MADE_UP.format(index): len(pieces) + len(codes) + index for index in range(madeup)}
        if len(vocabulary) != config.tgt_vocab:
            raise files.refuse(VOCABULARY, f"has {len(pieces)} pieces, which with {len(codes)} language codes and "
                               f"{madeup} made-up words make {len(vocabulary)} ids, not the model's "
                               f"{config.tgt_vocab}")  # fmt: skip
        return vocabulary

    def sentencepiece(self, files: CheckpointFiles) -> bytes:
        """The tokenizer's SentencePiece model: ``sentencepiece.bpe.model``."""
        files.require(M2M100_SPM)
        return (files.directory / M2M100_SPM).read_bytes()

    def tokenizers(
        self,
        files: CheckpointFiles,
        hf: dict[str, Any],
        config: TransformerConfig,
        ids: ModelIds,
        langs: Sequence[str] | None,
    ) -> Tokenizers:
        """The source side's texts start with the code of the pair's source (:meth:`languages`) and end with EOS; the
        ids force the code of its target first, as ``forced_bos_token_id`` does; the languages are the codes clients
        know (``deu_Latn``: ``de``)."""
        pair = self.languages(files, langs)
        vocabulary, file = self.vocabulary(files, config), self.vocabulary_file
        tokens = LanguageTokens.of(vocabulary, vocabulary)
        if tokens is None or not tokens.forced_target:
            raise files.refuse(file, "holds no language codes (M2M100's __de__, NLLB's deu_Latn)")
        try:
            codes = [tokens.choose(code, target=side == 1) for side, code in enumerate(pair)]
        except ValueError as error:
            raise UserError(f"--langs {' '.join(pair)}: {files.name!r}: {error}") from None
        for special, model_id in (("</s>", ids.eos), ("<pad>", ids.pad)):
            if vocabulary.get(special) != model_id:
                raise files.refuse(file, f"gives {special!r} the id {vocabulary.get(special)!r}, but {CONFIG} "
                                   f"{model_id}: the tokenizer does not fit the model")  # fmt: skip
        unk = vocabulary.get("<unk>")
        if isinstance(unk, bool) or not isinstance(unk, int):
            raise files.refuse(file, "has no '<unk>', which reads the pieces it lacks")
        specials = Specials(pad=ids.pad, bos=ids.start, eos=ids.eos, unk=unk)
        model = self.sentencepiece(files)
        try:
            source = SentencePieceTokenizer(model, vocabulary, append_eos=True, specials=specials,
                                            prefix=(tokens.sources[codes[0]],))  # fmt: skip
            target = SentencePieceTokenizer(model, vocabulary, append_eos=False, specials=specials)
        except ValueError as error:
            raise files.refuse(M2M100_SPM, f"is no SentencePiece model of this vocabulary: {error}") from None
        public = [tokens.public(code, target=side == 1) for side, code in enumerate(codes)]
        return Tokenizers(source, target, replace(ids, forced=(tokens.targets[codes[1]],)), public)


class Nllb200(M2M100):
    """NLLB-200 (``facebook/nllb-200-distilled-600M``): an M2M100 model whose ``tokenizer_config.json`` names
    ``NllbTokenizer``. Its ids are ``tokenizer.json``'s (:meth:`vocabulary`); without ``sentencepiece.bpe.model``
    (Transformers 5 saves ``tokenizer.json`` alone) its SentencePiece model is made from ``tokenizer.json``
    (:func:`sentencepiece_of`)."""

    name, tokenizer_class = "NLLB-200", "Nllb"
    files: tuple[str, ...] = (M2M100_SPM, TOKENIZER_JSON)
    vocabulary_file = TOKENIZER_JSON

    def vocabulary(self, files: CheckpointFiles, config: TransformerConfig) -> dict[str, int]:
        """``NllbTokenizer``'s ids, as ``tokenizer.json`` gives them: its model's pieces (``<s>``, ``<pad>``,
        ``</s>``, ``<unk>``, then SentencePiece's pieces one id on) and its added tokens (the ``deu_Latn`` codes,
        ``<mask>``); ids the model has beyond them (NLLB-200's embedding has two more rows) are made-up words."""
        if files.tokenizer_config().get("legacy_behaviour"):
            raise files.refuse(TOKENIZER_CONFIG, "has legacy_behaviour=true (the source's language code after its "
                               "EOS): multihead reads NLLB's sources as Transformers does by default, code "
                               "first")  # fmt: skip
        files.require(TOKENIZER_JSON)
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

    def sentencepiece(self, files: CheckpointFiles) -> bytes:
        """``sentencepiece.bpe.model``, or, without one, a model made from ``tokenizer.json``
        (:func:`sentencepiece_of`)."""
        if (files.directory / M2M100_SPM).is_file():
            return super().sentencepiece(files)
        settings = files.json(TOKENIZER_JSON)
        try:
            specials = [token["content"] for token in settings["added_tokens"] if token["special"]]
            return sentencepiece_of(settings, specials)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise files.refuse(TOKENIZER_JSON, f"is not the BPE model of a SentencePiece one, which multihead makes "
                               f"when there is no {M2M100_SPM}: {error}") from None  # fmt: skip


# --- the registry ------------------------------------------------------------------------------------------

FAMILIES: tuple[Family, ...] = (Marian(), M2M100(), Nllb200())
"""The families ``multihead import`` reads."""


def family_of(hf: dict[str, Any], files: CheckpointFiles) -> Family:
    """The registered family of the checkpoint whose ``config.json`` is ``hf``: of its ``model_type``, the one whose
    tokenizer class its ``tokenizer_config.json``'s starts with, the most particular one (NLLB-200's ``Nllb`` before
    M2M100's any); a refusal naming every registered family if none is."""
    tokenizer = str(files.tokenizer_config().get("tokenizer_class", ""))
    found = [family for family in FAMILIES
             if family.model_type == hf.get("model_type") and tokenizer.startswith(family.tokenizer_class)]  # fmt: skip
    if not found:
        known = ", ".join(f"{family.name} ({_key(family)})" for family in FAMILIES)
        raise files.refuse(CONFIG, f"has model_type={hf.get('model_type')!r}: multihead imports {known}")
    return max(found, key=lambda family: len(family.tokenizer_class))


def _key(family: Family) -> str:
    """What marks a checkpoint of ``family``: its model_type, and its tokenizer class where it names one."""
    tokenizer = f", tokenizer_class {family.tokenizer_class}..." if family.tokenizer_class else ""
    return f"model_type {family.model_type!r}{tokenizer}"
