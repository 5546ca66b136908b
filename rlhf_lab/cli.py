"""`python -m rlhf_lab COMMAND ...`: the lab's command line.

    python -m rlhf_lab data                                    # task datasets -> data/tasks/
    python -m rlhf_lab sft --preset all --overwrite            # retrain the shipped checkpoints
    python -m rlhf_lab sft --preset addition_sft --steps 500 --out /tmp/checkpoints
    python -m rlhf_lab sft --resume /tmp/checkpoints           # after Ctrl-C, SIGTERM, a kill or a crash
    python -m rlhf_lab train --algo grpo --steps 200 --out runs/grpo  # a resumable state every 10 steps
    python -m rlhf_lab train --resume runs/grpo                # after Ctrl-C, SIGTERM, a kill or a crash

A training run (train, compare, sft) owns its --out folder (a lock; another run there is refused
unless --resume or --overwrite). SIGINT and SIGTERM stop it cleanly with exit status 130, after saving.

Each command is a pair: `add_<command>_parser(subparsers)` declares its arguments and
`run_<command>(args) -> exit code` runs it; `COMMANDS` maps the name to the runner. A new command
adds one parser function to `build_parser` and one entry to `COMMANDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from .util.allocator import keep_freed_memory
from .util.validation import check_known, check_number

# ---------------------------------------------------------------------------------------------- data


def add_data_parser(subparsers) -> None:
    from .tasks.jsonl import DEFAULT_SIZES

    parser = subparsers.add_parser("data", help="write the task datasets (JSON Lines) and their manifest")
    parser.add_argument("--out-dir", default="data/tasks",
                        help="folder for the .jsonl files (default: data/tasks)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the train/test/OOD sampling (default: 0)")
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
    from .checkpoints.presets import PRESETS

    parser = subparsers.add_parser(
        "sft", help="supervised fine-tuning: (re)generate the shipped checkpoints",
        description="Train a checkpoint preset with SFT and save it as a Hugging Face Llama folder "
                    "OUT/<preset>, with its history OUT/<preset>.history.csv, then rewrite OUT/README.md. "
                    "Deterministic for a seed on CPU. The run owns OUT while it trains (run.json, and the "
                    "resumable state in OUT/resume/, both removed once every checkpoint is written).",
    )
    parser.add_argument("--preset", choices=[*PRESETS, "all"],
                        help="which checkpoint(s) to train (required unless --resume)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="override the preset's number of optimizer steps")
    parser.add_argument("--lr", type=float, dest="learning_rate", metavar="LR",
                        help="override the peak learning rate")
    parser.add_argument("--batch-size", type=int, metavar="N", help="override the batch size")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="override the seed of initialisation and batch order")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder that receives <preset>/ and README.md (default: data/checkpoints; a folder "
        "already holding <preset>/ needs --overwrite)",
    )
    parser.add_argument("--device", help="cpu, cuda, mps or auto (default: the preset's, cpu)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any SFTConfig field, e.g. --set eval_every=50 --set warmup_steps=20")
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="continue the run saved in DIR (after a stop, a kill or a crash) with its settings; "
        "--steps may extend it",
    )
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the preset's checkpoint (and an unfinished run) already in --out")
    add_save_every(parser)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1: two are faster on an idle 2-core CPU, slower beside a "
        'busy core; bench/RESULTS.md, "Threads")',
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


# What `sft --resume` fixes (the saved run's) and what it may change.
SFT_FIXED_OPTIONS = ("preset", "learning_rate", "batch_size", "seed", "device", "set")
SFT_RESUME_OPTIONS = ("steps",)


def sft_history_file(name: str) -> str:
    """The file name of preset `name`'s training history in the sft output folder."""
    return f"{name}.history.csv"


