"""`python -m rlhf_lab COMMAND ...`: the lab's command line.

    python -m rlhf_lab data                                   # task datasets -> data/tasks/
    python -m rlhf_lab sft --preset all                       # retrain the shipped checkpoints
    python -m rlhf_lab sft --preset addition_sft --steps 500 --out /tmp/checkpoints

Each command is a pair: `add_<command>_parser(subparsers)` declares its arguments and
`run_<command>(args) -> exit code` runs it; `COMMANDS` maps the name to the runner. A new command
adds one parser function to `build_parser` and one entry to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

# ---------------------------------------------------------------------------------------------- data


def add_data_parser(subparsers) -> None:
    from .tasks.jsonl import DEFAULT_SIZES

    parser = subparsers.add_parser("data", help="write the task datasets (JSON Lines) and their manifest")
    parser.add_argument("--out-dir", default="data/tasks", help="folder for the .jsonl files (default: data/tasks)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test/OOD sampling (default: 0)")
    for key, value in DEFAULT_SIZES.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value,
                            help=f"examples per task and split (default: {value})")


def run_data(args: argparse.Namespace) -> int:
    from .tasks import write_datasets

    written = write_datasets(args.out_dir, args.seed, args.n_train, args.n_test, args.n_ood)
    for path in written.values():
        print(f"{path}  {path.stat().st_size:>8} bytes")
    return 0


# ----------------------------------------------------------------------------------------------- sft


def add_sft_parser(subparsers) -> None:
    from .presets import CHECKPOINT_DIR, PRESETS

    parser = subparsers.add_parser(
        "sft", help="supervised fine-tuning: (re)generate the shipped checkpoints",
        description="Train a checkpoint preset with SFT and save it as a Hugging Face Llama folder "
                    "OUT/<preset>, then rewrite OUT/README.md. Deterministic for a seed on CPU.",
    )
    parser.add_argument("--preset", required=True, choices=[*PRESETS, "all"], help="which checkpoint(s) to train")
    parser.add_argument("--steps", type=int, metavar="N", help="override the preset's number of optimizer steps")
    parser.add_argument("--lr", type=float, dest="learning_rate", metavar="LR", help="override the peak learning rate")
    parser.add_argument("--batch-size", type=int, metavar="N", help="override the batch size")
    parser.add_argument("--seed", type=int, metavar="N", help="override the seed of initialisation and batch order")
    parser.add_argument("--out", type=Path, default=CHECKPOINT_DIR, metavar="DIR",
                        help="folder that receives <preset>/ and README.md (default: data/checkpoints)")
    parser.add_argument("--device", help="cpu, cuda, mps or auto (default: the preset's, cpu)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default: 1, fastest for the tiny model and bit-reproducible)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run_sft(args: argparse.Namespace) -> int:
    import torch

    from .presets import PRESETS, build_checkpoint, write_readme

    if args.threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    names = list(PRESETS) if args.preset == "all" else [args.preset]
    overrides = {key: getattr(args, key) for key in ("steps", "learning_rate", "batch_size", "seed", "device")}
    overrides = {key: value for key, value in overrides.items() if value is not None}
    for name in names:
        meta = build_checkpoint(name, out_dir=args.out, progress=not args.quiet, **overrides)
        low, high = meta["accuracy_band"]
        verdict = "in band" if meta["in_band"] else "OUTSIDE the band"
        print(f"{name}: held-out accuracy {meta['accuracy']:.1%} ({verdict} [{low:.0%}, {high:.0%}]) after "
              f"{meta['steps']} steps, {meta['train_seconds']:.0f} s -> {Path(args.out) / name}")
    print(f"wrote {write_readme(args.out)}")
    return 0


# ---------------------------------------------------------------------------------------- dispatch

# train / compare: add `add_train_parser` / `add_compare_parser` to build_parser and their runners here.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "data": run_data,
    "sft": run_sft,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab", description="rlhf_lab: RL fine-tuning of a tiny Llama, from the command line.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_parser(subparsers)
    add_sft_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the command; invalid settings exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValueError as error:  # config validation: the message names the field and allowed values
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
