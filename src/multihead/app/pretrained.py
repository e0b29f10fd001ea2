"""Models trained elsewhere, imported as runs: Hugging Face checkpoints of the families
:mod:`multihead.app.families` registers (:data:`~multihead.app.families.FAMILIES`): Marian (OPUS-MT's
``Helsinki-NLP/opus-mt-*``), M2M100 (``facebook/m2m100_418M``'s architecture) and NLLB-200.

``multihead import SOURCE RUN`` reads a checkpoint as Transformers' ``save_pretrained`` writes it, from a directory
or, given a Hub name, from the Hugging Face Hub (``huggingface_hub.snapshot_download``, which reuses the local
Hugging Face cache), and writes a run directory whose one checkpoint, ``step-0000000``, ``translate``, ``evaluate``,
``score``, ``serve`` and ``export`` read as any run's. It computes what Transformers' model of the checkpoint's
family computes (``MarianMTModel``, ``M2M100ForConditionalGeneration``):

- ``config.json``: its ``model_type`` (and ``tokenizer_config.json``'s ``tokenizer_class``) chooses the family
  (:func:`~multihead.app.families.family_of`), which reads the sizes, the activation, the embeddings' scale and ties,
  the special ids, the longest sequence and the dropout into our config. Keys absent take the defaults of the
  family's config class, as Transformers does.
- ``generation_config.json`` (else the generation keys of ``config.json``): ``bad_words_ids`` of single tokens (OPUS-MT
  bans its pad) become the tokens generation never chooses, ``forced_bos_token_id`` the token every translation
  starts with (a multilingual model's target language), and ``forced_eos_token_id`` the EOS a translation that
  reaches its length limit ends with: the run's generation spec (``banned``, ``forced``, ``eos_at_limit``). Its
  ``num_beams``, ``length_penalty`` and length limits become the run's default search
  (:func:`~multihead.app.hf_checkpoints.default_search`).
- the weights, ``model.safetensors`` (read without unpickling anything) or else ``pytorch_model.bin`` (read with
  ``torch.load(weights_only=True)``, which unpickles tensors only), stored as float32 under our names. Tied matrices
  that the file leaves out are filled from their tie; a missing ``final_logits_bias`` is zeros, as Transformers
  makes it; stored sinusoidal position tables are checked, not kept (they are computed).
- the tokenizer, the family's (its SentencePiece model and vocabulary), which gives the ids Transformers' tokenizer
  of the family gives; and the run's languages: ``--langs``, else those the checkpoint names.

Whatever the model computes that multihead cannot compute exactly is refused in one line naming the key and its value
(pre-norm layers, a LayerNorm after the embeddings or after the last layer, learned positions, other activations,
different sizes for the encoder and the decoder, an output layer of its own beside a shared vocabulary, bans of
token sequences, weights with no place in our model...), and nothing is written. Keys that
change nothing the model computes (the Hub's bookkeeping, training-only dropouts) are not read; keys the family does
not know are named in a warning. Search options ``multihead``'s search does not apply (``do_sample``,
``no_repeat_ngram_size``, ``repetition_penalty``, ``suppress_tokens``...) are named in a warning too.

Generation then differs from Transformers' ``generate`` in beam search only: unless ``renormalize_logits`` is set,
Transformers bans the pad after the softmax, leaving the others' probabilities as they were, where multihead (and
CTranslate2) ban it before the softmax, so that they sum to 1: beam scores differ by ``log(1 - p(pad))``, nothing for
a model that never learnt to write its pad; and with its default ``early_stopping=False`` it may stop a sentence
before a longer hypothesis that would rank higher, which multihead still finds (as ``early_stopping="never"``
does). Another pair of a many-language model's languages: :meth:`multihead.app.languages.LanguageTokens.direction`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multihead.app.console import UserError, warn
from multihead.app.families import FAMILIES, family_of
from multihead.app.hf_checkpoints import (
    CONFIG,
    EXAMPLE,
    GENERATION,
    PICKLED,
    SAFETENSORS,
    TOKENIZER_CONFIG,
    CheckpointFiles,
    checkpoint_weights,
    default_search,
)
from multihead.app.runs import check_new_run, save_imported_run
from multihead.app.tokenizers import SentencePieceTokenizer, Tokenizer
from multihead.config import TransformerConfig
from multihead.decoding import Generation

FILES = tuple(dict.fromkeys([CONFIG, GENERATION, TOKENIZER_CONFIG, *(file for f in FAMILIES for file in f.files)]))
"""What a Hub download fetches besides the weights (one weights file: the safetensors one where the model has it):
the configs and every family's tokenizer files."""
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Imported:
    """What ``multihead import`` wrote: the run, its model and tokenizers, and the languages it recorded."""

    run: Path
    source_name: str
    family: str  # the name of its family (:data:`~multihead.app.families.FAMILIES`): "Marian", "M2M100"...
    config: TransformerConfig
    generation: Generation
    search: dict[str, Any]  # the run's default search: SearchOptions values
    source: Tokenizer
    target: Tokenizer
    langs: list[str] | None
    parameters: int


