"""A run loaded to translate: its checkpoint's model on a device, in PyTorch (whatever trained it; in the inference
form chosen, :func:`multihead.torch.quantize`, its weights laid out for decoding) or, when asked, in Keras (its
:class:`FrontEnd`), an ensemble's other runs loaded alike; and what decodes with them: batches
(:func:`multihead.engine.generate`, through a session) and streams (each front end's ``StreamRows``).

Only a loaded run holds its models: a run is released by letting go of it (and of the translators made of it).
What describes a run besides (its languages, its tokenizers) is its checkpoint's and its direction's
(:class:`multihead.app.languages.Direction`).

Notation: B batch, Ls source length.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from multihead.app.batched import BATCH_TOKENS, CUDA_BATCH_TOKENS, Generate, Phrases, length_limit
from multihead.app.console import UserError, warn
from multihead.app.languages import Direction, LanguageTokens
from multihead.app.runs import WEIGHTS, Checkpoint, open_checkpoint, packed_forms
from multihead.app.tokenizers import SentencePieceTokenizer, digest, source_prefix
from multihead.decoding import Generation, SearchOptions
from multihead.engine import Ensemble, JoiningRows, Rows, generate


def run_direction(checkpoint: Checkpoint) -> Direction:
    """The direction a run translates as it was trained or imported: its recorded languages, its source tokenizer's
    opening ids, its generation."""
    langs = checkpoint.options.get("langs")
    pair = (langs[0], langs[1]) if langs else None
    return Direction(pair, source_prefix(checkpoint.source), checkpoint.generation)


def model_tokens(checkpoint: Checkpoint) -> str:
    """A digest of the tokens a run's model reads and writes (:func:`multihead.app.tokenizers.digest`), less the
    language token its tokenizers open each text with: the pair a run of a many-language model chose, not its
    model."""
    return digest(checkpoint.source, checkpoint.target, prefixes=False)


class FrontEnd(Protocol):
    """The framework a loaded run's models are in: how it loads a checkpoint's model, and what it computes with a
    :class:`LoadedRun`'s (arrays in, arrays out)."""

    @property
    def name(self) -> str:
        """``"torch"`` or ``"keras"`` (``--framework``)."""
        ...

    @property
    def device(self) -> str:
        """Where its models compute: ``"cpu"``, else a GPU (``"cuda:N"`` in PyTorch, ``"gpu"`` in Keras)."""
        ...

    def load(self, checkpoint: Checkpoint) -> Any:
        """The checkpoint's model with its weights, on the front end's device, ready to decode."""
        ...

    def layouts(self) -> Any:
        """What holds a model's weights laid out for decoding (PyTorch's :class:`~multihead.torch.Layouts`; ``None``
        in Keras)."""
        ...

    def decoding(self) -> AbstractContextManager[Any]:
        """Where its models decode without recording gradients."""
        ...

    def session(self, run: LoadedRun, src: np.ndarray, limit: int, *, alone: bool) -> Rows:
        """``run``'s model's decoding session of ``src (B, Ls)`` for at most ``limit`` steps; ``alone``: not one of
        an ensemble's (whose steps give their log-probabilities to be averaged)."""
        ...

    def stream_rows(self, run: LoadedRun, pad: int) -> JoiningRows:
        """``run``'s model's rows of a stream, sources padded with ``pad``."""
        ...

    def mean_log_probs(self, log_probs: Sequence[Any]) -> Any:
        """An ensemble's step: the mean of its models' (:class:`~multihead.engine.Ensemble`)."""
        ...

    def log_probs(
        self, run: LoadedRun, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, pad: int
    ) -> np.ndarray:
        """Teacher-forced: for each row ``(B,)``, the summed log-probabilities of ``tgt_out (B, Lt)``'s tokens other
        than ``pad``, reading ``src (B, Ls)`` and ``tgt_in (B, Lt)``."""
        ...

    def cross_attention(self, run: LoadedRun, src: list[int], tgt: list[int]) -> list[np.ndarray]:
        """Every decoder layer's cross-attention weights ``(H, Lt, Ls)`` for one source and its target prefix."""
        ...


