"""The package's import graph is a stack: each part imports only the parts below it.

`LAYERS` is the stack, bottom first (rlhf_lab/README.md draws it). Every import in the package, the
lazy ones inside functions included, must go to the same part or to a lower one, and nothing in the
package may import the development tools in tools/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlhf_lab"

# Bottom first. A part may import itself and anything listed before it.
LAYERS = ("util", "text", "model", "sampling", "tasks", "train", "sft", "checkpoints", "rl", "distributed",
          "preferences", "viz", "exercises", "runs", "teach", "cli", "__main__")
TOP_LEVEL_MODULES = {"__init__", "__main__", "cli", "sft"}  # the only loose modules


def part_of(module: str) -> str:
    """'rlhf_lab.rl.ppo' -> 'rl'; 'rlhf_lab.sft' -> 'sft'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target]
            if node.module is None or target == "rlhf_lab":  # `from . import x`: x may be a part
                targets = [f"{target}.{alias.name}" for alias in node.names]
            found += [(node.lineno, t) for t in targets]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def upward_imports(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        source = part_of(module_name(path, root))
        for line, target in imports_of(path, root):
            if target.split(".")[0] == "tools":
                problems.append(f"{path.relative_to(root.parent)}:{line} imports the development tool "
                                f"{target}")
            if not target.startswith("rlhf_lab.") or source == "__init__":
                continue
            imported = part_of(target)
            if imported not in LAYERS:
                problems.append(f"{path.relative_to(root.parent)}:{line} imports {target}, in no layer")
            elif LAYERS.index(imported) > LAYERS.index(source):
                problems.append(f"{path.relative_to(root.parent)}:{line}: {source} imports {target}, "
                                f"which is above it ({imported})")
    return problems


def test_every_part_of_the_package_is_in_the_stack():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert parts - {"__init__"} <= set(LAYERS), f"parts missing from LAYERS: {sorted(parts - set(LAYERS))}"
    loose = {p.stem for p in PACKAGE.glob("*.py")}
    assert loose <= TOP_LEVEL_MODULES, f"modules loose at the top: {sorted(loose - TOP_LEVEL_MODULES)}"


def test_no_upward_import():
    assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path):
    """The check fails on a planted upward import (a lazy one, inside a function)."""
    package = tmp_path / "rlhf_lab"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "model" / "bad.py").write_text("def f():\n    from ..rl import Trainer\n    return Trainer\n")
    (package / "model" / "good.py").write_text("from ..util.validation import check_number\n")
    problems = upward_imports(package)
    assert len(problems) == 1 and "model imports rlhf_lab.rl" in problems[0]


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_the_readme_map_names_each_part(layer):
    readme = (PACKAGE / "README.md").read_text(encoding="utf-8")
    name = f"`{layer}.py`" if (PACKAGE / f"{layer}.py").exists() else f"`{layer}/`"
    row = next((line for line in readme.splitlines() if line.startswith(f"| {name} |")), None)
    assert row is not None, f"rlhf_lab/README.md has no row for {name}"
    rows = [line.split("|")[1].strip() for line in readme.splitlines() if line.startswith("| `")]
    assert rows.index(name) == LAYERS.index(layer), "the README's table lists the parts in the stack's order"
