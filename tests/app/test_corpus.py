"""Parallel corpora in: two line-aligned files or a TSV file, plain or gzipped, and a validation set;
every bad corpus refused in one line, with status 2, before anything is written."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import multihead.app.corpus as corpus
import multihead.app.training as training
from app.support import PAIRS, SMALL, TRAIN, VALID, Cli, assert_refused, snapshot, write_corpus, write_lines
from multihead.app.batching import CorpusBatches
from multihead.app.console import UserError
from multihead.app.corpus import read_lines, read_parallel
from multihead.app.data import HELDOUT_SIZE, check_sides, is_heldout, load_corpus, survey
from multihead.app.options import TrainOptions
from multihead.app.runs import latest_checkpoint
from multihead.app.tokenizers import EOS, PAD


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


def numbered(count: int, start: int = 0) -> list[tuple[str, str]]:
    """``count`` different sentence pairs, ``start`` the first one's number."""
    return [(f"satz nummer {i} auf deutsch", f"sentence number {i} in english") for i in range(start, start + count)]


@pytest.mark.parametrize("count", [150, 1234, 2000])
def test_without_valid_a_tenth_is_held_out_and_never_trained_on(tmp_path: Path, count: int) -> None:
    pairs = PAIRS if count == len(PAIRS) else numbered(count)
    corpus = load_corpus(write_corpus(tmp_path, pairs))
    train = list(corpus.pairs())
    assert len(corpus.valid) == count // 10  # exactly a tenth (rounded down)
    assert len(set(corpus.valid)) == len(corpus.valid)
    assert corpus.valid == sorted(corpus.valid, key=pairs.index)  # in corpus order
    assert not set(corpus.valid) & set(train)
    assert sorted(train + corpus.valid) == sorted(pairs)


def test_both_directions_of_a_corpus_hold_out_the_same_pairs(tmp_path: Path) -> None:
    """An en→de run of a corpus validates on the pairs its de→en run validates on, never on its training pairs."""
    pairs = numbered(2000)
    swapped = [(target, source) for source, target in pairs]
    forward = load_corpus(write_corpus(tmp_path / "forward", pairs))
    de, en = write_corpus(tmp_path / "files", pairs)
    backward = load_corpus([en, de])  # the files the other way round
    tsv = write_lines(tmp_path / "backward.tsv", [f"{target}\t{source}" for source, target in pairs])
    assert [(t, s) for s, t in forward.valid] == backward.valid == load_corpus([str(tsv)]).valid
    assert set(backward.pairs()) == {(t, s) for s, t in forward.pairs()}
    assert load_corpus(write_corpus(tmp_path / "swapped", swapped)).valid == backward.valid


def test_every_copy_of_a_held_out_pair_is_left_out_of_training(tmp_path: Path) -> None:
    pairs = numbered(300) * 2 + numbered(100, start=300)  # 700 lines: 400 different pairs, 300 of them twice
    corpus = load_corpus(write_corpus(tmp_path, pairs))
    train = list(corpus.pairs())
    assert len(corpus.valid) == 70 == len(set(corpus.valid))  # a tenth of the lines, each pair once
    assert not set(corpus.valid) & set(train)
    assert len(train) == len(pairs) - sum(pairs.count(pair) for pair in corpus.valid)
    assert set(train) | set(corpus.valid) == set(pairs)


def test_a_small_corpus_holds_out_one_pair_and_a_large_one_a_thousand(tmp_path: Path) -> None:
    assert len(load_corpus(write_corpus(tmp_path / "five", numbered(5))).valid) == 1
    two = load_corpus(write_corpus(tmp_path / "two", numbered(1) * 5 + numbered(1, start=1) * 5))
    assert len(two.valid) == 1
    assert len(set(two.pairs())) == 1  # one pair is left to train on
    large = load_corpus(write_corpus(tmp_path / "large", numbered(12_345)))
    assert len(large.valid) == HELDOUT_SIZE == 1000
    assert sum(1 for _ in large.pairs()) == 12_345 - 1000
    with pytest.raises(UserError, match=r"need at least two different sentence pairs"):
        load_corpus(write_corpus(tmp_path / "one", numbered(1) * 20))


