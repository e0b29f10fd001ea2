"""The ``multihead`` command line: train, translate, demo.

User errors (unknown task, malformed TSV, unusable output directory, a run that is not ours, damaged or does not
fit, a file the system refuses to read or write) are one line on stderr and exit status 2; set ``MULTIHEAD_DEBUG=1``
to see the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from multihead import __version__
from multihead.app.console import EXIT_INTERRUPTED, EXIT_USAGE, OneLineErrorParser

DEMO_EXAMPLES = ("21 November 2026", "the 4th of July 1976", "Tue Mar 9 2021")


def _train_options(args: argparse.Namespace):
    from multihead.app.train import TrainOptions

    return TrainOptions(
        out=args.out, task=args.task if args.data is None else None, data=args.data, tokenizer=args.tokenizer,
        framework=args.framework, steps=args.steps, minutes=args.minutes, batch_size=args.batch_size, lr=args.lr,
        warmup=args.warmup, eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
        d_model=args.d_model, num_heads=args.heads, layers=args.layers, d_ff=args.d_ff, dropout=args.dropout,
        progress=not args.no_progress, resume=args.resume, extra={"task_given": args.task_given},
    )  # fmt: skip


def _report(result, out: str) -> int:
    if result.interrupted:
        print(f"interrupted at step {result.step}: checkpoint saved in {out}; continue with --resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.accuracy is not None:
        print(f"accuracy: {result.accuracy:.3f} (exact match on {result.heldout} held-out examples)")
    return 0


def _train(args: argparse.Namespace) -> int:
    from multihead.app.train import train

    result = train(_train_options(args))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    return _report(result, args.out)


def _translate(args: argparse.Namespace) -> int:
    from multihead.app.translate import Translator
    from multihead.files import check_file_target

    if args.plot:  # before the model loads and translates, not after
        check_file_target(args.plot, "--plot")
    translator = Translator(args.run)
    for index, text in enumerate(args.text):
        translation = translator.translate(text, beam=args.beam)
        print(translation.target)
        if args.plot and index == 0:
            from multihead.app.plot import plot_cross_attention

            path = plot_cross_attention(translation, args.plot)
            print(f"attention plot: {path}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from multihead.app.plot import plot_cross_attention
    from multihead.app.train import TrainOptions, train
    from multihead.app.translate import Translator

    print(f"multihead {__version__} demo: train a Transformer to write dates as YYYY-MM-DD ({args.out})")
    options = TrainOptions(out=args.out, task="dates", steps=args.steps, resume=True, progress=not args.no_progress)
    status = _report(train(options), args.out)
    if status:
        return status
    translator = Translator(args.out)
    for text in DEMO_EXAMPLES:
        print(f"  {text!r} -> {translator.translate(text).target!r}")
    path = plot_cross_attention(translator.translate(DEMO_EXAMPLES[0]), Path(args.out) / "attention.png")
    print(f"cross-attention of every layer and head: {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from multihead.app.bench import main as bench_main

    return bench_main(args.options)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, received {text}")
    return value


class _TaskAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.task_given = True


def build_parser() -> argparse.ArgumentParser:
    from multihead.app.tasks import TASKS

    parser = OneLineErrorParser(
        prog="multihead", description="The Transformer's attention from scratch: train, translate, look inside."
    )
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train",
        help="train a translation Transformer on a built-in task or a TSV corpus",
        description="Train a translation Transformer; checkpoints go to --out, --resume continues the latest one. "
        "Ctrl-C saves a checkpoint and stops. Under torchrun it trains data-parallel.",
    )
    data = train.add_mutually_exclusive_group()
    data.add_argument("--task", default="dates", action=_TaskAction, help=f"built-in task: {', '.join(TASKS)}")
    data.add_argument("--data", metavar="FILE.tsv", help="your parallel corpus: source<TAB>target per line")
    train.add_argument("--out", required=True, help="run directory for checkpoints (e.g. runs/dates)")
    train.add_argument("--framework", choices=("torch", "keras"), default="torch")
    train.add_argument("--steps", type=_positive_int, help="total optimizer steps")
    train.add_argument("--minutes", type=float, help="stop after this much training time (with --steps: first wins)")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    train.add_argument("--tokenizer", choices=("char", "word"), help="default: char (the built-in tasks' choice)")
    train.add_argument("--batch-size", type=_positive_int, default=64)
    train.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (warm-up, then 1/sqrt decay)")
    train.add_argument("--warmup", type=_positive_int, default=300)
    train.add_argument("--eval-every", type=_positive_int, default=500, help="held-out evaluation interval (steps)")
    train.add_argument("--checkpoint-every", type=_positive_int, default=500, help="checkpoint interval (steps)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--d-model", type=_positive_int, default=128)
    train.add_argument("--heads", type=_positive_int, default=4)
    train.add_argument("--layers", type=_positive_int, default=2, help="encoder and decoder layers each")
    train.add_argument("--d-ff", type=_positive_int, default=256)
    train.add_argument("--dropout", type=float, help="default: 0 for built-in tasks, 0.1 for --data")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=_train, task_given=False)

    translate = commands.add_parser("translate", help="translate text with a trained run")
    translate.add_argument("run", help="run directory written by multihead train")
    translate.add_argument("text", nargs="+", help="one or more texts to translate")
    translate.add_argument("--beam", type=_positive_int, default=1, help="beam size (1: greedy)")
    translate.add_argument("--plot", metavar="PATH", help="save the first text's cross-attention maps (PNG)")
    translate.set_defaults(handler=_translate)

    demo = commands.add_parser(
        "demo", help="train the dates task, translate three examples and plot the attention (make demo)"
    )
    demo.add_argument("--out", default="runs/dates")
    demo.add_argument("--steps", type=_positive_int, default=1500)
    demo.add_argument("--no-progress", action="store_true")
    demo.set_defaults(handler=_demo)

    bench = commands.add_parser(
        "bench",
        help="time our attention against its peers, each run in a fresh process (make bench)",
        add_help=False,  # `multihead bench --help` shows the benchmark's own options
    )
    bench.set_defaults(handler=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from multihead.app.runs import RunError

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
        print("multihead: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (RunError, ValueError, OSError) as error:
        if os.environ.get("MULTIHEAD_DEBUG"):
            raise
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"multihead: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
