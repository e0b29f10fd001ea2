"""``multihead bench``: our attention against what users would pick instead, by the performance protocol.

Every (implementation, case) is measured in a fresh process (``python -m multihead.app.bench --child IMPL CASE``):
build, warm up, then time whole steps and take the median; peak memory is the process's peak RSS growth over
its baseline taken after importing the framework (so it counts the model, inputs and attention, not the
framework). Implementations are interleaved within each repeat, and the reported time is the median over
repeats. Ratios are to the fastest peer (not ours) of the same case. Attention FLOPs are ``4·B·H·Lq·Lk·D`` forward
and 3.5× that forward+backward; GFLOP/s is set against the machine's matmul rate, measured in the same run.

Generation is timed the same way: greedy decoding of exactly ``--tokens`` tokens (EOS never wins) by a Transformer
with and without its KV cache, and for Keras compiled against eager, interleaved, each run in a fresh process.
The Keras layer is measured on each Keras backend: ``multihead-keras`` (TensorFlow, inside ``tf.function``),
``multihead-keras-jax`` (inside ``jax.jit``), ``multihead-keras-torch`` (eager); ``keras-mha-jax`` is Keras' own
layer on JAX.

Notation: B batch, L length (Lq/Lk query/key length), E model width, H heads, D = E/H.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from multihead.app.console import OneLineErrorParser, framework_notices_filtered
from multihead.files import atomic_write, atomic_write_text

OURS = ("multihead-torch", "multihead-keras", "multihead-keras-jax", "multihead-keras-torch")
PEERS = ("torch-mha", "torch-sdpa", "keras-mha", "keras-mha-jax", "tutorial")
IMPLEMENTATIONS = OURS + PEERS


def keras_backend(impl: str) -> str:
    """The Keras backend a Keras implementation runs on: its name's suffix, TensorFlow without one."""
    return {"jax": "jax", "torch": "torch"}.get(impl.rsplit("-", 1)[-1], "tensorflow")


def _import_keras(backend: str) -> Any:
    """Keras on ``backend``, in this fresh process (the backend is chosen once, before Keras is imported)."""
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with framework_notices_filtered():
        import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(f"Keras runs on {keras.backend.backend()}, not {backend}: it was imported before")
    return keras


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
        Case("L4096-train", 1, 4096, 4096, backward=True),
        Case(
            "L16384-forward",
            1,
            16384,
            16384,
            skip=("keras-mha", "keras-mha-jax", "tutorial"),
            why="materialise the 8 GiB score matrix several times over: more than this 24 GiB machine has",
        ),
    )
}


# --- the child: one measurement --------------------------------------------------------------------------


def _lengths(case: Case) -> Any:
    import numpy as np

    return np.random.default_rng(0).integers(64, case.lk + 1, size=case.batch)


def _minimal_sdpa(width: int, heads: int) -> Any:
    """The least a user writes around scaled_dot_product_attention: fused QKV, SDPA, output projection."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    dim = width // heads

    class MinimalSDPA(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.out = nn.Linear(width, width)

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

    return MinimalSDPA()


def _tutorial(width: int, heads: int) -> Any:
    """The tutorials' explicit matmul-softmax-matmul."""
    import torch
    from torch import nn

    dim = width // heads

    class Tutorial(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(width, width) for _ in range(4))

        def forward(self, x: torch.Tensor, m: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            b, lq, e = x.shape
            q, k, v = (
                w(t).view(b, -1, heads, dim).transpose(1, 2) for w, t in ((self.wq, x), (self.wk, m), (self.wv, m))
            )
            scores = q @ k.transpose(-2, -1) / dim**0.5
            if mask is not None:
                scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
            return self.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, lq, e))

    return Tutorial()


