"""Marian (OPUS-MT) tokenizers: a SentencePiece model and a vocabulary of its pieces give exactly the ids and the text
of Transformers' ``MarianTokenizer``, for a shared vocabulary and for one per side; a run keeps them byte for byte."""

from __future__ import annotations

import io
import json
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import hypothesis
import pytest
import sentencepiece
from hypothesis import strategies as st
from transformers import MarianTokenizer

from multihead.app.tokenizers import (
    SentencePieceTokenizer,
    Specials,
    digest,
    flat,
    load_tokenizers,
    save_tokenizers,
)

GERMAN = ["Die", "Straße", "ist", "schön", "über", "große", "Äpfel", "Öl", "für", "Mädchen", "heißt", "Grüße",
          "Bäcker", "Zürich", "Käse", "Frühstück"]  # fmt: skip
ENGLISH = ["the", "street", "is", "beautiful", "over", "big", "apples", "oil", "for", "girls", "called", "greetings",
           "baker", "café", "naïve", "résumé"]  # fmt: skip
CHINESE = ["我们", "喜欢", "北京", "中文", "学生", "今天", "天气", "很好", "朋友", "你好"]
NUMBERS = ["1984", "3,5", "12.000", "0", "42", "2024", "7"]

# Pieces of awkward text: accents (one character and combining), what NFKC changes (ligature, circled digit,
# no-break and ideographic spaces), spaces single, double and outer, a tab, Chinese, digits, a character the models
# never saw, language codes known and not, specials' text.
AWKWARD = ["Straße", "street", "Äpfel", "e\u0301", "ﬁ", "①", "\u00a0", "\u3000", " ", "  ", "\t", "我们北京", "。",
           "12.000", "3,5", "☃", ">>de<<", ">>xx<<", ">>", "<<", "</s>", "<unk>", "<pad>", "<", "x"]  # fmt: skip
TEXTS = [
    "Die Straße ist schön, über 12.000 Äpfel!",
    "the café naïve 1984",
    "我们喜欢北京 2024",
    "  leading and trailing  ",
    "double  spaces   here",
    "",
    " ",
    ">>de<< Grüße aus Zürich",
    ">>de<<",
    ">>xx<< unknown code",
    "a snowman ☃ never seen",
    "specials </s> and <unk> and<pad>in text",
    "ﬁne ① e\u0301\u00a0x",
]


def lines(words: list[str], count: int, seed: int) -> list[str]:
    chance = random.Random(seed)
    return [" ".join(chance.choice(words) for _ in range(chance.randint(2, 9))) for _ in range(count)]


def train_spm(texts: list[str]) -> bytes:
    """A SentencePiece model of 80 pieces (both sides the same size, as Transformers' conversion requires of
    separate vocabularies)."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, vocab_size=80, character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return model.getvalue()


def marian_vocabulary(*models: bytes, codes: tuple[str, ...] = ()) -> dict[str, int]:
    """A vocabulary laid out as OPUS-MT's: ``</s>`` 0, ``<unk>`` 1, language codes, the models' pieces, ``<pad>``
    last."""
    pieces = ["</s>", "<unk>", *codes]
    for model in models:
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        pieces += [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
    pieces = [piece for piece in dict.fromkeys(pieces) if piece != "<s>"]
    return {piece: index for index, piece in enumerate([*pieces, "<pad>"])}


@dataclass
class Marian:
    """A Marian checkpoint's tokenizer files, Transformers' tokenizer of them, and ours."""

    directory: Path
    separate: bool  # a vocabulary for each side
    hugging_face: MarianTokenizer
    source: SentencePieceTokenizer
    target: SentencePieceTokenizer


def marian(directory: Path, separate: bool) -> Marian:
    source_spm = train_spm(lines(ENGLISH, 200, 1) + lines(CHINESE + NUMBERS, 100, 2))
    target_spm = train_spm(lines(GERMAN, 200, 3) + lines(CHINESE + NUMBERS, 100, 4))
    files = directory / "files"
    files.mkdir()
    (files / "source.spm").write_bytes(source_spm)
    (files / "target.spm").write_bytes(target_spm)
    if separate:
        vocabularies = {"vocab.json": marian_vocabulary(source_spm), "target_vocab.json": marian_vocabulary(target_spm)}
    else:
        vocabularies = {"vocab.json": marian_vocabulary(source_spm, target_spm, codes=(">>de<<", ">>en<<"))}
    for name, vocabulary in vocabularies.items():
        (files / name).write_text(json.dumps(vocabulary), encoding="utf-8")
    saved = directory / "saved"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses." (used by nothing here)
        MarianTokenizer(
            source_spm=str(files / "source.spm"), target_spm=str(files / "target.spm"), vocab=str(files / "vocab.json"),
            target_vocab_file=str(files / "target_vocab.json") if separate else None, separate_vocabs=separate,
        ).save_pretrained(saved)  # fmt: skip
        hugging_face = MarianTokenizer.from_pretrained(saved)
    pad = vocabularies["vocab.json"]["<pad>"]
    target_pad = json.loads((saved / "target_vocab.json").read_text())["<pad>"] if separate else pad
    source = SentencePieceTokenizer.from_files(
        saved / "source.spm", saved / "vocab.json", append_eos=True, specials=Specials(pad=pad, bos=pad, eos=0, unk=1)
    )
    target = SentencePieceTokenizer.from_files(
        saved / "target.spm", saved / ("target_vocab.json" if separate else "vocab.json"), append_eos=False,
        specials=Specials(pad=target_pad, bos=target_pad, eos=0, unk=1),
    )  # fmt: skip
    return Marian(saved, separate, hugging_face, source, target)


@pytest.fixture(scope="module", params=["shared", "separate"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Marian:
    return marian(tmp_path_factory.mktemp(request.param), request.param == "separate")


def hugging_face_ids(model: Marian, texts: list[str], side: str) -> list[list[int]]:
    """Transformers' ids of ``texts``: the source's with their EOS, the target's without it (our batches add it)."""
    if side == "source":
        return model.hugging_face(texts).input_ids
    ids = model.hugging_face(text_target=texts).input_ids
    assert all(one[-1] == 0 for one in ids)
    return [one[:-1] for one in ids]


