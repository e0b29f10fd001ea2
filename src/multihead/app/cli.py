"""The ``multihead`` command line: train, translate, evaluate, score, average, export, import, serve, demo, bench.

User errors (unknown task, an unreadable corpus, an unusable output directory, a run that is not ours or is
damaged beyond recovery, a file the system refuses to read or write) are one line on stderr with exit status 2,
worded with the flags the user typed. Anything else is a bug of ours, said in one line with exit status 1. Set
``MULTIHEAD_DEBUG=1`` to see the traceback of either instead. Output into a pipe closed early (``| head``) ends
quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihead import __version__
from multihead.app.console import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    HelpFormatter,
    OneLineErrorParser,
    UserError,
    is_main_rank,
    plural,
    quiet_frameworks,
    report_error,
    say,
    warn,
)
from multihead.app.languages import BLEU_TOKENIZERS, bleu_tokenize_choice, bleu_tokenizer, pair_text
from multihead.app.segment import not_text

if TYPE_CHECKING:
    from multihead.app.documents import Format
    from multihead.app.keep import Keep
    from multihead.app.training import Result
    from multihead.app.translate import Translator

DEMO_EXAMPLES = ("21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021")
DEMO_STEPS = 1500
DEMO_TIME = "about 2 minutes on 2 CPU cores of an AMD EPYC"
"""How long ``make demo`` takes from scratch (``DEMO_STEPS`` steps, their evaluations, the final one, the examples and
the plot), as measured on this project's machine: ``demo --help`` says it, README.md quotes it word for word and
README.zh-CN.md its minutes (a test checks both)."""


# --- train ------------------------------------------------------------------------------------------------


def _report(result: Result, out: str, again: Sequence[str]) -> int:
    """Say how training ended; ``again``: the command line that continues the run (it is named when interrupted)."""
    if result.interrupted:
        say(f"interrupted at step {result.step}: checkpoint saved in {out}; to continue, run: {shlex.join(again)}",
            sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    if result.summary is not None:
        say(result.summary)
    return 0


def _train(args: argparse.Namespace) -> int:
    from multihead.app.options import continuing_command, train_options
    from multihead.app.training import train

    result = train(train_options(args))
    return _report(result, args.out, continuing_command(args)) if is_main_rank() else 0


# --- translate, evaluate ----------------------------------------------------------------------------------


def _read_input(path: str) -> list[str]:
    from multihead.app.corpus import read_lines, read_stdin_lines

    return (
        read_stdin_lines("--input") if path == "-" else read_lines(path, "--input", "a text file, one sentence a line")
    )


def _write_output(path: str | None, lines: Sequence[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
        return
    from multihead.files import atomic_write_text

    atomic_write_text(path, text)


def _check_targets(read: dict[str, str | None], **targets: str | None) -> None:
    """Each ``--flag FILE`` the command will write can be written (its directory exists and the system lets us write
    there), and is none of the files it reads (``read``: how each is named): checked before the model loads and
    translates."""
    from multihead.files import check_file_target

    for name, target in targets.items():
        flag = "--" + name
        if target is None:
            continue
        try:
            check_file_target(target, flag)
        except ValueError as error:
            raise UserError(str(error).replace(f"`{flag}`", flag)) from None
        except OSError as error:
            raise UserError(f"{flag}: {error}") from None
        for what, path in read.items():
            if (
                path not in (None, "-")
                and Path(path).exists()
                and Path(target).exists()
                and os.path.samefile(path, target)
            ):
                raise UserError(
                    f"{flag} {target} is {what} {path}: writing it would overwrite what is read; choose another {flag}"
                )


def _translation_input(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The texts to translate and how messages name each: the TEXT arguments, the lines of ``--input``, or, with
    neither, the lines piped into standard input."""
    if args.text and args.input is not None:
        raise UserError("give the texts to translate or --input FILE, not both")
    if args.text:
        for number, text in enumerate(args.text, start=1):
            if not text.strip():
                raise UserError(f"nothing to translate: text {number} is empty")
            if (problem := not_text(text)) is not None:
                raise UserError(f"text {number} is not UTF-8 text: it holds {problem}")
        return args.text, [f"text {number}" for number in range(1, len(args.text) + 1)]
    lines = _read_input("-" if args.input is None else args.input)
    name = "--input line" if args.input is not None else "standard input line"
    return lines, [f"{name} {number}" for number in range(1, len(lines) + 1)]


def _ensembled(args: argparse.Namespace) -> list[str]:
    """The runs after ``translate``'s RUN that ensemble with it: the TEXT arguments that name directories, up to the
    first that does not (taken out of ``args.text``). ``--plot`` and ``--html``, one model's attention, refused with
    them."""
    others = []
    while args.text and os.path.isdir(args.text[0]):  # False for "" and for what no path can be
        others.append(args.text.pop(0))
    if others and (args.plot or args.html):
        raise UserError(f"{'--plot' if args.plot else '--html'} draws one model's attention: give one run, not an "
                        f"ensemble of {len(others) + 1}")  # fmt: skip
    return others


def _checkpoints(translator: Translator) -> str:
    """Which checkpoint translates (``checkpoint best``), or, in an ensemble, each run's."""
    if len(translator.runs) == 1:
        return f"checkpoint {translator.checkpoint.path.name}"
    members = ", ".join(f"{run.path.parents[1]} ({run.path.name})" for run in translator.runs)
    return f"an ensemble of {len(translator.runs)} runs: {members}"


def _languages(translator: Translator) -> str:
    """What the run translates, as ``translate`` and ``evaluate`` say it: its languages (and its model's codes of
    them, NLLB's ``kor_Hang`` for ``ko``), or its built-in task."""
    task = translator.checkpoint.options.get("task")
    return pair_text(translator.langs, task=task, tokens=translator.language_tokens)


def _typed(args: argparse.Namespace) -> bool:
    """Whether ``translate`` translates lines as they are typed at a terminal (no TEXT, no ``--input``, standard input
    a terminal); the options that write what is translated, which need the texts first, refused with it."""
    if args.text or args.input is not None or not sys.stdin.isatty():
        return False
    for flag, value in (("--output", args.output), ("--plot", args.plot), ("--html", args.html)):
        if value:
            raise UserError(f"{flag} needs the texts before translating: give them, --input FILE, or pipe them "
                            "in (lines typed at a terminal are translated one by one, on stdout)")  # fmt: skip
    return True