def _torch_step(impl: str, case: Case) -> Callable[[], Any]:
    import torch
    from torch import nn

    from multihead.torch import MultiHeadAttention, padding_mask

    torch.manual_seed(0)
    query = torch.randn(case.batch, case.lq, case.width)
    memory = query if case.lq == case.lk else torch.randn(case.batch, case.lk, case.width)
    cross = memory is not query
    key_mask = padding_mask(torch.from_numpy(_lengths(case)), case.lk) if case.padded else None
    module: nn.Module
    if impl == "multihead-torch":
        module = MultiHeadAttention(case.width, case.heads)
        # In a padded self-attention batch the padded queries are padding too: saying so lets the module skip them.
        query_mask = None if cross else key_mask
        call = lambda: module(query, memory if cross else None, key_mask=key_mask, query_mask=query_mask)  # noqa: E731
    elif impl == "torch-mha":
        module = nn.MultiheadAttention(case.width, case.heads, batch_first=True)
        padding = None if key_mask is None else ~key_mask
        call = lambda: module(query, memory, memory, key_padding_mask=padding, need_weights=False)[0]  # noqa: E731
    else:
        module = (_minimal_sdpa if impl == "torch-sdpa" else _tutorial)(case.width, case.heads)
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
    """One step of a Keras layer as its backend runs it fastest: inside ``tf.function`` on TensorFlow, ``jax.jit``
    on JAX (weights passed in through ``stateless_call``), eagerly on torch."""
    backend = keras_backend(impl)
    keras = _import_keras(backend)
    import numpy as np

    from multihead.keras import MultiHeadAttention

    rng = np.random.default_rng(0)
    query = rng.normal(size=(case.batch, case.lq, case.width)).astype("float32")
    memory = query if case.lq == case.lk else rng.normal(size=(case.batch, case.lk, case.width)).astype("float32")
    key_mask = np.arange(case.lk)[None, :] < _lengths(case)[:, None] if case.padded else None
    if impl.startswith("multihead-keras"):
        layer = MultiHeadAttention(case.heads)
        inputs = {"query": query, "key": memory, "key_mask": key_mask}
    else:
        layer = keras.layers.MultiHeadAttention(case.heads, case.width // case.heads)
        mask = None if key_mask is None else np.broadcast_to(key_mask[:, None, :], (case.batch, case.lq, case.lk))
        inputs = {"query": query, "value": memory, "attention_mask": mask}
    inputs = {name: None if x is None else keras.ops.convert_to_tensor(x) for name, x in inputs.items()}
    layer(**inputs)  # build
    if backend == "tensorflow":
        return _tensorflow_step(layer, inputs, case.backward)
    if backend == "jax":
        return _jax_step(layer, inputs, case.backward)
    return _torch_backend_step(layer, inputs, case.backward)


def _tensorflow_step(layer: Any, inputs: dict[str, Any], backward: bool) -> Callable[[], Any]:
    import tensorflow as tf

    if not backward:
        return tf.function(lambda: layer(**inputs))

    @tf.function
    def train_step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(**inputs))
        return tape.gradient(loss, layer.trainable_variables)

    return train_step


def _jax_step(layer: Any, inputs: dict[str, Any], backward: bool) -> Callable[[], Any]:
    import jax

    trainable = [v.value for v in layer.trainable_variables]
    fixed = [v.value for v in layer.non_trainable_variables]

    def forward(trainable: list, fixed: list, inputs: dict[str, Any]) -> Any:
        return layer.stateless_call(trainable, fixed, **inputs)[0]

    program = jax.jit(jax.grad(lambda *args: forward(*args).sum()) if backward else forward)
    return lambda: jax.block_until_ready(program(trainable, fixed, inputs))


def _torch_backend_step(layer: Any, inputs: dict[str, Any], backward: bool) -> Callable[[], Any]:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if not backward:

        def forward() -> Any:
            with torch.no_grad():
                return layer(**inputs)

        return forward

    def train_step() -> Any:
        for weight in layer.trainable_variables:
            weight.value.grad = None
        out = layer(**inputs)
        out.sum().backward()
        return out

    return train_step


