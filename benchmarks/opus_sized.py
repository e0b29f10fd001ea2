"""A Marian checkpoint of a deployed model's sizes, with random weights, for timing ``import``, ``train --init`` and
``translate`` where no Hub model can be downloaded (its translations mean nothing).

``--sizes opus`` (the default) are opus-mt-de-en's: d_model 512, 6+6 layers, 8 heads, d_ff 2048, 58,101 ids, swish
(74 M parameters). ``--sizes nllb`` are NLLB-200-distilled-600M's: d_model 1024, 12+12 layers, 16 heads, d_ff 4096,
256,206 ids, ReLU (615 M), in Marian's post-norm layout (NLLB's is pre-norm: the same products, so the same time).
Both scale their embeddings and start from the pad, which they ban. The SentencePiece models are trained on the
corpus given, and the vocabulary is filled up to its size with pieces no text ever gives. Random weights repeat
one token and never end a translation: their output times generating a fixed number of tokens. Saved with
Transformers' ``save_pretrained`` (the ``dev`` extra)::

    .venv/bin/python benchmarks/opus_sized.py OUT/opus-mt-de-en DATA/train.de.gz DATA/train.en.gz
    multihead import OUT/opus-mt-de-en OUT/run
"""

from __future__ import annotations

import argparse
import io
import json
import warnings
from pathlib import Path

import sentencepiece
import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

from multihead.app.corpus import read_lines

PIECES = 6000  # the pieces each SentencePiece model learns
SIZES = {
    "opus": dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                 activation_function="swish"),
    "nllb": dict(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                 decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
                 activation_function="relu"),
}  # fmt: skip
"""The Marian configs' sizes: opus-mt-de-en's, NLLB-200-distilled-600M's."""


def pieces(lines: list[str], path: Path) -> list[str]:
    """Train a SentencePiece model on ``lines`` into ``path`` (``</s>`` 0, ``<unk>`` 1, as OPUS-MT's); its pieces."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=PIECES, eos_id=0, unk_id=1, bos_id=-1,
        pad_id=-1, eos_piece="</s>", minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    return [processor.id_to_piece(index) for index in range(2, processor.get_piece_size())]


def build(out: Path, sources: list[str], targets: list[str], *, sizes: str = "opus") -> None:
    """Write the checkpoint of ``sizes`` (a key of :data:`SIZES`) into ``out`` (which must not exist), its
    SentencePiece models trained on ``sources`` and ``targets``."""
    config_sizes = SIZES[sizes]
    vocabulary = int(config_sizes["vocab_size"])
    out.mkdir(parents=True)
    found = pieces(sources, out / "source.spm") + pieces(targets, out / "target.spm")
    symbols = ["</s>", "<unk>", *dict.fromkeys(found)]
    symbols += [f"▁unused{index}" for index in range(vocabulary - 1 - len(symbols))] + ["<pad>"]
    (out / "vocab.json").write_text(json.dumps({symbol: index for index, symbol in enumerate(symbols)}))
    with warnings.catch_warnings():  # MarianTokenizer recommends Moses' punctuation normalizer
        warnings.simplefilter("ignore", UserWarning)
        tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"))
    pad = vocabulary - 1
    config = MarianConfig(
        **config_sizes, decoder_vocab_size=vocabulary, scale_embedding=True, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the checkpoint directory to write (it must not exist)")
    parser.add_argument("src", help="source sentences to train the source SentencePiece model on (plain or .gz)")
    parser.add_argument("tgt", help="target sentences, likewise")
    parser.add_argument("--sizes", choices=sorted(SIZES), default="opus", help="whose sizes (default: opus)")
    args = parser.parse_args()
    build(args.out, read_lines(args.src, "SRC"), read_lines(args.tgt, "TGT"), sizes=args.sizes)


if __name__ == "__main__":
    main()