def test_no_held_out_pair_is_ever_in_a_training_batch(tmp_path: Path) -> None:
    pairs = numbered(600)
    options = TrainOptions(out=str(tmp_path / "run"), data=write_corpus(tmp_path, pairs), steps=1, tokenizer="word",
                           batch_tokens=400, **SMALL)  # fmt: skip
    run = training.Training(options)
    run.build()
    setup, batches = run.setup, run.batches
    assert isinstance(batches, CorpusBatches)
    heldout = set(setup.data.evaluation_pairs(None))
    assert len(heldout) == 60
    trained, step = [], 0
    while batches.epoch_of(step) < 1:  # every batch of the first epoch
        batch = batches.batch(step)
        for src, tgt in zip(batch.src, batch.tgt_out, strict=True):
            source = setup.source.decode(id for id in src.tolist() if id != PAD)
            trained.append((source, setup.target.decode(id for id in tgt.tolist() if id not in (PAD, EOS))))
        step += 1
    run.lock.release()
    assert len(trained) == 540 == len(set(trained))
    assert not heldout & set(trained)
    assert set(trained) | heldout == set(pairs)
    record = run.setup.prepared.facts
    assert record["heldout"] == "pairs"


def test_a_run_made_before_the_rule_was_recorded_keeps_its_held_out_pairs(tmp_path: Path) -> None:
    """Resuming a run made by a version that held out pairs by their source (and recorded no rule) goes on with
    those: the new rule would move its validation pairs into training."""
    pairs = numbered(400)
    data = write_corpus(tmp_path, pairs)
    options = TrainOptions(out=str(tmp_path / "run"), data=data, steps=1, tokenizer="word", batch_tokens=400, **SMALL)
    training.train(options)
    checkpoint = latest_checkpoint(tmp_path / "run")
    record = json.loads((checkpoint / "trainer.json").read_text(encoding="utf-8"))
    assert record["data"].pop("heldout") == "pairs"
    (checkpoint / "trainer.json").write_text(json.dumps(record), encoding="utf-8")
    old = training.Training(replace(options, steps=2, resume=True))
    old.build()
    old.lock.release()
    by_source = [pair for pair in pairs if is_heldout(pair[0])]
    assert old.setup.data.evaluation_pairs(None) == by_source != load_corpus(data).valid
    assert not set(by_source) & set(old.setup.data.pairs())
    assert len(old.setup.prepared.encoded) == len(pairs) - len(by_source)  # its encoding made again, by that rule
    assert "heldout" not in old.setup.prepared.facts  # and it stays a run of the old rule


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


def test_held_out_pairs_longer_than_the_model_reads_are_evaluated_not_fatal(
    tmp_path: Path, cli: Callable[..., Cli]
) -> None:
    """A validation pair longer than the model's positions (the corpus recipe's 256): its source is cut to what the
    model reads for BLEU, and the pair is left out of the validation loss, as training leaves such pairs out; the run
    trains, evaluates and resumes."""
    from app.support import CORPUS_FLAGS

    data = write_corpus(tmp_path / "corpus")
    long_pair = (" ".join(["Hund"] * 600), " ".join(["dog"] * 600))
    valid = write_corpus(tmp_path / "corpus", [*VALID[:5], long_pair], "valid")
    flags = [*CORPUS_FLAGS, "--eval-every", "2", "--no-progress"]
    result = cli("train", "--data", *data, "--valid", *valid, "--out", tmp_path / "run", "--steps", "2", *flags)
    assert result.status == 0, result.err
    evals = json.loads((latest_checkpoint(tmp_path / "run") / "trainer.json").read_text())["evals"]
    assert evals
    assert all(entry["examples"] == 6 and math.isfinite(entry["valid_loss"]) for entry in evals)
    resumed = cli("train", "--resume", "--out", tmp_path / "run", "--data", *data, "--valid", *valid, "--steps", "4")
    assert resumed.status == 0, resumed.err
