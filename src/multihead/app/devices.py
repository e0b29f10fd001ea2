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
import math
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
Multi30k BLEU held (docs/performance.md): AMD's Zen 5; and every CPU with AMX's bf16 tiles (:data:`BF16_AMX`). An
Intel Xeon with AVX512-BF16 and no AMX was slower in bf16; other kinds are not measured, and keep float32."""
BF16_AMX = "amx_bf16"
"""The flag of CPUs whose matrix units multiply bfloat16 tiles (Intel's AMX): faster in bf16, the BLEU held, on an
Intel Xeon (docs/performance.md)."""
BF16_CPU_WIDTH = 256
"""The narrowest model (d_model) that trains faster in bf16 on those CPUs: the corpus recipe's. Narrower ones (the
built-in tasks', 128) spend their steps in many small operations, to which autocast adds conversions: slower."""


def bf16_trains_faster(d_model: int) -> bool:
    """Whether a model ``d_model`` wide trains faster in bf16 than in float32 on this machine's CPU (one with AMX's
    bf16 tiles or one of :data:`BF16_CPUS`, the model at least :data:`BF16_CPU_WIDTH` wide)."""
    flags = cpu.flags()
    measured = BF16_AMX in flags or ("avx512_bf16" in flags and (cpu.vendor(), cpu.family()) in BF16_CPUS)
    return measured and d_model >= BF16_CPU_WIDTH


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
"""Seconds over which ``--threads``' default watches how busy the machine's cores are when a command starts."""
FOLLOW_EVERY = 1.0
"""Seconds between the looks a command without ``--threads`` takes at how busy the cores are while it runs."""


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


@dataclass(frozen=True)
class _Look:
    """The machine's CPU time (:func:`_cpu_times`) and this process's own (seconds, every thread) at one moment."""

    busy: int
    total: int
    own: float
    at: float  # time.monotonic()


def _look() -> _Look | None:
    times = _cpu_times()
    return None if times is None else _Look(*times, own=time.process_time(), at=time.monotonic())


def _free(before: _Look, after: _Look, *, crowded: bool, taken_from: float = 0.5) -> int | None:
    """The cores other processes left free between two looks (a core counts as taken from ``taken_from`` of its time
    up); ``crowded``: this process had a thread on every core meanwhile, so a neighbour got about half of the core it
    wanted (the scheduler shares a core evenly between two busy threads), and its time counts double."""
    if after.total <= before.total:
        return None
    ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    others = max(0.0, (after.busy - before.busy) - (after.own - before.own) * ticks_per_second)
    taken = others / (after.total - before.total) * (os.cpu_count() or 1) * (2 if crowded else 1)
    usable = cpu.usable_cores()
    return max(1, min(usable, usable - math.floor(taken + 1 - taken_from)))


def free_cores(sample: float = BUSY_SAMPLE) -> int | None:
    """How many of this process's cores the other processes leave free, watched for ``sample`` seconds (a core
    counts as taken from half its time up); ``None`` where the machine cannot say."""
    before = _look()
    time.sleep(sample)
    after = _look()
    return None if before is None or after is None else _free(before, after, crowded=False)


def default_threads() -> int | None:
    """``--threads``' default: the cores other processes leave free when the command starts (:func:`free_cores`);
    ``None`` (PyTorch's own choice) where ``OMP_NUM_THREADS`` says how many, or the machine cannot tell."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return free_cores()


class FreeCores:
    """CPU threads that follow the cores other processes leave free while a command runs: :meth:`fit`, called
    between units of work (a batch, a decoding step, a training step), looks at the machine every
    :data:`FOLLOW_EVERY` seconds and computes with one thread a free core. PyTorch's threads meet at the end of
    every operation, so one that shares its core with a busy neighbour holds up the others at each of them, and a
    thread fewer runs faster (docs/performance.md). A thread comes back once the others leave three quarters of a core
    free (a core with fewer of our threads than cores counts as taken from a quarter of its time up), so that a
    neighbour that takes a quarter to a half of a core does not change the threads at every look. Threads are set in
    the thread that calls :meth:`fit`, the one that computes."""

    def __init__(self) -> None:
        self.last = _look()

    def fit(self) -> None:
        import torch

        last = self.last
        if last is None or time.monotonic() - last.at < FOLLOW_EVERY:
            return
        self.last = now = _look()
        threads = torch.get_num_threads()
        crowded = threads >= cpu.usable_cores()
        free = None if now is None else _free(last, now, crowded=crowded, taken_from=0.5 if crowded else 0.25)
        if free is not None and free != threads:
            torch.set_num_threads(free)


_following: FreeCores | None = None


def choose_threads(given: int | None) -> None:
    """The threads a command that runs a model computes with: ``--threads`` when ``given``, else the free cores
    (:func:`default_threads`), followed while it runs (:class:`FreeCores`; not in a rank of several, which share
    the machine's cores out among themselves)."""
    global _following
    threads = given or default_threads()
    if threads is not None:
        use_threads(threads)
    single = int(os.environ.get("WORLD_SIZE", "1")) <= 1
    _following = FreeCores() if given is None and threads is not None and single else None


def fit_threads() -> None:
    """Between units of work: the threads fitted to the free cores where the command follows them
    (:func:`choose_threads`); nothing otherwise."""
    if _following is not None:
        _following.fit()


def use_threads(count: int) -> None:
    """Compute with ``count`` CPU threads (``--threads``): PyTorch's intra-op threads, which run the work of each
    operation (its inter-op pool only runs ``torch.jit`` forks, which nothing here makes, and can be set only once a
    process), and TensorFlow's two pools (``TF_NUM_INTRAOP_THREADS``, ``TF_NUM_INTEROP_THREADS``) where TensorFlow
    has not been imported yet (it reads them once). JAX's threads cannot be set."""
    import torch

    usable = cpu.usable_cores()
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
