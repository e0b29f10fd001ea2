"""Helpers of the application's tests (``from app.support import ...``; the fixtures are in ``conftest.py``).

The corpora are a made-up German→English of six subjects, five verbs and five adverbs (150 sentence pairs, with
umlauts), written on the spot, so that a model of 16 dimensions learns much of it in a hundred steps (a few seconds).
Tests never read ``../shared/data``.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from multihead.app.options import recipe_options
from multihead.app.runs import latest_checkpoint
from multihead.app.training import TrainOptions
from multihead.app.translate import TRANSLATION
from multihead.decoding import SearchOptions

SUBJECTS = [("der Hund", "the dog"), ("die Katze", "the cat"), ("das Kind", "the child"), ("der Mann", "the man"),
            ("die Frau", "the woman"), ("der Bär", "the bear")]  # fmt: skip
VERBS = [("läuft", "runs"), ("schläft", "sleeps"), ("isst", "eats"), ("spielt", "plays"), ("singt", "sings")]
ADVERBS = [("schnell", "fast"), ("langsam", "slowly"), ("heute", "today"), ("hier", "here"), ("gern", "gladly")]
PAIRS = [
    (f"{s} {v} {a}.", f"{ts} {tv} {ta}.") for (s, ts), (v, tv), (a, ta) in itertools.product(SUBJECTS, VERBS, ADVERBS)
]  # 150 pairs, in a fixed order
VALID = PAIRS[3::7]  # 22 pairs; every subject, verb and adverb is also in training
TRAIN = [pair for pair in PAIRS if pair not in VALID]


def beam(size: int, n_best: int = 1) -> SearchOptions:
    """The command line's search with ``size`` beams (1: greedy) and ``n_best`` hypotheses a sentence."""
    return replace(TRANSLATION, beam_size=size, n_best=n_best)


# Tiny model sizes, as flags and as TrainOptions.
SMALL_FLAGS = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--no-progress"]
SMALL = dict(d_model=16, num_heads=2, layers=1, d_ff=32, progress=False)
# A task run of those sizes, never evaluated on the way: what it writes is what matters.
TINY = dict(batch_size=16, d_model=16, num_heads=2, layers=1, d_ff=32, eval_every=1000, progress=False, warmup=5)
# A corpus run of those sizes that learns in a few seconds.
CORPUS_FLAGS = [*SMALL_FLAGS, "--vocab-size", "120", "--batch-tokens", "200", "--lr", "1e-2", "--warmup", "10",
                "--dropout", "0"]  # fmt: skip
SAMPLES = [source for source, _ in VALID[:6]]  # what the tests translate
# What a PyTorch trainer is built with in tests that make one directly.
TRAINER_OPTIONS = dict(device="cpu", seed=0, lr=1e-2, clip=0.0, label_smoothing=0.1, precision="fp32", compile=False,
                       tokenizer="char")  # fmt: skip


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a ``python -m multihead`` subprocess: one thread, no debugging tracebacks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("MULTIHEAD_DEBUG", None)
    return env


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    """``lines`` as a UTF-8 file, gzipped when ``path`` ends in ``.gz``."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def write_corpus(
    directory: Path, pairs: Sequence[tuple[str, str]] = TRAIN, name: str = "train", gz: bool = False
) -> list[str]:
    """``NAME.de`` and ``NAME.en`` (``.gz`` with ``gz``) in ``directory``: their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    source = write_lines(directory / f"{name}.de{suffix}", [s for s, _ in pairs])
    target = write_lines(directory / f"{name}.en{suffix}", [t for _, t in pairs])
    return [str(source), str(target)]


@dataclass
class Cli:
    """What one ``multihead`` command run in this process did."""

    status: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    @property
    def out_lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self) -> dict:
        """The JSON object on the last line of stdout (``evaluate``)."""
        return json.loads(self.out_lines[-1])


