"""The ``multihead`` command line: train, translate, evaluate, demo, bench.

User errors (unknown task, an unreadable corpus, an unusable output directory, a run that is not ours or is
damaged beyond recovery, a file the system refuses to read or write) are one line on stderr with exit status 2,
worded with the flags the user typed; set ``MULTIHEAD_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multihead import __version__
from multihead.app.console import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    HelpFormatter,
    OneLineErrorParser,
    UserError,
    is_main_rank,
    quiet_frameworks,
    report_error,
    say,
)

if TYPE_CHECKING:
    from multihead.app.training import Result

DEMO_EXAMPLES = ("21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021")


# --- train ------------------------------------------------------------------------------------------------


def _report(result: Result, out: str) -> int:
    if result.interrupted:
        say(f"interrupted at step {result.step}: checkpoint saved in {out}; continue with --resume", sys.stderr)
        return EXIT_INTERRUPTED
    if result.accuracy is not None:
        say(f"accuracy: {result.accuracy:.3f} (exact match on {result.heldout} held-out examples)")
    if result.scores is not None:
        scores = result.scores
        say(
            f"bleu: {scores['bleu']:.2f}, chrf: {scores['chrf']:.2f} (sacreBLEU, greedy, on {scores['examples']} "
            f"validation sentences; checkpoint {result.checkpoint}: translate and evaluate use it by default)"
        )
    return 0


def _train(args: argparse.Namespace) -> int:
    from multihead.app.options import train_options
    from multihead.app.training import train

    result = train(train_options(args))
    return _report(result, args.out) if is_main_rank() else 0


# --- translate, evaluate ----------------------------------------------------------------------------------


def _read_input(path: str) -> list[str]:
    from multihead.app.corpus import read_lines, read_stdin_lines

    return read_stdin_lines("--input") if path == "-" else read_lines(path, "--input")


def _write_output(path: str | None, lines: Sequence[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path is None:
        sys.stdout.write(text)
        return
    from multihead.files import atomic_write

    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _check_targets(**targets: str | None) -> None:
    """Each ``--flag FILE`` the command will write can be written: checked before the model loads and translates."""
    from multihead.files import check_file_target

    for name, target in targets.items():
        flag = "--" + name
        if target is not None:
            try:
                check_file_target(target, flag)
            except ValueError as error:
                raise UserError(str(error).replace(f"`{flag}`", flag)) from None


def _translate(args: argparse.Namespace) -> int:
    if bool(args.text) == (args.input is not None):
        raise UserError("give the texts to translate, or --input FILE (- for stdin), not both")
    _check_targets(plot=args.plot, output=args.output)
    texts = args.text or _read_input(args.input)
    if args.plot and not texts:
        raise UserError(f"--plot: nothing to plot, --input {args.input} holds no lines")
    names = (
        [f"text {i + 1}" for i in range(len(texts))]
        if args.text
        else [f"--input line {i + 1}" for i in range(len(texts))]
    )
    from multihead.app.translate import Translator

    translator = Translator(args.run, args.checkpoint)
    translations = translator.translate(
        texts, beam=args.beam, length_penalty=args.length_penalty, names=names, progress=sys.stderr.isatty()
    )
    _write_output(args.output, translations)
    if args.plot:
        from multihead.app.plot import plot_cross_attention

        path = plot_cross_attention(translator.attention(texts[0], beam=args.beam), args.plot)
        print(f"attention plot: {path}", file=sys.stderr)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from multihead.app.corpus import read_lines
    from multihead.app.evaluate import score
    from multihead.app.translate import Translator

    _check_targets(output=args.output)
    sources, references = read_lines(args.src, "SRC"), read_lines(args.ref, "REF")
    if len(sources) != len(references):
        raise UserError(
            f"SRC {args.src!r} has {len(sources)} lines but REF {args.ref!r} has {len(references)}; "
            "they must be line-aligned"
        )
    if not sources:
        raise UserError(f"SRC {args.src!r} and REF {args.ref!r} hold no lines: nothing to evaluate")
    translator = Translator(args.run, args.checkpoint)
    begin = time.perf_counter()
    hypotheses = translator.translate(
        sources, beam=args.beam, length_penalty=args.length_penalty,
        names=[f"SRC line {i + 1}" for i in range(len(sources))], progress=sys.stderr.isatty(),
    )  # fmt: skip
    seconds = time.perf_counter() - begin
    if args.output:
        _write_output(args.output, hypotheses)
    scores = score(hypotheses, references)
    print(f"BLEU {scores['bleu']:.2f} ({scores['signature']['bleu']})")
    print(f"chrF {scores['chrf']:.2f} ({scores['signature']['chrf']})")
    print(f"{len(sources)} sentences in {seconds:.1f} s ({len(sources) / seconds:.1f} sentences/s), beam {args.beam}")
    summary = {
        **scores, "sentences": len(sources), "seconds": round(seconds, 3), "beam": args.beam,
        "checkpoint": translator.checkpoint.path.name,
    }  # fmt: skip
    print(json.dumps(summary, sort_keys=True))
    return 0


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
    options = TrainOptions(out=args.out, task="dates", steps=args.steps, resume=existing, progress=not args.no_progress)
    status = _report(train(options), args.out)
    if status:
        return status
    translator = Translator(args.out)
    for text, translation in zip(DEMO_EXAMPLES, translator.translate(DEMO_EXAMPLES), strict=True):
        print(f"  {text!r} -> {translation!r}")
    path = plot_cross_attention(translator.attention(DEMO_EXAMPLES[0]), attention_plot(out))
    print(f"cross-attention of every layer and head: {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from multihead.app.bench import main as bench_main

    return bench_main(args.options)


# --- the parser -------------------------------------------------------------------------------------------

RUN_HELP = "run directory written by multihead train"


def _command(commands: argparse._SubParsersAction, name: str, handler: Any, **kwargs: Any) -> argparse.ArgumentParser:
    command = commands.add_parser(name, formatter_class=HelpFormatter, **kwargs)
    command.set_defaults(handler=handler)
    return command


def _add_train(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import add_train_arguments, resume_epilog

    train = _command(
        commands, "train", _train, help="train a translation Transformer on a built-in task or a parallel corpus",
        description="Train a translation Transformer; checkpoints go to --out. Ctrl-C saves a checkpoint and stops; "
        "--resume continues the newest intact one. Under torchrun it trains data-parallel. Defaults are a recipe "
        "for the kind of data: small and quick for a built-in task; for --data, the paper's recipe sized for "
        "~30k sentence pairs on a CPU (see docs/translation.md).",
        epilog=resume_epilog(),
    )  # fmt: skip
    add_train_arguments(train)


def _add_decoding_options(command: argparse.ArgumentParser) -> None:
    """What ``translate`` and ``evaluate`` share: the checkpoint and the search."""
    from multihead.app.options import POSITIVE, POSITIVE_NUMBER

    command.add_argument(
        "--checkpoint", metavar="WHICH",
        help="latest, best, average or step-N (default: best if the run has one, else latest)",
    )  # fmt: skip
    command.add_argument("--beam", type=POSITIVE.parse, default=1, help="beam size (1: greedy)")
    command.add_argument("--length-penalty", type=POSITIVE_NUMBER.parse, default=0.6, help="beam scores / length^this")


def _add_translate(commands: argparse._SubParsersAction) -> None:
    translate = _command(
        commands, "translate", _translate, help="translate texts or a file with a trained run",
        description="Translate each TEXT, or each line of --input, in order; one translation per line.",
    )  # fmt: skip
    translate.add_argument("run", help=RUN_HELP)
    translate.add_argument("text", nargs="*", help="texts to translate")
    translate.add_argument("--input", metavar="FILE", help="translate each line of FILE (plain or .gz; - for stdin)")
    translate.add_argument("--output", metavar="FILE", help="write the translations here (default: stdout)")
    translate.add_argument("--plot", metavar="PATH", help="save the first text's cross-attention maps (PNG)")
    _add_decoding_options(translate)


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    evaluate = _command(
        commands, "evaluate", _evaluate, help="translate SRC and score it against REF with sacreBLEU (BLEU, chrF)",
        description="Translate SRC and score against REF with sacreBLEU; the last line of stdout is a JSON object "
        "with bleu, chrf, signature, sentences and seconds (the translation time).",
    )  # fmt: skip
    evaluate.add_argument("run", help=RUN_HELP)
    evaluate.add_argument("src", help="source sentences, one per line (plain or .gz)")
    evaluate.add_argument("ref", help="reference translations, line-aligned with SRC")
    evaluate.add_argument("--output", metavar="FILE", help="also write the translations here")
    _add_decoding_options(evaluate)


def _add_demo(commands: argparse._SubParsersAction) -> None:
    from multihead.app.options import POSITIVE

    demo = _command(
        commands, "demo", _demo,
        help="train the dates task, translate three examples and plot the attention (make demo)",
    )  # fmt: skip
    demo.add_argument("--out", default="runs/dates", help="run directory (resumed when it holds the demo's run)")
    demo.add_argument("--steps", type=POSITIVE.parse, default=1500, help="training steps")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_bench(commands: argparse._SubParsersAction) -> None:
    commands.add_parser(
        "bench",
        help="time our attention against its peers, each run in a fresh process (make bench)",
        add_help=False,  # `multihead bench --help` shows the benchmark's own options
    ).set_defaults(handler=_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="multihead", description="The Transformer's attention from scratch: train, translate, look inside."
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for add in (_add_train, _add_translate, _add_evaluate, _add_demo, _add_bench):
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_frameworks()
    parser = build_parser()
    # `bench` hands every option on, in order, to the benchmark's own parser.
    args, passed_on = parser.parse_known_args(argv)
    if args.command == "bench":
        args.options = passed_on
    elif passed_on:
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.handler(args)
    except KeyboardInterrupt:  # outside the training loop, which saves first and returns normally
        say("multihead: interrupted", sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OSError) as error:  # UserError and RunError are ValueErrors
        if os.environ.get("MULTIHEAD_DEBUG"):
            raise
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        report_error(f"multihead: error: {message}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
