"""multihead at the sizes people deploy, against what its users would run instead: CTranslate2 for translation and a
plain Transformers loop for fine-tuning (results quoted in docs/performance.md).

The model: a Marian checkpoint of OPUS-MT's sizes (``--sizes opus``: d_model 512, 6+6 layers, 58,101 ids, 74 M
parameters) or NLLB-200-distilled-600M's (``--sizes nllb``: d_model 1024, 12+12 layers, 256,206 ids, 615 M), random
weights, built by ``benchmarks/opus_sized.py`` into WORK when missing, imported with ``multihead import`` and
converted by CTranslate2's own ``TransformersConverter`` (what its users do)::

    .venv/bin/python benchmarks/deployed_sizes.py WORK DATA [--sizes opus] [--sentences 200] [--tokens 32]
        [--threads 2] [--neighbours 0] [--int8-run]

DATA holds Multi30k's files (``{train,val,test_2016_flickr}.{de,en}.gz``).

Translation: the first ``--sentences`` sources of test_2016_flickr, greedy and beam 4, float32 and int8 (multihead
``--quantize int8``, CTranslate2 ``compute_type="int8"``; ``--computes`` chooses others: ``bfloat16`` against
``--quantize bf16``, ``int8_bfloat16`` against ``--quantize int8``), each engine batching as its users' calls do
(multihead ``translate``'s batches, CTranslate2's ``translate_batch`` with ``max_batch_size`` in tokens, the same
budget), every translation exactly ``--tokens`` tokens long (random weights never choose the end of sentence; the
lengths are checked). Each configuration runs in a fresh process (``--threads`` threads, its model loaded and warmed up
before the clock starts), all of them in turn, ``--repeats`` times; the fastest time counts, with that process's
resident set once it has translated, its model still loaded; the peak resident set (which counts a model file's pages
while it is read, memory-mapped) is the median of the repeats' (the table gives their range where they differ: where
the allocator places a batch's blocks moves a process's peak from one run to the next); and the shortest time its
model took to load (multihead's ``Translator(...)``, the run's tokenizers included; CTranslate2's ``Translator(...)``:
warm page cache after the first repeat; a multihead int8 run keeps its packed forms at its first load, which later
ones map). ``--threads 0`` runs each engine with its own default: multihead's (the cores other processes leave free,
followed while it translates), CTranslate2's (``intra_threads=0``). ``--neighbours N`` starts N busy processes (a
Python loop each) before each configuration's process and stops them after it: the machine shared with a neighbour, as
servers and batch jobs share it.
``--int8-run``: multihead's int8 configurations translate an int8 run (WORK/run-int8, its matrices stored as int8
rows, written by ``multihead export WORK/run WORK/run-int8 --format multihead --quantization int8`` when missing)
instead of the float32 run with ``--quantize int8``; the weights files' sizes on disk are reported. Sources are
tokenized by MarianTokenizer for CTranslate2, by the run's tokenizer for multihead: the greedy float32 token sequences
of the two are compared.

Fine-tuning (``--finetune-steps``; 0 skips it): ``multihead train --init`` on Multi30k (``--batch-tokens 2048``) and
a plain Transformers loop (``MarianMTModel``, ``torch.optim.AdamW`` at 1e-4, cross-entropy with label smoothing 0.1,
dropout 0.1) over the same batches (the run's own, read back from its encoded corpus), in float32 and with bf16
autocast (``--precision bf16``; ``torch.autocast`` around the loop's forward pass and loss), each in a fresh process:
target tokens per second of the steps after the first, and the peak memory.

Writes WORK/results.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from multihead import cpu

ENGINES = ("multihead", "CTranslate2")
COMPUTES = ("float32", "int8")
QUANTIZE = {"float32": None, "int8": "int8", "bfloat16": "bf16", "int8_bfloat16": "int8"}
"""multihead's ``--quantize`` for each of CTranslate2's compute types (``--computes``); its int8 computes the
activations in float32, beside CTranslate2's int8_bfloat16."""
BEAMS = (1, 4)


