"""``multihead bench``: our attention against what users would pick instead, by the performance protocol.

Every (implementation, case) is measured in a fresh process (``python -m multihead.app.bench --child IMPL CASE``):
build, warm up, then time whole steps and take the median; peak memory is the process's peak RSS growth over
its baseline taken after importing the framework (so it counts the model, inputs and attention, not the
framework). Implementations are interleaved within each repeat, and the reported time is the median over
repeats. Ratios are to the fastest peer (not ours) of the same case. Attention FLOPs are ``4·B·H·Lq·Lk·D`` forward
and 3.5× that forward+backward; GFLOP/s is set against the machine's matmul rate, measured in the same run.

Generation is timed the same way: greedy decoding of exactly ``--tokens`` tokens (EOS never wins) by a Transformer
with and without its KV cache, interleaved, each run in a fresh process.

Notation: B batch, L length (Lq/Lk query/key length), E model width, H heads, D = E/H.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multihead.app.console import OneLineErrorParser
from multihead.files import atomic_write

OURS = ("multihead-torch", "multihead-keras")
PEERS = ("torch-mha", "torch-sdpa", "keras-mha", "tutorial")
IMPLEMENTATIONS = OURS + PEERS


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    lq: int
    lk: int
    width: int = 512
    heads: int = 8
    backward: bool = False
    padded: bool = False
    skip: tuple[str, ...] = ()  # implementations that cannot run it here, with the reason in `why`
    why: str = ""

    @property
    def flops(self) -> float:
        forward = 4 * self.batch * self.heads * self.lq * self.lk * (self.width // self.heads)
        return forward * (3.5 if self.backward else 1.0)


CASES = {
    case.name: case
    for case in (
        Case("paper-forward", 64, 5, 5),
        Case("paper-train", 64, 5, 5, backward=True),
        Case("cross-forward", 32, 10, 20),
        Case("L512-forward", 8, 512, 512),
        Case("L512-train", 8, 512, 512, backward=True),
        Case("padded-forward", 16, 512, 512, padded=True),
        Case("L4096-forward", 1, 4096, 4096),
        Case(
            "L16384-forward",
            1,
            16384,
            16384,
            skip=("keras-mha", "tutorial"),
            why="materialise the 8 GiB score matrix several times over: more than this 24 GiB machine has",
        ),
    )
}


# --- the child: one measurement --------------------------------------------------------------------------


def _lengths(case: Case) -> Any:
    import numpy as np

    return np.random.default_rng(0).integers(64, case.lk + 1, size=case.batch)


def _torch_step(impl: str, case: Case) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from multihead.torch import MultiHeadAttention, padding_mask

    torch.manual_seed(0)
    query = torch.randn(case.batch, case.lq, case.width)
    memory = query if case.lq == case.lk else torch.randn(case.batch, case.lk, case.width)
    cross = memory is not query
    key_mask = padding_mask(torch.from_numpy(_lengths(case)), case.lk) if case.padded else None
    heads, dim = case.heads, case.width // case.heads

    class MinimalSDPA(nn.Module):
        """The least a user writes around scaled_dot_product_attention: fused QKV, SDPA, output projection."""

        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(case.width, 3 * case.width)
            self.out = nn.Linear(case.width, case.width)

        def forward(self, x: torch.Tensor, m: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            b, lq, e = x.shape
            w_q, w_kv = self.qkv.weight.split([e, 2 * e])
            b_q, b_kv = self.qkv.bias.split([e, 2 * e])
            if m is x:
                q, k, v = self.qkv(x).split(e, dim=-1)
            else:
                q, (k, v) = F.linear(x, w_q, b_q), F.linear(m, w_kv, b_kv).split(e, dim=-1)
            q, k, v = (t.view(b, -1, heads, dim).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
            attn_mask = None if mask is None else mask[:, None, None, :]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            return self.out(out.transpose(1, 2).reshape(b, lq, e))

    class Tutorial(nn.Module):
        """The tutorials' explicit matmul-softmax-matmul."""

        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(case.width, case.width) for _ in range(4))

        def forward(self, x: torch.Tensor, m: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            b, lq, e = x.shape
            q, k, v = (
                w(t).view(b, -1, heads, dim).transpose(1, 2) for w, t in ((self.wq, x), (self.wk, m), (self.wv, m))
            )
            scores = q @ k.transpose(-2, -1) / dim**0.5
            if mask is not None:
                scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
            return self.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, lq, e))

    if impl == "multihead-torch":
        module = MultiHeadAttention(case.width, heads)
        # In a padded self-attention batch the padded queries are padding too: saying so lets the module skip them.
        query_mask = None if cross else key_mask
        call = lambda: module(query, memory if cross else None, key_mask=key_mask, query_mask=query_mask)  # noqa: E731
    elif impl == "torch-mha":
        module = nn.MultiheadAttention(case.width, heads, batch_first=True)
        padding = None if key_mask is None else ~key_mask
        call = lambda: module(query, memory, memory, key_padding_mask=padding, need_weights=False)[0]  # noqa: E731
    else:
        module = MinimalSDPA() if impl == "torch-sdpa" else Tutorial()
        call = lambda: module(query, memory, key_mask)  # noqa: E731
    if not case.backward:
        module.eval()

        def forward() -> Any:
            with torch.no_grad():
                return call()

        return forward

    def train_step() -> Any:
        module.zero_grad(set_to_none=True)
        out = call()
        out.sum().backward()
        return out

    return train_step


