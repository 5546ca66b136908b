"""The shipped checkpoints: loading them (`loader.py`) and how they are built (`presets.py`).

    from rlhf_lab.checkpoints import load_checkpoint
    model, tokenizer, meta = load_checkpoint("addition_rl_start")

Importing the package imports the loader only; `rlhf_lab.checkpoints.presets` (the recipes, which
train with SFT) is imported by what rebuilds the checkpoints: the CLI's `sft --preset`.
"""

from .loader import CHECKPOINT_DIR, CheckpointError, checkpoint_folder, load_checkpoint, model_and_tokenizer

__all__ = ["CHECKPOINT_DIR", "CheckpointError", "checkpoint_folder", "load_checkpoint", "model_and_tokenizer"]
