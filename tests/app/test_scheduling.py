"""``serve``'s scheduling of requests (``multihead.app.streaming.Requests``) on a fake translator, in milliseconds:
pieces given out in turn, one request's share bounded while others wait, abandoned requests dropped, answers joined
in order. The fake cuts a text into its words (a piece each: the word's length) and joins the outputs back."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from concurrent.futures import Future

import pytest

from multihead.app.streaming import SHARE, Requests
from multihead.app.translate import TRANSLATION, Cut, Translated
from multihead.decoding import SearchOptions

Ids = list[int]


class Words:
    """A :class:`~multihead.app.streaming.Cutting` without a model: a word is a piece, its ids its length."""

    def pieces(self, texts: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[Cut], list[Ids]]:
        cuts = [Cut([[len(word)] for word in text.split()], text.split(), [""] * (len(text.split()) + 1))
                for text in texts]  # fmt: skip
        return cuts, [ids for cut in cuts for ids in cut.ids]

    def joined(
        self,
        cuts: Sequence[Cut],
        outputs: Sequence[Ids],
        search: SearchOptions = TRANSLATION,
        *,
        again: dict[int, Ids] | None = None,
    ) -> Translated:
        each = iter({**dict(enumerate(outputs)), **(again or {})}[index] for index in range(len(outputs)))
        return Translated([" ".join(str(next(each)[0]) for _ in cut.ids) for cut in cuts], [[] for _ in cuts])

    def doubts(self, cuts: Sequence[Cut], outputs: Sequence[Ids], search: SearchOptions) -> dict[int, str]:
        """A translation 0 is doubted."""
        return {index: "zero" for index, out in enumerate(outputs) if out == [0]}

    def wider(self, search: SearchOptions) -> SearchOptions:
        return search


def test_pieces_are_given_out_in_turn_and_answers_joined_in_order() -> None:
    requests: Requests[Words] = Requests(Words())
    heavy, short = Future(), Future()
    requests.add(["a bb ccc dddd " * 5], heavy)
    requests.add(["xx yyy", "", "z"], short)
    taken = requests.take(6)
    assert [job.future for job, _, _ in taken] == [heavy, short] * 3  # one of each, in turn
    for job, index, ids in taken:
        requests.ended(job, index, [(0.0, [ids[0] * 10])])
    assert short.result(timeout=0).texts == ["20 30", "", "10"]
    assert not heavy.done()
    while remaining := requests.take(8):
        for job, index, ids in remaining:
            requests.ended(job, index, [(0.0, [ids[0]])])
    assert heavy.result(timeout=0).texts == [" ".join(["10", "20", "30"] + ["4", "1", "2", "3"] * 4 + ["4"])]
    assert (requests.live, len(requests), requests.running) == ([], 0, 0)


def test_one_request_holds_at_most_its_share_while_others_are_translated() -> None:
    requests: Requests[Words] = Requests(Words())
    heavy, short = Future(), Future()
    requests.add([" ".join(["w"] * 100)], heavy)
    first = requests.take(50)  # alone, it takes every place
    assert len(first) == 50
    requests.add(["a b"], short)
    more = requests.take(50)
    assert [job for job, _, _ in more].count(first[0][0]) == 0  # at its share: only the short request's pieces
    assert len(more) == 2
    for job, index, ids in more:
        requests.ended(job, index, [(0.0, ids)])
    assert short.result(timeout=0).texts == ["1 1"]
    for job, index, ids in first[: 50 - SHARE]:
        requests.ended(job, index, [(0.0, ids)])
    assert len(requests.take(100)) == 50  # alone again: the rest


def test_an_abandoned_request_is_dropped_with_its_pieces() -> None:
    requests: Requests[Words] = Requests(Words())
    heavy, short = Future(), Future()
    requests.add([" ".join(["w"] * 1000)], heavy)
    requests.add(["a b c"], short)
    first = requests.take(4)
    heavy.cancel()
    gone = requests.drop_abandoned()
    assert [job.future for job in gone] == [heavy]
    assert len(requests) == sum(len(job.pending) + len(job.uncut) for job in requests.turns) < 3
    for job, index, ids in first:  # the heavy request's are dropped from the batch with it (never end)
        if job.future is short:
            requests.ended(job, index, [(0.0, ids)])
    while taken := requests.take(8):
        assert all(job.future is short for job, _, _ in taken)
        for job, index, ids in taken:
            requests.ended(job, index, [(0.0, ids)])
    assert short.result(timeout=0).texts == ["1 1 1"]


class Clock:
    """A fake ``time.monotonic`` that the fake engines' steps and the jobs advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Steps:
    """Fake engines (what :class:`~multihead.app.serve.worker.Worker` drives) with ``count`` steps to take, each
    2 ms, their run's page attention (what a job alone computes) 10 ms."""

    def __init__(self, clock: Clock, count: int, log: list[str]) -> None:
        self.clock, self.count, self.log = clock, count, log

    def __len__(self) -> int:
        return self.count

    def step(self) -> None:
        self.clock.now += 0.002
        self.count -= 1
        self.log.append("step")

    def fail(self, error: BaseException) -> None:
        raise AssertionError(error)

    def waiting(self) -> bool:
        return False

    def shrink(self, pinned: object) -> None:
        pass

    def to_load(self, pinned: object) -> list:
        return []

    def translator(self, job: object) -> Steps:
        return self

    def attention(self, sentence: str, *, search: object) -> str:
        self.clock.now += 0.010
        self.log.append(sentence)
        return sentence