def _translate_typed(translator: Translator, search: Any, n_best: int | None) -> int:
    """Translate each line typed at the terminal as soon as it is entered, its lines printed at once (as
    fairseq-interactive and marian do), until the end of the input (Ctrl-D)."""
    from multihead.app.translate import translated_lines

    say("type a text and press Enter to translate it; Ctrl-D ends", sys.stderr)
    for number, raw in enumerate(iter(sys.stdin.buffer.readline, b""), start=1):
        try:
            line = raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError as error:  # one line of the terminal's, not the end of the session
            warn(f"line {number} is not UTF-8 text ({error.reason} at byte {error.start}): not translated")
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        lines, _ = translated_lines(translator, [line], [f"line {number}"], search, n_best, first=number)
        sys.stdout.write("".join(out + "\n" for out in lines))
        sys.stdout.flush()
    return 0


def _document(args: argparse.Namespace) -> Format | None:
    """The document format of ``translate``'s ``--input`` (``--format``, else its extension; ``None``: a text file,
    a text a line), with the options that cannot go with a document refused before any work."""
    from multihead.app.documents import document_format

    if args.input is None:
        if args.format is not None:
            raise UserError(f"--format {args.format} names the format of --input FILE: give the file")
        return None
    found = document_format(args.input, args.format)
    if found is None:
        return None
    if args.text:
        raise UserError("give the texts to translate or --input FILE, not both")
    if args.output is None:
        raise UserError(f"--input {args.input!r} is a {found.name} document: give --output FILE, where its "
                        "translation is written (in the same format)")  # fmt: skip
    for flag, value in (("--n-best", args.n_best), ("--plot", args.plot), ("--html", args.html)):
        if value:
            raise UserError(f"{flag} is for texts, not for a {found.name} document (--input {args.input!r})")
    if not Path(args.input).is_file():
        raise UserError(f"--input {args.input!r} is not a file")
    if Path(args.output).resolve() == Path(args.input).resolve():
        raise UserError(f"--output {args.output!r} is --input: a document's translation never overwrites it")
    return found


def _translate_document(args: argparse.Namespace, found: Format, translator: Translator, search: Any) -> int:
    """``--input``, a document of the format ``found``, translated into ``--output`` (written once whole), its texts
    made durable a part at a time beside it, so that ``--resume`` goes on after an interruption
    (:class:`~multihead.app.documents.partial.Partial`)."""
    from multihead.app.console import progress_bar
    from multihead.app.documents import translate_document
    from multihead.app.documents.partial import Partial
    from multihead.app.options import search_text
    from multihead.app.translate import speed_text

    made_by = {name: getattr(args, name) for name in TERMINOLOGY_OPTIONS}
    made_by.update(runs=[str(run.path) for run in translator.runs], langs=translator.langs, search=search_text(search))
    partial = Partial(Path(args.input), Path(args.output), made_by, resume=args.resume)
    begin, bar = time.perf_counter(), progress_bar(None, unit="text")

    def translate(texts: list[str]) -> list[str]:
        return partial.translated(texts, lambda part: translator.translate(part, search=search), bar)

    count = translate_document(args.input, args.output, found, translate)
    bar.close()
    partial.remove()
    done = speed_text(count, "part", translator.tokens, time.perf_counter() - begin)
    say(f"translated {found.name} document {args.input} into {args.output}: {done}", sys.stderr)
    return 0


TERMINOLOGY_OPTIONS = ("glossary", "glossary_bonus", "keep", "no_keep_placeholders")
"""The options that change a document's translation beside the run and the search (what a resumed one must share)."""


def _translator_options(args: argparse.Namespace, others: list[str]) -> dict[str, Any]:
    """The :class:`~multihead.app.translate.Translator` ``translate`` asks for, but its run: checkpoint, device,
    precision, languages, normalizer, ensemble, splitting, guard, framework and terminology."""
    return {"checkpoint": args.checkpoint, "device": args.device, "quantize": args.quantize,
            "source_lang": args.source_lang, "target_lang": args.target_lang, "normalize": args.normalize,
            "ensemble": others, "split_sentences": not args.no_split, "guard": not args.no_guard,
            "framework": args.framework, **_terminology(args)}  # fmt: skip


def _check_resume(args: argparse.Namespace, search: Any) -> None:
    """``translate --resume`` refused in one line where it cannot continue: no ``--output``, ``--n-best``, sampling
    (and ``--actors``, which is for ``--ray``)."""
    if args.actors is not None:
        raise UserError(f"--actors {args.actors} is for --ray: the actors of a Ray job")
    if args.resume and (args.output is None or args.n_best is not None):
        raise UserError("--resume continues a translation into --output FILE (one line a text, no --n-best)")
    if args.resume and search.strategy.draws:
        raise UserError("--resume continues greedy or beam search: a sampled text draws as the ones before it did, "
                        "so translate the whole input again")  # fmt: skip


def _translate(args: argparse.Namespace) -> int:
    from multihead.app.options import check_min_length, search_options, search_text

    wide = {"beam_size": args.n_best} if args.n_best and args.beam_size is None else None  # the run's beams may be
    search = search_options(args, wide)  # the flags checked before any work; --n-best against the run's beams below
    others = _ensembled(args)
    if args.ray is not None:
        return _translate_on_ray(args, others)
    _check_resume(args, search)
    typed, document = _typed(args), _document(args)
    texts, names = ([], []) if typed or document else _translation_input(args)
    _check_targets({"--input": args.input}, plot=args.plot, output=args.output, html=args.html)
    for flag, value in (("--plot", args.plot), ("--html", args.html)):
        if value and not any(text.strip() for text in texts):
            raise UserError(f"{flag}: nothing to show, the input holds no text")
    from multihead.app.translate import Translator, speed_text, translate_into, translated_lines

    translator = Translator(args.run, **_translator_options(args, others))
    search = search_options(args, translator.checkpoint.search)  # the flags checked above, over the run's defaults
    check_min_length(search, translator.max_len)
    if sys.stderr.isatty():
        say(f"{_languages(translator)}, {_checkpoints(translator)}", sys.stderr)
    if document:
        return _translate_document(args, document, translator, search)
    if typed:
        return _translate_typed(translator, search, args.n_best)
    begin, count = time.perf_counter(), len(texts)
    if args.n_best is None and args.output is not None:  # a batch job: its lines written as they are done
        count = translate_into(args.output, texts, names, translator, search, resume=args.resume)
    else:
        lines, _ = translated_lines(translator, texts, names, search, args.n_best, progress=sys.stderr.isatty())
    seconds = time.perf_counter() - begin
    if args.n_best is not None or args.output is None:
        _write_output(args.output, lines)
    if texts and not args.text:  # a batch job: a file or a pipe
        done = speed_text(count, "sentence", translator.tokens, seconds)
        say(f"translated {done}, {search_text(search)}", sys.stderr)
    if args.html:
        from multihead.app.view import attention_view, write_page

        views = []
        for text, name in zip(texts, names, strict=True):
            if text.strip():
                try:
                    views.append(attention_view(translator.attention(text, search=search)))
                except UserError as error:
                    warn(f"--html leaves out {name}: {error}")
        print(f"attention page: {write_page(views, args.html)}", file=sys.stderr)
    if args.plot:
        from multihead.app.plot import plot_cross_attention

        first = next(text for text in texts if text.strip())
        path = plot_cross_attention(translator.attention(first, search=search), args.plot)
        print(f"attention plot: {path}", file=sys.stderr)
    return 0