def run_sft(args: argparse.Namespace) -> int:
    import dataclasses

    from .checkpoints import CHECKPOINT_DIR
    from .checkpoints.presets import PRESETS, get_preset
    from .runs.experiments import (
        RUN_FILE,
        STATE_FOLDER,
        output_folder,
        prepare_output_folder,
        removed_if_refused,
        run_record,
    )
    from .sft import SFTConfig
    from .tasks import get_task
    from .text.tokenizer import default_tokenizer
    from .util.atomic import FolderLock
    from .util.device import pick_device

    check_number("save_every", args.save_every, low=0, integer=True)
    _set_threads(args)
    if args.resume:
        out, run = _resume_settings(args, "sft", fixed=SFT_FIXED_OPTIONS, changeable=SFT_RESUME_OPTIONS)
        names, overrides = run["presets"], {**run["overrides"], **_changes(args, SFT_RESUME_OPTIONS)}
    else:
        if args.preset is None:
            raise ValueError("sft needs --preset (or --resume DIR to continue a saved run)")
        args.out = out = output_folder(CHECKPOINT_DIR if args.out is None else args.out)  # (main's stop hint)
        names = list(PRESETS) if args.preset == "all" else [args.preset]
        keys = ("steps", "learning_rate", "batch_size", "seed", "device")
        overrides = {key: getattr(args, key) for key in keys}
        overrides = {key: value for key, value in overrides.items()
                     if value is not None} | _set_values(args.set)
    check_known("SFTConfig", overrides, {f.name for f in dataclasses.fields(SFTConfig)})
    for name in names:  # bad settings raise here, before anything is written
        config = dataclasses.replace(get_preset(name).sft, **overrides)
        pick_device(config.device)
        get_task(config.task, **config.task_params).check_tokenizer(
            default_tokenizer(), "a model with its own BPE tokenizer: `python -m rlhf_lab train --model DIR`")
    outputs = (RUN_FILE, STATE_FOLDER, *names, *map(sft_history_file, names))
    with FolderLock(out), removed_if_refused(out):
        finished = [name for name in names if (out / name).exists()]
        if finished and not (args.resume or args.overwrite or (out / RUN_FILE).exists()):
            raise ValueError(
                f"{out} already holds the checkpoint(s) {', '.join(finished)}; pass --overwrite to "
                "retrain them, or choose another --out"
            )
        for name in finished:  # what a build replaces must be a checkpoint this command wrote
            check_preset_folder(out / name, name)
        prepare_output_folder(out, outputs, resume=bool(args.resume), overwrite=args.overwrite,
                              kept=("README.md", *PRESETS, *map(sft_history_file, PRESETS)), command="sft")
        with run_record(out, {"command": "sft", "presets": names, "overrides": overrides}, bool(args.resume)):
            _build_presets(args, out, names, overrides)
    return 0


def check_preset_folder(folder: Path, name: str) -> None:
    """Raise ValueError unless `folder` is the checkpoint `sft --preset name` wrote (its config.json
    says so): --overwrite replaces such a folder whole, so it must hold nothing of the user's."""
    from .checkpoints import CheckpointError
    from .model.hf import read_config

    try:
        written_by = (read_config(folder).get("rlhf_lab") or {}).get("name")
    except CheckpointError:
        written_by = None
    if written_by != name:
        raise ValueError(f"{folder} is not the checkpoint `sft --preset {name}` wrote (its config.json does "
                         "not name that preset), and --overwrite replaces only what the lab wrote; move it "
                         "away or choose another --out")


def _build_presets(args: argparse.Namespace, out: Path, names: list[str], overrides: dict) -> None:
    """run_sft's work once the folder is prepared and run.json written: each preset, then the README."""
    import shutil

    from .checkpoints.presets import build_checkpoint, write_readme
    from .runs.experiments import RUN_FILE, STATE_FOLDER
    from .train.run_state import has_state
    from .util.atomic import signals_deferred

    for name in names:
        state = out / STATE_FOLDER / name
        if args.resume and (out / name / "config.json").is_file() and not has_state(state):
            print(f"{name}: finished before the stop -> {out / name}")
            continue  # its checkpoint was written, then its state removed
        meta = build_checkpoint(name, out_dir=out, progress=not args.quiet, state_dir=state,
                                save_every=args.save_every, history_path=out / sft_history_file(name),
                                resume_hint=f"It is saved in {state}; continue with: "
                                            f"python -m rlhf_lab sft --resume {out}",
                                **overrides)
        with signals_deferred():
            shutil.rmtree(state)  # the checkpoint holds the result; the state is only for resuming
        low, high = meta["accuracy_band"]
        verdict = "in band" if meta["in_band"] else "OUTSIDE the band"
        print(f"{name}: held-out accuracy {meta['accuracy']:.1%} ({verdict} [{low:.0%}, {high:.0%}]) after "
              f"{meta['steps']} steps, {meta['train_seconds']:.0f} s -> {out / name}")
    print(f"wrote {write_readme(out)}")
    with signals_deferred():  # done: the folder holds checkpoints, no run to resume
        shutil.rmtree(out / STATE_FOLDER, ignore_errors=True)
        (out / RUN_FILE).unlink()