@dataclass(frozen=True)
class TorchFrontEnd:
    """PyTorch on ``device`` (a :func:`~multihead.app.devices.resolve_device` name); ``quantize`` as
    :func:`load_run` takes it."""

    device: str
    quantize: str | None = None
    name: str = "torch"

    def load(self, checkpoint: Checkpoint) -> Any:
        """The checkpoint's model. An int8 run (its weights stored as int8 rows) computes in int8 on the CPU unless
        ``quantize`` says otherwise, its weights kept as stored (no float32 copy); elsewhere, in float32 from them."""
        from multihead.io import load_weights, stored_weights
        from multihead.torch import Transformer, quantize

        path = checkpoint.path / WEIGHTS
        compute = self.quantize
        if compute is None and self.device == "cpu" and stored_weights(path).int8:
            compute = "int8"
        model = Transformer.from_config(checkpoint.config, initialise=False).eval()  # every weight loaded next
        load_weights(model, path, keep_int8=compute == "int8")
        model.to(self.device)
        if compute == "int8":
            _int8_forms(model, checkpoint)
        elif compute is not None:
            quantize(model, compute)
        return model

    def layouts(self) -> Any:
        from multihead.torch import Layouts

        return Layouts()

    def decoding(self) -> AbstractContextManager[Any]:
        import torch

        return torch.inference_mode()

    def session(self, run: LoadedRun, src: np.ndarray, limit: int, *, alone: bool) -> Rows:
        import torch

        source = torch.from_numpy(src).to(self.device)
        return run.model.decoding_session(source, max_len=limit, layouts=run.layouts)

    def stream_rows(self, run: LoadedRun, pad: int) -> JoiningRows:
        from multihead.torch.streaming import StreamRows

        return StreamRows(run.model, run.layouts, pad=pad)

    def mean_log_probs(self, log_probs: Sequence[Any]) -> Any:
        from multihead.torch.transformer import DecoderSteps

        return DecoderSteps.mean_log_probs(log_probs)

    def log_probs(
        self, run: LoadedRun, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, pad: int
    ) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = torch.from_numpy(tgt_out).to(self.device)
            logits = run.model(torch.from_numpy(src).to(self.device), torch.from_numpy(tgt_in).to(self.device))
            logits = logits.float()  # (B, Lt, V)
            picked = logits.gather(-1, out.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, Lt)
            return picked.masked_fill(out == pad, 0.0).sum(dim=1).double().cpu().numpy()

    def cross_attention(self, run: LoadedRun, src: list[int], tgt: list[int]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode():
            memory = run.model.encode(torch.tensor([src], device=self.device))
            _, weights = run.model.decode(torch.tensor([tgt], device=self.device), memory, return_weights=True)
        return [w[0].float().cpu().numpy() for w in weights]


@dataclass(frozen=True)
class KerasFrontEnd:
    """Keras, on the backend ``KERAS_BACKEND`` names, where that backend computes (``device``: ``"cpu"`` or
    ``"gpu"``): batches decode as its ``generate`` does (compiled on TensorFlow and JAX; an ensemble's eagerly),
    streams eagerly, one operation at a time (their rows change at every step)."""

    device: str
    name: str = "keras"

    def load(self, checkpoint: Checkpoint) -> Any:
        from multihead.io import load_weights
        from multihead.keras import Transformer

        model = Transformer.from_config(checkpoint.config)
        model.build()
        load_weights(model, checkpoint.path / WEIGHTS)
        return model

    def layouts(self) -> None:
        return None

    def decoding(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def session(self, run: LoadedRun, src: np.ndarray, limit: int, *, alone: bool) -> Rows:
        # A compiled session's log-probabilities stay inside its programs: an ensemble's members step eagerly.
        return run.model.decoding_session(src, max_len=limit, compiled=None if alone else False)

    def stream_rows(self, run: LoadedRun, pad: int) -> JoiningRows:
        from multihead.keras.streaming import StreamRows

        return StreamRows(run.model, pad=pad)

    def mean_log_probs(self, log_probs: Sequence[Any]) -> Any:
        from multihead.keras.transformer import DecoderSteps

        return DecoderSteps.mean_log_probs(log_probs)

    def log_probs(
        self, run: LoadedRun, src: np.ndarray, tgt_in: np.ndarray, tgt_out: np.ndarray, pad: int
    ) -> np.ndarray:
        from keras import ops

        logits = ops.cast(run.model(src, tgt_in), "float32")  # (B, Lt, V)
        log_probs = ops.convert_to_numpy(ops.log_softmax(logits, axis=-1)).astype(np.float64)
        picked = np.take_along_axis(log_probs, tgt_out[..., None], axis=-1)[..., 0]  # (B, Lt)
        return np.where(tgt_out == pad, 0.0, picked).sum(axis=1)

    def cross_attention(self, run: LoadedRun, src: list[int], tgt: list[int]) -> list[np.ndarray]:
        from keras import ops

        memory = run.model.encode(np.array([src], dtype=np.int64))
        _, weights = run.model.decode(np.array([tgt], dtype=np.int64), memory, return_weights=True)
        return [ops.convert_to_numpy(ops.cast(w, "float32"))[0] for w in weights]


@dataclass(frozen=True, eq=False)
class LoadedRun:
    """A run's ``checkpoint`` and its ``model``, loaded by its ``front`` end (:func:`load_run`), ready to decode:
    ``layouts``, a PyTorch model's weights laid out for decoding, once for every session (a loaded run never changes
    them; ``None`` in Keras); ``others``, an ensemble's other runs, whose models decode with this one's
    (:class:`multihead.engine.Ensemble`)."""

    checkpoint: Checkpoint
    model: Any
    front: FrontEnd
    layouts: Any
    others: tuple[LoadedRun, ...] = ()

    @property
    def device(self) -> str:
        """Where its models compute: its front end's device."""
        return self.front.device

    @property
    def runs(self) -> list[Checkpoint]:
        """The checkpoint of each run that translates: this one's, then the ensemble's others'."""
        return [self.checkpoint, *(other.checkpoint for other in self.others)]

    @functools.cached_property
    def max_len(self) -> int:
        """The most tokens a source may have: what every member's model reads."""
        return min(member.checkpoint.config.max_len for member in (self, *self.others))

    @functools.cached_property
    def longest_target(self) -> int:
        """The longest target its training saw, in tokens."""
        return int(self.checkpoint.trainer["data"].get("longest_target", 0))

    @property
    def batch_tokens(self) -> int:
        """Source tokens per batch on its device (:data:`~multihead.app.batched.BATCH_TOKENS`)."""
        return BATCH_TOKENS if self.device == "cpu" else CUDA_BATCH_TOKENS

    @functools.cached_property
    def language_tokens(self) -> LanguageTokens | None:
        """The language tokens of its model, if it translates between many languages (read once from its
        vocabularies: a SentencePiece model's)."""
        source, target = self.checkpoint.source, self.checkpoint.target
        if not isinstance(source, SentencePieceTokenizer):
            return None
        return LanguageTokens.of(source.vocabulary, getattr(target, "vocabulary", {}))

    def limit(self, source_length: int) -> int:
        """How many tokens a translation of ``source_length`` tokens may take
        (:func:`~multihead.app.batched.length_limit`; in an ensemble, the fewest any member allows)."""
        own = length_limit(source_length, self.longest_target, self.checkpoint.config.max_len)
        return min([own, *(other.limit(source_length) for other in self.others)])

    def limits(self, search: SearchOptions) -> Callable[[int], int]:
        """How many tokens a translation of a source's length may take under ``search``: its ``max_length`` where it
        sets one (more than :meth:`limit` allows, too), within the positions the model has; else :meth:`limit`."""
        if search.max_length is None:
            return self.limit
        most = min(search.max_length, self.max_len - 1)
        return lambda source_length: most

    def batch_size(self, search: SearchOptions) -> int:
        """Source tokens per batch for ``search``: the device's, divided by the beams."""
        return self.batch_tokens // search.beam_size

    def decoding(self) -> AbstractContextManager[Any]:
        """Where its models decode (:meth:`FrontEnd.decoding`)."""
        return self.front.decoding()

    def session(self, src: np.ndarray, limits: np.ndarray) -> Rows:
        """A decoding session of ``src (B, Ls)`` for rows limited to ``limits (B,)``, stepping with its layouts (an
        :class:`~multihead.engine.Ensemble` of every member's, in an ensemble); to step inside :meth:`decoding`."""
        members, limit = (self, *self.others), int(limits.max())
        sessions = [self.front.session(member, src, limit, alone=not self.others) for member in members]
        return Ensemble(sessions, self.front.mean_log_probs) if self.others else sessions[0]

    def stream_rows(self, pad: int) -> Rows:
        """The rows a stream decodes its sentences over (its front end's ``StreamRows``, a batch of joining sources
        padded with ``pad``; an :class:`~multihead.engine.Ensemble` of every member's, in an ensemble)."""
        members = [self.front.stream_rows(member, pad) for member in (self, *self.others)]
        return Ensemble(members, self.front.mean_log_probs) if self.others else members[0]

    def generator(
        self, spec: Generation, *, constraints: Sequence[Phrases] | None = None, first_key: int = 0
    ) -> Generate:
        """What translates a batch as ``spec`` says (one translation a sentence): ``src (B, Ls)``, each row's length
        limit and index ``i`` in the input -> tokens ``(B, T)`` as generated; row ``i`` samples with key
        ``first_key + i`` and holds the phrases ``constraints[i]`` (:func:`multihead.engine.generate`)."""

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            phrases = None if constraints is None else [constraints[index] for index in indices]
            with self.decoding():
                return generate(self.session(src, limits), len(src), spec, max_len=limits, keys=indices + first_key,
                                constraints=phrases)  # fmt: skip

        return run


def _int8_forms(model: Any, checkpoint: Checkpoint) -> None:
    """``model``'s int8 forms: mapped from the checkpoint's file of them packed on this kind of CPU
    (:func:`~multihead.app.runs.packed_forms`) where it holds them for these weights, else made from the weights and
    written there for the next load (in the time of one load; where the checkpoint cannot be written, a warning says
    so, and every load makes them)."""
    from multihead.app.memory import release_freed_memory
    from multihead.torch import quantize
    from multihead.torch.packed import load_quantized, packing, save_quantized, storable

    if not storable():
        quantize(model, "int8")
        return
    path, key = packed_forms(checkpoint.path, packing())
    try:
        if path.is_file() and load_quantized(model, path, key=key):
            return
    except (OSError, ValueError):
        pass  # a damaged or unreadable file: made anew, and replaced
    quantize(model, "int8")
    try:
        save_quantized(model, path, key=key)
    except OSError as error:
        if path not in _UNWRITABLE:
            _UNWRITABLE.add(path)
            warn(f"cannot keep the int8 forms for the next load ({error}): each load packs them anew")
        return
    # Mapped from the file just written, as later loads map them: the packed copies leave this process's heap (where
    # the file cannot be read back, the model keeps them, unchanged).
    try:
        if load_quantized(model, path, key=key):
            release_freed_memory()
    except (OSError, ValueError):
        pass


_UNWRITABLE: set[Path] = set()
"""The files of int8 forms this process could not write, warned about once each."""


def load_run(
    run: str | Path,
    checkpoint: str | None = None,
    *,
    device: str | None = None,
    quantize: str | None = None,
    ensemble: Sequence[str | Path] = (),
    framework: str = "torch",
) -> LoadedRun:
    """A run's checkpoint (``checkpoint`` names it; default: the run's) loaded in PyTorch on ``device`` (see
    :mod:`multihead.app.devices`); ``quantize`` (``"int8"`` or ``"bf16"``) computes its linear layers in that type (on
    the CPU). ``framework="keras"``: loaded in Keras instead, on the backend ``KERAS_BACKEND`` names, whatever trained
    it (one weight schema; PyTorch's inference forms, ``quantize``, refused in one line). ``ensemble``: other runs of
    the same vocabularies, each from its checkpoint ``checkpoint`` names, loaded alike by the same front end, whose
    models translate with this one's; one whose model reads or writes other tokens is refused in one line."""

    front = _front_end(framework, device=device, quantize=quantize)
    found, model = open_checkpoint(Path(run), checkpoint, front.load)
    if front.device == "cpu":  # a step's logits, (rows, vocabulary), would take fresh pages at every step;
        from multihead.app.memory import keep_freed_memory

        keep_freed_memory()  # from here on, not while loading, which frees what no step will reuse
    others = []
    for other in ensemble:
        member, member_model = open_checkpoint(Path(other), checkpoint, front.load)
        _check_member(found, member)
        others.append(LoadedRun(member, member_model, front, front.layouts()))
    return LoadedRun(found, model, front, front.layouts(), tuple(others))


def _front_end(framework: str, *, device: str | None, quantize: str | None) -> FrontEnd:
    """The front end of ``framework`` on ``device`` (see :func:`load_run`), checked in one line."""
    if framework == "keras":
        if quantize is not None:
            raise UserError(f"--quantize {quantize} is PyTorch's (its inference forms): not with --framework keras")
        from multihead.app.devices import check_device, keras_device

        check_device("keras", device or "auto")  # Keras imported there, its notices kept from the terminal
        return KerasFrontEnd(keras_device())
    from multihead.app.devices import resolve_device

    where = resolve_device(device or "auto")
    if quantize is not None and where != "cpu":
        raise UserError(f"--quantize {quantize} runs on the CPU (oneDNN's kernels): add --device cpu")
    return TorchFrontEnd(where, quantize)


def _check_member(mine: Checkpoint, theirs: Checkpoint) -> None:
    """Refuse, in one line, a run whose model reads or writes other tokens than this one's (whatever pair of a
    many-language model's languages each run chose: the ensemble translates this run's)."""
    same = model_tokens(mine) == model_tokens(theirs)
    if not same or mine.config.tgt_vocab != theirs.config.tgt_vocab:
        what = "their vocabularies differ" if not same else "their output layers differ"
        raise UserError(
            f"cannot ensemble {str(theirs.path.parents[1])!r} with {str(mine.path.parents[1])!r}: {what} (an "
            "ensemble's runs read and write the same tokens: train them with --vocab-from one of them)"
        )