def test_the_ids_are_those_of_marian_tokenizer(model: Marian) -> None:
    for side, tokenizer in (("source", model.source), ("target", model.target)):
        expected = hugging_face_ids(model, TEXTS, side)
        assert [tokenizer.encode(text)[0] for text in TEXTS] == expected, side
        assert tokenizer.encode_all(TEXTS) == expected, side
        ids, lengths = tokenizer.corpus_encoder()(TEXTS)
        assert (ids.tolist(), lengths.tolist()) == tuple(array.tolist() for array in flat(expected)), side
    assert len(model.source) == len(json.loads((model.directory / "vocab.json").read_text()))
    assert len(model.target) == model.target.specials.pad + 1  # pad is the last id


@hypothesis.settings(max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow])
@hypothesis.given(texts=st.lists(st.lists(st.sampled_from(AWKWARD), max_size=8).map("".join), min_size=1, max_size=6))
def test_awkward_texts_give_marian_tokenizers_ids_and_text(model: Marian, texts: list[str]) -> None:
    for side, tokenizer in (("source", model.source), ("target", model.target)):
        expected = hugging_face_ids(model, texts, side)
        assert tokenizer.encode_all(texts) == expected, side
        if side == "source" and model.separate:
            continue  # Transformers reads the source's ids with the target's vocabulary there
        for ids in expected:  # up to the first EOS (the text's own "</s>" is one)
            cut = ids[: ids.index(0)] if 0 in ids else ids
            assert tokenizer.decode(ids) == model.hugging_face.decode(
                cut, skip_special_tokens=True, use_source_tokenizer=side == "source"
            ), side


def test_language_codes_are_pieces_of_their_own_where_the_vocabulary_has_them(model: Marian) -> None:
    ids, unknown = model.source.encode(">>de<< the street")
    if model.separate:  # no language codes in the vocabulary
        assert (ids[0], unknown) == (model.source.specials.unk, [">>de<<"])
    else:
        assert (model.source.pieces(ids)[0], unknown) == (">>de<<", [])
    assert model.source.word_starts(ids)[0]
    assert model.source.encode(">>xx<< street")[1] == [">>xx<<"]


def test_unknown_pieces_are_reported_and_read_as_unk(model: Marian) -> None:
    ids, unknown = model.target.encode("Straße ☃ schön")
    assert unknown == ["☃"]
    assert ids.count(model.target.specials.unk) == 1
    assert model.target.encode("Straße </s> <unk> schön")[1] == []  # specials' text reads as the specials


def test_what_the_source_model_never_saw_may_be_a_piece_of_the_shared_vocabulary(model: Marian) -> None:
    processor = model.source.processor  # English and Chinese: "S" and "ß" are unknown to it
    assert processor.encode("Straße").count(processor.unk_id()) == 2
    ids, unknown = model.source.encode("Straße")
    assert ids == hugging_face_ids(model, ["Straße"], "source")[0] == model.source.encode_all(["Straße"])[0]
    assert unknown == (["S", "ß"] if model.separate else [])  # the target model's pieces


def test_decoding_stops_at_eos_and_skips_specials_as_marian_does(model: Marian) -> None:
    target, specials = model.target, model.target.specials
    ids, _ = target.encode(">>de<< Die Straße ist schön über 12.000 Äpfel")
    noisy = [specials.pad, *ids[:3], specials.unk, specials.pad, *ids[3:], specials.unk]
    for sequence in (ids, noisy, [*noisy, specials.eos, *ids], [specials.eos, *ids], []):
        end = sequence.index(specials.eos) if specials.eos in sequence else len(sequence)
        assert target.decode(sequence) == model.hugging_face.decode(sequence[:end], skip_special_tokens=True)
        # shared vocabularies: Transformers decodes with the source model by default, the target's here as Marian's
        # own pipeline does; the two give the same text
        assert target.decode(sequence) == model.hugging_face.decode(
            sequence[:end], skip_special_tokens=True, use_source_tokenizer=False
        )


