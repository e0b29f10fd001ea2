"""HTML as ``serve`` translates it: sentences split by inline markup translated whole, each element's tags put back
around its own translation where that is found in the sentence's (its text translated alone, else what the sentence
without it lacks), else around nothing; kept elements byte for byte in their places.

The translator here is a dictionary written by hand, so what each page must give back is known without a model, and
a text it was not written for (a fragment of a sentence) fails the test."""

from __future__ import annotations

import asyncio
import re

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
    "Ein dog.": "A dog.",
    "Der Hund & die Katze spielen.": "The dog & the cat play.",
    "Katze": "cat",
    "Ein Hund läuft, ein Hund schläft.": "A dog runs, a dog sleeps.",
    "Ein Pferd läuft.": "A horse runs.",
    "Pferd": "Horse horse horse horse",
    "Ein Hund": "A dog",
    "ein Hund": "one dog",
    "Ein schwarzer Hund läuft.": "A black dog runs.",
    "schwarzer Hund": "black dog",
    "schwarzer": "Black" + " black" * 56,  # a word translated alone, as a model may
    "Ich habe gestern Fußball gespielt.": "I played football yesterday.",
    "gestern": "yesterday",
    "Fußball": "football",
    "Ein Hund läuft 2.": "A dog runs 2.",
    "Ein Donaudampfschiff fährt.": "A Danube steamer goes.",
    "Hund läuft.": "dog runs.",
    # Kept elements: the model reads their text in the sentence.
    "Schreibe a<b hin.": "Write a<b down.",
    "Ich wohne in Hamburg.": "I live in Hamburg.",
    "Ich wohne in Bad Homburg.": "I live in Bad Homburg.",
    "Starte top jetzt.": "Start the summit now.",
    "Starte jetzt.": "Start now.",
    "Starte htop gleich.": "Start the hilltop soon.",
    "Starte gleich.": "Start right away.",
    "Starte": "Start",
    "gleich.": "soon.",
    "Klicke auf Zahnrad, um fortzufahren.": "Click on gear to continue.",
    "Klicke auf, um fortzufahren.": "Click on to continue.",
    "Klicke auf": "Click on",
    "und warte.": "and wait.",
    # An element's text translated alone otherwise than in its sentence.
    "Ein Hund läuft über eine Wiese.": "A dog runs across a grassy field.",
    "Ein Esel läuft über eine Wiese.": "A donkey runs across a grassy field.",
    "über eine Wiese": "A meadow",
    "Wiese": "field",
    "Ein Hund läuft.": "A dog runs.",
    "Ein Esel läuft.": "A donkey is running.",
    "Ein Hund jagt einen Köter.": "A dog chases a dog.",
    "Köter": "dog",
    "Ein Hund jagt einen.": "A dog chases one.",
    "Ein Hund und ein Hund spielen.": "A dog and a dog play.",
    "Ein Hund und spielen.": "A dog play.",
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
        # A word translated alone comes back repeated: once.
        ("<p>Ein <b>Pferd</b> läuft.</p>", "<p>A <b>horse</b> runs.</p>"),
        # Elements one inside another, the inner one's word said 57 times alone.
        ("<p>Ein <b><i>schwarzer</i> Hund</b> läuft.</p>", "<p>A <b><i>black</i> dog</b> runs.</p>"),
        # Elements in the translation's order.
        ("<p>Ich habe <b>gestern</b> <i>Fußball</i> gespielt.</p>",
         "<p>I played <i>football</i> <b>yesterday</b>.</p>"),
        # "Hund" twice in the sentence, "dog" twice in its translation: the element's is the second.
        ("<p>Ein Hund läuft, ein <b>Hund</b> schläft.</p>", "<p>A dog runs, a <b>dog</b> sleeps.</p>"),
        ("<p><b>Ein Hund</b> läuft, ein Hund schläft.</p>", "<p><b>A dog</b> runs, a dog sleeps.</p>"),
        # A word broken by <wbr> is read whole; an element without a letter is kept as it is.
        ("<p>Ein Donau<wbr>dampfschiff fährt.</p>", "<p>A Danube steamer goes.</p>"),
        ("<p>Ein Hund läuft <sup>2</sup>.</p>", "<p>A dog runs <sup>2</sup>.</p>"),
        # Kept elements stand in the sentence as their text, which the translation keeps: there they are, as written.
        ("<p>Schreibe <code>a&lt;b</code> hin.</p>", "<p>Write <code>a&lt;b</code> down.</p>"),
        ('<p>Ich wohne in <span translate="no">Hamburg</span>.</p>',
         '<p>I live in <span translate="no">Hamburg</span>.</p>'),
        ("<p>Ich wohne in <span class='city notranslate'><span>Bad</span>  Homburg</span>.</p>",
         "<p>I live in <span class='city notranslate'><span>Bad</span>  Homburg</span>.</p>"),
        # A tag left open in the sentence, a tag closing an element opened before it: each kept once.
        ("<p>Ein <b>Hund läuft.</p>", "<p>A <b>dog runs.</p>"),
        ("<p>Ein Hund</b> läuft.</p>", "<p>A dog</b> runs.</p>"),
    ],
)  # fmt: skip
def test_a_sentence_split_by_inline_tags_is_translated_whole(page: str, expected: str) -> None:
    result, calls = translated(page)
    assert result == expected
    assert len(calls) == 1  # every tag placed: no second call


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        # "A meadow" is not in the sentence's translation (its "A" is another word's): what the sentence without
        # "über eine Wiese" lacks is.
        ("<p>Ein Hund läuft <a href=x>über eine Wiese</a>.</p>",
         "<p>A dog runs <a href=x>across a grassy field</a>.</p>"),
        ("<p>Ein Hund läuft <a href=x>über eine <b>Wiese</b></a>.</p>",
         "<p>A dog runs <a href=x>across a grassy <b>field</b></a>.</p>"),
        # An image stands as its alt; a kept element the model translated: where what stands for them is.
        ('<p>Klicke auf <img src="g.png" alt="Zahnrad">, um fortzufahren.</p>',
         '<p>Click on <img src="g.png" alt="Zahnrad"> to continue.</p>'),
        ("<p>Starte <code>top</code> jetzt.</p>", "<p>Start <code>top</code> now.</p>"),
    ],
)  # fmt: skip
def test_an_element_not_found_by_its_own_translation_is_found_by_the_sentence_without_it(
    page: str, expected: str
) -> None:
    result, calls = translated(page)
    assert result == expected
    assert len(calls) == 2


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        # Found neither way: the sentence's translation whole, the tags after it around nothing.
        ("<p>Ein Esel läuft <a href=x>über eine Wiese</a>.</p>",
         "<p>A donkey runs across a grassy field.<a href=x></a></p>"),
        # ... its element inside found by its own translation.
        ("<p>Ein Esel läuft <a href=x>über eine <b>Wiese</b></a>.</p>",
         "<p>A donkey runs across a grassy <b>field</b>.<a href=x></a></p>"),
        # Found only inside another word: not placed.
        ("<p>Ein <b>Hot</b>dog.</p>", "<p>A hotdog.<b></b></p>"),
        # "dog" twice in the translation, "Köter" once in the sentence: which "dog" is its, is not known.
        ("<p>Ein Hund jagt einen <b>Köter</b>.</p>", "<p>A dog chases a dog.<b></b></p>"),
        # What "A dog play." lacks could be "dog and a" as well as "and a dog".
        ("<p>Ein Hund und <b>ein Hund</b> spielen.</p>", "<p>A dog and a dog play.<b></b></p>"),
    ],
)  # fmt: skip
def test_tags_not_found_go_around_nothing_never_around_other_words(page: str, expected: str) -> None:
    result, calls = translated(page)
    assert result == expected
    assert len(calls) == 2
    assert re.sub("<[^>]*>", "", result) == WORDS[calls[0][0]]  # no text lost or said twice


