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
from typing import TYPE_CHECKING

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
    from multihead.app.training import Result, TrainOptions

DEMO_EXAMPLES = ("21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021")


# --- argument types: their messages are what argparse prints after "argument --flag:" ----------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, received {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, received {text}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (0 or more), received {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number (0 or more), received {text}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, received {text!r}") from None


# --- train ------------------------------------------------------------------------------------------------


def _default(name: str) -> str:
    from multihead.app.training import RECIPES

    task, corpus = RECIPES["task"][name], RECIPES["corpus"][name]
    if task == corpus:
        return f"default: {task}"
    task = "the task's" if task is None else task
    corpus = "none" if corpus is None else corpus
    return f"default: {task} for a built-in task, {corpus} for --data"


def _train_options(args: argparse.Namespace) -> TrainOptions:
    from multihead.app.training import TrainOptions

    fields = (
        "task", "data", "valid", "framework", "steps", "minutes", "tokenizer", "vocab_size", "joint", "batch_size",
        "batch_tokens", "lr", "warmup", "clip", "label_smoothing", "d_model", "layers", "d_ff", "dropout",
        "eval_every", "eval_examples", "checkpoint_every", "keep", "average", "patience", "seed",
    )  # fmt: skip
    return TrainOptions(
        out=args.out, num_heads=args.heads, progress=not args.no_progress, resume=args.resume,
        **{name: getattr(args, name) for name in fields},
    )  # fmt: skip


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
    from multihead.app.training import train

    result = train(_train_options(args))
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
    from multihead.app.plot import plot_cross_attention
    from multihead.app.runs import CHECKPOINTS, RunError, has_checkpoints, read_json
    from multihead.app.training import TrainOptions, train
    from multihead.app.translate import Translator

    out = Path(args.out)
    existing = out.is_dir() and has_checkpoints(out)
    trained = None
    for checkpoint in sorted((out / CHECKPOINTS).glob("step-*"), reverse=True) if existing else ():
        try:  # what the newest readable checkpoint trained (resuming checks the rest, and warns)
            trained = read_json(checkpoint / "trainer.json")["options"]
            break
        except (RunError, KeyError, TypeError):
            continue
    if isinstance(trained, dict) and trained.get("task") != "dates":
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
    path = plot_cross_attention(translator.attention(DEMO_EXAMPLES[0]), out / "attention.png")
    print(f"cross-attention of every layer and head: {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from multihead.app.bench import main as bench_main

    return bench_main(args.options)


# --- the parser -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from multihead.app.data import TASKS
    from multihead.app.tokenizers import KINDS
    from multihead.app.training import FLAGS, RESUMABLE

    parser = OneLineErrorParser(
        prog="multihead", description="The Transformer's attention from scratch: train, translate, look inside."
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)

    train = commands.add_parser(
        "train",
        help="train a translation Transformer on a built-in task or a parallel corpus",
        formatter_class=HelpFormatter,
        description="Train a translation Transformer; checkpoints go to --out. Ctrl-C saves a checkpoint and stops; "
        "--resume continues the newest intact one. Under torchrun it trains data-parallel. Defaults are a recipe "
        "for the kind of data: small and quick for a built-in task; for --data, the paper's recipe sized for "
        "~30k sentence pairs on a CPU (see docs/translation.md).",
        epilog=f"--resume continues a run as it was built: it refuses options that would change the model or the data "
        f"(--task, --data, --valid, --tokenizer, --vocab-size, --joint-vocab, --d-model, --heads, --layers, --d-ff, "
        f"--dropout, --framework, --seed) and takes the run's values for those not given. These may change on "
        f"resume: {', '.join(FLAGS[name] for name in RESUMABLE)}.",
    )
    data = train.add_mutually_exclusive_group()
    data.add_argument("--task", metavar="NAME", help=f"built-in task: {', '.join(TASKS)} (default: dates)")
    data.add_argument("--data", nargs="+", metavar="FILE",
                      help="a parallel corpus: SRC TGT (two line-aligned files) or FILE.tsv; plain or .gz")  # fmt: skip
    train.add_argument("--valid", nargs="+", metavar="FILE", help="validation set for --data, as --data (default: a "
                       "held-out tenth of --data)")  # fmt: skip
    train.add_argument("--out", required=True, help="run directory for checkpoints (e.g. runs/dates)")
    train.add_argument("--framework", choices=("torch", "keras"), help="default: torch")
    train.add_argument("--steps", type=positive_int, help="total optimizer steps")
    train.add_argument("--minutes", type=number, help="stop after this much time (with --steps: first wins)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out")
    train.add_argument("--tokenizer", choices=KINDS, help=_default("tokenizer"))
    train.add_argument("--vocab-size", type=positive_int, help=f"subword vocabulary size ({_default('vocab_size')})")
    train.add_argument(
        "--joint-vocab", dest="joint", action=argparse.BooleanOptionalAction,
        help=f"one vocabulary for both languages, with tied embeddings ({_default('joint')})",
    )  # fmt: skip
    train.add_argument("--batch-size", type=positive_int, help=f"sentences per batch, tasks ({_default('batch_size')})")
    train.add_argument("--batch-tokens", type=positive_int,
                       help=f"padded tokens per batch, corpora ({_default('batch_tokens')})")  # fmt: skip
    train.add_argument("--lr", type=number, help=f"peak learning rate ({_default('lr')})")
    train.add_argument("--warmup", type=positive_int, help=f"warm-up steps, then 1/sqrt decay ({_default('warmup')})")
    train.add_argument("--clip", type=number, help=f"gradient norm clipping, 0: off ({_default('clip')})")
    train.add_argument("--label-smoothing", type=number, help=_default("label_smoothing"))
    train.add_argument("--d-model", type=positive_int, help=_default("d_model"))
    train.add_argument("--heads", type=positive_int, help=_default("num_heads"))
    train.add_argument("--layers", type=positive_int, help=f"encoder and decoder layers each ({_default('layers')})")
    train.add_argument("--d-ff", type=positive_int, help=_default("d_ff"))
    train.add_argument("--dropout", type=number, help=_default("dropout"))
    train.add_argument(
        "--eval-every", type=positive_int, help=f"evaluation interval in steps ({_default('eval_every')})"
    )
    train.add_argument("--eval-examples", type=positive_int,
                       help=f"held-out examples per evaluation ({_default('eval_examples')}: all)")  # fmt: skip
    train.add_argument("--checkpoint-every", type=positive_int, help=_default("checkpoint_every"))
    train.add_argument(
        "--keep", type=positive_int, help=f"step checkpoints kept, besides the best ({_default('keep')})"
    )
    train.add_argument(
        "--average", type=count, help=f"average the last N checkpoints at the end ({_default('average')})"
    )
    train.add_argument("--patience", type=count, help=f"stop after N evaluations without improvement, 0: never "
                       f"({_default('patience')})")  # fmt: skip
    train.add_argument("--seed", type=count, help=_default("seed"))
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=_train)

    def add_checkpoint_options(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--checkpoint", metavar="WHICH",
            help="latest, best, average or step-N (default: best if the run has one, else latest)",
        )  # fmt: skip
        command.add_argument("--beam", type=positive_int, default=1, help="beam size (1: greedy)")
        command.add_argument("--length-penalty", type=number, default=0.6, help="beam scores / length^this")

    translate = commands.add_parser(
        "translate", help="translate texts or a file with a trained run", formatter_class=HelpFormatter,
        description="Translate each TEXT, or each line of --input, in order; one translation per line.",
    )  # fmt: skip
    translate.add_argument("run", help="run directory written by multihead train")
    translate.add_argument("text", nargs="*", help="texts to translate")
    translate.add_argument("--input", metavar="FILE", help="translate each line of FILE (plain or .gz; - for stdin)")
    translate.add_argument("--output", metavar="FILE", help="write the translations here (default: stdout)")
    translate.add_argument("--plot", metavar="PATH", help="save the first text's cross-attention maps (PNG)")
    add_checkpoint_options(translate)
    translate.set_defaults(handler=_translate)

    evaluate = commands.add_parser(
        "evaluate", help="translate SRC and score it against REF with sacreBLEU (BLEU, chrF)",
        formatter_class=HelpFormatter,
        description="Translate SRC and score against REF with sacreBLEU; the last line of stdout is a JSON object "
        "with bleu, chrf, signature, sentences and seconds (the translation time).",
    )  # fmt: skip
    evaluate.add_argument("run", help="run directory written by multihead train")
    evaluate.add_argument("src", help="source sentences, one per line (plain or .gz)")
    evaluate.add_argument("ref", help="reference translations, line-aligned with SRC")
    evaluate.add_argument("--output", metavar="FILE", help="also write the translations here")
    add_checkpoint_options(evaluate)
    evaluate.set_defaults(handler=_evaluate)

    demo = commands.add_parser(
        "demo", help="train the dates task, translate three examples and plot the attention (make demo)",
        formatter_class=HelpFormatter,
    )  # fmt: skip
    demo.add_argument("--out", default="runs/dates", help="run directory (resumed when it holds the demo's run)")
    demo.add_argument("--steps", type=positive_int, default=1500, help="training steps")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(handler=_demo)

    bench = commands.add_parser(
        "bench",
        help="time our attention against its peers, each run in a fresh process (make bench)",
        add_help=False,  # `multihead bench --help` shows the benchmark's own options
    )
    bench.set_defaults(handler=_bench)
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
