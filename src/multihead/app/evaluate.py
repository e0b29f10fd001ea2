"""Scores of translations against references: sacreBLEU's BLEU (cased and lowercased; 13a tokenization, or the one
the target language needs) and chrF, with sacreBLEU's signatures, and exact match for the built-in tasks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["exact_match", "score"]


def score(hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str = "13a") -> dict[str, Any]:
    """Corpus BLEU (cased, detokenized, ``tokenize``: 13a, the standard way to report, for languages written with
    spaces; see :func:`multihead.app.languages.bleu_tokenizer`), lowercased BLEU, and chrF."""
    from sacrebleu.metrics import BLEU, CHRF

    cased, lowercased, chrf = BLEU(tokenize=tokenize), BLEU(lowercase=True, tokenize=tokenize), CHRF()
    refs = [list(references)]
    bleu, bleu_lowercase, chrf_score = (
        metric.corpus_score(list(hypotheses), refs) for metric in (cased, lowercased, chrf)
    )
    return {
        "bleu": round(bleu.score, 2),
        "bleu_lowercase": round(bleu_lowercase.score, 2),
        "chrf": round(chrf_score.score, 2),
        "signature": {
            "bleu": str(cased.get_signature()),
            "bleu_lowercase": str(lowercased.get_signature()),
            "chrf": str(chrf.get_signature()),
        },
    }


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The share of hypotheses equal to their reference."""
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(1, len(references))
