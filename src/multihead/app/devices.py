"""Where a command runs its model, and in what precision: ``--device`` and ``--precision``.

``--device auto`` (the default) takes the first CUDA device PyTorch sees, else the CPU; under ``torchrun`` each rank
takes ``cuda:LOCAL_RANK``. A device this machine does not have is refused in one line before anything is written.
``--precision auto`` is bf16 autocast on a CUDA device that supports it and where bf16 was measured to train faster
than float32 on the CPU with the BLEU held (:func:`bf16_trains_faster`), float32 elsewhere; ``bf16`` and ``fp16`` may
be asked for on any CPU. Weights are saved as float32 CPU tensors whatever trained them, so a run moves freely
between devices.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import time
from dataclasses import dataclass

from multihead import cpu
from multihead.app.console import UserError, framework_notices_filtered, warn

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_name(text: str) -> str:
    """An argparse type: the ``--device`` value as given, when it is one of the forms it takes."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be {DEVICE_CHOICES}, received {text!r}")
    return text


def resolve_device(name: str, flag: str = "--device") -> str:
    """The torch device ``name`` stands for on this machine (``cuda:LOCAL_RANK`` under torchrun for ``auto`` and
    ``cuda``); a :class:`UserError` when the machine has no such device."""
    import torch

    if name == "cpu":
        return "cpu"
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "auto" and not available:
        return "cpu"
    index = int(name.partition(":")[2]) if ":" in name else int(os.environ.get("LOCAL_RANK", "0"))
    if not available:
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UserError(
            f"{flag} {name}: PyTorch sees no CUDA device on this machine (torch {torch.__version__}, {build}); "
            "use --device cpu, or auto"
        )
    if index >= available:
        raise UserError(f"{flag} {name}: this machine has {available} CUDA device(s), cuda:0 to cuda:{available - 1}")
    return f"cuda:{index}"


@dataclass(frozen=True)
class Precision:
    """What a training step computes in: ``autocast`` (``None``: float32 throughout) and whether the loss is scaled
    against float16's narrow range."""

    name: str
    autocast: str | None  # "bfloat16" or "float16"
    scaled: bool


BF16_CPUS = (("AuthenticAMD", 26),)
"""The CPUs (vendor, family) with AVX512-BF16 whose training step is faster in bf16 than in float32, with the
Multi30k BLEU held (docs/performance.md): AMD's Zen 5. An Intel Xeon with AVX512-BF16 and no AMX was slower in bf16;
other kinds are not measured, and keep float32."""
BF16_CPU_WIDTH = 256
"""The narrowest model (d_model) that trains faster in bf16 on those CPUs: the corpus recipe's. Narrower ones (the
built-in tasks', 128) spend their steps in many small operations, to which autocast adds conversions: slower."""


def bf16_trains_faster(d_model: int) -> bool:
    """Whether a model ``d_model`` wide trains faster in bf16 than in float32 on this machine's CPU (one of
    :data:`BF16_CPUS`, the model at least :data:`BF16_CPU_WIDTH` wide)."""
    kind = (cpu.vendor(), cpu.family())
    return "avx512_bf16" in cpu.flags() and kind in BF16_CPUS and d_model >= BF16_CPU_WIDTH


def resolve_precision(name: str, device: str, d_model: int) -> Precision:
    """The precision ``--precision name`` stands for on ``device``, for a model ``d_model`` wide (``auto``: bf16 on a
    CUDA device with bf16 and where :func:`bf16_trains_faster` on the CPU, else fp32)."""
    import torch

    if name == "auto":
        bf16 = torch.cuda.is_bf16_supported() if device.startswith("cuda") else bf16_trains_faster(d_model)
        name = "bf16" if bf16 else "fp32"
    if name == "fp32":
        return Precision("fp32", None, False)
    return Precision(name, "bfloat16" if name == "bf16" else "float16", name == "fp16")