GENERATION_SIZES = {"d_model": 256, "num_heads": 8, "num_encoder_layers": 3, "num_decoder_layers": 3, "d_ff": 512}
GENERATION_BATCH, GENERATION_SOURCE, GENERATION_VOCAB = 8, 32, 8000
GENERATION_MODES = {
    "torch": ("cache", "recompute"),
    "keras": ("compiled", "cache", "recompute"),
    "keras-jax": ("compiled",),
}
"""What each front end's generation is timed in: ``cache`` (eager, with the KV cache), ``recompute`` (eager,
recomputing the prefix at every step), ``compiled`` (Keras: one traced program per step over a fixed-capacity
cache; on TensorFlow ``keras``, on JAX ``keras-jax``). Eager Keras on JAX would compile every operation at every new
length: minutes, not measured."""


def generation_child(framework: str, mode: str, tokens: int) -> dict[str, Any]:
    """Seconds for greedy generation of exactly ``tokens`` tokens, in this (fresh) process. A compiled mode's first
    call (tracing and compiling included) is timed too: ``first_s``."""
    import numpy as np

    source = np.random.default_rng(0).integers(3, GENERATION_VOCAB, size=(GENERATION_BATCH, GENERATION_SOURCE))
    sizes: dict[str, Any] = {**GENERATION_SIZES, "dropout": 0.0}
    options: dict[str, Any] = {"bos_id": 1, "eos_id": 2, "use_cache": mode != "recompute"}
    if framework == "torch":
        import torch

        from multihead.torch import Transformer

        torch.manual_seed(0)
        model: Any = Transformer(GENERATION_VOCAB, GENERATION_VOCAB, **sizes).eval()
        with torch.no_grad():
            model.output_proj.bias[2] = -1e9  # EOS (id 2) never wins: always the full length
        src = torch.from_numpy(source)
    else:
        keras = _import_keras("jax" if framework == "keras-jax" else "tensorflow")
        from multihead.keras import Transformer

        keras.utils.set_random_seed(0)
        model = Transformer(GENERATION_VOCAB, GENERATION_VOCAB, **sizes)
        model.build()
        bias = keras.ops.convert_to_numpy(model.output_proj.bias).copy()
        bias[2] = -1e9
        model.output_proj.bias.assign(bias)
        src = keras.ops.convert_to_tensor(source.astype("int32"))
        options["compiled"] = mode == "compiled"
    # A compiled program serves one capacity: its warm-up is the same call, and the one timed as the first call.
    begin = time.perf_counter()
    model.generate(src, max_len=tokens if mode == "compiled" else min(tokens, 8), **options)
    first = time.perf_counter() - begin
    begin = time.perf_counter()
    out = model.generate(src, max_len=tokens, **options)
    seconds = time.perf_counter() - begin
    if tuple(out.shape) != (GENERATION_BATCH, tokens):
        raise RuntimeError(f"generation stopped early: {tuple(out.shape)}")
    return {"framework": framework, "mode": mode, "seconds": seconds,
            "first_s": first if mode == "compiled" else None}  # fmt: skip


def _peak_rss_mib() -> float:
    from multihead.app.memory import peak_resident_bytes  # not ru_maxrss, which a child inherits from its parent

    return (peak_resident_bytes() or 0) / 2**20