def _keras_step(impl: str, case: Case) -> Callable[[], Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from multihead.keras import MultiHeadAttention

    rng = np.random.default_rng(0)
    query = tf.constant(rng.normal(size=(case.batch, case.lq, case.width)).astype("float32"))
    memory = (
        query
        if case.lq == case.lk
        else tf.constant(rng.normal(size=(case.batch, case.lk, case.width)).astype("float32"))
    )
    key_mask = tf.constant(np.arange(case.lk)[None, :] < _lengths(case)[:, None]) if case.padded else None
    if impl == "multihead-keras":
        layer = MultiHeadAttention(case.heads)
        call = lambda: layer(query, memory, key_mask=key_mask)  # noqa: E731
    else:
        layer = keras.layers.MultiHeadAttention(case.heads, case.width // case.heads)
        mask = None if key_mask is None else tf.broadcast_to(key_mask[:, None, :], (case.batch, case.lq, case.lk))
        call = lambda: layer(query, memory, attention_mask=mask)  # noqa: E731
    call()  # build
    if not case.backward:
        return tf.function(lambda: call())

    @tf.function
    def train_step() -> Any:
        with tf.GradientTape() as tape:
            out = call()
            loss = tf.reduce_sum(out)
        return tape.gradient(loss, layer.trainable_variables)

    return train_step


GENERATION_SIZES = {"d_model": 256, "num_heads": 4, "num_encoder_layers": 3, "num_decoder_layers": 3, "d_ff": 1024}
GENERATION_BATCH, GENERATION_SOURCE, GENERATION_VOCAB = 8, 32, 100


def generation_child(framework: str, use_cache: bool, tokens: int) -> dict[str, Any]:
    """Seconds for greedy generation of exactly ``tokens`` tokens, in this (fresh) process."""
    import numpy as np

    source = np.random.default_rng(0).integers(3, GENERATION_VOCAB, size=(GENERATION_BATCH, GENERATION_SOURCE))
    sizes = {**GENERATION_SIZES, "dropout": 0.0}
    if framework == "torch":
        import torch

        from multihead.torch import Transformer

        torch.manual_seed(0)
        model = Transformer(GENERATION_VOCAB, GENERATION_VOCAB, **sizes).eval()
        with torch.no_grad():
            model.output_proj.bias[2] = -1e9  # EOS (id 2) never wins: always the full length
        src = torch.from_numpy(source)
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras

        from multihead.keras import Transformer

        keras.utils.set_random_seed(0)
        model = Transformer(GENERATION_VOCAB, GENERATION_VOCAB, **sizes)
        model.build()
        bias = keras.ops.convert_to_numpy(model.output_proj.bias).copy()
        bias[2] = -1e9
        model.output_proj.bias.assign(bias)
        src = keras.ops.convert_to_tensor(source.astype("int32"))
    model.generate(src, max_len=min(tokens, 8), bos_id=1, eos_id=2, use_cache=use_cache)  # warm-up
    begin = time.perf_counter()
    out = model.generate(src, max_len=tokens, bos_id=1, eos_id=2, use_cache=use_cache)
    seconds = time.perf_counter() - begin
    if tuple(out.shape) != (GENERATION_BATCH, tokens):
        raise RuntimeError(f"generation stopped early: {tuple(out.shape)}")
    return {"framework": framework, "cache": use_cache, "seconds": seconds}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(impl: str, case_name: str, budget_s: float) -> dict[str, Any]:
    """Time one implementation on one case in this (fresh) process."""
    case = CASES[case_name]
    if "keras" in impl:  # the framework's own footprint is not the attention's: import it before the baseline
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    else:
        import torch
    baseline = _peak_rss_mib()
    step = _keras_step(impl, case) if "keras" in impl else _torch_step(impl, case)
    if "keras" not in impl:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    for _ in range(2):
        step()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - started < budget_s and len(times) < 200):
        begin = time.perf_counter()
        step()
        times.append(time.perf_counter() - begin)
    return {"impl": impl, "case": case_name, "median_s": statistics.median(times), "runs": len(times),
            "peak_mib": _peak_rss_mib() - baseline}  # fmt: skip


def matmul_gflops() -> float:
    """The machine's fp32 matmul rate (2048³, median of 10), in GFLOP/s."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        begin = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - begin)
    return 2 * 2048**3 / statistics.median(times) / 1e9


# --- the parent: the whole run ---------------------------------------------------------------------------


def _fresh_process(*options: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "multihead.app.bench", *options], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _measure(impl: str, case: str, budget_s: float) -> dict[str, Any]:
    return {"impl": impl, "case": case, **_fresh_process("--child", impl, case, "--budget", str(budget_s))}


def run_generation(frameworks: list[str], tokens: int, repeats: int, log: Callable[[str], None]) -> dict:
    """Generation with and without the cache, interleaved, medians over ``repeats`` fresh processes."""
    results: dict[str, Any] = {}
    for framework in frameworks:
        seconds: dict[str, list[float]] = {"cache": [], "recompute": []}
        for repeat in range(repeats):
            for mode in seconds:
                sample = _fresh_process("--generate", framework, mode, "--tokens", str(tokens))
                if "error" in sample:
                    raise RuntimeError(f"generation ({framework}, {mode}) failed: {sample['error']}")
                seconds[mode].append(sample["seconds"])
                log(f"[{repeat + 1}/{repeats}] generate {tokens} tokens, {framework} {mode}: {sample['seconds']:.2f} s")
        medians = {mode: statistics.median(values) for mode, values in seconds.items()}
        results[framework] = {
            "median_s": medians,
            "all_s": seconds,
            "speedup": medians["recompute"] / medians["cache"],
        }
    return {"tokens": tokens, "batch": GENERATION_BATCH, "source_len": GENERATION_SOURCE, **GENERATION_SIZES,
            "frameworks": results}  # fmt: skip


def run(cases: list[str], impls: list[str], repeats: int, budget_s: float, log: Callable[[str], None]) -> dict:
    rate = json.loads(
        subprocess.run(
            [sys.executable, "-m", "multihead.app.bench", "--matmul"], capture_output=True, text=True, check=True
        ).stdout
    )["gflops"]
    log(f"matmul rate: {rate:.1f} GFLOP/s (fp32, 2048³)")
    samples: dict[tuple[str, str], list[dict]] = {}
    for repeat in range(repeats):
        for case in cases:
            for impl in impls:  # interleaved: each repeat runs every implementation once per case
                if impl in CASES[case].skip:
                    continue
                sample = _measure(impl, case, budget_s)
                samples.setdefault((case, impl), []).append(sample)
                shown = f"{sample['median_s'] * 1e3:9.2f} ms" if "median_s" in sample else sample["error"][:60]
                log(f"[{repeat + 1}/{repeats}] {case:15s} {impl:16s} {shown}")
    rows = []
    for case in cases:
        measured = {}
        for impl in impls:
            good = [s for s in samples.get((case, impl), []) if "median_s" in s]
            if good:
                measured[impl] = {
                    "median_s": statistics.median(s["median_s"] for s in good),
                    "peak_mib": max(s["peak_mib"] for s in good),
                }
        peers = {i: m for i, m in measured.items() if i in PEERS}
        best = min(peers, key=lambda i: peers[i]["median_s"]) if peers else None
        for impl, m in measured.items():
            rows.append({
                "case": case, "impl": impl, **m,
                "ratio_to_best_peer": m["median_s"] / peers[best]["median_s"] if best else None,
                "best_peer": best,
                "gflops": CASES[case].flops / m["median_s"] / 1e9,
                "share_of_matmul": CASES[case].flops / m["median_s"] / 1e9 / rate,
            })  # fmt: skip
        for impl in CASES[case].skip:
            rows.append({"case": case, "impl": impl, "skipped": CASES[case].why})
    return {"matmul_gflops": rate, "repeats": repeats, "budget_s": budget_s, "cpus": os.cpu_count(),
            "cases": {name: asdict(CASES[name]) for name in cases}, "rows": rows}  # fmt: skip


def markdown(results: dict) -> str:
    lines = [
        f"Machine matmul rate: {results['matmul_gflops']:.1f} GFLOP/s (fp32). Medians of {results['repeats']} "
        "fresh-process runs; ratio = time / fastest peer's time (≤ 1.00: we are at least as fast).",
        "",
        "| case | implementation | median | ratio to best peer | peak memory | attention GFLOP/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        if "skipped" in row:
            lines.append(f"| {row['case']} | {row['impl']} | skipped | | | |")
            continue
        ratio = "" if row["ratio_to_best_peer"] is None else f"{row['ratio_to_best_peer']:.2f}"
        name = f"**{row['impl']}**" if row["impl"] in OURS else row["impl"]
        lines.append(
            f"| {row['case']} | {name} | {row['median_s'] * 1e3:.2f} ms | {ratio} | {row['peak_mib']:.0f} MiB | "
            f"{row['gflops']:.1f} |"
        )
    generation = results.get("generation")
    if generation:
        lines += [
            "",
            f"Greedy generation of {generation['tokens']} tokens (B={generation['batch']}, source length "
            f"{generation['source_len']}, d_model={generation['d_model']}, {generation['num_encoder_layers']}+"
            f"{generation['num_decoder_layers']} layers), medians of {results['repeats']} fresh-process runs:",
            "",
            "| framework | with the cache | recomputing the prefix | speed-up |",
            "|---|---:|---:|---:|",
        ]
        for framework, measured in generation["frameworks"].items():
            lines.append(
                f"| {framework} | {measured['median_s']['cache']:.2f} s | {measured['median_s']['recompute']:.2f} s "
                f"| {measured['speedup']:.1f}× |"
            )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r.get("ratio_to_best_peer")]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    figure, axis = plt.subplots(figsize=(max(8, len(cases) * 1.4), 4.5))
    width = 0.8 / max(1, len(impls))
    for index, impl in enumerate(impls):
        values = [
            next((r["ratio_to_best_peer"] for r in rows if r["case"] == c and r["impl"] == impl), 0) for c in cases
        ]
        axis.bar([c + index * width for c in range(len(cases))], values, width, label=impl)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))], cases, rotation=20, fontsize=8)
    axis.set_ylabel("time / fastest peer (lower is better)")
    axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=110, format="png"))
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="multihead bench", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), help="(none: skip)")
    parser.add_argument("--impls", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per implementation and case")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed steps per run (at least 3 steps)")
    parser.add_argument(
        "--generation",
        nargs="*",
        default=["torch", "keras"],
        choices=["torch", "keras"],
        help="front ends whose generation is timed with and without the cache (none: skip)",
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated in the generation benchmark")
    parser.add_argument("--out", default="benchmarks", help="directory for results.json, results.md, results.png")
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "CASE"), help=argparse.SUPPRESS)
    parser.add_argument("--generate", nargs=2, metavar=("FRAMEWORK", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--matmul", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.tokens < 1 or args.budget < 0:
        parser.error(
            f"--repeats and --tokens must be at least 1 and --budget non-negative, received --repeats {args.repeats}, "
            f"--tokens {args.tokens}, --budget {args.budget}"
        )
    if args.matmul:
        print(json.dumps({"gflops": matmul_gflops()}))
        return 0
    if args.child:
        print(json.dumps(child(*args.child, args.budget)))
        return 0
    if args.generate:
        framework, mode = args.generate
        print(json.dumps(generation_child(framework, mode == "cache", args.tokens)))
        return 0
    log = lambda line: print(line, flush=True)  # noqa: E731
    results = run(args.cases, args.impls, args.repeats, args.budget, log)
    if args.generation:
        results["generation"] = run_generation(args.generation, args.tokens, args.repeats, log)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(results, indent=2) + "\n"), ("results.md", markdown(results))):
        atomic_write(out / name, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
    if results["rows"]:
        plot(results, out / "results.png")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