def assert_refused(result: Cli, *fragments: str) -> None:
    """A user error: exit status 2, one line on stderr starting with ``multihead``, naming every fragment."""
    assert result.status == 2, (result.status, result.err)
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("multihead"), line
    assert "error: " in line, line
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in line, (fragment, line)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (``None`` for directories)."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))
    }


@dataclass
class CorpusRun:
    """A trained corpus run whose corpus is gone, and what it translated while the corpus was still there."""

    path: Path
    flags: list[str]  # the training flags, without --data, --valid and --out
    translations: list[str]  # of SAMPLES, from the default checkpoint, before the run was moved

    def copy(self, destination: Path) -> Path:
        shutil.copytree(self.path, destination)
        return destination


def no_evaluation(self: object, count: int | None) -> dict:
    """A stand-in for ``Training.evaluate`` where only the files a run writes matter: no translating."""
    if self.setup.data.metric == "bleu":
        return {"valid_loss": 1.0, "bleu": 0.0, "bleu_lowercase": 0.0, "chrf": 0.0, "signature": {}, "examples": 0}
    return {"accuracy": 0.0, "examples": 0}


def tiny(out: Path, **overrides: Any) -> TrainOptions:
    """Six steps of the reverse task at ``TINY`` sizes, a checkpoint every three."""
    return TrainOptions(out=str(out), **{"task": "reverse", "steps": 6, "checkpoint_every": 3, **TINY, **overrides})


# --- damaged runs -------------------------------------------------------------------------------------------


def damaged_run(run: Path, tmp_path: Path, damage: Callable[[Path], None]) -> Path:
    """A copy of ``run`` whose latest checkpoint ``damage`` has damaged."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    damage(latest_checkpoint(copy))
    return copy


def undamaged(checkpoint: Path) -> None:
    """A copy of the run as it is."""


def trainer_without(key: str) -> Callable[[Path], None]:
    """A damage: the checkpoint's trainer.json without ``key``."""

    def damage(checkpoint: Path) -> None:
        trainer = json.loads((checkpoint / "trainer.json").read_text())
        del trainer[key]
        (checkpoint / "trainer.json").write_text(json.dumps(trainer))

    return damage


def garbage_optimizer(checkpoint: Path) -> None:
    """A damage: an optimizer state that is not a safetensors file."""
    (checkpoint / "optimizer.safetensors").write_bytes(b"not safetensors")


def torch_trainer(config: Any = None, **options: Any) -> Any:
    """A PyTorch trainer of a tiny model (vocabularies of 12, padding id 0) on the CPU, fresh, with ``options`` over
    :data:`TRAINER_OPTIONS`."""
    from multihead.app.tokenizers import PAD
    from multihead.app.train_torch import TorchTrainer
    from multihead.config import TransformerConfig
    from multihead.decoding import Generation

    config = config or TransformerConfig(12, 12, 16, 2, 1, 1, 32, 0.0, "relu", False, 32, PAD, False)
    return TorchTrainer(config, recipe_options("task", **{**TRAINER_OPTIONS, **options}), None, Generation())


def run_ranks(target: Callable[..., None], world: int, *args: Any) -> None:
    """``target(rank, world, port, *args)`` in ``world`` spawned processes, as data-parallel ranks meeting on a free
    port of 127.0.0.1; each must exit 0 within 180 s."""
    import socket

    import torch

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = torch.multiprocessing.get_context("spawn")
    workers = [context.Process(target=target, args=(rank, world, port, *args)) for rank in range(world)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=180)
        assert worker.exitcode == 0


def sentences(count: int, seed: int = 0) -> list[str]:
    """Made-up German of the training words (``PAIRS``'s), a few of them unknown to the vocabulary."""
    rng = random.Random(seed)
    words = [word for subject, _ in SUBJECTS for word in subject.split()] + [verb for verb, _ in VERBS]
    words += ["Zebra", "quakt", "Qualle"]
    return [" ".join(rng.choices(words, k=rng.randint(1, 9))) + rng.choice(["", ".", "!"]) for _ in range(count)]
