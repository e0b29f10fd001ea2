"""The decoding engine, one for every way to decode: sentences join a running batch, step together and leave, each
searched as it asks (greedy, sampling or beam search), whatever front end computes the steps.

A front end's decoding state is a set of :class:`Rows`, addressed by index: ``step`` gives the next-token logits of
every row after its newest token, ``keep`` keeps some rows in a new order (beam search reorders its beams, ended
sentences leave), and :class:`JoiningRows` ``join`` new sources, encoded, as rows at the end. The :class:`Engine`
holds, for each row, its sentence, the tokens it has made and its score, and for each sentence what it asked: its
length limit, forced tokens, search options and, for sampling, its random generator. A step:

1. lets sentences waiting to join do so (:meth:`Engine.add`; only over joining rows): once they are a quarter of the
   rows decoding, or have waited :data:`JOIN_AFTER` steps, or nothing is decoding, since encoding a few sources at a
   time costs much more per source than a step;
2. computes every row's logits, processed as the :class:`~multihead.decoding.Generation` and each sentence say
   (:func:`~multihead.decoding.process`: banned and forced tokens, minimum length, EOS at the limit);
3. chooses: one token for each greedy or sampled sentence (one row each), and for each beam-search sentence its next
   beams from the ``2 * beam_size`` best continuations of its rows (the rule is in :mod:`multihead.decoding`);
4. reports the sentences that ended (:class:`Finished`) and keeps the rows still searched.

A greedy or sampled sentence that ends leaves the state once a quarter of the rows have ended (until then its row is
computed and its tokens ignored), or at once when beam rows are reordered anyway or sentences wait for room. Rows are
kept in their order, except that, when only one-row sentences are held, the last rows take the places of those that
leave (fewer rows move). A beam-search sentence's rows are always next to each other.

A batch ``generate`` is an engine whose rows already hold every source, stepped until every sentence has ended
(:func:`generate`); a service's stream adds sentences as requests arrive (:class:`multihead.torch.Stream`). Either
way a sentence gets the tokens the same search gives it alone, up to float rounding of batches of other sizes.

Notation: N rows held, S sentences of a beam group, k beam size, w a group's rows per sentence (1 at a beam
sentence's first step, then k), V vocabulary, W columns of the token history.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np

from multihead.constraints import Constraints, Phrase, Tables, advanced, made, written
from multihead.decoding import (
    Choices,
    Chooser,
    Generation,
    Limit,
    SearchOptions,
    process,
    row_limits,
    sample,
    sentence_generators,
)
from multihead.validation import check_positive_int

Tensor = Any
Owner = TypeVar("Owner")
"""What a sentence's caller names it by (returned with its translation)."""

JOIN_AFTER = 3
"""The most steps sentences wait to join while others decode."""
UNBOUNDED = 1 << 62
"""The rows an engine without a capacity has room for."""


class Rows(Choices, Protocol):
    """A front end's decoding state, one row per hypothesis being extended, addressed by index."""

    def step(self, tokens: np.ndarray) -> Tensor:
        """Logits ``(N, V)`` of every row's next token after its newest, ``tokens (N,)`` int64 (BOS at a row's first
        step), where the model computes."""
        ...

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        """Keep rows ``rows`` (int64 indices, repeats allowed), in that order; ``same_sources``: row ``i`` translates
        the same source as row ``rows[i]`` did, so only the target's state moves."""
        ...


class JoiningRows(Rows, Protocol):
    """Rows that new sources join while others decode."""

    def join(self, sources: Sequence[Sequence[int]]) -> None:
        """Encode ``sources`` (token ids, none empty) and add a row for each after the rows held; their first step's
        token is BOS."""
        ...


@dataclass(frozen=True)
class Finished(Generic[Owner]):
    """A sentence that has ended: its ``owner`` and its ``hypotheses``, best first, as (rank, int64 tokens after BOS,
    ending with EOS unless the limit cut them). Beam search ranks them by score / length ** length_penalty (up to its
    ``n_best``; none when every beam died out); greedy search and sampling give one, ranked NaN."""

    owner: Owner
    hypotheses: list[tuple[float, np.ndarray]]

    @property
    def tokens(self) -> np.ndarray:
        """The best hypothesis' tokens (none when there is none)."""
        return self.hypotheses[0][1] if self.hypotheses else np.zeros(0, dtype=np.int64)


@dataclass
class _Sentence:
    owner: Any
    search: SearchOptions
    limit: int
    forced: tuple[int, ...] | None  # its own forced tokens, else the generation's
    generator: np.random.Generator | None  # its draws, when sampling
    group: int  # the engine's index of its search options
    ranked: bool  # searched by beam search (ranked hypotheses), its beam size wide
    constraints: Constraints | None = None  # the phrases its translation must hold
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0))  # beam search: its n best finished ranks
    kept: list[np.ndarray] = field(default_factory=list)  # and their tokens

    def offer(self, rank: float, tokens: np.ndarray) -> None:
        """A finished hypothesis, kept where among the ``n`` best (after those of the same rank already kept)."""
        if rank > self.rank[-1]:
            place = int(np.count_nonzero(self.rank >= rank))
            self.rank[place + 1 :] = self.rank[place:-1]
            self.rank[place] = rank
            self.kept.insert(place, tokens)
            del self.kept[len(self.rank) :]

    def finished(self) -> Finished:
        """It, ended: its finished hypotheses, best first, with their ranks."""
        return Finished(self.owner, [(float(r), x) for r, x in zip(self.rank, self.kept, strict=False)])


@dataclass(frozen=True)
class _Waiting:
    ids: Sequence[int]
    sentence: _Sentence


