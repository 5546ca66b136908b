"""The shipped checkpoints' recipes: how each one is trained, and the build that (re)generates them.

Offline side only (it imports the SFT trainer); loading a checkpoint is `rlhf_lab.checkpoints`:

    from rlhf_lab.checkpoints import load_checkpoint
    model, tokenizer, meta = load_checkpoint("addition_rl_start")

| name                    | what it is for                                                          |
| ----------------------- | ----------------------------------------------------------------------- |
| `addition_rl_start`     | the RL starting point: SFT stopped half way, ~50% held-out accuracy, so |
|                         | RL has both right and wrong samples to learn from (and room to improve) |
| `addition_sft`          | the same run trained to convergence (~100%): sampling, KV-cache demos   |
| `addition_moe_rl_start` | the mixture-of-experts RL starting point (Qwen3-MoE style, 8 experts,   |
|                         | top-2: `MOE_MODEL_SIZE`), stopped like `addition_rl_start`: for routing |
|                         | replay and GSPO's MoE argument                                          |

Each preset is an `SFTConfig` plus the model size (`lab_model_config` keyword arguments). The
checkpoints are regenerated with `python -m rlhf_lab sft --preset all --overwrite` (`build_checkpoint` below;
`--resume data/checkpoints` continues it after a stop),
deterministically for a seed on CPU: same seed, same weights. The held-out set is the task's test
split for `data_seed` (the one the RL trainer evaluates on), so the accuracy recorded next to a
checkpoint is the number a notebook will measure. `write_readme` regenerates the table of
data/checkpoints/README.md; the prose around it is written in the README itself.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..model import LlamaModel
from ..model.hf import read_config, save_pretrained
from ..sft import MODEL_SIZE, MOE_MODEL_SIZE, SFTConfig, lab_model_config, train_sft
from ..tasks import get_task
from ..text.tokenizer import default_tokenizer
from ..train.evaluate import greedy_accuracy
from ..util.atomic import signals_deferred, write_text_atomic
from ..util.device import describe
from . import CHECKPOINT_DIR


@dataclass(frozen=True)
class CheckpointPreset:
    """One shipped checkpoint: its SFT run, its model size and the accuracy band it must land in."""

    name: str
    description: str
    sft: SFTConfig
    model: dict = field(default_factory=lambda: dict(MODEL_SIZE))  # lab_model_config(**model)
    accuracy_band: tuple[float, float] = (0.0, 1.0)  # [low, high] held-out greedy accuracy

    def __post_init__(self) -> None:
        low, high = self.accuracy_band
        if not 0 <= low <= high <= 1:
            raise ValueError(f"accuracy_band must satisfy 0 <= low <= high <= 1, got {self.accuracy_band}")


PRESETS: dict[str, CheckpointPreset] = {
    "addition_rl_start": CheckpointPreset(
        name="addition_rl_start",
        description="RL starting point for 3-digit reversed addition: SFT stopped at ~50% accuracy",
        # addition_sft's run, stopped at the first evaluation >= 45%. Accuracy climbs ~10 points per 10 steps
        # at that stage, so evaluate often, on 200 problems to keep that cheap; the accuracy recorded next
        # to the checkpoint is then measured on the whole 500-problem test split.
        sft=SFTConfig(steps=2000, eval_every=10, eval_examples=200, stop_at_accuracy=0.45),
        accuracy_band=(0.30, 0.70),
    ),
    "addition_moe_rl_start": CheckpointPreset(
        name="addition_moe_rl_start",
        description="MoE RL starting point for 3-digit reversed addition (Qwen3-MoE style, 8 experts, "
                    "top-2): "
        "SFT stopped at ~50% accuracy",
        # addition_rl_start's recipe on the MoE model; SFTTrainer adds the router's load-balancing loss.
        sft=SFTConfig(steps=2000, eval_every=10, eval_examples=200, stop_at_accuracy=0.45),
        model=dict(MOE_MODEL_SIZE),
        accuracy_band=(0.30, 0.70),
    ),
    "addition_sft": CheckpointPreset(
        name="addition_sft",
        description="3-digit reversed addition trained to convergence (a good model for sampling demos)",
        sft=SFTConfig(steps=2000, eval_every=250),
        accuracy_band=(0.95, 1.0),
    ),
}


def get_preset(name: str) -> CheckpointPreset:
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]


def build_checkpoint(
    preset: str | CheckpointPreset,
    out_dir: str | os.PathLike = CHECKPOINT_DIR,
    progress: bool = True,
    state_dir: str | os.PathLike | None = None,
    save_every: int = 10,
    resume_hint: str | None = None,
    history_path: str | os.PathLike | None = None,
    **overrides,
) -> dict:
    """Train `preset` with SFT and save it as `out_dir/<name>` (a Hugging Face Llama folder).

    `overrides` replace SFTConfig fields (steps=..., learning_rate=..., seed=...) and are validated
    like the config itself. The held-out accuracy is measured after training on the whole test split
    (`n_test` problems), in float32 on CPU, exactly as `load_checkpoint` users will measure it, and
    saved in config.json["rlhf_lab"].
    `state_dir`, `save_every`, `resume_hint`: a resumable run (`train_sft`; the CLI's `sft --resume`).
    `history_path`: where to write the training history as CSV (None: not written).
    Returns that metadata.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    config = dataclasses.replace(preset.sft, **overrides)  # runs SFTConfig's validation
    tokenizer = default_tokenizer()
    torch.manual_seed(config.seed)
    model = LlamaModel(lab_model_config(tokenizer, **preset.model))
    start, start_cpu = time.perf_counter(), time.process_time()
    model, history = train_sft(config, tokenizer, model=model, progress=progress, state_dir=state_dir,
                               save_every=save_every, resume_hint=resume_hint)
    train_seconds, train_cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    model = model.float().cpu().eval()

    task = get_task(config.task, **config.task_params)
    _, test = task.make_split(config.data_seed, config.n_train, config.n_test)
    accuracy = greedy_accuracy(model, tokenizer, task, test)  # the whole test split
    low, high = preset.accuracy_band
    metadata = {
        "name": preset.name,
        "description": preset.description,
        "task": config.task,
        "task_params": dict(config.task_params),
        "accuracy": accuracy,
        "accuracy_band": [low, high],
        "in_band": low <= accuracy <= high,
        "eval": {"split": "test", "data_seed": config.data_seed, "n_train": config.n_train,
                 "n_test": config.n_test, "examples": len(test), "decoding": "greedy"},
        "steps": int(history["step"].iloc[-1]) if len(history) else 0,
        "train_seconds": round(train_seconds, 1),  # wall time, evaluations included
        "train_cpu_seconds": round(train_cpu_seconds, 1),  # CPU time of this process: the idle-machine cost
        "threads": torch.get_num_threads(),
        "trained_on": describe(config.device),
        "num_parameters": model.num_parameters(),
        "sft": dataclasses.asdict(config),
        "command": f"python -m rlhf_lab sft --preset {preset.name}",
        "overrides": dict(overrides),  # SFTConfig fields changed from the preset ({} for the shipped ones)
    }
    with signals_deferred():  # a stop during the writes waits for them (each one is atomic)
        if history_path is not None:
            write_text_atomic(history_path, history.to_csv(index=False))
        save_pretrained(model, Path(out_dir) / preset.name, tokenizer=tokenizer, metadata=metadata)
    return metadata


# data/checkpoints/README.md is hand-written prose around one generated table: write_readme rewrites
# only what lies between these two lines (markers included), so the prose is edited in the README itself.
TABLE_BEGIN = "<!-- checkpoints table: generated by rlhf_lab.checkpoints.presets.write_readme -->"
TABLE_END = "<!-- end of table -->"
TABLE_HEADER = (
    "| name | task | parameters | SFT steps | train time | held-out accuracy | band | size |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"
)


def readme_table(out_dir: str | os.PathLike = CHECKPOINT_DIR) -> str:
    """The markdown table of the checkpoints in out_dir: one row per folder, from its saved metadata."""
    out_dir = Path(out_dir)
    rows = [TABLE_HEADER]
    for folder in sorted(p for p in out_dir.iterdir() if (p / "config.json").is_file()):
        meta = read_config(folder).get("rlhf_lab") or {}
        if "accuracy" not in meta:
            continue
        size_kb = sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1024
        low, high = meta["accuracy_band"]
        task = f"{meta['task']} ({', '.join(f'{k}={v}' for k, v in meta['task_params'].items())})"
        rows.append(
            f"| `{folder.name}` | {task} | {meta['num_parameters']:,} | {meta['steps']} | "
            f"{meta.get('train_cpu_seconds', meta['train_seconds']):.0f} s | {meta['accuracy']:.1%} | "
            f"{low:.0%} - {high:.0%} | {size_kb:.0f} KB |"
        )
    return "\n".join(rows)


def write_readme(out_dir: str | os.PathLike = CHECKPOINT_DIR) -> Path:
    """Rewrite the checkpoint table of out_dir/README.md; the prose around it stays as it is.

    The table is what lies between the TABLE_BEGIN and TABLE_END lines. A folder without a
    README.md (e.g. `--out /tmp/ckpt`) gets one holding a title and the table.
    """
    out_dir = Path(out_dir)
    path = out_dir / "README.md"
    table = f"{TABLE_BEGIN}\n{readme_table(out_dir)}\n{TABLE_END}"
    if path.is_file():
        text = path.read_text()
        one_each = text.count(TABLE_BEGIN) == 1 and text.count(TABLE_END) == 1
        if not one_each or text.index(TABLE_BEGIN) > text.index(TABLE_END):
            raise ValueError(
                f"{path} must hold the line {TABLE_BEGIN!r} and, after it, the line {TABLE_END!r} "
                "(once each): the generated table goes between them"
            )
        begin, end = text.index(TABLE_BEGIN), text.index(TABLE_END) + len(TABLE_END)
        text = text[:begin] + table + text[end:]
    else:
        text = f"# Checkpoints\n\n{table}\n"
    path.write_text(text)
    return path


def model_size_line(size: dict) -> str:
    """MODEL_SIZE as keyword arguments, the way the README's "Model" section quotes it."""
    return ", ".join(f"{k}={v}" for k, v in size.items())