def peak_mb() -> float:
    """This process's peak resident set, MB (with the pages of files it maps while it reads them): its own, where
    ``ru_maxrss`` would be its parent's when that was larger as it started the child."""
    from multihead.app.memory import peak_resident_bytes

    return (peak_resident_bytes() or 0) / 2**20


def rss_mb() -> float:
    """This process's resident set now, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def digest(sequences: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(sequences).encode()).hexdigest()[:16]


def sources(data: Path, count: int) -> list[str]:
    from multihead.app.corpus import read_lines

    return read_lines(str(data / "test_2016_flickr.de.gz"), "SRC")[:count]


# --- the children: one configuration each ----------------------------------------------------------------------------


def translate_multihead(args: argparse.Namespace) -> dict[str, Any]:

    from multihead.app.devices import choose_threads
    from multihead.app.translate import BATCH_TOKENS, Translator, translate_ids
    from multihead.decoding import SearchOptions

    choose_threads(args.threads or None)
    begin = time.perf_counter()
    run = args.work / ("run-int8" if args.int8_run and QUANTIZE[args.compute] == "int8" else "run")
    translator = Translator(run, device="cpu", quantize=QUANTIZE[args.compute])
    load = time.perf_counter() - begin
    ids = translator.source.encode_all(sources(args.data, args.sentences))
    generate = translator.generate(SearchOptions(beam_size=args.beam, length_penalty=0.6))

    def run(rows: list[list[int]], tokens: int) -> list[list[int]]:
        return translate_ids(generate, rows, limit=lambda _: tokens, generation=translator.generation,
                             batch_tokens=BATCH_TOKENS // args.beam)  # fmt: skip

    run(ids[:8], 4)  # warm-up
    begin = time.perf_counter()
    out = run(ids, args.tokens)
    return {"seconds": time.perf_counter() - begin, "sequences": out, "rss_mb": rss_mb(), "load_s": load}


def translate_ctranslate2(args: argparse.Namespace) -> dict[str, Any]:
    import ctranslate2
    from transformers import MarianTokenizer

    from multihead.app.translate import BATCH_TOKENS

    with warnings.catch_warnings():  # MarianTokenizer recommends Moses' punctuation normalizer
        warnings.simplefilter("ignore", UserWarning)
        tokenizer = MarianTokenizer.from_pretrained(args.work / "checkpoint")
    batch = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in sources(args.data, args.sentences)]
    # intra_threads 0: its own default
    begin = time.perf_counter()
    engine = ctranslate2.Translator(str(args.work / "ctranslate2"), device="cpu", compute_type=args.compute,
                                    intra_threads=args.threads, inter_threads=1)  # fmt: skip
    load = time.perf_counter() - begin

    def run(rows: list[list[str]], tokens: int) -> list[list[int]]:
        results = engine.translate_batch(
            rows, beam_size=args.beam, length_penalty=0.6, max_decoding_length=tokens,
            max_batch_size=BATCH_TOKENS // args.beam, batch_type="tokens",
        )  # fmt: skip
        return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]

    run(batch[:8], 4)  # warm-up
    begin = time.perf_counter()
    out = run(batch, args.tokens)
    return {"seconds": time.perf_counter() - begin, "sequences": out, "rss_mb": rss_mb(), "load_s": load}


def finetune_multihead(args: argparse.Namespace) -> dict[str, Any]:
    from multihead.app.cli import main

    out = args.work / "tuned"
    shutil.rmtree(out, ignore_errors=True)
    data = args.data
    status = main([
        "train", "--init", str(args.work / "run"), "--data", str(data / "train.de.gz"), str(data / "train.en.gz"),
        "--valid", str(data / "val.de.gz"), str(data / "val.en.gz"), "--out", str(out), "--steps",
        str(args.finetune_steps), "--batch-tokens", "2048", "--eval-every", "100000", "--checkpoint-every", "100000",
        "--log-every", "1", "--threads", str(args.threads), "--no-progress", "--precision", args.precision,
    ])  # fmt: skip
    if status != 0:
        raise SystemExit(f"multihead train exited with {status}")
    steps = [entry for entry in map(json.loads, (out / "train.jsonl").read_text().splitlines())
             if entry.get("event") == "step"]  # fmt: skip
    # Each line is one step (--log-every 1): its rate over its seconds of training. Steps after the first, as the
    # Transformers loop counts them: their tokens over their seconds.
    seconds = [after["seconds"] - before["seconds"] for before, after in itertools.pairwise(steps)]
    tokens = sum(entry["tokens_per_s"] * took for entry, took in zip(steps[1:], seconds, strict=True))
    return {"tokens_per_s": tokens / sum(seconds)}


def finetune_transformers(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import MarianMTModel

    from multihead.app.batching import CorpusBatches
    from multihead.app.encoded import read_cache
    from multihead.app.tokenizers import Specials

    torch.set_num_threads(args.threads)
    encoded = args.work / "tuned" / "encoded"  # the batches multihead trained on
    corpus = read_cache(encoded, json.loads((encoded / "manifest.json").read_text())["key"])
    if corpus is None:
        raise SystemExit(f"no encoded corpus in {encoded}: run multihead's fine-tuning first")
    model = MarianMTModel.from_pretrained(args.work / "checkpoint")
    config = model.config
    specials = Specials(pad=config.pad_token_id, bos=config.decoder_start_token_id, eos=config.eos_token_id, unk=1)
    batches = CorpusBatches(corpus, specials, 2048, seed=0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_function = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=-100)
    tokens, seconds = 0, 0.0
    for step in range(args.finetune_steps):
        batch = batches.batch(step)
        src, tgt_in = torch.from_numpy(batch.src), torch.from_numpy(batch.tgt_in)
        labels = torch.from_numpy(np.where(batch.tgt_out == specials.pad, -100, batch.tgt_out))
        begin = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(input_ids=src, attention_mask=src != specials.pad, decoder_input_ids=tgt_in).logits
            loss = loss_function(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step > 0:  # the first is a warm-up
            seconds += time.perf_counter() - begin
            tokens += batch.target_tokens
    return {"tokens_per_s": tokens / seconds}


CHILDREN = {
    "translate-multihead": translate_multihead,
    "translate-CTranslate2": translate_ctranslate2,
    "finetune-multihead": finetune_multihead,
    "finetune-Transformers": finetune_transformers,
}


def child(job: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """Run ``job`` (a key of :data:`CHILDREN`) in a fresh process: its result and peak memory."""
    command = [sys.executable, __file__, str(args.work), str(args.data), "--child", job, "--threads", str(args.threads),
               "--sentences", str(args.sentences), "--tokens", str(args.tokens), "--finetune-steps",
               str(args.finetune_steps)]  # fmt: skip
    for name, value in extra.items():
        command += [f"--{name}", str(value)]
    command += ["--int8-run"] if args.int8_run else []
    busy = busy_neighbours(args.neighbours)
    try:
        time.sleep(0.5 if busy else 0)  # the neighbours at work before the configuration starts
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    if done.returncode != 0:
        raise SystemExit(f"{job} {extra} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the parent: build, interleave, report ---------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    """The checkpoint, the multihead run and the CTranslate2 model in WORK (each made when missing)."""
    checkpoint = args.work / "checkpoint"
    if not checkpoint.exists():
        sys.path.insert(0, str(Path(__file__).parent))
        from opus_sized import build

        from multihead.app.corpus import read_lines

        data = args.data
        build(checkpoint, read_lines(str(data / "train.de.gz"), "SRC"), read_lines(str(data / "train.en.gz"), "TGT"),
              sizes=args.sizes)  # fmt: skip
    if not (args.work / "run").exists():
        subprocess.run([Path(sys.executable).parent / "multihead", "import", checkpoint, args.work / "run"], check=True)
    if not (args.work / "ctranslate2").exists():
        import ctranslate2

        ctranslate2.converters.TransformersConverter(str(checkpoint)).convert(str(args.work / "ctranslate2"))
    if args.int8_run and not (args.work / "run-int8").exists():
        subprocess.run([Path(sys.executable).parent / "multihead", "export", args.work / "run", args.work / "run-int8",
                        "--format", "multihead", "--quantization", "int8"], check=True)  # fmt: skip


def disk_mb(args: argparse.Namespace) -> dict[str, float]:
    """The weights files' sizes, MB: the run's, the int8 run's (``--int8-run``) and CTranslate2's model."""
    files = {"run": "run/checkpoints/*/model.safetensors", "ctranslate2": "ctranslate2/model.bin"}
    if args.int8_run:
        files["run-int8"] = "run-int8/checkpoints/*/model.safetensors"
    return {name: round(sum(path.stat().st_size for path in args.work.glob(pattern)) / 2**20, 1)
            for name, pattern in files.items()}  # fmt: skip


def translation(args: argparse.Namespace) -> list[dict[str, Any]]:
    configs = [(engine, compute, beam) for beam in BEAMS for compute in args.computes for engine in ENGINES]
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    loads: dict[tuple[str, str, int], list[float]] = {}
    peaks: dict[tuple[str, str, int], list[float]] = {}
    for repeat in range(args.repeats):  # interleaved: every configuration once, then again
        for engine, compute, beam in configs:
            found = child(f"translate-{engine}", args, compute=compute, beam=beam)
            print(f"  [{repeat + 1}/{args.repeats}] {engine} {compute} beam {beam}: {found['seconds']:.2f} s, "
                  f"{found['peak_mb']:.0f} MB, loaded in {found['load_s']:.3f} s", file=sys.stderr,
                  flush=True)  # fmt: skip
            key = (engine, compute, beam)
            loads.setdefault(key, []).append(found["load_s"])
            peaks.setdefault(key, []).append(found["peak_mb"])
            if key not in best or found["seconds"] < best[key]["seconds"]:
                best[key] = found
    rows = []
    for (engine, compute, beam), found in best.items():
        lengths = {len(sequence) for sequence in found["sequences"]}
        if lengths != {args.tokens}:
            raise SystemExit(f"{engine} {compute} beam {beam}: translations of {sorted(lengths)} tokens, not all "
                             f"{args.tokens}: the timings would not compare")  # fmt: skip
        theirs = best["CTranslate2", compute, beam]
        rows.append({
            "engine": engine, "compute": compute, "beam": beam, "seconds": round(found["seconds"], 3),
            "tokens_per_s": round(args.sentences * args.tokens / found["seconds"], 1),
            "peak_mb": round(statistics.median(peaks[engine, compute, beam])),
            "peak_range_mb": [round(min(peaks[engine, compute, beam])), round(max(peaks[engine, compute, beam]))],
            "rss_mb": round(found["rss_mb"]),
            "ratio": round(found["seconds"] / theirs["seconds"], 3),
            "load_s": round(min(loads[engine, compute, beam]), 3),
            "sequences": digest(found["sequences"]),
        })  # fmt: skip
    if ("multihead", "float32", 1) not in best:
        return rows
    ours, theirs = best["multihead", "float32", 1]["sequences"], best["CTranslate2", "float32", 1]["sequences"]
    # A run that ends translations with EOS at the length limit (the checkpoint's forced_eos_token_id, as Transformers'
    # generate does) writes EOS where CTranslate2 writes one more token: the tokens before it are compared.
    eos = json.loads((args.work / "checkpoint" / "config.json").read_text()).get("forced_eos_token_id")
    same = sum(a[:-1] == b[:-1] if a[-1:] == [eos] else a == b for a, b in zip(ours, theirs, strict=True))
    print(f"greedy float32: {same} of {len(ours)} token sequences identical", file=sys.stderr)
    rows.append({"identical_greedy_float32": same, "of": len(ours)})
    return rows


def finetuning(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for precision in ("fp32", "bf16"):
        for engine in ("multihead", "Transformers"):  # multihead first: the other reads its batches
            found = child(f"finetune-{engine}", args, precision=precision)
            print(f"  fine-tuning, {engine} {precision}: {found['tokens_per_s']:.1f} target tokens/s, "
                  f"{found['peak_mb']:.0f} MB", file=sys.stderr, flush=True)  # fmt: skip
            rows.append({"engine": engine, "precision": precision, "tokens_per_s": round(found["tokens_per_s"], 1),
                         "peak_mb": round(found["peak_mb"])})  # fmt: skip
    return rows


BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"
"""A neighbour's loop: busy until its parent goes, however the parent ends (killed, it runs no cleanup)."""


