"""Greedy translation of a file in batches against one sentence at a time (results quoted in
docs/translation.md).

    .venv/bin/python benchmarks/translate_speed.py RUN SRC [--single 100] [--before OTHER/src]

Batched: all of SRC, twice, the faster taken. One at a time: the first ``--single`` sentences, each its own call,
with the same code. ``--before`` also times them one at a time the way ``multihead translate`` did at first, with
the code of another checkout (``git worktree add /tmp/before 8208ce5``) in a child process: the run's weights
in that checkout's ``Transformer``, one ``generate`` per sentence up to the model's ``max_len - 1`` tokens, then the
encode and decode with cross-attention weights that its ``translate`` computed for every sentence.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BOS, EOS = 1, 2  # multihead.app.tokenizers' ids, fixed since the first run format


def translate_as_before(run: Path, sources: list[list[int]]) -> float:
    """Seconds for ``sources`` one at a time with the code on ``sys.path`` (an older checkout's), as its
    ``Translator.translate`` did for each text."""
    import torch

    from multihead.io import load_weights
    from multihead.torch import Transformer

    chosen = run / "best" if (run / "best").exists() else run / "latest"  # as translate chooses by default
    checkpoint = run / "checkpoints" / chosen.read_text().strip()
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("tie_embeddings", None)  # the weights file holds the tied matrix under each of its three names
    model = Transformer.from_config(config).eval()
    load_weights(model, checkpoint / "model.safetensors")
    begin = time.perf_counter()
    for ids in sources:
        src = torch.tensor([ids])
        out = model.generate(src, max_len=config["max_len"] - 1, bos_id=BOS, eos_id=EOS)[0].tolist()
        generated = out[: out.index(EOS) + 1] if EOS in out else out
        with torch.no_grad():
            memory = model.encode(src)
            model.decode(torch.tensor([[BOS, *generated[:-1]]]), memory, return_weights=True)
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory written by multihead train")
    parser.add_argument("src", help="sentences to translate, one per line (plain or .gz)")
    parser.add_argument("--single", type=int, default=100, help="sentences translated one at a time")
    parser.add_argument("--before", help="an older checkout's src directory: also time it one sentence at a time")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a JSON file of token ids, for --before
    args = parser.parse_args()
    if args.child:
        import multihead

        seconds = translate_as_before(Path(args.run), json.loads(Path(args.child).read_text()))
        print(json.dumps({"seconds": seconds, "src": str(Path(multihead.__file__).parent.parent)}))
        return
    from multihead import cpu  # here: a child imports multihead from the checkout it measures

    print(f"CPU: {cpu.describe()}", flush=True)

    from multihead.app.corpus import read_lines
    from multihead.app.translate import Translator

    texts = read_lines(args.src, "SRC")
    translator = Translator(args.run)
    translator.translate(texts[:16])  # warm-up
    batched_s = []
    for _ in range(2):
        begin = time.perf_counter()
        batched = translator.translate(texts)
        batched_s.append(time.perf_counter() - begin)
    begin = time.perf_counter()
    singles = [translator.translate([text])[0] for text in texts[: args.single]]
    single_s = time.perf_counter() - begin
    batched_rate, single_rate = len(texts) / min(batched_s), len(singles) / single_s
    same = sum(a == b for a, b in zip(batched, singles, strict=False))
    print(f"batched: {len(texts)} sentences in {min(batched_s):.1f} s: {batched_rate:.1f} sentences/s")
    print(f"one at a time: {len(singles)} sentences in {single_s:.1f} s: {single_rate:.1f} sentences/s")
    print(f"speed-up {batched_rate / single_rate:.1f}x; identical translations {same}/{len(singles)}")
    if args.before:
        sources = [translator.source.encode(text)[0] for text in texts[: args.single]]
        with tempfile.NamedTemporaryFile("w", suffix=".json") as ids:
            json.dump(sources, ids)
            ids.flush()
            env = {**os.environ, "PYTHONPATH": str(Path(args.before).resolve())}
            command = [sys.executable, __file__, args.run, args.src, "--child", ids.name]
            result = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        if measured["src"] != env["PYTHONPATH"]:
            raise RuntimeError(f"the child imported multihead from {measured['src']}, not {env['PYTHONPATH']}")
        before_rate = len(sources) / measured["seconds"]
        print(f"one at a time, as the first version did ({args.before}): {before_rate:.1f} sentences/s")
        print(f"batched against it: {batched_rate / before_rate:.1f}x")


if __name__ == "__main__":
    main()