RAY_MADE_BY = (
    "checkpoint",
    "quantize",
    "source_lang",
    "target_lang",
    "normalize",
    "no_split",
    "no_guard",
    "framework",
    "n_best",
    *TERMINOLOGY_OPTIONS,
)
"""The options of ``translate --ray`` that change its translations beside the runs and the search (what a resumed
job must share)."""


def _translate_on_ray(args: argparse.Namespace, others: list[str]) -> int:
    """``--input``'s shards translated into the folder ``--output`` on Ray (:mod:`multihead.app.raydata`), after
    every check: the options, the shards, the run's checkpoint and search."""
    import importlib.util

    from multihead.app.options import search_options, search_text
    from multihead.app.raydata import ShardJob, translate_shards
    from multihead.app.runs import open_checkpoint

    if importlib.util.find_spec("ray") is None:
        raise UserError("--ray needs Ray Data: pip install 'multihead[ray]'")
    inputs = _shards(args)
    for flag, value in (("TEXT", args.text), ("--plot", args.plot), ("--html", args.html), ("--format", args.format)):
        if value:
            raise UserError(f"--ray translates the lines of --input's shards: {flag} is not for it")
    options = _translator_options(args, others)
    checkpoint, _ = open_checkpoint(Path(args.run), args.checkpoint, lambda found: None)
    search = search_options(args, checkpoint.search)
    made_by = {name: getattr(args, name) for name in RAY_MADE_BY}
    made_by.update(runs=[str(Path(run).resolve()) for run in (args.run, *others)], search=search_text(search))
    job = ShardJob(inputs, Path(args.output), str(args.run), options, search, args.n_best, made_by,
                   address=args.ray or None, actors=args.actors, threads=args.threads or 1,
                   resume=args.resume)  # fmt: skip
    begin = time.perf_counter()
    tally = translate_shards(job)
    say(tally.text(time.perf_counter() - begin) if tally.shards else f"every shard is in {args.output} already",
        sys.stderr)  # fmt: skip
    return 0


