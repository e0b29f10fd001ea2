"""Mask rules every front end follows (framework-neutral).

- Polarity: ``True`` = this query may attend this key. Float masks are added to the scores.
- Causal is bottom-right aligned: query ``i`` may attend key ``j`` iff ``j <= i + (Lk - Lq)``. With
  ``Lq == Lk`` that is the usual lower triangle; when ``Lq`` new queries follow ``Lk - Lq`` cached keys it is
  exactly what decoding needs. With ``Lq > Lk`` the first ``Lq - Lk`` queries see no key: their rows are
  fully masked and give zeros.
"""

from __future__ import annotations


def causal_diagonal(lq: int, lk: int) -> int:
    """The diagonal offset of the bottom-right causal triangle (``tril(..., diagonal=...)``)."""
    return lk - lq
