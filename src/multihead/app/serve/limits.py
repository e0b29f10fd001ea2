"""What one request may ask, and who may ask: the server's limits, its API keys and each address's rate, checked on
the event loop before a request reaches the worker. A request refused is an :class:`ApiError`: its HTTP status and
LibreTranslate's message."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from pathlib import Path

from multihead.app.console import UserError

ADDRESSES = 4096
"""Client addresses the rate limit remembers before it forgets those quiet for a minute."""


class ApiError(Exception):
    """A request refused: its HTTP status and LibreTranslate's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Limits:
    """What one request may ask (``-1``: no limit): characters per text, texts per request, requests per minute from
    one address, alternatives, seconds of translation (answered 503 when over); ``api_keys``: when given,
    ``/translate`` and ``/attention`` require one of them."""

    char_limit: int = -1
    batch_limit: int = -1
    req_limit: int = -1
    alternatives_limit: int = 4
    api_keys: frozenset[str] | None = None
    timeout: float = -1


def read_api_keys(path: str) -> frozenset[str]:
    """The keys in ``path``, one a line (blank lines and ``#`` comments ignored)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--api-keys {path}: cannot read it ({error})") from None
    keys = frozenset(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise UserError(f"--api-keys {path} holds no key: one key a line")
    return keys


class RateLimiter:
    """At most ``per_minute`` requests from one address in any 60 seconds."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.seen: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def check(self, address: str) -> None:
        if self.per_minute < 0:
            return
        now, times = time.monotonic(), self.seen[address]
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) >= self.per_minute:
            raise ApiError(429, f"Slowdown: {self.per_minute} per 1 minute")
        times.append(now)
        if len(self.seen) > ADDRESSES:  # forget the addresses quiet for a minute
            recent = {seen: times for seen, times in self.seen.items() if times[-1] > now - 60}
            self.seen = collections.defaultdict(collections.deque, recent)


class Access:
    """Who may ask under ``limits``: LibreTranslate's order, the API key, then the rate limit."""

    def __init__(self, limits: Limits) -> None:
        self.keys = limits.api_keys
        self.rate = RateLimiter(limits.req_limit)

    def check(self, key: object, address: str) -> None:
        """Refuse a request with ``key`` (the ``api_key`` parameter, if any) from ``address``."""
        if self.keys is not None:
            if key and key not in self.keys:
                raise ApiError(403, "Invalid API key")
            if not key:
                raise ApiError(400, "Please contact the server operator to get an API key")
        self.rate.check(address)