def _shards(args: argparse.Namespace) -> list[Path]:
    """The shards ``--input`` names with ``--ray``: the files its pattern matches (``'shards/*.txt.gz'``, quoted),
    or a folder's files, in name order; refused where none, where one is a document, where two share a name (each
    gives its output its name) or where an output would be an input."""
    import glob

    if args.input is None or args.output is None:
        raise UserError("--ray translates the shards --input PATTERN matches into the folder --output FOLDER: give "
                        "both")  # fmt: skip
    pattern = Path(args.input)
    found = sorted(pattern.iterdir()) if pattern.is_dir() else sorted(map(Path, glob.glob(args.input)))
    inputs = [path for path in found if path.is_file() and not path.name.startswith(".")]
    if not inputs:
        raise UserError(f"--input {args.input!r} matches no file")
    from multihead.app.documents import document_format

    for path in inputs:
        document = document_format(path)
        if document is not None:
            raise UserError(f"--ray translates text files, a text a line: {str(path)!r} is a {document.name} document "
                            "(translate it with --input FILE --output FILE)")  # fmt: skip
    names = [path.name for path in inputs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError(f"--input {args.input!r}: shards in different folders share the name {twice[0]!r}; each "
                        "shard's translation takes its name in --output")  # fmt: skip
    folder = Path(args.output).resolve()
    if any(path.resolve().parent == folder for path in inputs):
        raise UserError(f"--output {args.output!r} holds the shards: their translations would replace them; choose "
                        "another folder")  # fmt: skip
    return inputs


def _without_final_blanks(lines: list[str]) -> list[str]:
    """``lines`` less the blank lines at the end (an editor's final empty line is not a sentence)."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _evaluate(args: argparse.Namespace) -> int:
    from multihead.app.corpus import read_lines
    from multihead.app.evaluate import score
    from multihead.app.options import check_min_length, search_options, search_text
    from multihead.app.translate import Translator, speed_text

    search, terminology = search_options(args), _terminology(args)
    _check_targets({"SRC": args.src, "REF": args.ref}, output=args.output)
    sources, references = (
        _without_final_blanks(read_lines(args.src, "SRC")),
        _without_final_blanks(read_lines(args.ref, "REF")),
    )
    if len(sources) != len(references):
        raise UserError(
            f"SRC {args.src!r} has {plural(len(sources), 'line')} but REF {args.ref!r} has {len(references)}; "
            "they must be line-aligned"
        )
    if not sources:
        raise UserError(f"SRC {args.src!r} and REF {args.ref!r} hold no lines: nothing to evaluate")
    translator = Translator(
        args.run[0], args.checkpoint, device=args.device, quantize=args.quantize, source_lang=args.source_lang,
        target_lang=args.target_lang, normalize=args.normalize, ensemble=args.run[1:],
        split_sentences=not args.no_split, guard=not args.no_guard, framework=args.framework, **terminology,
    )  # fmt: skip
    search = search_options(args, translator.checkpoint.search)  # the flags checked above, over the run's defaults
    check_min_length(search, translator.max_len)
    begin = time.perf_counter()
    hypotheses = translator.translate(
        sources, search=search, names=[f"SRC line {i + 1}" for i in range(len(sources))],
        progress=sys.stderr.isatty(),
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    if args.output:
        _write_output(args.output, hypotheses)
    langs = translator.langs
    scores = score(hypotheses, references, tokenize=args.bleu_tokenize or bleu_tokenizer(langs[1] if langs else None))
    print(f"BLEU {scores['bleu']:.2f} ({scores['signature']['bleu']})")
    print(f"chrF {scores['chrf']:.2f} ({scores['signature']['chrf']})")
    print(f"languages: {_languages(translator)}")
    if len(translator.runs) > 1:
        print(_checkpoints(translator))
    print(f"{speed_text(len(sources), 'sentence', translator.tokens, seconds)}, {search_text(search)}")
    summary = {
        **scores, "sentences": len(sources), "seconds": round(seconds, 3), "beam": search.beam_size,
        "checkpoint": translator.checkpoint.path.name, "langs": translator.langs,
        "runs": [{"run": str(run.path.parents[1]), "checkpoint": run.path.name} for run in translator.runs],
    }  # fmt: skip
    print(json.dumps(summary, sort_keys=True))
    return 0


def _score(args: argparse.Namespace) -> int:
    from multihead.app.corpus import read_lines, read_stdin_lines
    from multihead.app.translate import Translator, speed_text

    if args.src == "-" and args.hyp == "-":
        raise UserError("SRC and HYP cannot both be - (standard input): give one of them as a file")
    _check_targets({"SRC": args.src, "HYP": args.hyp}, output=args.output)
    sources, translations = (
        read_stdin_lines(name) if path == "-" else read_lines(path, name)
        for name, path in (("SRC", args.src), ("HYP", args.hyp))
    )
    while sources and translations and not sources[-1].strip() and not translations[-1].strip():
        sources, translations = sources[:-1], translations[:-1]  # no pair: a blank line at the end of both files
    if len(sources) != len(translations):
        raise UserError(
            f"SRC {args.src!r} has {plural(len(sources), 'line')} but HYP {args.hyp!r} has {len(translations)}; "
            "they must be line-aligned"
        )
    translator = Translator(
        args.run, args.checkpoint, device=args.device, quantize=args.quantize, source_lang=args.source_lang,
        target_lang=args.target_lang, normalize=args.normalize, framework=args.framework,
    )  # fmt: skip
    begin = time.perf_counter()
    scored = translator.score(
        sources, translations, names=[f"line {i + 1}" for i in range(len(sources))], progress=sys.stderr.isatty()
    )
    seconds = time.perf_counter() - begin
    _write_output(args.output, [f"{item.log_prob:.4f}\t{item.tokens}\t{item.mean:.4f}" for item in scored])
    say(f"scored {speed_text(len(sources), 'sentence pair', translator.tokens, seconds)}", sys.stderr)
    return 0


def _average(args: argparse.Namespace) -> int:
    from multihead.app.runs import averaged_checkpoints, save_average_run

    run, out = Path(args.run), Path(args.out)
    kept = averaged_checkpoints(run, last=args.last, names=args.checkpoints)
    save_average_run(run, kept, out)
    say(f"wrote {out}: the average of {', '.join(path.name for path in kept)} of {run} (translate with it as a run)")
    return 0


def _imported_search(search: dict[str, Any], eos_at_limit: bool) -> str:
    """How ``import`` names the run's default search (Transformers' with the model's generation config)."""
    penalty = f"length penalty {search['length_penalty']:g}"
    said = [f"beam {search['beam_size']}, {penalty}" if search["beam_size"] > 1 else f"greedy (--beam K: {penalty})"]
    said += [f"at most {search['max_length']} tokens"] if "max_length" in search else []
    said += ["EOS at the length limit"] if eos_at_limit else []
    said += [f"at least {search['min_length']} tokens"] if search.get("min_length") else []
    overriding = "translate --beam, --length-penalty, --max-length override it"
    return f"{', '.join(said)}, as Transformers' generate ({overriding})"


def _import(args: argparse.Namespace) -> int:
    from multihead.app.languages import LanguageTokens
    from multihead.app.pretrained import import_pretrained

    imported = import_pretrained(args.source, Path(args.run), langs=args.langs)
    config, source, target = imported.config, imported.source, imported.target
    print(f"imported {imported.source_name} into {imported.run}")
    print(
        f"  model: {imported.family} Transformer, {config.num_encoder_layers} encoder and "
        f"{config.num_decoder_layers} decoder layers, d_model {config.d_model}, {config.num_heads} heads, "
        f"feed-forward {config.d_ff} "
        f"({config.activation}), {_count(imported.parameters)} parameters, at most {config.max_len} tokens a side"
    )  # fmt: skip
    if config.tie_embeddings:
        print(f"  vocabulary: {len(source)} SentencePiece pieces, one for both sides")
    else:
        print(f"  vocabularies: source {len(source)}, target {len(target)} SentencePiece pieces")
    langs = pair_text(imported.langs) if imported.langs else "not recorded (import again with --langs SRC TGT)"
    print(f"  languages: {langs}")
    tokens = LanguageTokens.of(getattr(source, "vocabulary", {}), getattr(target, "vocabulary", {}))
    if tokens is not None:
        prefix = " ".join(source.pieces(getattr(source, "prefix", [])))
        opening = f"every source starts with {prefix}" if prefix else "no source starts with a language code"
        print(f"  {tokens.choosing()}; {opening}")
    generation = imported.generation
    if generation.banned or generation.forced:
        forced = " ".join(target.pieces(list(generation.forced)))
        said = [f"never {' or '.join(target.pieces(list(generation.banned)))}"] if generation.banned else []
        said += [f"every translation starts with {forced}"] if forced else []
        print(f"  generation: {', '.join(said)}")
    print(f"  default search: {_imported_search(imported.search, generation.eos_at_limit)}")
    print(f"translate with: {shlex.join(['multihead', 'translate', str(imported.run)])} TEXT...")
    return 0


def _count(number: int) -> str:
    """``74.4M``, or ``12,345`` below a million."""
    return f"{number / 1e6:.1f}M" if number >= 1_000_000 else f"{number:,}"


# --- demo, bench ------------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from multihead.app.options import TrainOptions
    from multihead.app.plot import plot_cross_attention
    from multihead.app.runs import attention_plot, has_checkpoints, trained_options
    from multihead.app.training import train
    from multihead.app.translate import Translator

    out = Path(args.out)
    existing = out.is_dir() and has_checkpoints(out)
    trained = trained_options(out) if existing else None
    if trained is not None and trained.get("task") != "dates":
        what = f"task {trained['task']!r}" if trained.get("task") else "a corpus"
        raise UserError(f"--out {args.out!r} holds a run of {what}, not the demo's dates; choose another --out")
    say(f"multihead {__version__} demo: train a Transformer to write dates as YYYY-MM-DD ({args.out})")
    options = TrainOptions(
        out=args.out, task="dates", steps=args.steps, resume=existing, progress=not args.no_progress, device=args.device
    )
    again = ["multihead", "demo", "--out", args.out]  # it resumes its run by itself: the same command, no --resume
    again += [*(["--steps", str(args.steps)] if args.steps != DEMO_STEPS else []),
              *(["--device", args.device] if args.device else [])]  # fmt: skip
    status = _report(train(options), args.out, again)
    if status:
        return status
    translator = Translator(args.out, device=args.device)
    for text, translation in zip(DEMO_EXAMPLES, translator.translate(DEMO_EXAMPLES), strict=True):
        print(f"  {text!r} -> {translation!r}")
    path = plot_cross_attention(translator.attention(DEMO_EXAMPLES[0]), attention_plot(out))
    print(f"cross-attention of every layer and head: {path}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from multihead.app.export import export

    out = export(args.run, args.out, checkpoint=args.checkpoint, quantization=args.quantization, format=args.format)
    if args.format == "multihead":
        say(f"wrote an {args.quantization} run to {out}: translate, evaluate, score and serve read it as any run")
    else:
        say(f"wrote a CTranslate2 model to {out} (how to translate with it: {out / 'README.md'})")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("multihead serve needs the serve extra: pip install 'multihead[serve]'") from None
    from multihead.app.options import check_min_length, search_options
    from multihead.app.serve import Limits, read_api_keys, serve

    search_options(args)  # the flags checked before any work

    def search(translator: Translator) -> Any:  # the flags over the first run's defaults (an imported model's)
        found = search_options(args, translator.checkpoint.search)
        check_min_length(found, translator.max_len)
        return found

    keys = read_api_keys(args.api_keys) if args.api_keys else None
    limits = Limits(
        char_limit=args.char_limit, batch_limit=args.batch_limit, req_limit=args.req_limit,
        alternatives_limit=args.alternatives_limit, api_keys=keys, timeout=args.timeout,
    )  # fmt: skip
    return serve(
        args.run, host=args.host, port=args.port, checkpoint=args.checkpoint, device=args.device,
        quantize=args.quantize, search=search, langs=args.langs, limits=limits, max_loaded=args.max_loaded,
        memory=args.memory, normalize=args.normalize, split_sentences=not args.no_split, guard=not args.no_guard,
        ensemble=args.ensemble, framework=args.framework, jobs=args.jobs, **_terminology(args, serving=True),
    )  # fmt: skip


def _bench(args: argparse.Namespace) -> int:
    from multihead.app.bench import main as bench_main

    return bench_main(args.options)


# --- the parser -------------------------------------------------------------------------------------------

RUN_HELP = "run directory written by multihead train"
ENSEMBLE_HELP = (
    "several runs of the same vocabularies (trained with --vocab-from one of them, or imports of one model for other "
    "pairs: the first run's pair is translated) translate as an ensemble: each step's log-probabilities averaged over "
    "their models, --checkpoint naming each run's checkpoint"
)


def _command(commands: argparse._SubParsersAction, name: str, handler: Any, **kwargs: Any) -> argparse.ArgumentParser:
    command = commands.add_parser(name, formatter_class=HelpFormatter, **kwargs)
    command.set_defaults(handler=handler)
    return command


def _add_train(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import add_train_arguments, resume_epilog

    train = _command(
        commands, "train", _train, help="train a translation Transformer on a built-in task or a parallel corpus",
        description="Train a translation Transformer on --task NAME or --data FILES for --steps N or --minutes M (one "
        "of them is required for a new run); checkpoints go to --out. Ctrl-C saves a checkpoint and stops; "
        "--resume continues the newest intact one. One process at a time trains a run directory. Under torchrun it "
        "trains data-parallel, one GPU per process. Defaults are a recipe for the kind of data and device: small "
        "and quick for a built-in task; for --data, the paper's recipe sized for ~30k sentence pairs on a CPU, or the "
        "paper's base model on a GPU (see docs/translation.md).",
        epilog=resume_epilog(),
    )  # fmt: skip
    add_train_arguments(train)


def _add_checkpoint_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--checkpoint", metavar="WHICH",
        help="latest, best, average or step-N (default: best if the run has one, else latest)",
    )  # fmt: skip


def _add_model_options(command: argparse.ArgumentParser) -> None:
    """What the commands that run a trained model share: which framework and where (``--framework``, ``--device``,
    ``--threads``, ``train``'s own options), which checkpoint, and in what precision."""
    from multihead.app.options import BY_NAME, RUN_DEVICE_HELP, RUN_FRAMEWORK_HELP, RUN_THREADS_HELP
    from multihead.config import QUANTIZED

    BY_NAME["framework"].add_to(command, help=RUN_FRAMEWORK_HELP)
    command.set_defaults(framework="torch")
    BY_NAME["device"].add_to(command, help=RUN_DEVICE_HELP)
    BY_NAME["threads"].add_to(command, help=RUN_THREADS_HELP)
    _add_checkpoint_option(command)
    command.add_argument(
        "--quantize", choices=QUANTIZED,
        help="compute the linear layers in int8 (weights per output feature, inputs as they come) or bf16 (fast on "
        "CPUs with bfloat16 instructions); the CPU only (default: float32, but int8 for an int8 run, which export "
        "--format multihead writes; docs/performance.md has speeds and BLEU)",
    )  # fmt: skip
    command.add_argument(
        "--normalize", choices=("moses",),
        help="normalize the source's punctuation first, as Moses' normalizer does (sacremoses; what MarianTokenizer "
        "applies, so that an imported OPUS-MT model reads what it was trained on; default: the text as it is)",
    )  # fmt: skip


def _add_language_options(command: argparse.ArgumentParser) -> None:
    """What ``translate``, ``evaluate`` and ``score`` take to choose another pair of a many-language model's
    languages than the run's."""
    from multihead.app.languages import language_code

    for flag, side in (("--source-lang", "source"), ("--target-lang", "target")):
        command.add_argument(
            flag, type=language_code, metavar="CODE",
            help=f"the {side} language, one of a many-language model's (an imported M2M100, NLLB-200 or "
            "multilingual OPUS-MT run's): an ISO code such as de, zh, zh-Hant or ko (NLLB's kor_Hang), never taken "
            "for another script or language, or the model's own such as zho_Hant (default: the run's)",
        )  # fmt: skip


def _add_glossary_option(command: argparse.ArgumentParser, *, serving: bool = False) -> None:
    """What ``translate``, ``evaluate`` and (``serving``) ``serve`` take to make translations use a glossary's
    terms."""
    from multihead.app.options import positive_number

    which = (
        "; read for every pair served directly (a pair the file has no terms of takes none, one through a pivot "
        "language neither), a request's own glossary field joining it" if serving else ""
    )  # fmt: skip
    command.add_argument(
        "--glossary", metavar="FILE",
        help="terms translations must use: a table whose header names the languages (de<TAB>en; .csv: commas), a "
        "row an entry, or a TBX termbase (.tbx), a concept an entry; each source term found in a sentence (a whole "
        "word, any case, the longest first) puts its target term, as written, in the translation (a constrained beam "
        f"search, one beam more than its terms; a term ending in a letter or digit stays a whole word){which}",
    )  # fmt: skip
    command.add_argument(
        "--glossary-bonus", type=positive_number, metavar="BONUS",
        help="prefer the glossary's terms instead of requiring them: each token of a term a translation writes adds "
        "BONUS to its log-probability (for languages that inflect terms; 1 to 3 is a start)",
    )  # fmt: skip


def _add_keep_options(command: argparse.ArgumentParser) -> None:
    """What ``translate``, ``evaluate`` and ``serve`` take to keep spans of the sources as they are in translations
    (``serve``: a request's own ``keep`` field joining them)."""
    command.add_argument(
        "--keep", action="append", metavar="REGEX",
        help="keep what this regular expression matches as it is, exactly once in the translation (repeatable); "
        "placeholders are kept without it: {name}, {{name}}, %%s, %%1$s, %%(name)s, ${name}, <x id=\"..\"/>, URLs "
        "and e-mail addresses",
    )  # fmt: skip
    command.add_argument(
        "--no-keep-placeholders", action="store_true",
        help="translate placeholders, URLs and e-mail addresses as text (only --keep's matches are kept)",
    )  # fmt: skip


def _terminology(args: argparse.Namespace, *, serving: bool = False) -> dict[str, Any]:
    """What the glossary and keep options ask of a translator (its ``glossary``, ``glossary_bonus`` and ``keep``),
    checked before any work: ``--glossary-bonus`` needs a glossary (``serving``: the server's, or a request's own)."""
    if args.glossary_bonus is not None and args.glossary is None and not serving:
        raise UserError(f"--glossary-bonus {args.glossary_bonus:g} needs --glossary FILE: terms to prefer")
    return {"glossary": args.glossary, "glossary_bonus": args.glossary_bonus, "keep": _keep(args)}


def _keep(args: argparse.Namespace) -> Keep | None:
    """The spans ``--keep`` and ``--no-keep-placeholders`` ask to keep (``None``: none), each regular expression
    refused in one line where it is not one, or matches an empty text."""
    from multihead.app.keep import Keep, keep_pattern

    try:
        keep = Keep(tuple(keep_pattern(regex) for regex in args.keep or ()), placeholders=not args.no_keep_placeholders)
    except ValueError as error:
        raise UserError(f"--keep {error}") from None
    return keep or None


def _add_decoding_options(command: argparse.ArgumentParser) -> None:
    """What ``translate``, ``evaluate`` and ``serve`` share: the model's options and the search."""
    from multihead.app.options import add_search_arguments

    _add_model_options(command)
    add_search_arguments(command)
    command.add_argument(
        "--no-split", action="store_true",
        help="translate each line whole, as one sentence (for input already split into sentences); by default a "
        "line is split into its sentences, each translated, and the translations joined with the line's spacing",
    )  # fmt: skip
    command.add_argument(
        "--no-guard", action="store_true",
        help="take each sentence's translation as the search finds it, as other engines do; by default one that looks "
        "as if it lost or invented words (it did not end, is far shorter or longer than its source, or repeats "
        "itself) is searched again with a beam of 4, then in halves, and named in a warning if it still does",
    )  # fmt: skip


def _add_translate(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import limit

    translate = _command(
        commands, "translate", _translate, help="translate texts or a file with a trained run",
        description="Translate each TEXT, or each line of --input FILE or of standard input (piped, when no TEXT is "
        "given), in order: one translation per line, a blank line for a blank line. A line longer than the model reads "
        "is translated in pieces split at sentence ends, with a warning. Translating a file or standard input ends "
        "with the speed on stderr (sentences/s, and target tokens/s: those generated, EOS included). Options may come "
        "before, between or after the run and the texts. With no TEXT and no --input at a terminal, each line is "
        "translated as it is typed, its translation printed at once (Ctrl-D ends), as fairseq-interactive and marian "
        "do.",
    )  # fmt: skip
    translate.add_argument("run", help=f"{RUN_HELP}; {ENSEMBLE_HELP}")
    translate.add_argument(
        "text", nargs="*",
        help="texts to translate (those right after RUN that name directories are the ensemble's other runs: give a "
        "text that names a directory through --input or standard input)",
    )  # fmt: skip
    translate.add_argument(
        "--input", metavar="FILE",
        help="translate each line of FILE (plain or .gz; - for stdin), or, for a document (see --format), the "
        "document, written whole to --output in its format",
    )  # fmt: skip
    translate.add_argument(
        "--format", metavar="NAME",
        help="the format of --input's document when its extension does not say it (.html, .docx, .srt...: "
        "see docs/documents.md)",
    )  # fmt: skip
    translate.add_argument(
        "--output", metavar="FILE",
        help="write the translations here, a part at a time as they are done (default: stdout)",
    )  # fmt: skip
    translate.add_argument(
        "--resume", action="store_true",
        help="continue an interrupted --output FILE after its last complete line (greedy or beam search)",
    )  # fmt: skip
    translate.add_argument("--plot", metavar="PATH", help="save the first text's cross-attention maps (PNG)")
    translate.add_argument(
        "--html", metavar="FILE",
        help="write every text's cross-attention as one standalone page (choose layer and head, point at a word)",
    )  # fmt: skip
    translate.add_argument(
        "--n-best", type=limit(1), metavar="N",
        help="the N best translations of each input, best first, from a beam at least N wide (--beam N or more: "
        "a narrower one is refused): N lines per input, each NUMBER<TAB>SCORE<TAB>TRANSLATION, NUMBER the input's "
        "(from 1), SCORE what ranks it, its log-probability (natural log, EOS included) / length^--length-penalty "
        "(--length-penalty 0: the log-probability, as multihead score gives it); a blank input gives one line with "
        "no score and no translation",
    )  # fmt: skip
    _add_ray_options(translate)
    _add_decoding_options(translate)
    _add_glossary_option(translate)
    _add_keep_options(translate)
    _add_language_options(translate)


def _add_ray_options(translate: argparse.ArgumentParser) -> None:
    from multihead.app.options import limit

    translate.add_argument(
        "--ray", nargs="?", const="", metavar="ADDRESS",
        help="translate the shards --input PATTERN matches (quoted: 'shards/*.txt.gz'; or a folder's files) on Ray "
        "Data into the folder --output, one file a shard under its name, each written whole once translated, "
        "recorded in the folder's manifest.jsonl (--resume goes on with the shards not yet done); on a new local Ray "
        "cluster, or ADDRESS's (auto: the running one, as ray start made it); --threads is each actor's (default 1)",
    )  # fmt: skip
    translate.add_argument(
        "--actors", type=limit(1), metavar="N",
        help="with --ray: how many actors translate, each holding the model (default: the cluster's CPUs over "
        "--threads, or its GPUs with --device cuda)",
    )  # fmt: skip


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    evaluate = _command(
        commands, "evaluate", _evaluate, help="translate SRC and score it against REF with sacreBLEU (BLEU, chrF)",
        description="Translate SRC and score against REF with sacreBLEU (blank lines at the end of either file are "
        "not sentences); the last line of stdout is a JSON object with bleu, bleu_lowercase, chrf, signature (of each "
        "score), sentences, seconds (the translation time), beam, checkpoint and langs (the run's languages, or null), "
        "and runs (each run's directory and checkpoint: several in an ensemble).",
    )  # fmt: skip
    evaluate.add_argument("run", nargs="+", metavar="RUN", help=f"{RUN_HELP}; {ENSEMBLE_HELP}")
    evaluate.add_argument("src", help="source sentences, one per line (plain or .gz)")
    evaluate.add_argument("ref", help="reference translations, line-aligned with SRC")
    evaluate.add_argument("--output", metavar="FILE", help="also write the translations here")
    evaluate.add_argument(
        "--bleu-tokenize", type=bleu_tokenize_choice, metavar="{" + ",".join(BLEU_TOKENIZERS) + "}",
        help="sacreBLEU's tokenizer (default: by the run's target language: zh for Chinese, ja-mecab for Japanese "
        "where installed, else char; 13a for the others)",
    )  # fmt: skip
    _add_decoding_options(evaluate)
    _add_glossary_option(evaluate)
    _add_keep_options(evaluate)
    _add_language_options(evaluate)


def _add_score(commands: argparse._SubParsersAction) -> None:
    score = _command(
        commands, "score", _score, help="the model's log-probability of given translations (for filtering, reranking)",
        description="Score each translation of HYP as a translation of the same line of SRC (line-aligned; blank lines "
        "at the end of both files are not pairs; one of them may be - for standard input): the model reads the "
        "source and BOS + the translation's tokens (teacher forcing, in batches of similar length) and predicts the "
        "translation's tokens + EOS. One line per pair, tab-separated: the log-probability of the translation (natural "
        "log, summed over its tokens, EOS included), its tokens (EOS included), and the log-probability per token. A "
        "side longer than the model reads is cut to what it reads (the tokens say how much was scored), a blank source "
        "scores nan, each with a warning. Ends with the speed on stderr.",
    )  # fmt: skip
    score.add_argument("run", help=RUN_HELP)
    score.add_argument("src", help="source sentences, one per line (plain or .gz; - for stdin)")
    score.add_argument("hyp", help="their translations, line-aligned with SRC (plain or .gz; - for stdin)")
    score.add_argument("--output", metavar="FILE", help="write the scores here (default: stdout)")
    _add_model_options(score)
    _add_language_options(score)


def _add_average(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import limit

    average = _command(
        commands, "average", _average, help="average checkpoints of a run into a new run directory",
        description="Average the weights of checkpoints of RUN (the --last N newest, or those --checkpoints names), as "
        "the paper does with its last checkpoints, into OUT, a new run directory that translate, evaluate, score, "
        "serve and export read as any run: its one checkpoint, checkpoints/average (which OUT/latest names), has the "
        "newest chosen checkpoint's config, tokenizers and training record (plus what was averaged) and no optimizer "
        "state, so training does not resume from it. OUT appears whole or not at all; an existing OUT is refused, "
        "never overwritten.",
    )  # fmt: skip
    average.add_argument("run", help=RUN_HELP)
    chosen = average.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--last", type=limit(1), metavar="N", help="the N newest step checkpoints the run keeps (2 or "
                        "more)")  # fmt: skip
    chosen.add_argument(
        "--checkpoints", nargs="+", metavar="NAME", help="these step checkpoints: step-N (or N), two or more"
    )
    average.add_argument("--out", required=True, help="the new run directory to write (it must not exist)")


def _add_import(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import BY_NAME

    command = _command(
        commands, "import", _import,
        help="make a run of a Hugging Face Marian (OPUS-MT's Helsinki-NLP/opus-mt-*), M2M100 or NLLB-200 model",
        description="Write RUN, a new run directory that translate, evaluate, score, serve and export read as any "
        "run, from SOURCE: a directory holding a Hugging Face Marian, M2M100 or NLLB-200 checkpoint as save_pretrained "
        "writes "
        "it (its config, weights as safetensors or pytorch_model.bin, SentencePiece models and vocabularies), or a "
        "Hub name such as Helsinki-NLP/opus-mt-de-en, downloaded with huggingface_hub (or found in its cache). The "
        "model computes what Transformers' MarianMTModel or M2M100ForConditionalGeneration computes; a model with "
        "anything multihead cannot compute exactly (learned positions, another activation...) is refused, naming "
        "the setting. An M2M100 or NLLB-200 run translates the pair --langs names (else its tokenizer's src_lang and "
        "tgt_lang). "
        "RUN "
        "appears whole or not at all; an existing RUN is refused, never overwritten. Fine-tune it on your corpus with "
        "multihead train --init RUN --data SRC TGT --out NEW.",
    )  # fmt: skip
    command.add_argument("source", help="a Marian, M2M100 or NLLB-200 checkpoint's directory, or a Hub name")
    command.add_argument("run", help="the run directory to write (it must not exist)")
    langs = BY_NAME["langs"]
    command.add_argument(
        langs.flag, dest=langs.name, type=langs.kind.parse, **langs.argparse,
        help="the languages the model translates, ISO 639-1 codes (default: read from the model's name, such as "
        "opus-mt-de-en, or from its tokenizer's settings; else none recorded). An M2M100 model translates this pair "
        "of its languages",
    )  # fmt: skip


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import BY_NAME, RUN_DEVICE_HELP, RUN_THREADS_HELP, limit

    demo = _command(
        commands, "demo", _demo,
        help="train the dates task, translate three examples and plot the attention (make demo)",
        description=f"Train a small Transformer to write dates as YYYY-MM-DD ({DEMO_TIME}), translate three dates "
        "and draw the cross-attention of every layer and head into OUT/attention.png. Ctrl-C saves a checkpoint; "
        "the same command run again resumes the run in --out (no --resume needed), and says from which step.",
    )  # fmt: skip
    demo.add_argument("--out", default="runs/dates", help="run directory (resumed when it holds the demo's run)")
    demo.add_argument("--steps", type=limit(1), default=DEMO_STEPS, help="training steps")
    BY_NAME["device"].add_to(demo, help=RUN_DEVICE_HELP)
    BY_NAME["threads"].add_to(demo, help=RUN_THREADS_HELP.replace("the process computes", "the demo computes"))
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_export(commands: argparse._SubParsersAction) -> None:
    from multihead.app.export import FORMATS, QUANTIZATIONS

    export = _command(
        commands, "export", _export,
        help="write a run's checkpoint as a CTranslate2 model directory, or as an int8 run",
        description="Write the run's checkpoint into OUT (a new directory): for CTranslate2 (--format ctranslate2, "
        "the default), its model and vocabularies, the run's tokenizer files and a README with the lines that "
        "translate with it (needs the export extra: pip install 'multihead[export]'); with --format multihead "
        "--quantization int8, a new run of that checkpoint alone, its weight matrices stored as int8 rows with a "
        "scale each (about a quarter of the size), which translate, evaluate, score and serve read as any run and "
        "compute in int8 on the CPU (on a GPU, or with --framework keras, in float32 from those values). OUT appears "
        "whole or not at all.",
    )  # fmt: skip
    export.add_argument("run", help=RUN_HELP)
    export.add_argument("out", help="the directory to write (it must not exist)")
    export.add_argument(
        "--format", choices=FORMATS, default="ctranslate2",
        help="ctranslate2 (a CTranslate2 model) or multihead (a run of our own, stored in --quantization int8)",
    )  # fmt: skip
    export.add_argument(
        "--quantization", choices=QUANTIZATIONS,
        help="the type the weights are stored in (default: float32); CTranslate2 may compute in another; "
        "--format multihead takes int8",
    )  # fmt: skip
    _add_checkpoint_option(export)


def _add_holding_options(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options of which runs hold their models, and of ensembles."""
    from multihead.app.options import byte_size, limit

    serve.add_argument(
        "--max-loaded", type=limit(1), metavar="N",
        help="hold the models of at most N runs at once: the least recently used idle one is released, and loaded "
        "again when a request needs it (default: every run's)",
    )  # fmt: skip
    serve.add_argument(
        "--memory", type=byte_size, metavar="SIZE",
        help="keep the server's resident memory within SIZE (4G, 1536M; powers of 1024): runs are held while they "
        "fit, the least recently used idle ones released to make room for a run a request needs; each run's cost is "
        "measured as it first loads, and a run that does not fit alone is refused at the start (Linux; default: no "
        "budget)",
    )  # fmt: skip
    serve.add_argument(
        "--ensemble", action="store_true",
        help="serve the runs as one ensemble (runs of the same vocabularies, as translate takes them): every step's "
        "log-probabilities averaged over their models, with the first run's pairs, tokenizers and search defaults",
    )  # fmt: skip


def _add_serve(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import BY_NAME, limit, port_number, seconds_limit

    serve = _command(
        commands, "serve", _serve, help="serve runs over LibreTranslate's HTTP API, with an attention page at /",
        description="Serve the runs over LibreTranslate's HTTP API (POST /translate, GET /languages, POST /detect, "
        "GET /health, GET /frontend/settings), so that LibreTranslate's clients work unchanged, and a page at / that "
        "translates and shows the cross-attention. Each request goes to the run that serves its source and target "
        "(--langs: the first run's pair, the page's default). Concurrent requests are translated together, a large "
        "text sharing the running batch with the short requests that come after it; the work of a client that "
        "disconnects is dropped. GET /health answers 503 when the translation worker has been stuck on one step for "
        "a minute. SIGINT or SIGTERM refuses new requests, answers those in flight (dropping them after 30 seconds) "
        "and exits 0. Needs the serve extra: pip install "
        "'multihead[serve]'. See docs/serving.md.",
    )  # fmt: skip
    serve.add_argument(
        "run", nargs="+", metavar="RUN",
        help="run directories (or directories holding runs), each serving its pairs; a pair two runs serve goes to "
        "the one named first, a pair none serves through English (or another language both legs share)",
    )  # fmt: skip
    _add_holding_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=port_number, default=5000, help="the port to listen on (0: a free one)")
    BY_NAME["langs"].add_to(
        serve,
        help="the first run's pair, ISO codes: the languages it translates where the run does not record them (a run "
        "of one recorded pair refuses another); of a many-language model (M2M100, NLLB-200, multilingual OPUS-MT), "
        "the pair the page opens with (default: the pair the run records)",
    )
    serve.add_argument("--char-limit", type=limit(-1), default=-1, help="characters per text (-1: no limit)")
    serve.add_argument("--batch-limit", type=limit(-1), default=-1, help="texts per request (-1: no limit)")
    serve.add_argument(
        "--req-limit", type=limit(-1), default=-1, help="requests per minute from one address (-1: no limit)"
    )
    serve.add_argument(
        "--alternatives-limit", type=limit(-1), default=4,
        help="alternative translations a request may ask for (-1: no limit; each widens the beam to one more)",
    )  # fmt: skip
    serve.add_argument("--api-keys", metavar="FILE", help="require one of the keys in FILE (one a line)")
    serve.add_argument("--jobs", metavar="DIR", help="keep the document jobs (POST /documents) in DIR, one server's: "
                       "started again on it, serve resumes them (default: a temporary one, gone at exit)")  # fmt: skip
    serve.add_argument(
        "--timeout", type=seconds_limit, default=-1, metavar="SECONDS",
        help="answer a request that takes longer with an error (503) and drop its work (-1: no limit; the work of a "
        "client that disconnects is dropped either way)",
    )  # fmt: skip
    _add_glossary_option(serve, serving=True)
    _add_keep_options(serve)
    _add_decoding_options(serve)


def _add_bench(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "bench",
        help="time our attention against its peers, each run in a fresh process (make bench)",
        add_help=False,  # `multihead bench --help` shows the benchmark's own options
    ).set_defaults(handler=_bench)


def build_parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _parsers() -> tuple[OneLineErrorParser, dict[str, OneLineErrorParser]]:
    """The command line's parser and each command's."""
    parser = OneLineErrorParser(
        prog="multihead", description="The Transformer's attention from scratch: train, translate, look inside."
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for add in (
        _add_train, _add_translate, _add_evaluate, _add_score, _add_average, _add_export, _add_import, _add_serve,
        _add_demo, _add_bench,
    ):  # fmt: skip
        add(commands)
    return parser, commands.choices


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line's arguments. A command's options may come before, between or after its positional arguments
    (argparse's intermixed parsing); ``bench`` hands every option on, in order, to the benchmark's own parser."""
    parser, commands = _parsers()
    if not argv or argv[0] not in commands:  # --version, --help, no command or an unknown one
        return parser.parse_args(argv)
    name, rest = argv[0], list(argv[1:])
    if name == "bench":
        return argparse.Namespace(command=name, handler=_bench, options=rest)
    args = commands[name].parse_intermixed_args(rest)
    args.command = name
    return args


def main(argv: Sequence[str] | None = None) -> int:
    quiet_frameworks()
    args = parse(sys.argv[1:] if argv is None else list(argv))
    if args.command is None:
        build_parser().print_help()
        return EXIT_USAGE
    try:
        if hasattr(args, "threads"):  # every command that runs a model has --threads
            from multihead.app.devices import choose_threads

            choose_threads(args.threads)
        status = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, rather than at exit
        return status
    except KeyboardInterrupt:  # outside the training loop, which saves first and returns normally
        say("multihead: interrupted", sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say, to anyone
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (UserError, OSError) as error:
        if os.environ.get("MULTIHEAD_DEBUG"):
            raise
        report_error(f"multihead: error: {_first_line(error)}")
        return EXIT_USAGE
    except Exception as error:  # a bug of ours
        if os.environ.get("MULTIHEAD_DEBUG"):
            raise
        report_error(
            f"multihead: internal error (a bug in multihead, not in what you typed): {type(error).__name__}: "
            f"{_first_line(error)} (MULTIHEAD_DEBUG=1 shows where; please report it)"
        )
        return EXIT_INTERNAL


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error).strip() else type(error).__name__


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not fail on the closed pipe too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
