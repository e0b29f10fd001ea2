"""A run loaded to translate: its checkpoint's model in PyTorch (whatever trained it) on a device, in the inference
form chosen (:func:`multihead.torch.quantize`), its weights laid out for decoding, an ensemble's other runs loaded
alike; and what decodes with them: batches (:func:`multihead.engine.generate`, through a session) and streams
(:class:`multihead.torch.streaming.StreamRows`).

Only a loaded run holds its models: a run is released by letting go of it (and of the translators made of it).
What describes a run besides (its languages, its tokenizers) is its checkpoint's and its direction's
(:class:`multihead.app.languages.Direction`).

Notation: B batch, Ls source length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from multihead.app.batched import BATCH_TOKENS, CUDA_BATCH_TOKENS, Generate, length_limit
from multihead.app.console import UserError
from multihead.app.languages import Direction, LanguageTokens
from multihead.app.runs import WEIGHTS, Checkpoint, open_checkpoint
from multihead.app.tokenizers import SentencePieceTokenizer, digest, source_prefix
from multihead.decoding import Generation, SearchOptions
from multihead.engine import Ensemble, generate


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


@dataclass(frozen=True, eq=False)
class LoadedRun:
    """A run's ``checkpoint`` and its ``model``, loaded on ``device`` (:func:`load_run`), ready to decode:
    ``layouts``, the model's weights laid out for decoding, once for every session (a loaded run never changes
    them); ``others``, an ensemble's other runs, whose models decode with this one's
    (:class:`multihead.engine.Ensemble`)."""

    checkpoint: Checkpoint
    model: Any
    device: Any
    layouts: Any
    others: tuple[LoadedRun, ...] = ()

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
        return CUDA_BATCH_TOKENS if self.device.type == "cuda" else BATCH_TOKENS

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

    def session(self, src: np.ndarray, limits: np.ndarray) -> Any:
        """A decoding session of ``src (B, Ls)`` for rows limited to ``limits (B,)``, stepping with its layouts (an
        :class:`~multihead.engine.Ensemble` of every member's, in an ensemble); inside ``torch.inference_mode()``."""
        import torch

        source = torch.from_numpy(src).to(self.device)
        sessions = [
            member.model.decoding_session(source, max_len=int(limits.max()), layouts=member.layouts)
            for member in (self, *self.others)
        ]
        return Ensemble(sessions, sessions[0].steps.mean_log_probs) if self.others else sessions[0]

    def stream_rows(self, pad: int) -> Any:
        """The rows a stream decodes its sentences over (:class:`multihead.torch.streaming.StreamRows`, a batch of
        joining sources padded with ``pad``, stepping with its layouts; an :class:`~multihead.engine.Ensemble` of
        every member's, in an ensemble)."""
        from multihead.torch.streaming import StreamRows

        members = [StreamRows(member.model, member.layouts, pad=pad) for member in (self, *self.others)]
        return Ensemble(members, members[0].steps.mean_log_probs) if self.others else members[0]

    def generator(self, spec: Generation) -> Generate:
        """What translates a batch as ``spec`` says (one translation a sentence): ``src (B, Ls)``, each row's length
        limit and index in the input (which seeds its sampling) -> tokens ``(B, T)`` as generated."""
        import torch

        def run(src: np.ndarray, limits: np.ndarray, indices: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return generate(self.session(src, limits), len(src), spec, max_len=limits, keys=indices)

        return run


def load_run(
    run: str | Path,
    checkpoint: str | None = None,
    *,
    device: str | None = None,
    quantize: str | None = None,
    ensemble: Sequence[str | Path] = (),
) -> LoadedRun:
    """A run's checkpoint (``checkpoint`` names it; default: the run's) loaded in PyTorch on ``device`` (see
    :mod:`multihead.app.devices`); ``quantize`` (``"int8"`` or ``"bf16"``) computes its linear layers in that type
    (on the CPU). ``ensemble``: other runs of the same vocabularies, each from its checkpoint ``checkpoint`` names,
    loaded alike, whose models translate with this one's; one whose model reads or writes other tokens is refused
    in one line."""
    import torch

    from multihead.app.devices import resolve_device
    from multihead.app.memory import keep_freed_memory
    from multihead.io import load_weights
    from multihead.torch import Layouts, Transformer
    from multihead.torch import quantize as quantize_model

    where = torch.device(resolve_device(device or "auto"))
    if quantize is not None and where.type != "cpu":
        raise UserError(f"--quantize {quantize} runs on the CPU (oneDNN's kernels): add --device cpu")

    def load(found: Checkpoint) -> Any:
        model = Transformer.from_config(found.config).eval()
        load_weights(model, found.path / WEIGHTS)
        return model.to(where)

    found, model = open_checkpoint(Path(run), checkpoint, load)
    if where.type == "cpu":  # a step's logits, (rows, vocabulary), would take fresh pages at every step;
        keep_freed_memory()  # from here on, not while loading, which frees what no step will reuse
    if quantize is not None:
        quantize_model(model, quantize)
    others = tuple(load_run(other, checkpoint, device=device, quantize=quantize) for other in ensemble)
    for other in others:
        _check_member(found, other.checkpoint)
    return LoadedRun(found, model, where, Layouts(), others)


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
