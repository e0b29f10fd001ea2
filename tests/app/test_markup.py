"""HTML as ``serve`` translates it: sentences split by inline markup translated whole, the tags put back around their
elements' translations where those stand in the sentence's, else the texts between tags one by one.

The translator here is a dictionary written by hand, so what each page must give back is known without a model."""

from __future__ import annotations

import asyncio

import pytest

from multihead.app.markup import translate_html, visible_text

WORDS = {
    "Ein Hund läuft schnell.": "A dog runs fast.",
    "Hund": "Dog",
    "Hund.": "Dog.",
    "Ein": "A",
    "läuft schnell.": "runs fast.",
    "läuft": "runs",
    "Eine Katze.": "A cat.",
    "Ein Hotdog.": "A hotdog.",
    "Hot": "dog",
    "Der Hund & die Katze spielen.": "The dog & the cat play.",
    "Katze": "cat",
    "Ein Hund, eine Katze.": "A dog, a cat.",
    "eine": "one",
    "Ein Hund läuft, ein Hund schläft.": "A dog runs, a dog sleeps.",
    "ein Hund schläft.": "a dog sleeps.",
    "Ein Pferd läuft.": "A horse runs.",
    "Pferd": "Horse horse horse horse",
    "Ein Esel läuft.": "A donkey runs.",
    "Esel": "Mule mule",
    "Ein Hund": "A dog",
    "ein Hund": "a dog",
    "läuft.": "runs.",
    "dog.": "dog.",
}


def translated(page: str) -> tuple[str, list[list[str]]]:
    """``page`` translated with ``WORDS``, and the lists of texts each call was given."""
    calls: list[list[str]] = []

    async def translate(texts: list[str]) -> list[str]:
        calls.append(texts)
        return [WORDS[text] for text in texts]

    return asyncio.run(translate_html(page, translate)), calls


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        # The sentence whole, the element's tags around its translation (found case aside, as a whole word).
        ("<p>Ein <b>Hund</b> läuft schnell.</p>", "<p>A <b>dog</b> runs fast.</p>"),
        ('<p> Ein <a href="/x?a=1&amp;b=2">Hund</a> läuft schnell. </p>',
         '<p> A <a href="/x?a=1&amp;b=2">dog</a> runs fast. </p>'),
        ("<li><i>Ein</i> Hund <b>läuft</b> schnell.</li>", "<li><i>A</i> dog <b>runs</b> fast.</li>"),
        ("<p>Der Hund &amp; die <em>Katze</em> spielen.</p>", "<p>The dog &amp; the <em>cat</em> play.</p>"),
        # A word translated alone comes back repeated: its first word is found.
        ("<p>Ein <b>Pferd</b> läuft.</p>", "<p>A <b>horse</b> runs.</p>"),
        # Two elements of one text: in order, the second after the first.
        ("<p><b>Ein Hund</b> läuft, <b>ein Hund</b> schläft.</p>", "<p><b>A dog</b> runs, <b>a dog</b> sleeps.</p>"),
    ],
)  # fmt: skip
def test_a_sentence_split_by_inline_tags_is_translated_whole(page: str, expected: str) -> None:
    result, calls = translated(page)
    assert result == expected
    assert len(calls) == 1  # every tag placed: no second call


@pytest.mark.parametrize(
    ("page", "expected", "calls"),
    [
        # Neither its translation nor its first word is in the sentence's: the texts between tags one by one.
        ("<p>Ein <b>Esel</b> läuft.</p>", "<p>A <b>Mule mule</b> runs.</p>", 2),
        # Found only inside another word: not placed.
        ("<p>Ein <b>Hot</b>dog.</p>", "<p>A <b>dog</b>dog.</p>", 2),
        # An element inside another: the texts one by one, from the start.
        ("<p>Ein <b><i>Hund</i></b> läuft schnell.</p>", "<p>A <b><i>Dog</i></b> runs fast.</p>", 1),
    ],
)  # fmt: skip
def test_tags_that_cannot_be_placed_leave_the_texts_between_them_translated_one_by_one(
    page: str, expected: str, calls: int
) -> None:
    result, made = translated(page)
    assert result == expected
    assert len(made) == calls


def test_block_elements_no_letters_and_scripts_are_as_before() -> None:
    page = "<ul><li>Ein Hund läuft schnell.</li><li>Eine Katze.</li></ul><p><b>Hund</b>.</p><script>Hund();</script>"
    result, calls = translated(page)
    assert result == "<ul><li>A dog runs fast.</li><li>A cat.</li></ul><p><b>Dog</b>.</p><script>Hund();</script>"
    assert calls == [["Ein Hund läuft schnell.", "Eine Katze.", "Hund"]]  # each alone: no sentence split by tags
    assert visible_text("<p>Ein <b>Hund</b>\n läuft.</p><style>p {}</style>") == "Ein Hund läuft."