# ------------------------------------------------------------------------------------- train / compare


def _add_rl_arguments(parser) -> None:
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds of training (evaluation excluded)")
    parser.add_argument("--steps", type=int, default=None, help="maximum number of RL steps")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: 0)")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps or auto (default: cpu)")
    parser.add_argument("--init", default=None, help="checkpoint name or folder (default: addition_rl_start)")
    parser.add_argument(
        "--model",
        default=None,
        metavar="FOLDER",
        help="a local Hugging Face folder (Llama, Qwen2/2.5, Qwen3) to train, with its own tokenizer",
    )
    parser.add_argument("--task", default=None,
                        help="task name, e.g. countdown or word_problems (default: addition)")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any config field, e.g. --set learning_rate=1e-4 --set loss_type=dr_grpo")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (new or empty; one run per folder)")
    parser.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run saved in DIR (after a stop, a kill or a crash) with its settings; "
        "--steps / --time-budget may extend it",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    add_save_every(parser)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


# What a resumed run may change (the rest is fixed by the saved run: a resumed run is the same run).
RESUME_OPTIONS = ("steps", "time_budget", "eval_every")


def _rl_overrides(args: argparse.Namespace) -> dict:
    overrides: dict = {"seed": 0 if args.seed is None else args.seed, "device": args.device or "cpu"}
    if args.time_budget is not None:
        overrides["time_budget"] = args.time_budget
        overrides["steps"] = 1_000_000  # the clock decides
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.init and args.model:
        raise ValueError("give --init (a lab checkpoint) or --model (a Hugging Face folder), not both")
    if args.init or args.model:
        overrides["init_checkpoint"] = args.init or args.model
    if args.task:
        # the task's defaults; --set task_params=...
        overrides["task"], overrides["task_params"] = args.task, {}
    if args.eval_every is not None:
        overrides["eval_every"] = args.eval_every
    overrides.update(_set_values(args.set))
    return overrides


def _set_values(items: list[str]) -> dict:
    """`--set FIELD=VALUE` options as {field: value}; VALUE is read as JSON, else kept as a string."""
    values = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        field, raw = item.split("=", 1)
        try:
            values[field] = json.loads(raw)
        except json.JSONDecodeError:
            values[field] = raw  # a bare string such as dr_grpo
    return values


def _resume_settings(args: argparse.Namespace, command: str, fixed=("seed", "init", "set", "device"),
                     changeable=RESUME_OPTIONS) -> tuple[Path, dict]:
    """(folder, its run.json) for --resume DIR, refusing the options in `fixed` (those that would make
    it another run; only `changeable` ones may differ)."""
    from .runs.experiments import RUN_FILE, output_folder, read_run

    given = [f"--{name.replace('_', '-')}" for name in fixed if getattr(args, name, None) not in (None, [])]
    given += ["--out"] if args.out and Path(args.out) != Path(args.resume) else []
    if given:
        raise ValueError(f"{', '.join(given)} cannot be combined with --resume: the saved run fixes them "
                         f"(only {', '.join('--' + o.replace('_', '-') for o in changeable)} may change)")
    folder = output_folder(args.resume)
    path = folder / RUN_FILE
    if not path.is_file():
        raise ValueError(f"--resume: {folder} holds no run ({RUN_FILE} not found)")
    run = read_run(folder)
    if run["command"] != command:
        raise ValueError(f"--resume: {folder} holds a `{run['command']}` run, not a `{command}` run")
    for key, kind, what in RUN_ENTRIES[command]:
        if not isinstance(run.get(key), kind) or isinstance(run.get(key), bool):
            raise ValueError(f"--resume: {path} has no {key!r} entry ({what}), so the run cannot be "
                             "continued; start it again with --overwrite")
    if command == "train" and not isinstance(run["config"].get("algo"), str):
        raise ValueError(f"--resume: {path} names no algorithm (config.algo); start the run again with "
                         "--overwrite")
    return folder, run


# What each command's run.json holds, and so what --resume reads: (key, type, what it is).
RUN_ENTRIES = {
    "train": (("config", dict, "the run's settings"),),
    "compare": (("algos", list, "the algorithms"), ("target", (int, float), "the target accuracy"),
                ("overrides", dict, "the settings")),
    "sft": (("presets", list, "the presets"), ("overrides", dict, "the settings")),
}


