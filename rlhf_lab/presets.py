"""The shipped checkpoints: how each one is trained, and how a notebook loads it by name.

    from rlhf_lab.presets import load_checkpoint
    model, tokenizer, meta = load_checkpoint("addition_rl_start")
    meta["accuracy"], meta["accuracy_band"]          # measured held-out greedy accuracy, its band

| name                | what it is for                                                              |
| ------------------- | --------------------------------------------------------------------------- |
| `addition_rl_start` | the RL starting point: SFT stopped half way, ~50% held-out accuracy, so RL  |
|                     | has both right and wrong samples to learn from (and room to improve)        |
| `addition_sft`      | the same run trained to convergence (~100%): sampling and KV-cache demos    |

Each preset is an `SFTConfig` plus the model size (`lab_model_config` keyword arguments). The
checkpoints are regenerated with `python -m rlhf_lab sft --preset all` (`build_checkpoint` below),
deterministically for a seed on CPU: same seed, same weights. The held-out set is the task's test
split for `data_seed` (the one the RL trainer evaluates on), so the accuracy recorded next to a
checkpoint is the number a notebook will measure.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .device import describe, pick_device
from .evaluate import greedy_accuracy
from .model import LlamaModel
from .model.hf import CheckpointError, from_pretrained, read_config, save_pretrained
from .sft import SFTConfig, lab_model_config, train_sft
from .tasks import get_task
from .tokenizer import CharTokenizer, default_tokenizer

# data/checkpoints of the repository (notebooks and the CLI run from a clone, where it sits next to
# the package). RLHF_LAB_CHECKPOINTS points somewhere else, e.g. for a pip-installed package.
CHECKPOINT_DIR = Path(os.environ.get("RLHF_LAB_CHECKPOINTS", Path(__file__).resolve().parents[1] / "data" / "checkpoints"))

# The lab model's size for the shipped checkpoints (see data/checkpoints/README.md for why this size).
# Pinned here (not taken from lab_model_config's defaults) so that regenerating gives the same weights.
MODEL_SIZE: dict = dict(
    hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    initializer_range=0.06,
)


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
    **overrides,
) -> dict:
    """Train `preset` with SFT and save it as `out_dir/<name>` (a Hugging Face Llama folder).

    `overrides` replace SFTConfig fields (steps=..., learning_rate=..., seed=...) and are validated
    like the config itself. The held-out accuracy is measured after training on the whole test split
    (`n_test` problems), in float32 on CPU, exactly as `load_checkpoint` users will measure it, and
    saved in config.json["rlhf_lab"].
    Returns that metadata.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    config = dataclasses.replace(preset.sft, **overrides)  # runs SFTConfig's validation
    tokenizer = default_tokenizer()
    torch.manual_seed(config.seed)
    model = LlamaModel(lab_model_config(tokenizer, **preset.model))
    start, start_cpu = time.perf_counter(), time.process_time()
    model, history = train_sft(config, tokenizer, model=model, progress=progress)
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
    save_pretrained(model, Path(out_dir) / preset.name, tokenizer=tokenizer, metadata=metadata)
    return metadata


def checkpoint_folder(name: str | os.PathLike) -> Path:
    """A shipped checkpoint's folder by name, or `name` itself when it is a folder."""
    if isinstance(name, str) and (CHECKPOINT_DIR / name).is_dir():
        return CHECKPOINT_DIR / name
    if Path(name).is_dir():
        return Path(name)
    if isinstance(name, str) and name in PRESETS:
        raise CheckpointError(
            f"checkpoint {name!r} is not in {CHECKPOINT_DIR}; regenerate it with "
            f"`python -m rlhf_lab sft --preset {name}`"
        )
    raise CheckpointError(f"name must be one of {sorted(PRESETS)} or a checkpoint folder, got {str(name)!r}")


def load_checkpoint(name: str | os.PathLike, device: str | torch.device = "cpu"):
    """Load a shipped checkpoint (by preset name) or any checkpoint folder.

    `device`: "cpu" (default), "cuda", "mps" or "auto". Returns (model, tokenizer, metadata): the
    lab's `LlamaModel` in eval mode, its `CharTokenizer`,
    and the dict saved under config.json["rlhf_lab"] (accuracy, accuracy_band, steps, sft settings...).
    """
    folder = checkpoint_folder(name)
    model = from_pretrained(folder, device=pick_device(device))
    tokenizer = CharTokenizer.load(folder) if (folder / "tokenizer.json").is_file() else default_tokenizer()
    return model, tokenizer, dict(read_config(folder).get("rlhf_lab") or {})


