"""Translation at scale and translate's inputs: a self-contained run,
``--input FILE|-`` and ``--output``, batched equals one at a time, beam search, ``evaluate``'s JSON line, and
``--checkpoint latest|best|average|step-N``. Every input is checked before anything is translated or printed."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

import multihead.app.translate as translate_module
from app.support import SAMPLES, VALID, Cli, CorpusRun, assert_refused, beam, subprocess_env, write_lines
from conftest import mapped_from
from multihead.app.cli import main
from multihead.app.loaded import LoadedRun
from multihead.app.runs import latest_checkpoint
from multihead.app.tokenizers import EOS
from multihead.app.translate import Translator, translate_ids

SOURCES = [source for source, _ in VALID]
REFERENCES = [target for _, target in VALID]


def best_of(run: CorpusRun) -> str:
    """The checkpoint the run's validation BLEU chose."""
    history = json.loads((run.path / "history.json").read_text(encoding="utf-8"))
    best = max(history["evals"], key=lambda evaluation: evaluation["bleu"])
    name = best.get("checkpoint", f"step-{best['step']:07d}")
    assert (run.path / "best").read_text(encoding="utf-8").strip() == name
    return name


def test_a_run_is_self_contained(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """The fixture moved the run and deleted its corpus: it translates as it did before, and so does a copy."""
    assert Translator(corpus_run.path).translate(SAMPLES) == corpus_run.translations
    copy = corpus_run.copy(tmp_path / "another" / "machine")
    result = cli("translate", copy, *SAMPLES)
    assert result.status == 0, result.err
    assert result.out_lines == corpus_run.translations
    assert result.err == ""


@pytest.mark.parametrize("source", ["file", "gz", "stdin"])
def test_input_gives_one_translation_per_line_in_order(
    source: str, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = SOURCES[::-1]  # not sorted by length: the order must come back as it went in
    expected = Translator(corpus_run.path).translate(lines)
    if source == "stdin":
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        path = "-"
    else:
        path = write_lines(tmp_path / ("in.txt.gz" if source == "gz" else "in.txt"), lines)
    result = cli("translate", corpus_run.path, "--input", path)
    assert result.status == 0, result.err
    assert result.out_lines == expected
    output = tmp_path / "out.txt"
    if source == "stdin":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    result = cli("translate", corpus_run.path, "--input", path, "--output", output)
    assert result.status == 0, result.err
    assert result.out == ""
    assert output.read_text(encoding="utf-8") == "".join(line + "\n" for line in expected)


def test_stdin_is_split_only_at_line_feeds(
    corpus_run: CorpusRun, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a file is: a form feed or a Unicode line separator inside a line does not make two lines of it."""
    data = "der Hund\x0cläuft.\ndie Katze\u2028isst.\r\ndas Kind singt.\n".encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    result = cli("translate", corpus_run.path, "--input", "-")
    assert result.status == 0, result.err
    assert len(result.out_lines) == 3


def test_texts_and_input_are_one_or_the_other(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]):
    path = write_lines(tmp_path / "in.txt", SAMPLES)
    assert_refused(cli("translate", corpus_run.path, "abc", "--input", path), "give the texts", "--input", "not both")


def test_without_texts_standard_input_is_read_when_piped(
    corpus_run: CorpusRun, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(f"{s}\n" for s in SAMPLES).encode())))
    result = cli("translate", corpus_run.path)
    assert result.status == 0, result.err
    assert result.out_lines == corpus_run.translations


def test_at_a_terminal_each_line_is_translated_as_it_is_typed(task_run: Path) -> None:
    """Without texts or a pipe, standard input a terminal (a pseudo-terminal here): each line's translation is printed
    as soon as the line is entered, before the next is typed, as fairseq-interactive and marian do; a line that is not
    UTF-8 is named and skipped; Ctrl-D ends."""
    texts = ["abc", "", "cab"]
    expected = Translator(task_run).translate(texts)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "multihead", "translate", str(task_run)], stdin=terminal, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=subprocess_env(),
    )  # fmt: skip
    os.close(terminal)
    try:
        for text, translation in zip(texts, expected, strict=True):
            os.write(controller, f"{text}\n".encode())
            assert select.select([process.stdout], [], [], 120)[0], f"no translation of {text!r} within 120 s"
            assert process.stdout.readline().decode("utf-8") == f"{translation}\n"
        os.write(controller, b"a\xffb\n")  # a line that is not UTF-8: a warning and a blank line, and it goes on
        assert select.select([process.stdout], [], [], 120)[0], "no answer to a line that is not UTF-8 within 120 s"
        assert process.stdout.readline() == b"\n"
        os.write(controller, b"\x04")  # Ctrl-D at the start of a line: the end of the input
        assert process.wait(timeout=60) == 0, process.stderr.read()
        said = process.stderr.read().decode("utf-8")
        assert "Ctrl-D ends" in said
        assert "warning: line 4 is not UTF-8 text (invalid start byte at byte 1): not translated" in said
    finally:
        process.kill()
        process.wait()
        os.close(controller)


@pytest.mark.parametrize("flag", ["--output", "--plot", "--html"])
def test_at_a_terminal_what_writes_the_translations_of_given_texts_is_refused(
    flag: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(Translator, "__init__", lambda *args, **kwargs: pytest.fail("the model loaded"))
    result = cli("translate", task_run, flag, tmp_path / "out")
    assert_refused(result, f"{flag} needs the texts before translating: give them, --input FILE, or pipe them")


@pytest.mark.parametrize("size", [1, 3])
def test_batched_translation_equals_one_at_a_time(corpus_run: CorpusRun, size: int) -> None:
    translator = Translator(corpus_run.path)
    batched = translator.translate(SOURCES, search=beam(size))
    assert batched == [translator.translate([source], search=beam(size))[0] for source in SOURCES]
    assert len(set(batched)) > 1


@pytest.mark.parametrize("size", [1, 3])
def test_a_sentences_length_limit_does_not_depend_on_its_batch(
    corpus_run: CorpusRun, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limits that bind (a few tokens less than the source): each sentence is cut at its own, batched or alone (a
    short sentence batched with a long one once took the long one's limit)."""
    translator = Translator(corpus_run.path)
    monkeypatch.setattr(LoadedRun, "limit", lambda self, length: max(1, length - 3))
    lines = sorted(SOURCES, key=len)[:: max(1, len(SOURCES) // 6)]  # short to long
    batched = translator.translate(lines, search=beam(size))
    assert batched == [translator.translate([line], search=beam(size))[0] for line in lines]
    lengths = [len(translator.target.encode(text)[0]) for text in batched]
    assert lengths == [max(1, len(translator.source.encode(line)[0]) - 3) for line in lines]  # every limit bound


@pytest.mark.parametrize("size", [1, 2], ids=["greedy", "beam"])
def test_max_length_is_the_limit_more_or_less_than_the_default_within_the_models_positions(
    corpus_run: CorpusRun, size: int
) -> None:
    """A model that never ends (its EOS banned by an output bias) translates to the limit: ``--max-length`` above
    the default (twice the source's plus 10) as well as below it, and never past the model's positions."""
    import torch

    from multihead.decoding import SearchOptions

    translator = Translator(corpus_run.path)
    with torch.no_grad():
        translator.model.output_proj.bias[translator.specials.eos] = -1e9
    line = SOURCES[0]
    default = translator.limit(len(translator.source.encode(line)[0]))
    positions = translator.checkpoint.config.max_len - 1
    ids = translator.source.encode(line)[0]
    for asked, expected in ((None, default), (3, 3), (default + 20, default + 20), (10_000, positions)):
        search = SearchOptions(beam_size=size, max_length=asked)
        (out,) = translate_ids(translator.generate(search), [ids], limit=translator.limits(search),
                               generation=translator.generation)  # fmt: skip
        assert len(out) == expected, asked


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_min_length_the_models_positions_cannot_end_is_refused_before_translating(
    command: str, task_run: Path, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model of P positions writes at most P - 1 tokens, EOS included: ``--min-length P - 1`` or more would take
    every sentence to that limit and cut it there, never ending."""
    positions = json.loads((latest_checkpoint(task_run) / "config.json").read_text(encoding="utf-8"))["max_len"]
    src = write_lines(tmp_path / "src.txt", ["abc"])
    args = [command, task_run, *(["abc"] if command == "translate" else [src, src])]
    assert cli(*args, "--min-length", positions - 2, "--max-length", positions - 1).status == 0
    monkeypatch.setattr(Translator, "translate", lambda *args, **kwargs: pytest.fail("translation started"))
    for asked in (positions - 1, 500):
        assert_refused(cli(*args, "--min-length", asked), f"--min-length {asked}: this model's translations take at "
                       f"most {positions - 1} tokens", f"give at most {positions - 2}")  # fmt: skip


def test_beam_search_gives_one_translation_per_input(corpus_run: CorpusRun, cli: Callable[..., Cli]) -> None:
    greedy = cli("translate", corpus_run.path, *SAMPLES)
    beam = cli("translate", corpus_run.path, *SAMPLES, "--beam", "4", "--length-penalty", "1.0")
    assert greedy.status == beam.status == 0
    assert len(beam.out_lines) == len(SAMPLES)
    assert cli("translate", corpus_run.path, *SAMPLES, "--beam", "1").out_lines == greedy.out_lines
    assert_refused(cli("translate", corpus_run.path, "abc", "--beam", "0"), "--beam")


def test_sampling_from_the_command_line_is_reproducible(
    corpus_run: CorpusRun, cli: Callable[..., Cli], tmp_path: Path
) -> None:
    """The same seed, the same translations, whatever order the options come in; another seed or none, others (with a
    flat temperature on this small model); top-k 1 is greedy; evaluate names its search."""
    options = ["--sampling-topk", "0", "--sampling-temperature", "2", "--seed", "3"]
    first = cli("translate", corpus_run.path, *SAMPLES, *options)
    assert first.status == 0, first.err
    assert cli("translate", *options[2:], corpus_run.path, *options[:2], *SAMPLES).out_lines == first.out_lines
    greedy = cli("translate", corpus_run.path, *SAMPLES)
    assert first.out_lines != greedy.out_lines
    assert cli("translate", corpus_run.path, *SAMPLES, *options[:4], "--seed", "4").out_lines != first.out_lines
    assert cli("translate", corpus_run.path, *SAMPLES, "--sampling-topk", "1").out_lines == greedy.out_lines
    sources, references = (
        write_lines(tmp_path / "sample.de", SAMPLES),
        write_lines(tmp_path / "sample.en", greedy.out_lines),
    )
    result = cli("evaluate", corpus_run.path, sources, references, *options)
    assert result.status == 0, result.err
    assert "sampling (top-k 0, top-p 1.0, temperature 2.0, seed 3)" in result.out
    assert json.loads(result.out_lines[-1])["bleu"] < 100


def test_hypotheses_are_the_beams_best_translations_best_first(
    corpus_run: CorpusRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first is what beam search translates (in the same batches), then the next best, none twice; a blank text
    gives one blank translation."""
    translator = Translator(corpus_run.path)
    texts = [*SOURCES, "  "]
    found = translator.hypotheses(texts, beam(4, n_best=3))
    assert [hypotheses[0] for hypotheses in found] == translator.translate(texts, search=beam(4))
    for hypotheses in found[:-1]:
        assert len(set(hypotheses)) == len(hypotheses) == 3, hypotheses
    assert found[-1] == [""]
    few = translator.hypotheses(SAMPLES[:2], beam(3, n_best=3))
    assert [hypotheses[0] for hypotheses in few] == translator.translate(SAMPLES[:2], search=beam(3))
    # A text longer than the model reads: its i-th translation joins its pieces' i-th best.
    (long,) = translator.hypotheses([" ".join([SAMPLES[1]] * 60)], beam(2, n_best=2))
    assert long == [
        " ".join([hypothesis] * 60) for hypothesis in translator.hypotheses([SAMPLES[1]], beam(2, n_best=2))[0]
    ]
    assert "translated in 60 parts" in capsys.readouterr().err


def test_cross_attention_plot_of_a_subword_model(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]):
    result = cli("translate", corpus_run.path, SAMPLES[0], "--plot", tmp_path / "attention.png")
    assert result.status == 0, result.err
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- evaluate ---------------------------------------------------------------------------------------------


def test_evaluate_ends_with_a_json_line_of_sacrebleu_scores(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    src, ref = write_lines(tmp_path / "test.de", SOURCES), write_lines(tmp_path / "test.en.gz", REFERENCES)
    result = cli("evaluate", corpus_run.path, src, ref, "--output", tmp_path / "hypotheses.txt")
    assert result.status == 0, result.err
    summary = result.json()
    assert {"bleu", "chrf", "signature", "sentences", "seconds"} <= set(summary)
    assert summary["sentences"] == len(SOURCES)
    assert summary["seconds"] >= 0
    assert summary["beam"] == 1
    assert summary["checkpoint"] == best_of(corpus_run)
    hypotheses = (tmp_path / "hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert hypotheses == Translator(corpus_run.path).translate(SOURCES)
    bleu = BLEU()
    assert summary["bleu"] == round(bleu.corpus_score(hypotheses, [REFERENCES]).score, 2)
    assert summary["signature"]["bleu"] == str(bleu.get_signature())
    assert summary["signature"]["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
    assert summary["bleu"] > 5  # the model learned something
    beam = cli("evaluate", corpus_run.path, src, ref, "--beam", "2").json()
    assert (beam["beam"], beam["sentences"]) == (2, len(SOURCES))


def test_evaluate_refuses_files_of_different_lengths(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(translate_module.Translator, "__init__", lambda *args: pytest.fail("the model was loaded"))
    src, ref = write_lines(tmp_path / "test.de", SOURCES), write_lines(tmp_path / "test.en", REFERENCES[:-1])
    result = cli("evaluate", corpus_run.path, src, ref)
    assert_refused(result, f"SRC '{src}' has {len(SOURCES)} lines", f"REF '{ref}' has {len(SOURCES) - 1}")
    assert result.out == ""


# --- --checkpoint ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "name"),
    [(None, "BEST"), ("best", "BEST"), ("latest", "step-0000120"), ("average", "average"),
     ("step-90", "step-0000090"), ("step-0000120", "step-0000120"), ("90", "step-0000090")],
)  # fmt: skip
def test_checkpoint_chooses_what_translates(
    which: str | None, name: str, corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    if name == "BEST":
        name = best_of(corpus_run)
    src, ref = write_lines(tmp_path / "test.de", SAMPLES), write_lines(tmp_path / "test.en", REFERENCES[:6])
    chosen = [] if which is None else ["--checkpoint", which]
    summary = cli("evaluate", corpus_run.path, src, ref, *chosen).json()
    assert summary["checkpoint"] == name
    translated = cli("translate", corpus_run.path, *SAMPLES, *chosen)
    assert translated.status == 0, translated.err
    assert translated.out_lines == Translator(corpus_run.path, name).translate(SAMPLES)


def test_checkpoints_translate_differently(corpus_run: CorpusRun) -> None:
    """(So that the test above can tell them apart.)"""
    translations = {name: tuple(Translator(corpus_run.path, name).translate(SOURCES)) for name in ("step-90", "latest")}
    assert len(set(translations.values())) == 2


@pytest.mark.parametrize(
    ("which", "fragments"),
    [
        ("step-7", ["no checkpoint step-0000007", "it keeps: step-0000090, step-0000120"]),
        ("newest", ["--checkpoint must be latest, best, average or step-N, received 'newest'"]),
    ],
)
def test_checkpoint_that_is_not_there_is_refused(
    which: str, fragments: list[str], corpus_run: CorpusRun, cli: Callable[..., Cli]
) -> None:
    result = cli("translate", corpus_run.path, "abc", "--checkpoint", which)
    assert_refused(result, *fragments)
    assert result.out == ""


# --- every input checked before any is translated --------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "named"),
    [([""], "text 1 is empty"), (["   "], "text 1 is empty"), (["\t"], "text 1 is empty"),
     ([SAMPLES[0], "", SAMPLES[1]], "text 2 is empty"), ([SAMPLES[0], SAMPLES[1], " "], "text 3 is empty")],
    ids=["empty", "spaces", "tab", "second-of-three", "last-of-three"],
)  # fmt: skip
def test_an_empty_text_aborts_before_anything_is_printed(
    texts: list[str], named: str, corpus_run: CorpusRun, cli: Callable[..., Cli]
) -> None:
    result = cli("translate", corpus_run.path, *texts)
    assert_refused(result, named)
    assert result.out == ""


def test_blank_input_lines_give_blank_lines(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """A blank line in, a blank line out: the translations stay aligned with the input, a final blank line too."""
    path = write_lines(tmp_path / "in.txt", [SAMPLES[0], SAMPLES[1], "  ", SAMPLES[2], ""])
    result = cli("translate", corpus_run.path, "--input", path, "--output", tmp_path / "out.txt")
    assert result.status == 0, result.err
    assert len(result.err_lines) == 1, result.err  # the speed, and nothing else
    assert result.err_lines[0].startswith("translated 5 sentences in "), result.err
    written = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    translations = corpus_run.translations
    assert written == [translations[0], translations[1], "", translations[2], "", ""]
    src, ref = write_lines(tmp_path / "test.de", ["", SAMPLES[0]]), write_lines(tmp_path / "test.en", ["a", "b"])
    result = cli("evaluate", corpus_run.path, src, ref)
    assert result.status == 0, result.err
    assert result.json()["sentences"] == 2


def test_final_blank_lines_of_src_and_ref_are_no_sentences(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    src = write_lines(tmp_path / "test.de", SAMPLES)
    ref = write_lines(tmp_path / "test.en", [*(target for _, target in VALID[:6]), ""])
    result = cli("evaluate", corpus_run.path, src, ref)
    assert result.status == 0, result.err
    assert result.json()["sentences"] == len(SAMPLES)
    src = write_lines(tmp_path / "test2.de", [*SAMPLES, "", "  "])
    assert cli("evaluate", corpus_run.path, src, ref).json()["bleu"] == result.json()["bleu"]


def test_a_line_longer_than_the_model_reads_is_translated_in_pieces(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """Split at sentence ends (which the segmenter keeps together before a lower-case word, in German), with one
    warning naming the line in the user's terms; the file is never refused."""
    long = " ".join([SAMPLES[1]] * 60)  # 60 sentences, several times what the model reads
    path = write_lines(tmp_path / "in.txt", [SAMPLES[0], long, SAMPLES[2]])
    result = cli("translate", corpus_run.path, "--input", path)
    assert result.status == 0, result.err
    assert len(result.out_lines) == 3
    assert [result.out_lines[0], result.out_lines[2]] == [corpus_run.translations[0], corpus_run.translations[2]]
    assert result.out_lines[1] == " ".join([corpus_run.translations[1]] * 60)  # sentence by sentence
    assert len(result.err_lines) == 2, result.err  # the warning, then the speed
    assert result.err_lines[1].startswith("translated 3 sentences in "), result.err
    assert re.fullmatch(
        r"warning: --input line 2: a sentence longer than this model reads \(\d+ subword tokens, at most 256\): "
        r"translated in 60 parts split at sentence ends, clauses or words",
        result.err_lines[0],
    ), result.err_lines[0]
    assert "position" not in result.err
    assert "`" not in result.err
    one_sentence = cli("translate", corpus_run.path, "der Hund " * 200)  # no sentence end: split between words
    assert one_sentence.status == 0
    assert re.fullmatch(r"warning: text 1: a sentence longer than this model reads \(\d+ subword tokens, at most "
                        r"256\): translated in \d+ parts split at sentence ends, clauses or words",
                        one_sentence.err_lines[0]), one_sentence.err  # fmt: skip
    # 400 words that say nothing, which the little model translates with a few: the guard names them
    assert all("may have lost or invented words" in line for line in one_sentence.err_lines[1:]), one_sentence.err


def test_unknown_characters_are_listed_one_by_one(corpus_run: CorpusRun, cli: Callable[..., Cli]) -> None:
    result = cli("translate", corpus_run.path, SAMPLES[0], "der Hund Ωβ läuft.")
    assert result.status == 0, result.err
    assert len(result.out_lines) == 2
    assert result.err_lines == ["warning: text 2: 'Ω', 'β' not in the model's vocabulary, read as <unk>"]


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize("where", ["missing-directory", "a-directory"])
def test_files_to_write_are_checked_before_the_model_loads(
    command: str,
    where: str,
    corpus_run: CorpusRun,
    tmp_path: Path,
    cli: Callable[..., Cli],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(translate_module.Translator, "__init__", lambda *args: pytest.fail("the model was loaded"))
    src, ref = write_lines(tmp_path / "test.de", SAMPLES), write_lines(tmp_path / "test.en", SAMPLES)
    target = tmp_path / "absent" / "out.txt" if where == "missing-directory" else tmp_path
    args = [*SAMPLES] if command == "translate" else [src, ref]
    result = cli(command, corpus_run.path, *args, "--output", target)
    assert_refused(result, "--output", str(target))
    assert "`" not in result.err


def test_evaluate_json_names_the_checkpoint_of_a_task_run_as_latest(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """A built-in task's run has no best checkpoint: the default is the latest, and asking for best says why not."""
    out = tmp_path / "run"
    train = ["train", "--task", "copy", "--out", out, "--steps", "2", "--eval-examples", "2", "--batch-size", "4"]
    assert cli(*train, "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--no-progress").status == 0
    src, ref = write_lines(tmp_path / "src.txt", ["abc"]), write_lines(tmp_path / "ref.txt", ["abc"])
    assert cli("evaluate", out, src, ref).json()["checkpoint"] == "step-0000002"
    refused = cli("translate", out, "abc", "--checkpoint", "best")
    assert_refused(refused, "has no best checkpoint", "--checkpoint latest")
    assert json.loads((out / "history.json").read_text(encoding="utf-8"))["metric"] == "accuracy"


def test_a_task_run_is_named_by_its_task_not_sent_to_langs(
    task_run: Path, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in task translates no language, and train refuses --langs for one: evaluate (and translate on a
    terminal) name the task instead of suggesting train --langs."""
    src = write_lines(tmp_path / "src.txt", ["abc"])
    result = cli("evaluate", task_run, src, src)
    assert result.status == 0, result.err
    assert "languages: built-in task reverse (no languages)" in result.out_lines
    assert "--langs" not in result.out + result.err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    shown = cli("translate", task_run, "abc")
    assert shown.status == 0, shown.err
    assert "built-in task reverse (no languages), checkpoint step-0000004" in shown.err
    assert "--langs" not in shown.err


def test_translating_a_file_ends_with_its_speed_as_evaluate_gives_it(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sentences/s and tokens/s (the target tokens generated, EOS included) on stderr after a file or a pipe, not
    after texts given as arguments; evaluate says the same on stdout."""
    speed = r"in \d+\.\d s \(\d+\.\d sentences/s, (\d+) tokens/s\)"
    path = write_lines(tmp_path / "in.de", SOURCES)
    result = cli("translate", corpus_run.path, "--input", path, "--beam", "2")
    assert result.status == 0, result.err
    assert re.fullmatch(rf"translated {len(SOURCES)} sentences {speed}, beam 2", result.err_lines[-1]), result.err
    assert int(re.search(speed, result.err_lines[-1])[1]) > 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes()), encoding="utf-8"))
    piped = cli("translate", corpus_run.path)
    assert re.fullmatch(rf"translated {len(SOURCES)} sentences {speed}, beam 1", piped.err_lines[-1]), piped.err
    assert cli("translate", corpus_run.path, *SAMPLES).err == ""
    evaluated = cli("evaluate", corpus_run.path, path, path)
    assert any(re.fullmatch(rf"{len(SOURCES)} sentences {speed}, beam 1", line) for line in evaluated.out_lines)
    generated: list[list[int]] = []

    def spy(*args: object, **kwargs: object) -> list[list[int]]:
        generated.extend(translate_ids(*args, **kwargs))
        return generated

    monkeypatch.setattr(translate_module, "translate_ids", spy)
    translator = Translator(corpus_run.path)
    translator.translate(SOURCES)
    assert all(tokens[-1] == EOS for tokens in generated)
    assert translator.tokens == sum(map(len, generated))


def test_an_empty_input_file(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    """Nothing in, nothing out; but nothing to plot or to score is an error (it was a traceback)."""
    empty = write_lines(tmp_path / "empty.txt", [])
    result = cli("translate", corpus_run.path, "--input", empty)
    assert (result.status, result.out, result.err) == (0, "", "")
    assert_refused(cli("translate", corpus_run.path, "--input", empty, "--plot", tmp_path / "a.png"), "--plot")
    assert not (tmp_path / "a.png").exists()
    assert_refused(cli("evaluate", corpus_run.path, empty, empty), "hold no lines")


# --- a built-in task's run ---------------------------------------------------------------------------


def test_translate_prints_and_plots(dates_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "attention.png"
    assert main(["translate", str(dates_run), "21 November 2026", "4 July 1976", "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["translate", str(dates_run), "21 November 2026", "--beam", "3"]) == 0


def test_translation_exposes_every_layer_and_head(dates_run: Path) -> None:
    translation = Translator(dates_run).attention("21 Nov 2026")
    assert len(translation.cross_attention) == 1  # one decoder layer
    heads, rows, columns = translation.cross_attention[0].shape
    assert (heads, columns) == (2, len("21 Nov 2026"))
    assert rows == len(translation.target_tokens)
    np.testing.assert_allclose(translation.cross_attention[0].sum(-1), 1.0, atol=1e-5)


def test_unknown_characters_warn(dates_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", str(dates_run), "21 Novémber 2026"]) == 0
    assert "warning: text 1: 'é' not in the model's vocabulary, read as <unk>" in capsys.readouterr().err


# --- what the command is given --------------------------------------------------------------------------------


def test_the_output_is_never_the_input(corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]) -> None:
    path = write_lines(tmp_path / "in.txt", SAMPLES)
    before = path.read_bytes()
    assert_refused(cli("translate", corpus_run.path, "--input", path, "--output", path), "--output", "is --input")
    src, ref = write_lines(tmp_path / "test.de", SAMPLES), write_lines(tmp_path / "test.en", SAMPLES)
    assert_refused(cli("evaluate", corpus_run.path, src, ref, "--output", ref), "--output", "is REF")
    assert path.read_bytes() == before
    assert ref.read_bytes() == before


def test_a_directory_as_input_is_named_as_translation_input(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    result = cli("translate", corpus_run.path, "--input", tmp_path)
    assert_refused(result, "--input", "is a directory; give a text file, one sentence a line")
    assert "TSV" not in result.err


# --- int8 ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_quantized_linear_layers_translate_close_to_float32(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], dtype: str
) -> None:
    quantized = Translator(corpus_run.path, device="cpu", quantize=dtype)
    translations = quantized.translate(SAMPLES)
    assert quantized.loaded.layouts[quantized.model, "output"].kind == dtype  # what translated
    same = sum(a == b for a, b in zip(translations, corpus_run.translations, strict=True))
    assert same >= len(SAMPLES) - 1, (translations, corpus_run.translations)
    result = cli("translate", corpus_run.path, *SAMPLES, "--quantize", dtype, "--plot", tmp_path / "a.png")
    assert result.status == 0, result.err
    assert result.out_lines == translations
    assert (tmp_path / "a.png").is_file()


def test_int8_is_refused_off_the_cpu(corpus_run: CorpusRun, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = cli("translate", corpus_run.path, "Hallo", "--quantize", "int8", "--device", "cuda")
    assert_refused(result, "--quantize int8 runs on the CPU", "--device cpu")
    assert_refused(cli("translate", corpus_run.path, "Hallo", "--quantize", "int4"), "--quantize", "'int4'")


def int8_forms(translator: Translator) -> list[object]:
    from multihead.torch.layouts import Quantized

    return [form for m in translator.model.modules() if isinstance(m, Quantized) for form in m.forms.values()]


def test_int8_forms_are_kept_with_the_checkpoint_and_mapped_at_the_next_load(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    """The first ``--quantize int8`` load packs the forms, keeps them in the checkpoint (one file) and maps them from
    it, as the next load does without packing, translating the same; new weights (the weights file replaced) or a
    damaged file make them anew."""
    from multihead.torch.packed import storable

    if not storable():
        pytest.skip("this PyTorch cannot store oneDNN's packed int8 weights")
    run = corpus_run.copy(tmp_path / "run")
    checkpoint = latest_checkpoint(run)
    first = Translator(run, device="cpu", quantize="int8")
    (kept,) = checkpoint.glob("int8-*.safetensors")
    written = kept.stat().st_ino
    assert all(mapped_from(form.pages, kept) for form in int8_forms(first))  # not the heap copies it packed
    expected = first.translate(SAMPLES)
    again = Translator(run, device="cpu", quantize="int8")
    assert all(mapped_from(form.pages, kept) for form in int8_forms(again))
    assert kept.stat().st_ino == written  # mapped, not packed and written again
    assert again.translate(SAMPLES) == expected
    result = cli("translate", run, *SAMPLES, "--quantize", "int8")
    assert result.status == 0, result.err
    assert result.out_lines == expected
    command = [sys.executable, "-m", "multihead", "translate", str(run), SAMPLES[0], "--quantize", "int8"]
    alone = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines() == expected[:1]
    assert "deprecated" not in alone.stderr  # PyTorch's notice about int8 tensors, given where it is ignored
    weights = checkpoint / "model.safetensors"
    copy = tmp_path / "weights"
    copy.write_bytes(weights.read_bytes())
    copy.replace(weights)  # the same values in a new file: not known to be the weights the forms were made from
    replaced = Translator(run, device="cpu", quantize="int8")
    assert kept.stat().st_ino != written  # packed anew and written
    assert all(mapped_from(form.pages, kept) for form in int8_forms(replaced))
    assert replaced.translate(SAMPLES) == expected
    assert Translator(run, device="cpu", quantize="int8").translate(SAMPLES) == expected
    kept.write_bytes(kept.read_bytes()[:1000])
    assert Translator(run, device="cpu", quantize="int8").translate(SAMPLES) == expected
    assert all(mapped_from(form.pages, kept) for form in int8_forms(Translator(run, device="cpu", quantize="int8")))
    assert "warning" not in capsys.readouterr().err


def test_a_checkpoint_that_cannot_keep_int8_forms_warns_once_and_translates(
    corpus_run: CorpusRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import multihead.torch.packed as packed_module

    def refused(*args: object, **kwargs: object) -> None:
        raise OSError("cannot write 'int8-….safetensors': Read-only file system")

    monkeypatch.setattr(packed_module, "save_quantized", refused)
    run = corpus_run.copy(tmp_path / "run")
    for kept in latest_checkpoint(run).glob("int8-*"):  # kept by an earlier test's load
        kept.unlink()
    translations = [Translator(run, device="cpu", quantize="int8").translate(SAMPLES) for _ in range(2)]
    assert translations[0] == translations[1]
    err = capsys.readouterr().err
    assert err.count("warning: cannot keep the int8 forms for the next load") == 1, err
    assert "Read-only file system" in err
    assert "each load packs them anew" in err
    assert not list(latest_checkpoint(run).glob("int8-*"))


def test_output_is_written_as_it_is_done_and_resume_continues_it(
    corpus_run: CorpusRun, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--output FILE`` gets its lines a part at a time: an interruption keeps the parts done (exit 130), and
    ``--resume`` continues after the last complete line (an unfinished one dropped), to what one run writes."""
    import multihead.app.translate as translate_module

    monkeypatch.setattr(translate_module, "TRANSLATE_CHUNK", 3)
    lines = [SOURCES[i % len(SOURCES)] for i in range(10)]
    source, out = write_lines(tmp_path / "source.de", lines), tmp_path / "out.en"
    whole = cli("translate", corpus_run.path, "--input", source)
    assert whole.status == 0, whole.err
    calls = []
    translate_from = Translator.translate_from

    def interrupted(self: Translator, *args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return translate_from(self, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(Translator, "translate_from", interrupted)
        assert cli("translate", corpus_run.path, "--input", source, "--output", out).status == 130
    assert out.read_text().splitlines() == whole.out_lines[:6]  # two parts of three, done and durable
    with out.open("a") as handle:
        handle.write("an unfinished li")
    resumed = cli("translate", corpus_run.path, "--input", source, "--output", out, "--resume")
    assert resumed.status == 0, resumed.err
    assert "after its 6 lines, 4 texts left" in resumed.err
    assert out.read_text().splitlines() == whole.out_lines
    again = cli("translate", corpus_run.path, "--input", source, "--output", out, "--resume")
    assert (again.status, out.read_text().splitlines()) == (0, whole.out_lines)  # nothing left: as it was
    assert_refused(cli("translate", corpus_run.path, "--input", source, "--resume"), "--resume", "--output FILE")
    assert_refused(cli("translate", corpus_run.path, "--input", source, "--output", out, "--resume",
                       "--sampling-topk", "0"), "--resume continues greedy or beam search")  # fmt: skip
    write_lines(out, [*whole.out_lines, "one more"])
    assert_refused(cli("translate", corpus_run.path, "--input", source, "--output", out, "--resume"),
                   "holds 11 lines, more than the input's 10 texts")  # fmt: skip


def test_normalize_moses_reads_the_source_as_moses_normalizes_it(
    corpus_run: CorpusRun, cli: Callable[..., Cli]
) -> None:
    """``--normalize moses``: each source goes through Moses' punctuation normalizer (as ``MarianTokenizer`` applies
    it) before the model reads it: the translation of the normalized text."""
    from sacremoses import MosesPunctNormalizer

    odd = f"„{SOURCES[0][:-1]}“ ,  sagt er …"
    plain = MosesPunctNormalizer(lang="de").normalize(odd)
    assert plain != odd
    expected = Translator(corpus_run.path).translate([plain])
    assert Translator(corpus_run.path, normalize="moses").translate([odd]) == expected
    result = cli("translate", corpus_run.path, odd, "--normalize", "moses")
    assert (result.status, result.out_lines) == (0, expected)
    refused = cli("translate", corpus_run.path, odd, "--normalize", "nfkc")
    assert refused.status == 2
    assert "argument --normalize: invalid choice: 'nfkc'" in refused.err