def _changes(args: argparse.Namespace, options=RESUME_OPTIONS) -> dict:
    """The options a resumed run may change, as config fields."""
    changes = {name: getattr(args, name) for name in options if getattr(args, name, None) is not None}
    if getattr(args, "time_budget", None) is not None and args.steps is None:
        changes["steps"] = 1_000_000
    return changes


def _set_threads(args: argparse.Namespace) -> None:
    if args.threads is not None:
        import torch

        check_number("threads", args.threads, low=1, integer=True)
        torch.set_num_threads(args.threads)


def add_train_parser(subparsers) -> None:
    from .rl import ALGORITHMS

    parser = subparsers.add_parser("train", help="RL-train the shipped checkpoint with one algorithm")
    parser.add_argument("--algo", choices=sorted(ALGORITHMS), help="required unless --resume")
    _add_rl_arguments(parser)
    parser.add_argument("--rollout-workers", type=int, metavar="N",
                        help="rollout/learner split: N rollout processes beside this learner (under "
                             "torchrun: WORLD_SIZE - 1, the default there); rlhf_lab.distributed")
    parser.add_argument("--max-staleness", type=int, metavar="K",
                        help="split: a rollout may be at most K policy versions old (default 0: synchronous)")


def run_train(args: argparse.Namespace) -> int:
    from .distributed import AsyncTrainer, command_line_split, torchrun_environment, torchrun_rollout_worker
    from .rl import make_config
    from .runs.experiments import train_run

    _set_threads(args)
    run = {}
    if args.resume:
        out, run = _resume_settings(args, "train", fixed=("seed", "init", "set", "device", "rollout_workers",
                                                          "max_staleness"))
        if args.algo and args.algo != run["config"]["algo"]:
            raise ValueError(f"--algo {args.algo}: the run in {out} is a {run['config']['algo']} run")
        config = make_config(run["config"]["algo"], run["config"], **_changes(args))
    else:
        if not args.algo or args.out is None:
            raise ValueError("train needs --algo and --out (or --resume DIR to continue a saved run)")
        out, config = args.out, make_config(args.algo, **_rl_overrides(args))
    split = command_line_split(args.rollout_workers, args.max_staleness, run.get("split"), config.device)
    if split is not None and split.launch == "torchrun" and torchrun_environment()["rank"] > 0:
        return torchrun_rollout_worker(split)  # ranks 1.. sample; rank 0 learns and writes the run
    summary = train_run(config, out, progress=not args.no_progress, resume=bool(args.resume),
                        overwrite=args.overwrite, save_every=args.save_every, plots=not args.no_plots,
                        trainer=AsyncTrainer(config, split) if split else None,
                        run_info={"split": split.to_dict()} if split else None)
    trainer = summary.pop("trainer")
    print(f"{config.algo}: held-out accuracy {summary['initial_eval_accuracy']:.3f} -> "
          f"{summary['final_eval_accuracy']:.3f} in {summary['train_seconds']:.1f} s "
          f"({summary['steps']} steps, stopped by {summary['stop_reason']}); results in {out}")
    if trainer.stop_reason == "interrupted":
        return 130  # the trainer said where the run is saved and how to continue it
    return 1 if trainer.stop_reason == "non_finite" else 0


def add_compare_parser(subparsers) -> None:
    from .rl import ALGORITHMS

    parser = subparsers.add_parser("compare",
                                   help="run several algorithms on the same seed; write one report")
    parser.add_argument("--algos", nargs="+", default=None, choices=sorted(ALGORITHMS),
                        help="default: ppo grpo gspo rloo reinforce")
    parser.add_argument("--target", type=float, default=0.95, help="accuracy for the time-to-target column")
    _add_rl_arguments(parser)


def run_compare(args: argparse.Namespace) -> int:
    from .runs.experiments import compare_runs

    _set_threads(args)
    if args.resume:
        out, run = _resume_settings(args, "compare")
        algos, target, overrides = run["algos"], run["target"], {**run["overrides"], **_changes(args)}
    else:
        if args.out is None:
            raise ValueError("compare needs --out (or --resume DIR to continue a saved comparison)")
        out, target, overrides = args.out, args.target, _rl_overrides(args)
        algos = args.algos or ["ppo", "grpo", "gspo", "rloo", "reinforce"]
    table = compare_runs(
        algos,
        out,
        progress=not args.no_progress,
        target=target,
        resume=bool(args.resume),
        overwrite=args.overwrite,
        save_every=args.save_every,
        plots=not args.no_plots,
        **overrides,
    )
    print(table.to_string(index=False))
    print(f"report: {out}/report.md")
    return 0