def child(impl: str, case_name: str, budget_s: float) -> dict[str, Any]:
    """Time one implementation on one case in this (fresh) process."""
    case = CASES[case_name]
    if "keras" in impl:  # the framework's own footprint is not the attention's: import it before the baseline
        _import_keras(keras_backend(impl))
        __import__(keras_backend(impl))
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
    """Every front end's generation modes (``GENERATION_MODES``), interleaved within each repeat, medians over
    ``repeats`` fresh processes. ``speedup`` is recomputing's time over the fastest mode with a cache."""
    seconds: dict[str, dict[str, list[float]]] = {
        framework: {mode: [] for mode in GENERATION_MODES[framework]} for framework in frameworks
    }
    first: dict[str, list[float]] = {framework: [] for framework in frameworks}
    for repeat in range(repeats):
        for framework in frameworks:
            for mode in GENERATION_MODES[framework]:
                sample = _fresh_process("--generate", framework, mode, "--tokens", str(tokens))
                if "error" in sample:
                    raise RuntimeError(f"generation ({framework}, {mode}) failed: {sample['error']}")
                seconds[framework][mode].append(sample["seconds"])
                shown = f"{sample['seconds']:.2f} s"
                if sample.get("first_s") is not None:
                    first[framework].append(sample["first_s"])
                    shown += f" (first call {sample['first_s']:.2f} s)"
                log(f"[{repeat + 1}/{repeats}] generate {tokens} tokens, {framework} {mode}: {shown}")
    results: dict[str, Any] = {}
    for framework, measured in seconds.items():
        medians = {mode: statistics.median(values) for mode, values in measured.items()}
        cached = min((m for m in medians if m != "recompute"), key=lambda mode: medians[mode])
        results[framework] = {
            "median_s": medians,
            "all_s": measured,
            "per_step_ms": {mode: value / tokens * 1e3 for mode, value in medians.items()},
            "first_call_s": statistics.median(first[framework]) if first[framework] else None,
            "speedup": medians["recompute"] / medians[cached] if "recompute" in medians else None,
        }
    return {"tokens": tokens, "batch": GENERATION_BATCH, "source_len": GENERATION_SOURCE, "vocab": GENERATION_VOCAB,
            **GENERATION_SIZES, "frameworks": results}  # fmt: skip


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
        torch_step = generation["frameworks"].get("torch", {}).get("per_step_ms", {}).get("cache")
        lines += [
            "",
            f"Greedy generation of {generation['tokens']} tokens (B={generation['batch']}, source length "
            f"{generation['source_len']}, d_model={generation['d_model']}, {generation['num_heads']} heads, "
            f"{generation['num_encoder_layers']}+{generation['num_decoder_layers']} layers, d_ff={generation['d_ff']}, "
            f"vocabulary {generation['vocab']}), medians of {results['repeats']} fresh-process "
            "runs; a compiled mode's first call includes tracing and compiling:",
            "",
            "| framework | mode | total | per step | per step / torch's | recompute / this | first call |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for framework, measured in generation["frameworks"].items():
            for mode, total in measured["median_s"].items():
                step = (
                    measured["per_step_ms"][mode] if "per_step_ms" in measured else total / generation["tokens"] * 1e3
                )
                versus_torch = f"{step / torch_step:.2f}" if torch_step else ""
                recompute = measured["median_s"].get("recompute")
                speedup = f"{recompute / total:.1f}×" if recompute and mode != "recompute" else ""
                first_call = measured.get("first_call_s") if mode == "compiled" else None
                first_call = "" if first_call is None else f"{first_call:.2f} s"
                lines.append(
                    f"| {framework} | {mode} | {total:.2f} s | {step:.2f} ms | {versus_torch} | {speedup} | "
                    f"{first_call} |"
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
    parser = OneLineErrorParser(prog="multihead bench", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES), help="(none: skip)")
    parser.add_argument("--impls", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process runs per implementation and case")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed steps per run (at least 3 steps)")
    parser.add_argument(
        "--generation",
        nargs="*",
        default=list(GENERATION_MODES),
        choices=list(GENERATION_MODES),
        help="front ends whose generation is timed: torch, Keras on TensorFlow (compiled, eager, recomputing), Keras "
        "on JAX (compiled) (none: skip)",
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
        impl, case = args.child
        print(json.dumps(child(impl, case, args.budget)))
        return 0
    if args.generate:
        framework, mode = args.generate
        print(json.dumps(generation_child(framework, mode, args.tokens)))
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    results = run(args.cases, args.impls, args.repeats, args.budget, log)
    if args.generation:
        results["generation"] = run_generation(args.generation, args.tokens, args.repeats, log)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("results.json", json.dumps(results, indent=2) + "\n"), ("results.md", markdown(results))):
        atomic_write_text(out / name, text)
    if results["rows"]:
        plot(results, out / "results.png")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