@dataclass
class _Next:
    """A step's new rows: each one's parent row, token and score, and its place: the row it takes, where that is one
    its sentence held (``fresh`` places, from the rows held on, are new rows of a beam opening)."""

    def __init__(self, held: int) -> None:
        self.parent: list[np.ndarray] = []
        self.token: list[np.ndarray] = []
        self.score: list[np.ndarray] = []
        self.place: list[np.ndarray] = []
        self.next_fresh = held

    def fresh(self, count: int) -> np.ndarray:
        """``count`` places past the rows held."""
        self.next_fresh += count
        return np.arange(self.next_fresh - count, self.next_fresh)

    def add(self, parent: np.ndarray, token: np.ndarray, score: np.ndarray, place: np.ndarray) -> None:
        self.parent.append(parent)
        self.token.append(token)
        self.score.append(score)
        self.place.append(place)

    def add_beams(
        self, held: np.ndarray, going: np.ndarray, local: np.ndarray, parent: np.ndarray, token: np.ndarray,
        score: np.ndarray,
    ) -> None:  # fmt: skip
        """The next beams of the sentences ``going`` (indices) of rows ``held (S, width)``: ``k`` each, their
        ``parent`` rows, ``token``s and ``score``s ``(S, k)`` (``local``: each parent's place among its sentence's
        rows). Where the sentences hold ``k`` rows, each beam in its parent's place where it can (those rows' states
        need not move); else a beam opening: its first beam in the sentence's row, the others in new rows."""
        k = parent.shape[1]
        if held.shape[1] == k:
            order = _stay(local)  # (S, k): the beam each place takes
            parent, token, score = (np.take_along_axis(a, order, axis=1) for a in (parent, token, score))
            places = held
        else:
            places = np.zeros((len(held), k), dtype=np.int64)
            places[:, 0] = held[:, 0]
            places[going, 1:] = self.fresh(len(going) * (k - 1)).reshape(len(going), k - 1)
        self.add(parent[going].reshape(-1), token[going].reshape(-1), score[going].reshape(-1).astype(np.float32),
                 places[going].reshape(-1))  # fmt: skip

    def joined(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The new rows' parents, tokens and scores, in the order they take: a row whose place is among the first as
        many as there are new rows stays there, the others (by place) fill the places left."""
        if not self.parent:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        place = np.concatenate(self.place)
        count = len(place)
        stays = place < count
        movers = np.flatnonzero(~stays)
        position = place.copy()
        position[movers[np.argsort(place[movers], kind="stable")]] = np.setdiff1d(np.arange(count), place[stays])
        order = np.empty(count, dtype=np.int64)
        order[position] = np.arange(count)  # the new row at each position
        return tuple(np.concatenate(parts)[order] for parts in (self.parent, self.token, self.score))  # type: ignore[return-value]


class Engine(Generic[Owner]):
    """Sentences decoded over ``rows`` as ``generation`` says (each may ask for its own search, limit and forced
    tokens), at most ``capacity`` rows at a time (beam search counts its beam size; ``None``: no bound): see the
    module's docstring. :meth:`add` queues a sentence (over :class:`JoiningRows`), :meth:`hold` names the sentences
    that rows already hold, :meth:`step` decodes one token of each and returns those that ended. ``ranked``: every
    sentence is searched by beam search, even of one beam, whose hypotheses carry their ranks (n-best lists).
    ``vocab``: the target vocabulary's size, which the generation's and each sentence's ids are checked against."""

    def __init__(
        self,
        rows: Rows,
        generation: Generation,
        *,
        capacity: int | None = None,
        ranked: bool = False,
        vocab: int | None = None,
    ) -> None:
        if not isinstance(generation, Generation):
            raise TypeError(f"`generation` must be a Generation, received {type(generation).__name__}")
        if vocab is not None:
            generation.check(vocab)
        self.rows, self.generation, self.ranked, self.vocab = rows, generation, ranked, vocab
        self.capacity = None if capacity is None else check_positive_int("capacity", capacity)
        self.seed = secrets.randbits(64)  # the draws of searches without a seed of their own
        self.searches: list[SearchOptions] = []  # the distinct searches asked for; a sentence's group is an index
        self.waiting: deque[_Waiting] = deque()
        self.waited = 0  # steps since sentences began waiting to join
        self.opened = False  # room said sentences may join at the next step
        self.counted = 0  # sentences that have joined
        self.followers: list[np.ndarray] = []  # (V,) bools each: the tokens that may follow phrases (Phrase)
        self._reset_rows(0)

    def _reset_rows(self, count: int) -> None:
        self.of_row: list[_Sentence] = []  # (N,) each row's sentence
        self.made = np.zeros(count, dtype=np.int64)  # (N,) tokens made after BOS
        self.last = np.zeros(count, dtype=np.int64)  # (N,) the newest token
        self.score = np.zeros(count, dtype=np.float32)  # (N,) a beam's log-probability
        self.limit = np.zeros(count, dtype=np.int64)  # (N,) its sentence's length limit
        self.width = np.ones(count, dtype=np.int64)  # (N,) its sentence's rows
        self.group = np.zeros(count, dtype=np.int64)  # (N,) its sentence's search
        self.beams = np.zeros(count, dtype=np.int64)  # (N,) its sentence's beam size; 0: one row, not ranked
        self.floor = np.zeros(count, dtype=np.int64)  # (N,) its sentence's min_length
        self.forcing = np.zeros(count, dtype=bool)  # (N,) its sentence forces tokens of its own
        self.constrained = np.zeros(count, dtype=bool)  # (N,) its sentence's translation must hold phrases
        self.phrase_ids = np.zeros((count, 0, 0), dtype=np.int64)  # (N, Q, L) its sentence's phrases (Tables)
        self.phrase_sizes = np.zeros((count, 0), dtype=np.int64)  # (N, Q)
        self.phrase_fail = np.zeros((count, 0, 0), dtype=np.int64)  # (N, Q, L)
        self.phrase_bonus = np.zeros((count, 0))  # (N, Q)
        self.phrase_follow = np.zeros((count, 0), dtype=np.int64)  # (N, Q) what may follow it: a followers index, or -1
        self.pending = np.full(count, -1, dtype=np.int64)  # (N,) the followers its next token must be one of, or -1
        self.met = np.zeros((count, 0), dtype=bool)  # (N, Q) the phrases it holds
        self.partial = np.zeros((count, 0), dtype=np.int64)  # (N, Q) the start of each other that it ends with
        self.sid = np.zeros(count, dtype=np.int64)  # (N,) its sentence's number (the engine's count when it came)
        self.ended = np.zeros(count, dtype=bool)  # (N,) a one-row sentence that has ended, not yet left
        self.history = np.zeros((count, 8), dtype=np.int64)  # (N, W) row i's tokens at 0..made[i]
        self._summarise()

    def _summarise(self) -> None:
        """What any row's sentence asks for, read at every step and changed only when sentences join or leave."""
        self.any_beams, self.any_forcing = bool(self.beams.any()), bool(self.forcing.any())
        self.any_floor, self.any_constrained = bool(self.floor.any()), bool(self.constrained.any())

    def __len__(self) -> int:
        """Sentences decoding or waiting to join."""
        return len(self.decoding) + len(self.waiting)

    @property
    def decoding(self) -> list[Owner]:
        """The owners of the sentences decoding (not those waiting to join), in the rows' order."""
        live = [sentence for sentence, ended in zip(self.of_row, self.ended, strict=True) if not ended]
        return list(dict.fromkeys(sentence.owner for sentence in live))

    # --- sentences in ------------------------------------------------------------------------------------------

    def _sentence(
        self,
        owner: Any,
        limit: int,
        key: int,
        forced: Sequence[int] | None,
        search: SearchOptions | None,
        constraints: Sequence[Sequence[int] | Phrase] = (),
    ) -> _Sentence:
        search = self.generation.search if search is None else search
        if not isinstance(search, SearchOptions):
            raise TypeError(f"`search` must be a SearchOptions or None, received {type(search).__name__}")
        bound = Constraints(constraints) if len(constraints) else None
        if bound is not None:
            if search.strategy.draws:
                raise ValueError("constraints need greedy or beam search, not sampling")
            specials = self.generation.specials
            never = {*self.generation.banned, specials.bos, specials.eos, specials.pad}
            for phrase, after in zip(bound.phrases, bound.followers, strict=True):
                if self.vocab is not None and max(phrase) >= self.vocab:
                    raise ValueError(f"constraint {list(phrase)} holds an id past the vocabulary ({self.vocab} ids)")
                if self.vocab is not None and after is not None and len(after) != self.vocab:
                    raise ValueError(f"constraint {list(phrase)}'s followed_by has {len(after)} entries, not one for "
                                     f"each of the {self.vocab} ids")  # fmt: skip
                if never & set(phrase):
                    raise ValueError(f"constraint {list(phrase)} holds {sorted(never & set(phrase))}, which no "
                                     "translation may hold (banned, or BOS, EOS or PAD)")  # fmt: skip
            if bound.held:  # a beam wide enough that every phrase to hold has a place beside the best hypothesis
                search = dataclasses.replace(search, beam_size=max(search.beam_size, len(bound.held) + 1))
        if search not in self.searches:
            self.searches.append(search)
        own = None
        if forced is not None:
            checked = dataclasses.replace(self.generation, forced=forced)
            if self.vocab is not None:
                checked.check(self.vocab)
            own = tuple(checked.forced)
        generator = None
        if search.strategy.draws:
            generator = sentence_generators(self.seed if search.seed is None else search.seed, [key])[0]
        ranked = search.beam_size > 1 or self.ranked or bound is not None
        limited = int(search.limit(limit, 1)[0])
        room = limited - len(self.generation.forced if own is None else own)  # the tokens it chooses
        phrase = max(bound.held if bound is not None else (), key=len, default=())
        if len(phrase) > room:
            raise ValueError(f"constraint {list(phrase)} is {len(phrase)} tokens, more than the {room} this "
                             f"sentence's limit of {limited} leaves")  # fmt: skip
        sentence = _Sentence(owner, search, limited, own, generator, self.searches.index(search), ranked, bound)
        if ranked:
            sentence.rank = np.full(search.n_best, -np.inf)
        return sentence

    def add(
        self,
        ids: Sequence[int],
        owner: Owner,
        *,
        limit: int,
        key: int = 0,
        forced: Sequence[int] | None = None,
        search: SearchOptions | None = None,
        constraints: Sequence[Sequence[int] | Phrase] = (),
    ) -> None:
        """Queue source ``ids`` (not empty, at most what the model reads), translated into at most ``limit`` tokens
        (and its search's ``max_length``); ``key`` names it to its random generator when sampling (as its index in a
        ``generate`` call would); ``forced``: the tokens its translation starts with instead of the generation's;
        ``search``: its own search instead of the generation's; ``constraints``: phrases (token ids) its translation
        must hold (see :meth:`_constrained`)."""
        if not hasattr(self.rows, "join"):
            raise TypeError(f"{type(self.rows).__name__} holds the sentences it was made with: no others join it")
        self.waiting.append(_Waiting(ids, self._sentence(owner, limit, key, forced, search, constraints)))

    def hold(
        self,
        owners: Sequence[Owner],
        limits: np.ndarray,
        keys: np.ndarray,
        constraints: Sequence[Sequence[Sequence[int] | Phrase]] | None = None,
    ) -> None:
        """Name the sentences the rows already hold, row ``i`` sentence ``owners[i]``, limited to ``limits[i]`` tokens,
        drawing by ``keys[i]`` and holding the phrases ``constraints[i]`` (the engine's first call)."""
        phrases = constraints if constraints is not None else [()] * len(owners)
        sentences = [self._sentence(owner, int(limit), int(key), None, None, own)
                     for owner, limit, key, own in zip(owners, limits, keys, phrases, strict=True)]  # fmt: skip
        self._append(sentences)

    def _append(self, sentences: list[_Sentence]) -> None:
        """Rows for ``sentences`` after those held, each at its first step."""
        count = len(sentences)
        self.of_row += sentences
        self.made = np.concatenate([self.made, np.zeros(count, dtype=np.int64)])
        self.last = np.concatenate([self.last, np.full(count, self.generation.specials.bos, dtype=np.int64)])
        self.score = np.concatenate([self.score, np.zeros(count, dtype=np.float32)])
        self.limit = np.concatenate([self.limit, [sentence.limit for sentence in sentences]]).astype(np.int64)
        self.width = np.concatenate([self.width, np.ones(count, dtype=np.int64)])
        self.group = np.concatenate([self.group, [sentence.group for sentence in sentences]]).astype(np.int64)
        self.beams = np.concatenate([self.beams, [s.search.beam_size * s.ranked for s in sentences]]).astype(np.int64)
        self.floor = np.concatenate([self.floor, [s.search.min_length for s in sentences]]).astype(np.int64)
        self.forcing = np.concatenate([self.forcing, [s.forced is not None for s in sentences]]).astype(bool)
        self.constrained = np.concatenate([self.constrained, [s.constraints is not None for s in sentences]]).astype(
            bool
        )
        self._append_phrases(sentences)
        self.sid = np.concatenate([self.sid, self.counted + np.arange(count)])
        self.counted += count
        self.ended = np.concatenate([self.ended, np.zeros(count, dtype=bool)])
        self.history = np.concatenate([self.history, np.zeros((count, self.history.shape[1]), dtype=np.int64)])
        self._summarise()

    def _append_phrases(self, sentences: list[_Sentence]) -> None:
        """The phrase tables and progress of ``sentences``' rows (:mod:`multihead.constraints`), after those held,
        every table padded to the most phrases and the longest phrase of any."""
        if not sentences:
            return
        bounds = [s.constraints or Constraints(()) for s in sentences]
        count = max([self.met.shape[1], *map(len, bounds)])
        length = max([self.phrase_ids.shape[2], *(bound.longest for bound in bounds)])
        grow_q, grow_l = count - self.met.shape[1], length - self.phrase_ids.shape[2]
        if grow_q or grow_l:  # a phrase of no token is held from the start
            self.phrase_ids = np.pad(self.phrase_ids, ((0, 0), (0, grow_q), (0, grow_l)), constant_values=-1)
            self.phrase_fail = np.pad(self.phrase_fail, ((0, 0), (0, grow_q), (0, grow_l)))
            self.phrase_sizes = np.pad(self.phrase_sizes, ((0, 0), (0, grow_q)))
            self.phrase_bonus = np.pad(self.phrase_bonus, ((0, 0), (0, grow_q)))
            self.phrase_follow = np.pad(self.phrase_follow, ((0, 0), (0, grow_q)), constant_values=-1)
            self.met = np.pad(self.met, ((0, 0), (0, grow_q)), constant_values=True)
            self.partial = np.pad(self.partial, ((0, 0), (0, grow_q)))
        tables = [bound.tables(count, length) for bound in bounds]
        self.phrase_ids = np.concatenate([self.phrase_ids, np.stack([t.ids for t in tables])])
        self.phrase_fail = np.concatenate([self.phrase_fail, np.stack([t.fail for t in tables])])
        self.phrase_sizes = np.concatenate([self.phrase_sizes, np.stack([t.sizes for t in tables])])
        self.phrase_bonus = np.concatenate([self.phrase_bonus, np.stack([t.bonus for t in tables])])
        follow = np.full((len(bounds), count), -1, dtype=np.int64)
        for i, bound in enumerate(bounds):
            follow[i, : len(bound)] = [-1 if mask is None else self._follower(mask) for mask in bound.followers]
        self.phrase_follow = np.concatenate([self.phrase_follow, follow])
        self.pending = np.concatenate([self.pending, np.full(len(bounds), -1, dtype=np.int64)])
        self.met = np.concatenate([self.met, np.stack([t.sizes == 0 for t in tables])])
        self.partial = np.concatenate([self.partial, np.zeros((len(tables), count), dtype=np.int64)])

    def _follower(self, mask: np.ndarray) -> int:
        """The index of ``mask`` among the followers, added if it is not there."""
        known = next((index for index, follower in enumerate(self.followers) if follower is mask), None)
        if known is None:
            self.followers.append(mask)
        return len(self.followers) - 1 if known is None else known

    def _tables(self, rows: np.ndarray) -> Tables:
        """The phrase tables of ``rows``' sentences, ``(R, Q, L)``."""
        return Tables(self.phrase_ids[rows], self.phrase_sizes[rows], self.phrase_fail[rows], self.phrase_bonus[rows])

    def _taken(self) -> int:
        """The rows the sentences decoding take, or will once their beams open."""
        return int(np.maximum(self.width, self.beams)[~self.ended].sum())

    def _admitted(self, waiting: int, *, count_wait: bool) -> int:
        """How many of ``waiting`` sentences (the queue's first, then a caller's) join now, by the rule of the
        module's docstring, one row each; a step they wait is counted when ``count_wait``."""
        held = int((~self.ended).sum())
        count = waiting if self.capacity is None else min(self.capacity - self._taken(), waiting)
        if count <= 0:
            return 0
        if held and count * 4 < held and self.waited < JOIN_AFTER:
            if count_wait:
                self.waited += 1
            return 0
        return count

    def room(self, available: int) -> int:
        """How many rows ``available`` sentences not yet added would find at the next step (a sentence takes one, or
        its beam), by the rule added sentences wait by: a caller that asks once a step and adds only sentences of that
        many rows keeps its sentences in its own queue, never waiting here."""
        if not self._admitted(len(self.waiting) + available, count_wait=not self.waiting):
            return 0
        self.opened = True  # those added before the step join it, however few
        waiting = sum(entry.sentence.search.beam_size for entry in self.waiting)
        return max(0, (UNBOUNDED if self.capacity is None else self.capacity - self._taken()) - waiting)

    def _join(self) -> None:
        count = len(self.waiting) if self.opened else self._admitted(len(self.waiting), count_wait=True)
        self.opened = False
        if self.capacity is not None:  # beams need their rows too
            beams = np.cumsum([self.waiting[index].sentence.search.beam_size for index in range(count)])
            count = int(np.searchsorted(beams, self.capacity - self._taken(), side="right"))
        if not count:
            return
        self.waited = 0
        self._leave(np.flatnonzero(self.ended))  # those that ended make room first
        joining = [self.waiting[index] for index in range(count)]
        cast(JoiningRows, self.rows).join([entry.ids for entry in joining])  # a failure leaves them waiting
        for _ in range(count):
            self.waiting.popleft()
        self._append([entry.sentence for entry in joining])

    # --- sentences out -----------------------------------------------------------------------------------------

    def clear(self) -> list[Owner]:
        """Drop every sentence; their owners."""
        return self.drop(lambda owner: True)

    def drop(self, dropped: Callable[[Owner], bool]) -> list[Owner]:
        """Drop the sentences (decoding or waiting) whose owner ``dropped`` names, e.g. those nobody waits for any
        more; their owners. The others decode on as before."""
        waiting = [entry for entry in self.waiting if dropped(entry.sentence.owner)]
        if waiting:
            self.waiting = deque(entry for entry in self.waiting if not dropped(entry.sentence.owner))
        gone = np.array([self.ended[row] or dropped(sentence.owner) for row, sentence in enumerate(self.of_row)],
                        dtype=bool)  # fmt: skip
        owners = list(dict.fromkeys(s.owner for row, s in enumerate(self.of_row) if gone[row] and not self.ended[row]))
        self._leave(np.flatnonzero(gone))
        return owners + [entry.sentence.owner for entry in waiting]

    def _leave(self, gone: np.ndarray) -> None:
        """Rows ``gone`` leave: the last rows take their places."""
        count = len(self.of_row)
        if not len(gone):
            return
        left = count - len(gone)
        holes = gone[gone < left]
        donors = np.setdiff1d(np.arange(left, count), gone)  # as many as holes
        order = np.arange(left)
        order[holes] = donors
        self._keep(order, same_sources=False)

    def _keep(self, order: np.ndarray, *, same_sources: bool) -> None:
        """The rows ``order`` of the state, in that order, in the rows and here; ``same_sources``: each row keeps its
        sentence, whose values stay as they are."""
        self.rows.keep(order, same_sources=same_sources)
        names = ["made", "last", "score", "ended", "history", "met", "partial", "pending"]  # each row's own
        if not same_sources:
            self.of_row = [self.of_row[row] for row in order]
            names += ["limit", "width", "group", "beams", "floor", "forcing", "constrained", "sid"]  # its sentence's
            names += ["phrase_ids", "phrase_sizes", "phrase_fail", "phrase_bonus", "phrase_follow"]
        for name in names:
            setattr(self, name, getattr(self, name)[order])
        if not same_sources:
            self._summarise()

    # --- a step ------------------------------------------------------------------------------------------------

    def step(self) -> list[Finished[Owner]]:
        """Let those waiting join (as many as there is room for), decode one token of every sentence; the sentences
        that ended."""
        self._join()
        if not len(self.of_row) or self.ended.all():
            return []
        logits = self._processed(self.rows.step(self.last.copy()))  # theirs to keep
        if self.made.max() + 1 >= self.history.shape[1]:
            self.history = np.pad(self.history, ((0, 0), (0, self.history.shape[1])))
        finished: list[Finished[Owner]] = []
        going, alone = ~self.ended, len(self.searches) == 1
        next_rows = _Next(len(self.of_row))
        if self.any_constrained and (going & self.constrained).any():
            finished += self._constrained(logits, np.flatnonzero(going & self.constrained), next_rows)
            going, alone = going & ~self.constrained, False
        for group, search in enumerate(self.searches):
            in_group = going if alone else going & (self.group == group)
            if not alone and not in_group.any():
                continue
            if search.beam_size > 1 or self.ranked:
                for width in np.unique(self.width[in_group]):
                    rows = np.flatnonzero(in_group & (self.width == width))
                    rows = rows[np.argsort(self.sid[rows], kind="stable")]  # each sentence's rows together
                    finished += self._beam(logits, rows, int(width), search, next_rows)
            else:
                finished += self._one_row(logits, np.flatnonzero(in_group), search, next_rows)
        if self.any_beams:
            parent, token, score = next_rows.joined()
            if len(parent):
                self._advance(parent, token, score)
            else:  # every sentence has ended: the rows leave when others join
                self.ended[:] = True
        elif self.ended.sum() * 4 >= len(self.of_row) and not self.ended.all():
            self._leave(np.flatnonzero(self.ended))
        return finished

    def _processed(self, logits: Tensor) -> Tensor:
        """A step's logits as the generation and each row's sentence say."""
        generation = self.generation
        own = self.any_forcing
        forced = [generation.forced if s.forced is None else s.forced for s in self.of_row] if own else None
        says = generation.banned or generation.forced or own or generation.eos_at_limit or self.any_floor
        if not says:
            return logits
        return process(self.rows, logits, self.made, generation, forced, self.limit, self.floor)

    def _one_row(self, logits: Tensor, rows: np.ndarray, search: SearchOptions, next_rows: _Next) -> list[Finished]:
        """Greedy or sampled sentences' next tokens, at ``rows`` (one each); those that ended. Every row takes its most
        probable token (those of the others ignored); when every row samples, the rows that have ended and not left
        draw too (cheaper than choosing the others), their tokens ignored."""
        if search.strategy.draws:
            every = len(self.searches) == 1
            drawn = np.arange(len(self.of_row)) if every else rows
            generators = [self.of_row[row].generator for row in drawn]
            token = sample(self.rows, logits, generators, search, None if every else rows)  # type: ignore[arg-type]
            token = token[rows] if every else token
        else:
            token = self.rows.argmax(logits)[rows]
        made = self.made[rows] + 1
        self.history[rows, made - 1] = token
        self.made[rows], self.last[rows] = made, token
        ends = (token == self.generation.specials.eos) | (made == self.limit[rows])
        if self.any_beams:  # the rows are laid out again after the step
            next_rows.add(rows[~ends], token[~ends], self.score[rows[~ends]], rows[~ends])
        if not ends.any():
            return []
        self.ended[rows[ends]] = True
        nan = float("nan")
        return [Finished(self.of_row[row].owner, [(nan, self.history[row, : self.made[row]].copy())])
                for row in rows[ends]]  # fmt: skip

    def _advance(self, parent: np.ndarray, token: np.ndarray, score: np.ndarray) -> None:
        """The rows after a step with beams: row ``i`` extends ``parent[i]`` by ``token[i]`` (one-row sentences extend
        themselves: their token is written already)."""
        same_sources = len(parent) == len(self.sid) and bool((self.sid[parent] == self.sid).all())
        if not (same_sources and (parent == np.arange(len(parent))).all()):
            self._keep(parent, same_sources=same_sources)
        rows = np.flatnonzero(self.beams)
        bound = rows[self.constrained[rows]]
        if len(bound):  # their progress along their phrases, and what must follow a phrase just written whole
            met, partial = advanced(self._tables(bound), self.met[bound], self.partial[bound], token[bound, None])
            follow = np.where(met[:, 0] & ~self.met[bound], self.phrase_follow[bound], -1)  # (R, Q)
            self.pending[bound] = follow.max(axis=1, initial=-1)
            self.met[bound], self.partial[bound] = met[:, 0], partial[:, 0]
        self.history[rows, self.made[rows]] = token[rows]
        self.made[rows] += 1
        self.last, self.score = token, score.astype(np.float32)
        self.width[rows] = self.beams[rows]

    def _beam(
        self, logits: Tensor, rows: np.ndarray, width: int, search: SearchOptions, next_rows: _Next
    ) -> list[Finished]:
        """Beam-search sentences' next beams, their ``width`` rows each at ``rows`` (a sentence's rows one after the
        other there, wherever they are held); those that ended."""
        k, eos, penalty = search.beam_size, self.generation.specials.eos, search.length_penalty
        everyone = len(rows) == len(self.of_row) and bool((rows == np.arange(len(rows))).all())
        count = min(2 * k, width * int(logits.shape[-1]))
        values, indices = self.rows.top_k(
            logits, self.score[rows], width, count, None if everyone else rows
        )  # (S, count)
        vocab = int(logits.shape[-1])
        if count < min(2 * k, k * vocab):  # a first step with fewer tokens than 2k: dead candidates fill the rest
            dead = ((0, 0), (0, min(2 * k, k * vocab) - count))
            values, indices = np.pad(values, dead, constant_values=-np.inf), np.pad(indices, dead)
            count = values.shape[1]
        held = rows.reshape(-1, width)  # (S, width): each sentence's rows
        firsts = held[:, 0]
        sentences = [self.of_row[row] for row in firsts]
        local = indices // vocab  # (S, count): the sentence's row each extends
        parent, token = np.take_along_axis(held, local, axis=1), indices % vocab
        t = self.made[firsts] + 1  # (S,) the length of the hypotheses this step makes
        ending = (token == eos) & (np.arange(count) < k) & np.isfinite(values)
        for s, c in zip(*np.nonzero(ending), strict=True):
            ended = np.append(self.history[parent[s, c], : t[s] - 1], eos)
            sentences[s].offer(float(values[s, c] / t[s] ** penalty), ended)
        # The next beams: the best k continuations that do not end (at most one per row ends, so at most k of the 2k).
        kept = np.argsort(token == eos, axis=1, kind="stable")[:, :k]  # (S, k)
        scores, local = np.take_along_axis(values, kept, axis=1), np.take_along_axis(local, kept, axis=1)
        parent, token = np.take_along_axis(parent, kept, axis=1), np.take_along_axis(token, kept, axis=1)
        limit = self.limit[firsts]  # (S,)
        for s in np.flatnonzero(limit == t):  # those sentences' beams end here, unfinished
            for j in range(k):
                unfinished = np.append(self.history[parent[s, j], : t[s] - 1], token[s, j])
                sentences[s].offer(float(scores[s, j] / t[s] ** penalty), unfinished)
        # A continuation's score only falls: its rank is at most its score over the next or the last length.
        bound = np.maximum(scores[:, 0] / (t + 1) ** penalty, scores[:, 0] / limit**penalty)
        worst = np.array([sentence.rank[-1] for sentence in sentences])
        going = ~(worst >= bound) & np.isfinite(scores[:, 0]) & (limit > t)
        next_rows.add_beams(held, np.flatnonzero(going), local, parent, token, scores)
        return [sentence.finished() for s, sentence in enumerate(sentences) if not going[s]]

    def _constrained(self, logits: Tensor, rows: np.ndarray, next_rows: _Next) -> list[Finished]:
        """The next beams of the constrained sentences at ``rows`` (dynamic beam allocation, Post and Vilar 2018): a
        sentence's candidates are each of its rows' ``2k`` best tokens and the tokens that take the row further along
        its phrases (:mod:`multihead.constraints`); they are banked by the phrase tokens they have written, and the
        ``k`` beams taken from the banks in turn, fullest bank first, each bank's best first (:func:`_allocated`). A
        hypothesis ends (EOS) only once it holds every phrase; at the limit, if none does, the best beam ends as it
        is. Every row's candidates are weighed at once; their log-probabilities reach the host in two calls."""
        rows = rows[np.argsort(self.sid[rows], kind="stable")]  # each sentence's rows together
        eos, vocab = self.generation.specials.eos, int(logits.shape[-1])
        count = min(2 * int(self.beams[rows].max()), vocab)
        best, token = self.rows.top_k(logits, np.zeros(len(rows), np.float32), 1, count, rows)  # (R, count)
        tables, met, partial = self._tables(rows), self.met[rows], self.partial[rows]
        further = np.take_along_axis(tables.ids, partial[..., None], axis=-1)[..., 0]  # (R, Q) each phrase's next
        further = np.concatenate([np.where(met, -1, further), np.full((len(rows), 1), eos)], axis=1)  # (R, Q + 1)
        columns = np.unique(further[further >= 0])
        at = self.rows.log_probs_at(logits, rows, columns)  # (R, T)
        extra = np.take_along_axis(at, np.searchsorted(columns, np.maximum(further, 0)), axis=1)
        q = np.arange(further.shape[1])
        twice = ((further[:, :, None] == further[:, None, :]) & (q[None, None, :] < q[None, :, None])).any(-1)
        listed = (further[:, :, None] == token[:, None, :]).any(-1)  # among the row's best already
        extra[(further < 0) | twice | listed] = -np.inf
        tokens = np.concatenate([token, further], axis=1)  # (R, C)
        scores = self.score[rows, None] + np.concatenate([best, extra], axis=1)
        pending = self.pending[rows]
        for follower in np.unique(pending[pending >= 0]):  # rows that just wrote a phrase whole: what may follow
            at = np.flatnonzero(pending == follower)
            allowed = self.followers[follower][np.maximum(tokens[at], 0)] | (tokens[at] == eos)
            scores[at] = np.where(allowed, scores[at], -np.inf)
        soft = tables.bonus > 0  # (R, Q) the phrases to prefer
        done = (met | soft).all(axis=1)
        earned = written(tables, met, partial)  # (R,) the bonus of the phrases to prefer, in the scores
        for r, c in zip(*np.nonzero((tokens == eos) & np.isfinite(scores) & done[:, None]), strict=True):
            t = int(self.made[rows[r]]) + 1  # a hypothesis that holds every phrase ends
            sentence = self.of_row[rows[r]]
            sentence.offer(_rank(float(scores[r, c]), float(earned[r]), t, sentence.search.length_penalty),
                           np.append(self.history[rows[r], : t - 1], eos))  # fmt: skip
        met, partial = advanced(tables, met, partial, tokens)  # (R, C, Q) each candidate's progress
        now = written(tables, met, partial)  # (R, C)
        scores = scores + (now - earned[:, None])
        banks = made(np.where(soft, 0, tables.sizes)[:, None, :], met, np.where(soft[:, None, :], 0, partial))
        candidates = _Candidates(tokens, scores, banks, np.all(met | soft[:, None, :], axis=-1), now)
        finished = []
        widths, beams = self.width[rows], self.beams[rows]
        for width, k in {(int(w), int(b)) for w, b in zip(widths, beams, strict=True)}:
            at_rows = np.flatnonzero((widths == width) & (beams == k)).reshape(-1, width)  # (S, width)
            finished += self._allocate(rows[at_rows], candidates.of(at_rows), k, next_rows)
        return finished

    def _allocate(self, held: np.ndarray, candidates: _Candidates, k: int, next_rows: _Next) -> list[Finished]:
        """The next ``k`` beams of the constrained sentences of rows ``held (S, width)`` from their ``candidates``
        (``(S, width * C)``, :meth:`_constrained`); those that ended."""
        eos, firsts = self.generation.specials.eos, held[:, 0]
        sentences = [self.of_row[row] for row in firsts]
        penalty = sentences[0].search.length_penalty
        valid = np.isfinite(candidates.scores) & (candidates.tokens != eos)
        chosen = _allocated(candidates.banks, candidates.scores, valid, k)  # (S, k), or fewer: as many as there are
        fewer = k - chosen.shape[1]
        live = np.pad(np.take_along_axis(valid, chosen, axis=1), ((0, 0), (0, fewer)))  # dead beams fill the rest
        chosen = np.pad(chosen, ((0, 0), (0, fewer)))
        scores = np.where(live, np.take_along_axis(candidates.scores, chosen, axis=1), -np.inf)
        earned = np.take_along_axis(candidates.earned, chosen, axis=1)  # (S, k) of their scores, the bonuses
        tokens = np.where(live, np.take_along_axis(candidates.tokens, chosen, axis=1), eos)
        local = np.where(live, chosen // (candidates.scores.shape[1] // held.shape[1]), 0)  # (S, k) their rows
        parent = np.take_along_axis(held, local, axis=1)
        t, limit = self.made[firsts] + 1, self.limit[firsts]  # (S,)
        for s in np.flatnonzero(limit == t):  # the beams end here: those that hold every phrase, else the best
            ends = np.flatnonzero(live[s] & np.take_along_axis(candidates.done, chosen, axis=1)[s])
            if not len(ends) and not np.isfinite(sentences[s].rank[0]) and live[s].any():
                ends = np.array([np.argmax(scores[s])])
            for j in ends:
                sentences[s].offer(_rank(float(scores[s, j]), float(earned[s, j]), int(t[s]), penalty),
                                   np.append(self.history[parent[s, j], : t[s] - 1], tokens[s, j]))  # fmt: skip
        top = scores.max(axis=1)
        # A continuation's log-probability only falls, and its bonus is at most every preferred phrase's whole.
        most = (self.phrase_bonus[firsts] * self.phrase_sizes[firsts]).sum(axis=1)  # (S,)
        falling = (scores - earned).max(axis=1)
        bound = np.maximum(falling / (t + 1) ** penalty, falling / limit**penalty) + most
        worst = np.array([sentence.rank[-1] for sentence in sentences])
        g = np.flatnonzero(np.isfinite(top) & (limit > t) & ~(worst >= bound))
        next_rows.add_beams(held, g, local, parent, tokens, scores)
        ended = np.setdiff1d(np.arange(len(held)), g)
        return [sentences[s].finished() for s in ended]


@dataclass(frozen=True)
class _Candidates:
    """A constrained step's candidates, ``(R, C)`` each: their ``tokens``, ``scores``, ``banks`` (the phrase tokens
    they will have written), whether they will hold every phrase (``done``) and how much of their scores is the bonus
    of the phrases to prefer they will have written (``earned``)."""

    tokens: np.ndarray
    scores: np.ndarray
    banks: np.ndarray
    done: np.ndarray
    earned: np.ndarray

    def of(self, rows: np.ndarray) -> _Candidates:
        """Those of ``rows (S, width)`` (indices into R), each sentence's in one row: ``(S, width * C)`` each."""
        names = ("tokens", "scores", "banks", "done", "earned")
        return _Candidates(*(getattr(self, name)[rows].reshape(len(rows), -1) for name in names))


def _rank(score: float, earned: float, length: int, penalty: float) -> float:
    """A finished hypothesis' rank: its log-probability (its ``score`` without the bonus ``earned`` of the phrases to
    prefer it holds) over its ``length`` to the ``penalty``, and that bonus, which no length divides."""
    return (score - earned) / length**penalty + earned


def _allocated(banks: np.ndarray, scores: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` candidates each sentence takes, of ``banks``, ``scores`` and ``valid`` ``(S, n)``: each bank's best
    in turn, fullest bank first (a bank that runs out leaves its turns to the others; invalid candidates come last),
    as indices ``(S, k)``."""
    first = np.lexsort((-scores, -banks, ~valid), axis=-1)  # (S, n) valid, fullest bank, best first
    bank = np.take_along_axis(banks, first, axis=1)
    index = np.arange(banks.shape[1])
    starts = np.ones(bank.shape, dtype=bool)
    starts[:, 1:] = bank[:, 1:] != bank[:, :-1]
    turn = index - np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # its place in its bank
    second = np.lexsort((-bank, turn, ~np.take_along_axis(valid, first, axis=1)), axis=-1)
    return np.take_along_axis(first, second[:, :k], axis=1)


class Ensemble(Chooser):
    """Rows of several models translating the same sources into the same target vocabulary, one :class:`Rows` each
    (joining when they all join): a step's logits are ``mean`` of the members' (the mean of their log-probabilities,
    a log-linear ensemble of equal weights, as Marian's; fairseq averages the probabilities instead), which the
    searches renormalise, so each step's distribution is the models' normalised geometric mean. Every row change
    happens in each member; the first member's choices choose the tokens (what it computes on holds them all)."""

    def __init__(self, members: Sequence[Rows], mean: Callable[[list[Tensor]], Tensor]) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member's rows, received none")
        self.members, self.mean, self.choices = list(members), mean, members[0]

    def step(self, tokens: np.ndarray) -> Tensor:
        return self.mean([member.step(tokens) for member in self.members])

    def keep(self, rows: np.ndarray, *, same_sources: bool = False) -> None:
        for member in self.members:
            member.keep(rows, same_sources=same_sources)

    def join(self, sources: Sequence[Sequence[int]]) -> None:
        for member in self.members:
            cast(JoiningRows, member).join(sources)


def _stay(parents: np.ndarray) -> np.ndarray:
    """For each sentence's new beams ``(S, k)``, best first, given as their parents' places among its beams: which
    beam each place takes, so that as many beams as can stay in their parent's place (the best child of each parent
    takes its parent's place, the others the places left, in order)."""
    first = np.ones(parents.shape, dtype=bool)  # the best child of its parent
    for j in range(1, parents.shape[1]):
        first[:, j] = ~(parents[:, :j] == parents[:, j : j + 1]).any(axis=1)
    taken = np.zeros(parents.shape, dtype=bool)  # places a best child takes
    sentence, child = np.nonzero(first)
    taken[sentence, parents[sentence, child]] = True
    place = parents.copy()
    # The other children, in order, take the places not taken, in order (firsts' entries are set back below).
    others, free = np.argsort(first, axis=1, kind="stable"), np.argsort(taken, axis=1, kind="stable")
    np.put_along_axis(place, others, free, axis=1)
    place = np.where(first, parents, place)  # (S, k): each beam's place
    return np.argsort(place, axis=1)  # (S, k): each place's beam


def generate(
    rows: Rows,
    batch: int,
    generation: Generation,
    *,
    max_len: Limit,
    keys: Sequence[int] | np.ndarray | None = None,
    constraints: Sequence[Sequence[Sequence[int] | Phrase]] | None = None,
) -> np.ndarray:
    """The tokens of ``batch`` sources that ``rows`` hold (row ``i`` source ``i``), generated as ``generation`` says,
    ``max_len`` tokens at most (one limit, or one per source, and at most ``search.max_length``), each starting from
    ``specials.bos``; ``keys`` name the sentences to sampling (default: ``0..B-1``); ``constraints[i]``: phrases
    (token ids) translation ``i`` must hold, searched by a beam of at least one more than its phrases
    (:meth:`Engine._constrained`). int64 ``(B, T)``, each row ending at its first EOS or its limit, padded after
    it."""
    search = generation.search
    if search.n_best != 1:
        raise ValueError(f"`generate` gives one translation a sentence: n-best lists (received n_best={search.n_best}) "
                         "come from n_best_search")  # fmt: skip
    found = _run(rows, batch, generation, max_len=max_len, keys=keys, constraints=constraints)
    tokens = [found[index].tokens for index in range(batch)]
    out = np.full((batch, max(1, *(len(row) for row in tokens))), generation.specials.pad, dtype=np.int64)
    for index, row in enumerate(tokens):
        out[index, : len(row)] = row
    return out


def n_best_search(
    rows: Rows,
    batch: int,
    generation: Generation,
    *,
    max_len: Limit,
    constraints: Sequence[Sequence[Sequence[int] | Phrase]] | None = None,
) -> list[list[tuple[float, np.ndarray]]]:
    """Each sentence's ``search.n_best`` best hypotheses, best first, from a beam search as ``generation`` says: (rank,
    int64 tokens after BOS, ending with EOS unless the limit cut them). A sentence stops when no continuation can
    outrank its ``n``-th best finished hypothesis; one whose beams all die out first has fewer. ``constraints`` as
    :func:`generate` takes them."""
    if generation.search.strategy.draws:
        raise ValueError("n-best lists come from beam search: give beam_size > 1, not sampling options")
    found = _run(rows, batch, generation, max_len=max_len, keys=None, ranked=True, constraints=constraints)
    return [found[index].hypotheses for index in range(batch)]


def _run(
    rows: Rows,
    batch: int,
    generation: Generation,
    *,
    max_len: Limit,
    keys: Sequence[int] | np.ndarray | None,
    ranked: bool = False,
    constraints: Sequence[Sequence[Sequence[int] | Phrase]] | None = None,
) -> dict[int, Finished[int]]:
    """Every sentence of a batch that ``rows`` hold, stepped until each has ended."""
    engine: Engine[int] = Engine(rows, generation, ranked=ranked)
    keys = np.arange(batch) if keys is None else np.asarray(keys)
    engine.hold(list(range(batch)), row_limits(max_len, batch), keys, constraints)
    found: dict[int, Finished[int]] = {}
    while len(found) < batch:
        for finished in engine.step():
            found[finished.owner] = finished
    return found
