"""A Marian checkpoint of OPUS-MT's sizes, with random weights, for timing ``import``, ``train --init`` and
``translate`` where no Hub model can be downloaded (its translations mean nothing).

The sizes are opus-mt-de-en's (d_model 512, 6+6 layers, 8 heads, d_ff 2048, 58,101 ids, swish, scaled embeddings,
the pad as decoder start and banned); the SentencePiece models are trained on the corpus given, and the vocabulary
is filled up to 58,101 ids with pieces no text ever gives. Saved with Transformers' ``save_pretrained`` (the ``dev``
extra)::

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

VOCABULARY, PIECES = 58101, 6000  # opus-mt-de-en's ids; the pieces each SentencePiece model learns
SIZES = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
             encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512)  # fmt: skip


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the checkpoint directory to write (it must not exist)")
    parser.add_argument("src", help="source sentences to train the source SentencePiece model on (plain or .gz)")
    parser.add_argument("tgt", help="target sentences, likewise")
    args = parser.parse_args()
    args.out.mkdir(parents=True)
    found = pieces(read_lines(args.src, "SRC"), args.out / "source.spm")
    found += pieces(read_lines(args.tgt, "TGT"), args.out / "target.spm")
    symbols = ["</s>", "<unk>", *dict.fromkeys(found)]
    symbols += [f"▁unused{index}" for index in range(VOCABULARY - 1 - len(symbols))] + ["<pad>"]
    (args.out / "vocab.json").write_text(json.dumps({symbol: index for index, symbol in enumerate(symbols)}))
    with warnings.catch_warnings():  # MarianTokenizer recommends Moses' punctuation normalizer
        warnings.simplefilter("ignore", UserWarning)
        tokenizer = MarianTokenizer(str(args.out / "source.spm"), str(args.out / "target.spm"),
                                    str(args.out / "vocab.json"))  # fmt: skip
    pad = VOCABULARY - 1
    config = MarianConfig(
        **SIZES, vocab_size=VOCABULARY, decoder_vocab_size=VOCABULARY, activation_function="swish",
        scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config)
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
