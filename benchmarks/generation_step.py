"""Cached greedy generation, time per decoding step, for one or more checkouts side by side (the figures are quoted in
docs/performance.md): PyTorch's, or Keras' compiled generation on the active Keras backend (``--framework keras``);
with ``--stream RUN``, a service's decoding stream instead.

    .venv/bin/python benchmarks/generation_step.py [--src OTHER/src ...] [--rounds 3] [--runs 7] [--framework keras]
    .venv/bin/python benchmarks/generation_step.py --stream RUN --sentences SRC [--clients 16] [--seconds 10]

The model: B=8, source length 32, up to 128 tokens, d_model 256, 3+3 layers, 8 heads, d_ff 512,
vocabulary 8000, EOS made unreachable so that every run takes all 128 steps. Each round runs every checkout in a
fresh process, one after the other (this checkout's ``src`` first, then each ``--src``); each process warms up, then
times ``--runs`` generations and prints their median time per step. With ``--src``, the ratios of this checkout's time
to each other's, round by round, and their median: on a machine whose speed drifts, compare those.

``--stream RUN`` measures what ``multihead serve`` decodes, without HTTP: the run's translator (PyTorch, greedy, on
PyTorch's default threads) streaming ``--clients`` sentences at a time over one engine, each sentence that ends replaced
at once by another (as closed-loop clients do, one sentence a request), drawn from ``--sentences`` (seeded, the same
for every checkout), each limited to twice its length plus 10 tokens; after a second of warm-up, ``--seconds`` of it
timed, as milliseconds a sentence (the inverse of the rate). A step decodes the sentences in flight and first encodes
those that join: on a small model, at 16 sentences, the joining sources' encoding weighs as much as the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE_SRC = Path(__file__).resolve().parent.parent / "src"


SIZES = dict(d_model=256, num_heads=8, num_encoder_layers=3, num_decoder_layers=3, d_ff=512, dropout=0.0)
EOS = 2


def torch_model() -> tuple[object, object]:
    """The model (EOS unreachable, so that every run decodes all its tokens) and a batch of sources."""
    import torch

    from multihead.torch import Transformer

    torch.manual_seed(0)
    model = Transformer(8000, 8000, **SIZES).eval()
    with torch.no_grad():
        model.output_proj.bias[EOS] = -1e9
    return model, torch.randint(3, 8000, (8, 32))


def keras_model() -> tuple[object, object]:
    """As :func:`torch_model`, in Keras; generation runs compiled (on TensorFlow and JAX)."""
    import keras
    import numpy as np

    from multihead.keras import Transformer

    keras.utils.set_random_seed(0)
    model = Transformer(8000, 8000, **SIZES)
    model.build()
    bias = np.zeros(8000, "float32")
    bias[EOS] = -1e9
    model.output_proj.bias.assign(bias)
    return model, np.random.default_rng(0).integers(3, 8000, (8, 32)).astype("int32")


def child(runs: int, tokens: int, framework: str) -> dict:
    import multihead

    model, src = (torch_model if framework == "torch" else keras_model)()
    model.generate(src, max_len=tokens, bos_id=1, eos_id=EOS)  # warm-up (and compilation)
    per_step = []
    for _ in range(runs):
        begin = time.perf_counter()
        out = model.generate(src, max_len=tokens, bos_id=1, eos_id=EOS)
        per_step.append((time.perf_counter() - begin) / out.shape[1] * 1e3)
        if out.shape[1] != tokens:
            raise RuntimeError(f"generation stopped after {out.shape[1]} of {tokens} tokens")
    return {"src": str(Path(multihead.__file__).parent.parent), "ms": statistics.median(per_step)}


def stream_child(run: str, sentences: str, clients: int, seconds: float) -> dict:
    import gzip
    import random

    import torch

    import multihead
    from multihead.app.translate import TRANSLATION, Translator
    from multihead.engine import Engine

    translator = Translator(Path(run))
    opener = gzip.open if sentences.endswith(".gz") else open
    with opener(sentences, "rt", encoding="utf-8") as lines:
        texts = [line.strip() for line in lines if line.strip()]
    sources = translator.source.encode_all(texts)
    engine: Engine[int] = Engine(translator.stream_rows(), translator.spec(TRANSLATION))
    draw = random.Random(0)

    def join(owner: int) -> None:
        ids = sources[draw.randrange(len(sources))]
        engine.add(list(ids), owner, limit=2 * len(ids) + 10)

    def stream(seconds: float) -> tuple[int, float]:
        """Steps for ``seconds``: the sentences that ended, and the time taken."""
        ended, begin = 0, time.perf_counter()
        while time.perf_counter() - begin < seconds:
            for finished in engine.step():
                ended += 1
                join(finished.owner)
        return ended, time.perf_counter() - begin

    for owner in range(clients):
        join(owner)
    with torch.inference_mode():
        stream(1.0)  # warm-up
        ended, elapsed = stream(seconds)
    if not ended:
        raise RuntimeError(f"no sentence ended in {elapsed:.1f} s")
    return {"src": str(Path(multihead.__file__).parent.parent), "ms": elapsed / ended * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="another checkout's src directory to compare")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fresh processes, checkouts interleaved")
    parser.add_argument("--runs", type=int, default=7, help="timed generations per process")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    parser.add_argument("--framework", choices=("torch", "keras"), default="torch", help="which front end generates")
    parser.add_argument("--stream", metavar="RUN", help="time a service's decoding stream of this run instead")
    parser.add_argument("--sentences", metavar="SRC", help="with --stream: the source sentences (plain or .gz)")
    parser.add_argument("--clients", type=int, default=16, help="with --stream: sentences in flight (default: 16)")
    parser.add_argument("--seconds", type=float, default=10.0, help="with --stream: timed seconds (default: 10)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stream is not None and (args.sentences is None or args.framework != "torch"):
        parser.error("--stream takes --sentences SRC, and streams on PyTorch only")
    if args.child:
        if args.stream is not None:
            print(json.dumps(stream_child(args.stream, args.sentences, args.clients, args.seconds)))
        else:
            print(json.dumps(child(args.runs, args.tokens, args.framework)))
        return
    from multihead import cpu  # here: a child imports multihead from the checkout it measures

    print(f"CPU: {cpu.describe()}", flush=True)
    unit = "ms a sentence in the stream" if args.stream is not None else "ms/step"
    sources = [str(HERE_SRC), *(str(Path(s).resolve()) for s in args.src)]
    results: dict[str, list[float]] = {s: [] for s in sources}
    for round_ in range(args.rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": src}
            command = [sys.executable, __file__, "--child", "--runs", str(args.runs), "--tokens", str(args.tokens),
                       "--framework", args.framework]  # fmt: skip
            if args.stream is not None:
                command += ["--stream", args.stream, "--sentences", args.sentences, "--clients", str(args.clients),
                            "--seconds", str(args.seconds)]  # fmt: skip
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            measured = json.loads(out.strip().splitlines()[-1])
            if measured["src"] != src:
                raise RuntimeError(f"expected multihead from {src}, imported it from {measured['src']}")
            results[src].append(measured["ms"])
            print(f"round {round_ + 1}: {src}: {measured['ms']:.2f} {unit}", flush=True)
    print(f"medians over rounds ({unit}):")
    for src, values in results.items():
        print(f"  {statistics.median(values):6.2f}  {src}  ({', '.join(f'{v:.2f}' for v in values)})")
    this = results[sources[0]]
    for src in sources[1:]:  # round by round: a machine whose speed drifts moves both figures of a round together
        ratios = [mine / theirs for mine, theirs in zip(this, results[src], strict=True)]
        print(
            f"this checkout / {src}, round by round: {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.2f}"
        )


if __name__ == "__main__":
    main()