class Refusing(Words):
    """A fake that cannot cut a text holding ``!`` (as a tokenizer fails on a text it cannot encode)."""

    def pieces(self, texts: Sequence[str], names: Sequence[str] | None = None) -> tuple[list[Cut], list[Ids]]:
        if any("!" in text for text in texts):
            raise RuntimeError("cannot encode")
        return super().pieces(texts, names)


@pytest.mark.parametrize("place", [0, 1], ids=["first-text", "later-text"])
def test_a_text_that_cannot_be_cut_fails_its_request_alone_and_leaves_nothing_queued(place: int) -> None:
    """The request whose text fails (its first, cut when it comes; or a later one, cut while its pieces are given
    out) gets the error; the other request is answered; afterwards nothing waits, so an idle worker stays idle."""
    requests: Requests[Refusing] = Requests(Refusing())
    bad, good = Future(), Future()
    texts = ["a b", "c d"]
    texts[place] = "bang!"
    requests.add(texts, bad)
    requests.add(["xx y"], good)
    while len(requests) or requests.running:
        requests.drop_abandoned()
        for job, index, ids in requests.take(4):
            requests.ended(job, index, [(0.0, [ids[0] * 10])])
    with pytest.raises(RuntimeError, match="cannot encode"):
        bad.result(timeout=0)
    assert good.result(timeout=0).texts == ["20 10"]
    requests.drop_abandoned()
    assert (len(requests), requests.running, requests.live) == (0, 0, [])


def test_jobs_that_run_alone_take_their_share_of_the_worker_between_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four 10 ms jobs beside 100 steps of 2 ms: the first at once, each next one once the steps since the last have
    taken (1 - share) / share of its time."""
    from multihead.app.serve import worker
    from multihead.app.serve.jobs import Attend, Stop
    from multihead.app.serve.routing import Leg

    clock, log = Clock(), []
    monkeypatch.setattr(worker.time, "monotonic", clock)
    working = worker.Worker(Steps(clock, 100, log), thread=False)  # type: ignore[arg-type]
    jobs = [Attend(Leg(0, ("de", "en")), f"job {index}") for index in range(4)]
    for job in jobs:
        working.submit(job)
    working.jobs.put(Stop())
    working.work()
    assert [job.answer.result(timeout=0) for job in jobs] == [f"job {index}" for index in range(4)]
    places = [index for index, entry in enumerate(log) if entry.startswith("job")]
    wait = math.ceil(0.010 / (0.002 * worker.ALONE_SHARE / (1 - worker.ALONE_SHARE)))  # steps between two jobs
    assert places[0] == 0  # at once
    assert [b - a - 1 for a, b in itertools.pairwise(places[:3])] == [wait, wait]
    assert log.count("step") == 100
    assert places[3] - places[2] - 1 == wait


def test_pieces_the_guard_doubts_are_searched_again_before_the_answer() -> None:
    """A request whose pieces have all ended is checked: the doubted ones are given out again (their second try, in
    the stream beside the others) and the answer joins those tries; a request with none doubted is answered at once."""
    requests: Requests[Words] = Requests(Words())
    doubted, clean = Future(), Future()
    requests.add(["a bb ccc"], doubted)
    requests.add(["dd"], clean)
    taken = requests.take(10)
    assert [(job.future, index) for job, index, _ in taken] == [(doubted, 0), (clean, 0), (doubted, 1), (doubted, 2)]
    for job, index, ids in taken:
        requests.ended(job, index, [(0.0, [0] if job.future is doubted and index == 1 else ids)])
    assert clean.result(timeout=0).texts == ["2"]
    assert not doubted.done()  # piece 1 was doubted: it goes out again
    ((job, index, ids),) = requests.take(10)
    assert (job.future, index) == (doubted, 1)
    requests.ended(job, index, [(0.0, [7])])  # its second try
    assert doubted.result(timeout=0).texts == ["1 7 3"]
    assert not requests.live