BUSY_SAMPLE = 0.1
"""Seconds over which ``--threads``' default watches how busy the machine's cores are."""


def _cpu_times() -> tuple[int, int] | None:
    """The machine's CPU time so far, busy and in all (clock ticks, every core: ``/proc/stat``); ``None`` where there
    is no ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:9]]  # user nice system idle iowait irq ...
    except (OSError, ValueError):
        return None
    idle = sum(ticks[3:5])  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def free_cores(sample: float = BUSY_SAMPLE) -> int | None:
    """How many of this process's cores the other processes leave free, watched for ``sample`` seconds (a core
    counts as taken from half its time up); ``None`` where the machine cannot say."""
    before = _cpu_times()
    time.sleep(sample)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    taken = (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable, round(usable - taken)))


def default_threads() -> int | None:
    """``--threads``' default: the cores other processes leave free when the command starts (:func:`free_cores`);
    ``None`` (PyTorch's own choice) where ``OMP_NUM_THREADS`` says how many, or the machine cannot tell."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cores()


def use_threads(count: int) -> None:
    """Compute with ``count`` CPU threads (``--threads``): PyTorch's intra-op threads, which run the work of each
    operation (its inter-op pool only runs ``torch.jit`` forks, which nothing here makes, and can be set only once a
    process), and TensorFlow's two pools (``TF_NUM_INTRAOP_THREADS``, ``TF_NUM_INTEROP_THREADS``) where TensorFlow
    has not been imported yet (it reads them once). JAX's threads cannot be set."""
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if count > usable:
        warn(f"--threads {count}: this process may use {usable} cores; more threads than cores take turns on them "
             "(slower, not faster)")  # fmt: skip
    torch.set_num_threads(count)
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ[name] = str(count)


def keep_frameworks_off_gpus() -> None:
    """Hide the GPUs from every framework imported after this (``--device cpu`` for Keras, whose backends place
    their work themselves): TensorFlow's and PyTorch's CUDA see no device, JAX runs on its CPU platform."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["JAX_PLATFORMS"] = "cpu"


KERAS_BACKENDS = ("tensorflow", "jax", "torch")
"""The Keras backends ``--framework keras`` trains on."""


def check_keras_backend() -> None:
    """``KERAS_BACKEND``, when set, names a backend Keras trains on here: checked before Keras is imported (which would
    fail on another name) and before anything is written."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend is not None and backend not in KERAS_BACKENDS:
        raise UserError(
            f"KERAS_BACKEND={backend!r} is not a backend --framework keras trains on: set it to "
            f"{', '.join(KERAS_BACKENDS[:-1])} or {KERAS_BACKENDS[-1]} (unset: Keras' default, tensorflow)"
        )


def check_device(framework: str, device: str) -> None:
    """The device a run is to train or decode on exists: checked before anything is written or loaded. Keras is
    imported here, after its backend's name is checked and, for ``--device cpu``, with the GPUs hidden from it."""
    if framework != "keras":
        resolve_device(device)
        return
    check_keras_backend()
    if device == "cpu":
        keep_frameworks_off_gpus()
    with framework_notices_filtered():
        # Keras imports TensorFlow whenever it is installed, whatever the backend (set_random_seed seeds it too):
        # here, where its start-up notices are filtered, rather than in the middle of a progress bar.
        if importlib.util.find_spec("tensorflow") is not None:
            importlib.import_module("tensorflow")

    found = keras_device()
    if device.startswith("cuda") and found == "cpu":
        raise UserError(f"--device {device}: Keras' {os.environ.get('KERAS_BACKEND', 'tensorflow')} backend sees no "
                        "GPU on this machine; use --device cpu, or auto")  # fmt: skip


def keras_device() -> str:
    """Where Keras' backend computes: ``gpu`` when it sees one, else ``cpu``."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    if backend == "jax":
        import jax

        return "gpu" if jax.devices()[0].platform == "gpu" else "cpu"
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"