def test_pieces_and_word_starts(model: Marian) -> None:
    tokenizer = model.target
    ids, _ = tokenizer.encode("Frühstück in Zürich</s>")
    pieces = tokenizer.pieces(ids)
    assert "".join(pieces).replace("▁", " ").strip() == "Frühstück in Zürich</s>"
    assert tokenizer.word_starts(ids) == [piece.startswith("▁") or piece == "</s>" for piece in pieces]


def test_a_run_keeps_the_files_and_gives_the_same_ids(model: Marian, tmp_path: Path) -> None:
    written = save_tokenizers(model.source, model.target, tmp_path)
    vocabularies = ["vocab.source.json", "vocab.target.json"] if model.separate else ["vocab.json"]
    assert sorted(written) == sorted(["tokenizer.json", "source.spm", "target.spm", *vocabularies])
    assert (tmp_path / "source.spm").read_bytes() == (model.directory / "source.spm").read_bytes()
    assert (tmp_path / "target.spm").read_bytes() == (model.directory / "target.spm").read_bytes()
    manifest = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert manifest["joint"] is False
    assert manifest["source"] == {
        "kind": "sentencepiece", "model": "source.spm", "vocabulary": vocabularies[0], "append_eos": True,
        "specials": {"pad": model.source.specials.pad, "bos": model.source.specials.pad, "eos": 0, "unk": 1},
    }  # fmt: skip
    assert manifest["target"]["vocabulary"] == vocabularies[-1]
    assert manifest["target"]["append_eos"] is False
    source, target = load_tokenizers(tmp_path)
    assert isinstance(source, SentencePieceTokenizer)
    assert isinstance(target, SentencePieceTokenizer)
    assert source is not target
    assert source.encode_all(TEXTS) == model.source.encode_all(TEXTS)
    assert target.encode_all(TEXTS) == model.target.encode_all(TEXTS)
    assert (source.specials, target.specials) == (model.source.specials, model.target.specials)
    assert digest(source, target) == digest(model.source, model.target)
    again = tmp_path / "again"
    again.mkdir()
    save_tokenizers(source, target, again)
    for name in written:
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_the_digest_covers_model_vocabulary_and_rules(model: Marian) -> None:
    source, target = model.source, model.target
    base = digest(source, target)
    reordered = dict(reversed(source.vocabulary.items()))  # the same pieces with the same ids, in another order
    same = SentencePieceTokenizer(source.model, reordered, append_eos=True, specials=source.specials)
    assert digest(same, target) == base
    swapped = {**source.vocabulary, "</s>": 1, "<unk>": 0}
    others = [
        SentencePieceTokenizer(source.model, source.vocabulary, append_eos=False, specials=source.specials),
        SentencePieceTokenizer(target.model, source.vocabulary, append_eos=True, specials=source.specials),
        SentencePieceTokenizer(source.model, swapped, append_eos=True, specials=source.specials),
        SentencePieceTokenizer(
            source.model, source.vocabulary, append_eos=True, specials=Specials(pad=0, bos=0, eos=0, unk=1)
        ),
    ]
    assert len({base, *(digest(other, target) for other in others)}) == 1 + len(others)


def test_damaged_files_are_refused_naming_them(model: Marian, tmp_path: Path) -> None:
    save_tokenizers(model.source, model.target, tmp_path)
    manifest = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    damaged = {**manifest, "target": {"kind": "sentencepiece"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(damaged), encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer\.json.* is damaged: its target"):
        load_tokenizers(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(manifest), encoding="utf-8")
    (tmp_path / "source.spm").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"source\.spm.* is damaged: not a SentencePiece model"):
        load_tokenizers(tmp_path)
    (tmp_path / "source.spm").write_bytes(model.source.model)
    vocabulary = tmp_path / manifest["source"]["vocabulary"]
    vocabulary.write_text('{"</s>": 0, "<unk>": 0}', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(vocabulary.name)}.* is damaged: .*\[0\] more than once"):
        load_tokenizers(tmp_path)
    vocabulary.unlink()
    with pytest.raises(ValueError, match=rf"{re.escape(vocabulary.name)}.* is damaged: .*No such file"):
        load_tokenizers(tmp_path)
    with pytest.raises(ValueError, match=r"vocab\.json.* does not fit: the specials"):
        SentencePieceTokenizer.from_files(
            model.directory / "source.spm", model.directory / "vocab.json", append_eos=True,
            specials=Specials(pad=10**6, bos=0, eos=0, unk=1),
        )  # fmt: skip
