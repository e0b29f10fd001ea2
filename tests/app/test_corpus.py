"""Parallel corpora in: two line-aligned files or a TSV file, plain or gzipped, and a validation set;
every bad corpus refused in one line, with status 2, before anything is written."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest

import multihead.app.corpus as corpus
import multihead.app.training as training
from app.support import PAIRS, TRAIN, VALID, Cli, assert_refused, snapshot, write_corpus, write_lines
from multihead.app.console import UserError
from multihead.app.corpus import read_lines, read_parallel
from multihead.app.data import check_sides, load_corpus, survey


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_two_line_aligned_files(tmp_path: Path, gz: bool) -> None:
    assert read_parallel(write_corpus(tmp_path, gz=gz)) == TRAIN


def test_a_tab_inside_a_line_of_two_files_is_a_space(tmp_path: Path) -> None:
    """Multi30k's German training data has a line with a TAB: only the TSV format splits on it; in two files it is
    whitespace between words, not a symbol of the vocabulary."""
    pairs = [("ein\tHund", "a\tdog"), ("eine Katze", "a cat")]
    assert read_parallel(write_corpus(tmp_path, pairs), "--data") == [("ein Hund", "a dog"), ("eine Katze", "a cat")]


@pytest.mark.parametrize(("line", "column"), [("der Hund\t", "target"), ("\tthe dog", "source")])
def test_a_tsv_line_with_an_empty_column_is_named(tmp_path: Path, line: str, column: str) -> None:
    path = write_lines(tmp_path / "corpus.tsv", ["die Katze\tthe cat", line])
    with pytest.raises(UserError, match=rf"--data: '.*corpus.tsv' line 2: the {column} column is empty"):
        read_parallel([str(path)], "--data")


# --- what looks like a mistake: warned about, not refused -------------------------------------------------------


def warnings_of(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]


def test_one_text_on_both_sides_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (source, _) = write_corpus(tmp_path)
    corpus = load_corpus([source, source])
    check_sides(corpus, survey(corpus, 1000), [source, source], None)
    assert warnings_of(capsys) == [
        f"warning: --data {source} {source}: source and target are the same text on every line: the model will learn "
        "to copy"
    ]


@pytest.mark.parametrize("named", [True, False], ids=["by-file-names", "by-words"])
def test_a_validation_set_the_other_way_round_is_warned_about(
    tmp_path: Path, named: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    if named:
        data, valid = write_corpus(tmp_path), write_corpus(tmp_path, VALID, "valid")[::-1]
    else:
        data = [str(write_lines(tmp_path / "train.tsv", [f"{s}\t{t}" for s, t in TRAIN]))]
        valid = [str(write_lines(tmp_path / "valid.tsv", [f"{t}\t{s}" for s, t in VALID]))]
    check_sides(load_corpus(data, valid), survey(load_corpus(data, valid), 1000), data, valid)
    assert warnings_of(capsys) == [
        f"warning: --valid {' '.join(valid)} reads the other way round from --data {' '.join(data)}: source and "
        "target swapped? (validation scores, and the best checkpoint, would mean nothing)"
    ]
    right = valid[::-1] if named else [str(write_lines(tmp_path / "ok.tsv", [f"{s}\t{t}" for s, t in VALID]))]
    check_sides(load_corpus(data, right), survey(load_corpus(data, right), 1000), data, right)
    assert warnings_of(capsys) == []


def test_the_training_set_as_validation_set_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_corpus(tmp_path)
    check_sides(load_corpus(data, data), survey(load_corpus(data, data), 1000), data, data)
    assert warnings_of(capsys) == [
        f"warning: --valid {' '.join(data)} holds only training pairs: its scores will not say how the model does on "
        "new sentences"
    ]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_tsv_takes_the_first_two_columns(tmp_path: Path, gz: bool) -> None:
    lines = [
        "\ufeffder Hund läuft.\tthe dog runs.\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (x) & #2 (y)\r",
        "",  # blank lines are skipped
        "   ",
        "die Katze schläft.\tthe cat sleeps.",
        "das Kind singt.\tthe child sings.\t\t",
    ]
    path = write_lines(tmp_path / ("corpus.tsv.gz" if gz else "corpus.tsv"), lines)
    assert read_parallel([path]) == [
        ("der Hund läuft.", "the dog runs."),  # no BOM in the first source, no attribution, no CR
        ("die Katze schläft.", "the cat sleeps."),
        ("das Kind singt.", "the child sings."),
    ]


def test_valid_names_the_validation_set(tmp_path: Path) -> None:
    corpus = load_corpus(write_corpus(tmp_path), write_corpus(tmp_path, VALID, "valid"))
    assert list(corpus.pairs()) == TRAIN
    assert corpus.valid == VALID


def test_without_valid_a_tenth_is_held_out_and_never_trained_on(tmp_path: Path) -> None:
    corpus = load_corpus(write_corpus(tmp_path, PAIRS))
    train = list(corpus.pairs())
    assert corpus.valid
    assert train
    assert not {s for s, _ in corpus.valid} & {s for s, _ in train}
    assert sorted(train + corpus.valid) == sorted(PAIRS)
    assert 0.03 < len(corpus.valid) / len(PAIRS) < 0.2  # about a tenth


def _bad(tmp_path: Path, source: bytes, target: bytes, names: tuple[str, str] = ("a.de", "b.en")) -> list[Path]:
    paths = [tmp_path / name for name in names]
    for path, data in zip(paths, (source, target), strict=True):
        path.write_bytes(data)
    return paths


def _truncated_gz(tmp_path: Path) -> list[Path]:
    data = gzip.compress(b"".join(f"line {i}\n".encode() for i in range(2000)))
    return _bad(tmp_path, data[: len(data) // 2], b"x\n" * 2000, ("a.de.gz", "b.en"))


def _one_file(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "b.en", ["x"])


# case: (what the corpus is, what the one line must name)
BAD_CORPORA: dict[str, tuple[Callable[[Path], list[Path]], Callable[[Path], list[str]]]] = {
    "different-line-counts": (
        lambda d: _bad(d, b"a\nb\nc\n", b"x\ny\n"),
        lambda d: [f"'{d / 'a.de'}' has 3 lines", f"'{d / 'b.en'}' has 2"],
    ),
    "invalid-utf8": (lambda d: _bad(d, b"a\nb\n", b"x\n\xff\xfe\n"), lambda d: [f"'{d / 'b.en'}' line 2", "UTF-8"]),
    "invalid-utf8-in-gz": (
        lambda d: _bad(d, gzip.compress(b"a\nb\nc\xe4\n"), b"x\ny\nz\n", ("a.de.gz", "b.en")),
        lambda d: [f"'{d / 'a.de.gz'}' line 3", "UTF-8"],
    ),
    "empty-on-one-side": (
        lambda d: _bad(d, b"a\n\nc\n", b"x\ny\nz\n"),
        lambda d: ["line 2", f"empty in '{d / 'a.de'}'", f"not in '{d / 'b.en'}'"],
    ),
    "tsv-empty-side": (lambda d: [write_lines(d / "c.tsv", ["a\tx", "\ty"])], lambda d: [f"'{d / 'c.tsv'}' line 2"]),
    "truncated-gz": (_truncated_gz, lambda d: [f"'{d / 'a.de.gz'}'", "truncated"]),
    "missing-file": (lambda d: [d / "a.de", _one_file(d)], lambda d: [f"'{d / 'a.de'}'", "does not exist"]),
    "directory": (lambda d: [d, _one_file(d)], lambda d: [f"'{d}'", "is a directory"]),
}


@pytest.mark.parametrize("flag", ["--data", "--valid"])
@pytest.mark.parametrize("case", list(BAD_CORPORA))
def test_bad_corpora_are_refused_in_one_line_before_anything_is_written(
    case: str, flag: str, tmp_path: Path, cli: Callable[..., Cli], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training, "make_trainer", lambda *args: pytest.fail("training started"))
    inputs, good = tmp_path / "inputs", tmp_path / "good"
    inputs.mkdir()
    make, named = BAD_CORPORA[case]
    paths = make(inputs)
    good_paths = write_corpus(good)
    corpora = {"--data": paths, "--valid": good_paths} if flag == "--data" else {"--data": good_paths, "--valid": paths}
    before = snapshot(tmp_path)
    out = tmp_path / "run"
    result = cli("train", "--data", *corpora["--data"], "--valid", *corpora["--valid"], "--out", out, "--steps", "1")
    assert_refused(result, f"{flag}: ", *named(inputs))
    assert snapshot(tmp_path) == before  # no run directory, nothing else
    assert result.out == ""


def test_a_corpus_of_three_files_is_refused(tmp_path: Path, cli: Callable[..., Cli]) -> None:
    paths = [*write_corpus(tmp_path), str(tmp_path / "train.de")]
    assert_refused(cli("train", "--data", *paths, "--out", tmp_path / "run", "--steps", "1"), "--data", "3 paths")
    assert not (tmp_path / "run").exists()


def test_tsv_byte_order_mark_is_not_part_of_the_first_source(tmp_path: Path) -> None:
    path = tmp_path / "bom.tsv"
    path.write_bytes("\ufeffa\tb\nc\td\n".encode())
    assert read_parallel([path])[0] == ("a", "b")


@pytest.mark.parametrize("block", [1, 7, 1 << 22])
def test_lines_are_the_same_whatever_the_block_they_are_read_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    monkeypatch.setattr(corpus, "BLOCK", block)
    text = "\ufeffeins\r\nzwei ü\n\n  drei\r\r\nvier ohne Zeilenende"
    path = tmp_path / "lines.txt.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    assert read_lines(path, "--data") == ["eins", "zwei ü", "", "  drei", "vier ohne Zeilenende"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"gut\nauch gut\nschlecht \xff hier\nwieder gut\n")
    with pytest.raises(UserError, match=r"bad.txt' line 3 is not UTF-8 text"):
        read_lines(bad, "--data")