# ---------------------------------------------------------------------------------------- dispatch

TRAINING_COMMANDS = ("sft", "train", "compare")  # these turn on the allocator tuning (util/allocator.py)

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "data": run_data,
    "sft": run_sft,
    "train": run_train,
    "compare": run_compare,
}


def add_save_every(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save-every", type=int, default=10, metavar="N",
                        help="save the resumable state every N steps, and at any stop "
                             "(default: 10; 0: only at the end)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab",
                                     description="rlhf_lab: RL fine-tuning of a tiny Llama, from the "
                                                 "command line.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_data_parser(subparsers)
    add_sft_parser(subparsers)
    add_train_parser(subparsers)
    add_compare_parser(subparsers)
    return parser


def one_line(message) -> str:
    """An error message on one line (a library's own message may span several)."""
    return " ".join(str(message).split())


def describe_os_error(error: OSError, args: argparse.Namespace) -> str:
    """One line for an OSError: which file or folder, what is wrong, what to do (and, when the
    folder holds a run, how to continue it)."""
    import errno

    from .runs.experiments import RUN_FILE

    if error.errno is None:  # a message of the lab's own (FolderLock: the folder is not writable)
        return str(error)
    if error.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):  # EDQUOT: POSIX
        todo = "free some space"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        todo = "choose a folder you can write to"
    elif error.errno == errno.ENOENT:
        todo = "check the path"
    else:
        todo = "check the file and the disk"
    out = getattr(args, "resume", None) or getattr(args, "out", None)
    if out and (Path(out) / RUN_FILE).is_file():
        todo += f", then continue the run: python -m rlhf_lab {args.command} --resume {out}"
    return f"{error.filename or 'a file'}: {error.strerror or error}; {todo}"


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the command. Invalid settings, a folder in use or
    not writable exit with status 2, a file that cannot be written or read (a full disk) with 1, each
    with a one-line message; SIGINT / SIGTERM stop cleanly with status 130 (a training run saves
    first, see rlhf_lab.train.run_state)."""
    import warnings

    from .util.atomic import FolderInUseError, StopSignals

    args = None
    shown = warnings.showwarning
    try:
        # installed before torch is imported: a Ctrl-C at any moment exits cleanly
        with StopSignals() as stop:
            try:
                # An import cut by Ctrl-C leaves a half-initialised module (numpy, seen) that breaks later
                # code: a signal during start-up waits for the imports, then stops.
                with stop.deferred("start-up (imports)"):
                    parser = build_parser()
                    from .runs import experiments  # noqa: F401  (what train and compare run)
                args = parser.parse_args(argv)
                if args.command in TRAINING_COMMANDS:
                    keep_freed_memory()  # process-wide allocator tuning, opt-in here (util/allocator.py)
                warnings.showwarning = lambda message, *rest, **kw: print(  # one line, no source line
                    f"{parser.prog} {args.command}: warning: {message}", file=sys.stderr)
                return COMMANDS[args.command](args)
            except (ValueError, FolderInUseError) as error:
                # validation names the field and allowed values; a folder in use says so
                parser.exit(2, f"{parser.prog} {args.command}: error: {one_line(error)}\n")
            except OSError as error:  # a folder not writable, a full disk, a file that cannot be read
                code = 2 if isinstance(error, PermissionError) and error.errno is None else 1
                message = one_line(describe_os_error(error, args))
                parser.exit(code, f"{parser.prog} {args.command}: error: {message}\n")
            finally:
                warnings.showwarning = shown
    except KeyboardInterrupt:
        # Caught outside StopSignals, whose handlers are back by now (`python -m rlhf_lab`: ignoring), so
        # a second signal cannot cut the message; one that lands while the block is closing is caught
        # here too, never left to Python, which would end the process by SIGINT (exit status -2).
        out = args is not None and (getattr(args, "resume", None) or getattr(args, "out", None))
        hint = (
            f" The run keeps what it saved: python -m rlhf_lab {args.command} --resume {out}" if out else ""
        )
        print(f"\nStopped.{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