def write_readme(out_dir: str | os.PathLike = CHECKPOINT_DIR) -> Path:
    """(Re)write out_dir/README.md: one table row per checkpoint folder, from its saved metadata."""
    out_dir = Path(out_dir)
    rows = []
    for folder in sorted(p for p in out_dir.iterdir() if (p / "config.json").is_file()):
        meta = read_config(folder).get("rlhf_lab") or {}
        if "accuracy" not in meta:
            continue
        size_kb = sum(f.stat().st_size for f in folder.iterdir()) / 1024
        low, high = meta["accuracy_band"]
        task = f"{meta['task']} ({', '.join(f'{k}={v}' for k, v in meta['task_params'].items())})"
        rows.append(
            f"| `{folder.name}` | {task} | {meta['num_parameters']:,} | {meta['steps']} | "
            f"{meta.get('train_cpu_seconds', meta['train_seconds']):.0f} s | {meta['accuracy']:.1%} | {low:.0%} - {high:.0%} | {size_kb:.0f} KB |"
        )
    size = model_size_line(MODEL_SIZE)
    text = README_TEMPLATE.format(rows="\n".join(rows), size=size)
    path = out_dir / "README.md"
    path.write_text(text)
    return path


def model_size_line(size: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in size.items())


README_TEMPLATE = """\
# Shipped checkpoints

Hugging Face Llama folders (`config.json`, `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json`): `transformers.AutoModelForCausalLM.from_pretrained(folder)` loads them, and
so does the lab:

```python
from rlhf_lab.presets import load_checkpoint
model, tokenizer, meta = load_checkpoint("addition_rl_start")   # meta: config.json["rlhf_lab"]
```

| name | task | parameters | SFT steps | train time | held-out accuracy | band | size |
| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |
{rows}

- `addition_rl_start` is the RL starting point: the `addition_sft` run (same seed, same schedule)
  stopped at its first evaluation reaching 45%, so sampled completions are right about half the time
  and RL has both rewarded and unrewarded samples to learn from.
- `addition_sft` is trained to convergence, for the notebooks that need a good model (sampling, KV cache).

*Held-out accuracy*: greedy decoding, exact match, on the whole test split of the task
(`make_split(data_seed=0, n_train=20000, n_test=500)`, the split the RL trainer evaluates on). The
same number and its band are stored in each `config.json` under `"rlhf_lab"`, and
`tests/test_checkpoints.py` recomputes it. *Train time* is the CPU time of the SFT run (evaluations
included) with one thread on the 2-core CPU that made them: the wall time on an idle core. The wall
time of the actual run, on a machine shared with other jobs, is in the metadata (`train_seconds`).

## Model

`lab_model_config({size})`: the lab's Llama with tied embeddings.

Chosen for speed: RL cost grows with model size, and the RL notebooks must show learning within
minutes. Of the sizes tried (head_dim 16, GQA), it is the smallest and cheapest. CPU time of one
SFT step (batch 64, one thread): hidden 64 / 2 layers (96k parameters) 30 ms, 64 / 3 layers 39 ms,
96 / 2 layers 43 ms, 128 / 4 layers (746k) 108 ms.
With the learning rate 3e-3, 64 / 2 reached 99-100% within 1500 steps for three seeds out of four
(the fourth was at 44%), so it has the capacity; 96 / 2 was no more reliable (two seeds out of three
still at 10% after 1500 steps). `initializer_range` is 0.06 rather than Llama's 0.02: at width 64,
std 0.02 starts attention almost uniform with tiny gradients, and SFT sat at ~10% accuracy for
1500 steps. A learning rate of 5e-3 was not more reliable than 3e-3 (seed 0 stayed at 12%).

Learning is not smooth: accuracy sits near 10% for hundreds of steps while one digit column is
still guessed (in the shipped run the units digit, 90% wrong at step 600), then climbs from 15% to
81% in 100 steps (steps 650-750). That is why `addition_rl_start` evaluates every 10 steps. Which
column lags, and for how long, changes with the seed and even with the float rounding of the model
code, so a regenerated `addition_rl_start` may stop at another step, still at the first evaluation
above 45%, inside its 30-70% band.

## Regenerate

Deterministic for a seed on CPU (the same weights every time; only the recorded train time changes):

```bash
python -m rlhf_lab sft --preset all                 # both, into data/checkpoints/
python -m rlhf_lab sft --preset addition_sft --steps 500 --out /tmp/ckpt   # a variant elsewhere
```
"""
