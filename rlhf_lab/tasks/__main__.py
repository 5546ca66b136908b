"""`python -m rlhf_lab.tasks [--out-dir data/tasks] [--seed 0]`: write the task datasets."""

from __future__ import annotations

import argparse

from rlhf_lab.tasks.jsonl import DEFAULT_SIZES, write_datasets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.tasks", description=__doc__)
    parser.add_argument("--out-dir", default="data/tasks", help="folder for the .jsonl files")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test/OOD sampling")
    for key, value in DEFAULT_SIZES.items():
        parser.add_argument(
            f"--{key.replace('_', '-')}", type=int, default=value, help=f"examples per task ({key})"
        )
    args = parser.parse_args(argv)
    written = write_datasets(args.out_dir, args.seed, args.n_train, args.n_test, args.n_ood)
    for path in written.values():
        print(f"{path}  {path.stat().st_size:>8} bytes")


if __name__ == "__main__":
    main()
