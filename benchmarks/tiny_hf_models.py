"""Random tiny Marian (OPUS-MT) and NLLB checkpoints, imported as runs: what ``benchmarks/placeholders.py`` measures
imported models with, without downloading one.

    .venv/bin/python benchmarks/tiny_hf_models.py OUT TRAIN_SRC TRAIN_TGT [--lines 29000]

Each gets BPE SentencePiece vocabularies learnt from the first ``--lines`` line pairs (plain or gzipped), random
weights (2+2 layers of 16 dimensions, seeded) saved by Transformers' ``save_pretrained`` with its tokenizer, and is
imported by ``multihead import``: ``OUT/marian-run`` (separate vocabularies, OPUS-MT's layout) and ``OUT/nllb-run``
(deu_Latn to eng_Latn). Their translations are noise: what they show is what the search and the tokenizers do.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import sentencepiece
import torch

from multihead.app.corpus import iter_lines
from multihead.app.pretrained import import_pretrained

LAYERS = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=256, d_model=16)  # fmt: skip


def _spm(lines: list[str], path: Path, **specials: object) -> list[str]:
    """A BPE SentencePiece model of about 400 pieces learnt from ``lines`` (every character they hold, as a real
    model's vocabulary spells every ASCII character), written to ``path``: its pieces."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=400, model_type="bpe", hard_vocab_limit=False,
        character_coverage=1.0, minloglevel=2, **specials,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(index) for index in range(processor.get_piece_size())]


def marian(out: Path, sources: list[str], targets: list[str]) -> Path:
    """A random Marian checkpoint of separate vocabularies (``</s>`` 0, ``<unk>`` 1, the pieces, one ``<pad>``)."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    specials = dict(eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, eos_piece="</s>")
    source = _spm(sources, out / "source.spm", **specials)[2:]
    target = _spm(targets, out / "target.spm", **specials)[2:]
    target_vocabulary = {symbol: i for i, symbol in enumerate(["</s>", "<unk>", *target, "<pad>"])}
    symbols = ["</s>", "<unk>", *source]
    symbols.insert(len(target_vocabulary) - 1, "<pad>")  # one pad id for both sides
    (out / "vocab.json").write_text(json.dumps({symbol: i for i, symbol in enumerate(symbols)}))
    (out / "target_vocab.json").write_text(json.dumps(target_vocabulary))
    tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                                target_vocab_file=str(out / "target_vocab.json"), separate_vocabs=True,
                                source_lang="de", target_lang="en")  # fmt: skip
    pad = target_vocabulary["<pad>"]
    config = MarianConfig(**LAYERS, vocab_size=len(symbols), decoder_vocab_size=len(target_vocabulary),
                          scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                          forced_eos_token_id=0, share_encoder_decoder_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def nllb(out: Path, sources: list[str], targets: list[str]) -> Path:
    """A random NLLB checkpoint (M2M100's architecture, NLLB's tokenizer) of one vocabulary of both sides."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer

    out.mkdir(parents=True)
    _spm([*sources, *targets], out / "sentencepiece.bpe.model")
    codes = ["deu_Latn", "eng_Latn"]
    tokenizer = NllbTokenizer.from_pretrained(out, src_lang="deu_Latn", tgt_lang="eng_Latn",
                                              extra_special_tokens=codes)  # fmt: skip
    config = M2M100Config(**LAYERS, vocab_size=len(tokenizer), dropout=0.0, pad_token_id=1, eos_token_id=2,
                          decoder_start_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    M2M100ForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("train_src")
    parser.add_argument("train_tgt")
    parser.add_argument("--lines", type=int, default=29000)
    args = parser.parse_args()
    sources = [line for line, _ in zip(iter_lines(args.train_src, "TRAIN_SRC"), range(args.lines), strict=False)]
    targets = [line for line, _ in zip(iter_lines(args.train_tgt, "TRAIN_TGT"), range(args.lines), strict=False)]
    for name, make in (("marian", marian), ("nllb", nllb)):
        checkpoint = make(args.out / name, sources, targets)
        import_pretrained(str(checkpoint), args.out / f"{name}-run", langs=["de", "en"])
        print(f"{args.out / f'{name}-run'}: a random tiny {name} checkpoint, imported")


if __name__ == "__main__":
    main()
