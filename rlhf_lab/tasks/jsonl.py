"""Writing and reading the task datasets as JSON Lines (one `Example` per line).

Each line is `{"answer": ..., "completion": ..., "prompt": ...}` with sorted keys, compact
separators and '\n' line ends, so the same seed always gives byte-identical files on any platform.
`write_datasets` writes, for every task in `DEFAULT_DATASETS`:

    <name>_train.jsonl   <name>_test.jsonl   <name>_ood.jsonl   (problems one digit/item longer)

and a `manifest.json` recording the seed, the parameters and the number of lines of each file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlhf_lab.tasks.base import Example
from rlhf_lab.tasks.registry import get_task
from rlhf_lab.util.atomic import naming
from rlhf_lab.util.validation import check_number

# (registry name, parameters). The three addition formats use the same digits and seed, hence the
# same problems: the data-format experiment compares formats, not datasets.
DEFAULT_DATASETS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("addition", {"digits": 3}),
    ("addition_cot", {"digits": 3}),
    ("addition_answer_first", {"digits": 3}),
    ("sort", {"length": 5}),
)
DEFAULT_SIZES = {"n_train": 4000, "n_test": 500, "n_ood": 500}
# The split is drawn with this many training problems, the size SFT and the RL trainer use
# (SFTConfig.n_train, RLConfig.n_train), and the files keep the first n_train of them. So the test
# files hold exactly the held-out problems the shipped checkpoints never saw.
SPLIT_N_TRAIN = 20000


def example_to_json(example: Example) -> str:
    """One JSON line (without the newline) with sorted keys and no spaces."""
    record = {"prompt": example.prompt, "answer": example.answer, "completion": example.completion}
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def write_jsonl(path: str | Path, examples: Iterable[Example]) -> Path:
    """Write examples to `path`, one JSON object per line; returns the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="\n") as f:
            for example in examples:
                f.write(example_to_json(example) + "\n")
    except OSError as exc:  # a full disk or a read-only folder: say which file
        raise naming(exc, path) from exc
    return path


def read_records(path: str | Path, parse, what: str) -> list:
    """`parse(line)` for every non-blank line of a JSON Lines file; a line that fails to parse raises
    ValueError naming the file, the line number and `what` it should have been."""
    records = []
    with Path(path).open(encoding="utf-8") as f:
        try:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    records.append(parse(line))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
                    raise ValueError(f"{path}:{line_number}: not {what} ({error})") from error
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not a UTF-8 text file of {what} records ({error})") from error
    return records


def _example_from_json(line: str) -> Example:
    record = json.loads(line)
    fields = {key: record[key] for key in ("prompt", "answer", "completion")}
    for key, value in fields.items():
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a string, got {value!r}")
    return Example(**fields)


def load_jsonl(path: str | Path) -> list[Example]:
    """Read a file written by `write_jsonl`; raises ValueError naming the line of a malformed record."""
    return read_records(path, _example_from_json, "an Example record")


def write_datasets(
    out_dir: str | Path = "data/tasks",
    seed: int = 0,
    n_train: int = DEFAULT_SIZES["n_train"],
    n_test: int = DEFAULT_SIZES["n_test"],
    n_ood: int = DEFAULT_SIZES["n_ood"],
    datasets: Sequence[tuple[str, dict[str, Any]]] = DEFAULT_DATASETS,
) -> dict[str, Path]:
    """Write train/test/OOD JSON Lines for every task in `datasets` into `out_dir`.

    Returns {file name: path}, manifest.json included. Deterministic: same arguments, same bytes.
    """
    check_number("seed", seed, low=0, integer=True)
    for name, value in (("n_train", n_train), ("n_test", n_test), ("n_ood", n_ood)):
        check_number(name, value, low=1, integer=True)  # an empty split is no dataset
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise naming(exc, out_dir) from exc
    written: dict[str, Path] = {}
    manifest: dict[str, Any] = {
        "seed": seed,
        "format": "one JSON object per line: prompt, answer, completion",
        "tasks": {},
    }
    for name, params in datasets:
        task = get_task(name, **params)
        train, test = task.make_split(seed, max(n_train, min(SPLIT_N_TRAIN, task.space_size() - n_test)), n_test)
        train = train[:n_train]
        ood = task.make_ood_test(seed, n_ood)
        files = {}
        for split, examples in (("train", train), ("test", test), ("ood", ood)):
            file_name = f"{name}_{split}.jsonl"
            written[file_name] = write_jsonl(out_dir / file_name, examples)
            files[split] = {"file": file_name, "examples": len(examples)}
        manifest["tasks"][name] = {"params": task.params(), "files": files}
    manifest_path = out_dir / "manifest.json"
    try:
        with manifest_path.open("w", encoding="utf-8", newline="\n") as f:
            f.write(json.dumps(manifest, sort_keys=True, indent=1) + "\n")
    except OSError as exc:
        raise naming(exc, manifest_path) from exc
    written["manifest.json"] = manifest_path
    return written