def test_a_kept_element_not_found_cuts_its_sentence() -> None:
    # Neither "htop" nor what "Starte gleich." lacks is in "Start the hilltop soon.": each side translated alone.
    result, calls = translated("<p>Starte <code>htop</code> gleich.</p>")
    assert result == "<p>Start <code>htop</code> soon.</p>"
    assert calls == [["Starte htop gleich."], ["Starte gleich."], ["Starte", "gleich."]]
    # An image without alt has nothing to be found by: the sentence cut there at once.
    result, calls = translated('<p>Klicke auf <img src="g.png"> und warte.</p>')
    assert (result, calls) == ('<p>Click on <img src="g.png"> and wait.</p>', [["Klicke auf", "und warte."]])


def test_block_elements_lines_no_letters_scripts_and_kept_elements() -> None:
    page = ("<ul><li>Ein Hund läuft schnell.</li><li>Eine Katze.</li></ul><script>if (a<b) Hund();</script>"
            "<p><b>Hund</b>.</p><p>Ein<br>Hund.</p><pre>Ein  <b>Hund</b></pre><div translate=no><p>Ein Hund</p></div>"
            "<style>p {}</style>")  # fmt: skip
    result, calls = translated(page)
    assert result == ("<ul><li>A dog runs fast.</li><li>A cat.</li></ul><script>if (a<b) Hund();</script>"
                      "<p><b>Dog</b>.</p><p>A<br>Dog.</p><pre>Ein  <b>Hund</b></pre><div translate=no><p>Ein Hund</p>"
                      "</div><style>p {}</style>")  # fmt: skip
    assert calls == [["Ein Hund läuft schnell.", "Eine Katze.", "Hund", "Ein", "Hund."]]  # each alone
    assert visible_text("<p>Ein <b>Hund</b>\n läuft <code>ls</code>.</p><style>p {}</style>") == "Ein Hund läuft ."