def busy_neighbours(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy processes (:data:`BUSY`), to be killed by the caller."""
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="a directory for the checkpoint, run and CTranslate2 model")
    parser.add_argument("data", type=Path, help="Multi30k's directory")
    parser.add_argument("--sizes", choices=("opus", "nllb"), default="opus", help="whose sizes (default: opus)")
    parser.add_argument("--sentences", type=int, default=200, help="sentences translated (default: 200)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each translation takes (default: 32)")
    parser.add_argument("--repeats", type=int, default=2, help="times each configuration runs (default: 2)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (default: 2; 0: each "
                        "engine's own default)")  # fmt: skip
    parser.add_argument("--neighbours", type=int, default=0, help="busy processes beside each configuration while "
                        "it translates (default: 0)")  # fmt: skip
    parser.add_argument("--finetune-steps", type=int, default=5, help="fine-tuning steps, the first a warm-up "
                        "(default: 5; 0: no fine-tuning)")  # fmt: skip
    parser.add_argument("--skip-translation", action="store_true", help="fine-tuning only")
    parser.add_argument("--int8-run", action="store_true", help="multihead's int8 configurations translate an int8 "
                        "run (WORK/run-int8, exported if missing), not --quantize int8 of the float32 run")  # fmt: skip
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--computes", nargs="+", choices=sorted(QUANTIZE), default=list(COMPUTES), metavar="TYPE",
                        help="CTranslate2's compute types compared, each against multihead's --quantize of the same "
                        "(bfloat16: bf16; int8_bfloat16: int8) (default: float32 int8)")  # fmt: skip
    parser.add_argument("--compute", choices=sorted(QUANTIZE), default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = CHILDREN[args.child](args)
        print(json.dumps({"peak_mb": peak_mb(), **result}))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    prepare(args)
    results: dict[str, Any] = {
        "sizes": args.sizes, "sentences": args.sentences, "tokens": args.tokens, "threads": args.threads,
        "neighbours": args.neighbours, "int8_run": args.int8_run, "disk_mb": disk_mb(args),
        "cpu": cpu.describe(), "command": " ".join(sys.argv),
    }  # fmt: skip
    if not args.skip_translation:
        results["translation"] = translation(args)
    if args.finetune_steps > 0:
        results["finetuning"] = finetuning(args)
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


def peak(row: dict[str, Any]) -> str:
    """A configuration's peak MB: the repeats' median, and their range where they differ."""
    low, high = row.get("peak_range_mb", (row["peak_mb"], row["peak_mb"]))
    return f"{row['peak_mb']}" if low == high else f"{row['peak_mb']} ({low}–{high})"


def table(results: dict[str, Any]) -> str:
    threads = results["threads"] or "each engine's default"
    beside = f", beside {results['neighbours']} busy processes" if results.get("neighbours") else ""
    lines = [f"{results['sizes']}-sized, {results['cpu']}, {threads} threads{beside}: `{results['command']}`", ""]
    if "disk_mb" in results:
        sizes = ", ".join(f"{name} {mb:,.1f} MB" for name, mb in results["disk_mb"].items())
        lines += [f"weights on disk: {sizes}", ""]
    if "translation" in results:
        lines += [
            f"| {results['sentences']} sentences × {results['tokens']} tokens | seconds | tokens/s | peak MB | "
            "MB after | / CTranslate2 | load s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in results["translation"]:
            if "engine" in row:
                lines.append(f"| {row['engine']} {row['compute']}, beam {row['beam']} | {row['seconds']:.2f} | "
                             f"{row['tokens_per_s']:.0f} | {peak(row)} | {row['rss_mb']} | "
                             f"{row['ratio']:.2f}× | {row['load_s']:.3f} |")  # fmt: skip
            else:
                lines.append(f"\ngreedy float32: {row['identical_greedy_float32']} of {row['of']} token sequences "
                             "identical")  # fmt: skip
    if "finetuning" in results:
        lines += ["", "| fine-tuning, 2,048-token batches | target tokens/s | peak MB |", "|---|---:|---:|"]
        for row in results["finetuning"]:
            lines.append(f"| {row['engine']} {row['precision']} | {row['tokens_per_s']:.1f} | {row['peak_mb']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