def import_pretrained(source_name: str, run: Path, *, langs: Sequence[str] | None = None) -> Imported:
    """Import the checkpoint ``source_name`` (a directory, or a Hub name such as ``Helsinki-NLP/opus-mt-de-en``) of a
    registered family as the new run directory ``run``; ``langs`` (``[source, target]``) is recorded, by default
    those the checkpoint names. A :class:`UserError` in one line, nothing written, for what cannot be imported."""
    check_new_run(run, "RUN", "import")  # before a download
    directory = checkpoint_directory(source_name)
    files = CheckpointFiles(directory, source_name)
    hf = files.json(CONFIG)
    generation = files.json(GENERATION) if (directory / GENERATION).is_file() else None
    family = family_of(hf, files)
    config, ids = family.config(hf, generation, files)
    made = family.tokenizers(files, hf, config, ids, langs)
    weights = checkpoint_weights(files.tensors(), config, files, names=family.weight_names(config), family=family.name)
    search = default_search(hf, generation, files)
    try:
        spec = Generation(made.target.specials, banned=made.ids.banned, forced=made.ids.forced,
                          eos_at_limit=made.ids.eos_at_limit)  # fmt: skip
        spec.check(config.tgt_vocab)
    except ValueError as error:
        raise files.refuse(GENERATION if generation is not None else CONFIG, f"describes no generation multihead "
                           f"can run: {error}") from None  # fmt: skip
    for note in files.notes:
        warn(note)
    record = {"source": source_name, "config": hf, "generation_config": generation, "weights": files.weights_name}
    # No --vocab-size made the vocabulary; --joint-vocab: one for both sides, tied as ours are.
    options = {"task": None, "data": None, "tokenizer": SentencePieceTokenizer.kind, "vocab_size": None,
               "joint": config.tie_embeddings, "langs": made.langs, "imported": source_name,
               "search": search}  # fmt: skip
    save_imported_run(run, config=config, generation=spec, weights=weights, tokenizers=(made.source, made.target),
                      options=options, record=record)  # fmt: skip
    parameters = sum({id(array): array.size for array in weights.values()}.values())  # a tied matrix once
    return Imported(run, source_name, family.name, config, spec, search, made.source, made.target, made.langs,
                    parameters)  # fmt: skip


# --- where the checkpoint is ------------------------------------------------------------------------------


def checkpoint_directory(source_name: str) -> Path:
    """The directory holding the checkpoint ``source_name`` names: itself, or a Hub model's files downloaded into the
    Hugging Face cache (or found there)."""
    path = Path(source_name)
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"SOURCE {source_name!r} is a file: give the directory that holds the model's {CONFIG}")
    if not HUB_NAME.match(source_name):
        raise UserError(f"SOURCE {source_name!r} is not a directory, nor a Hugging Face Hub name such as {EXAMPLE}")
    return _download(source_name)


def _download(name: str) -> Path:
    """The Hub model ``name``'s files (its weights in one format), downloaded or from the local cache."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.utils import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise UserError(
            f"SOURCE {name!r} is not a directory; to download it from the Hugging Face Hub, install huggingface_hub "
            "(pip install 'multihead[app]'), or import a directory that holds the model"
        ) from None
    instead = (f"download it on a machine with network (hf download {name} --local-dir DIR), copy DIR here and run "
               "multihead import DIR RUN")  # fmt: skip
    try:
        directory = Path(snapshot_download(name, allow_patterns=[*FILES, SAFETENSORS]))
        if not (directory / SAFETENSORS).is_file():  # an older model: its weights pickled only
            directory = Path(snapshot_download(name, allow_patterns=[*FILES, PICKLED]))
    except GatedRepoError:
        raise UserError(
            f"{name} on the Hugging Face Hub is gated: accept its terms there and log in (hf auth login)"
        ) from None
    except RepositoryNotFoundError:
        raise UserError(
            f"the Hugging Face Hub has no model {name} (or it is private: log in with hf auth login); check the name, "
            f"such as {EXAMPLE}"
        ) from None
    except LocalEntryNotFoundError:
        raise UserError(f"cannot download {name}: the Hugging Face Hub cannot be reached from here (no network, or "
                        f"HF_HUB_OFFLINE is set) and it is not in the local cache; {instead}") from None  # fmt: skip
    except (HfHubHTTPError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"cannot download {name} from the Hugging Face Hub ({reason}); {instead}") from None
    return directory
