"""Loading a checkpoint: a shipped one by name, or any checkpoint folder.

    from rlhf_lab.checkpoints import load_checkpoint
    model, tokenizer, meta = load_checkpoint("addition_rl_start")
    meta["accuracy"], meta["accuracy_band"]          # measured held-out greedy accuracy, its band

This is the runtime side only: it imports the model and the tokenizer, never the training code.
How the shipped checkpoints are trained (and regenerated) is `rlhf_lab.checkpoints.presets`; what they are is
data/checkpoints/README.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..model.hf import CheckpointError, from_pretrained, read_config
from ..text.hf_tokenizer import HFTokenizer, is_char_tokenizer
from ..text.tokenizer import CharTokenizer
from ..text.tokenizer import default_tokenizer as _default_tokenizer
from ..util.atomic import recover_folder
from ..util.device import pick_device

__all__ = ["CHECKPOINT_DIR", "CheckpointError", "checkpoint_folder", "load_checkpoint", "model_and_tokenizer"]

# data/checkpoints of the repository (notebooks and the CLI run from a clone, where it sits next to
# the package). RLHF_LAB_CHECKPOINTS points somewhere else, e.g. for a pip-installed package.
CHECKPOINT_DIR = Path(os.environ.get("RLHF_LAB_CHECKPOINTS", Path(__file__).resolve().parents[2] / "data" / "checkpoints"))


def _available() -> list[str]:
    """Names of the checkpoint folders in CHECKPOINT_DIR (those with a config.json)."""
    if not CHECKPOINT_DIR.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINT_DIR.iterdir() if (p / "config.json").is_file())


def checkpoint_folder(name: str | os.PathLike) -> Path:
    """A shipped checkpoint's folder by name, or `name` itself when it is a folder (put back first if
    a save was killed between its two renames, see `rlhf_lab.util.atomic.recover_folder`)."""
    if not (isinstance(name, str) and (CHECKPOINT_DIR / name).is_dir()):
        recover_folder(name)
    if isinstance(name, str) and (CHECKPOINT_DIR / name).is_dir():
        return CHECKPOINT_DIR / name
    if Path(name).is_dir():
        return Path(name)
    raise CheckpointError(
        f"{str(name)!r} is neither a checkpoint folder nor one of the checkpoints in {CHECKPOINT_DIR} "
        f"({', '.join(_available()) or 'none there'}). A shipped checkpoint is regenerated with "
        f"`python -m rlhf_lab sft --preset NAME` (`--help` lists the presets)"
    )


def load_checkpoint(name: str | os.PathLike, device: str | torch.device = "cpu", default_tokenizer: bool = False):
    """Load a shipped checkpoint (by name) or any checkpoint folder.

    `device`: "cpu" (default), "cuda", "mps" or "auto". Returns (model, tokenizer, metadata): the
    lab's `LlamaModel` in eval mode, its tokenizer (the lab's `CharTokenizer` when the folder's
    tokenizer.json is one, else the checkpoint's own through `HFTokenizer`, e.g. a Qwen3 folder), and
    the dict saved under config.json["rlhf_lab"] (accuracy, accuracy_band, steps, sft settings...).

    A shipped checkpoint (by name) must carry the sha256 of each weights file in its config.json,
    and every checksum given is checked. A folder without tokenizer.json, or whose tokenizer files
    cannot be read, raises CheckpointError: its model was trained with some
    tokenizer, and guessing it would give silently wrong ids. `default_tokenizer=True` accepts
    such a folder and pairs it with the lab's default `CharTokenizer` (right for any model the lab
    trained with `default_tokenizer()`, e.g. a `save_pretrained(model, folder)` without tokenizer).
    """
    folder = checkpoint_folder(name)
    shipped = folder.parent.resolve() == CHECKPOINT_DIR.resolve()  # each shipped weights file has its sha256
    # first: "not a checkpoint" beats "no tokenizer"
    model = from_pretrained(folder, device=pick_device(device), require_checksums=shipped)
    if is_char_tokenizer(folder):
        tokenizer = CharTokenizer.load(folder)
    elif any((folder / name).is_file() for name in ("tokenizer.json", "vocab.json", "tokenizer.model")):
        # A Hugging Face tokenizer's own files (tokenizer_config.json alone, which the lab also writes,
        # holds no vocabulary).
        try:
            tokenizer = HFTokenizer.from_pretrained(folder)
        except Exception as exc:  # transformers and tokenizers raise many kinds (KeyError, their own...)
            files = [f for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
                     if (folder / f).is_file()]
            raise CheckpointError(f"{folder}: its tokenizer files ({', '.join(files)}) cannot be read as a "
                                  f"tokenizer ({type(exc).__name__}: {exc}); restore them from the original "
                                  "checkpoint") from exc
        # Generation stops at the tokenizer's end of completion (a chat model's end-of-turn token).
        model.config.eos_token_id, model.config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    elif default_tokenizer:
        tokenizer = _default_tokenizer()
    else:
        raise CheckpointError(
            f"{folder} has no tokenizer.json, so the tokenizer its model was trained with is unknown; "
            "pass default_tokenizer=True to use the lab's default CharTokenizer"
        )
    return model, tokenizer, dict(read_config(folder).get("rlhf_lab") or {})


def model_and_tokenizer(model, tokenizer, checkpoint: str | os.PathLike):
    """What a trainer trains: (model, tokenizer) as given, or `checkpoint` loaded when model is None.
    A model without its tokenizer is refused (its token ids would be guessed)."""
    if model is None:
        model, tokenizer, _ = load_checkpoint(checkpoint)
    if tokenizer is None:
        raise ValueError("tokenizer is required when a model is passed")
    return model, tokenizer
