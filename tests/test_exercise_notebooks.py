"""The exercise notebooks (notebooks/exercises/): committed as clean worksheets, every exercise has a
blank cell and a check, and CI runs each notebook twice in FAST mode: with the reference solutions
injected into the blank cells every check passes; with a catalogued wrong variant injected, every
check fails and names that mistake."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from test_notebooks import private_uses

from rlhf_lab import exercises
from tools.notebook_runner import execute

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks" / "exercises"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
CJK = re.compile(r"[\u4e00-\u9fff]")


def blanks(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and "exercise" in c.metadata]


def output_text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
        if output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "".join(parts)


def test_every_exercise_is_in_exactly_one_notebook():
    names = [c.metadata["exercise"] for path in NOTEBOOKS for c in blanks(nbformat.read(path, as_version=4))]
    assert sorted(names) == sorted(exercises.EXERCISES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_worksheet_is_clean_and_public(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    first = nb.cells[0].source.lower()
    for heading in ("what you will learn", "prerequisites", "run time"):
        assert heading in first
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and not c.execution_count for c in code), "worksheets are committed without outputs"
    assert not private_uses([c.source if c.cell_type == "code" else "" for c in nb.cells])
    text = "\n".join(c.source for c in nb.cells)
    for heading in ("你将学到", "前置知识", "运行时间"):  # the introduction in Chinese too
        assert heading in first
    for cell in blanks(nb):
        exercise = exercises.get(cell.metadata["exercise"])
        assert exercise.signature in cell.source and "raise NotImplementedError" in cell.source
        for hint in exercise.hints + exercise.hints_zh:  # the hints shown on demand are the package's
            assert hint in text, (exercise.name, hint)
        for lang in ("en", "zh"):  # title, question and explanation in both languages
            for piece in (exercise.title_in(lang), exercise.question_in(lang), exercise.explanation_in(lang)):
                assert piece in text, (exercise.name, lang, piece)
        assert f'exercises.check("{exercise.name}", {exercise.name})' in text
    markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    boxes = [source for source in markdown if "What to say in an interview" in source]
    assert boxes and all("面试怎么答" in box for box in boxes)  # every interview box in both languages
    headings = [line for source in markdown for line in source.splitlines() if line.startswith("## ")]
    assert headings and all(CJK.search(line) for line in headings), headings


def run_injected(path: Path, tmp_path: Path, inject) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(blanks(nb)):
        cell.source = inject(index, cell.metadata["exercise"])
    copy = tmp_path / path.name
    nbformat.write(nb, copy)
    executed, seconds = execute(copy, fast=True, timeout=120, write=False)
    print(f"{path.name}: {seconds:.1f} s in FAST mode")
    errors = [output_text(c) for c in executed.cells if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    return executed


def check_outputs(nb) -> dict[str, str]:
    """exercise name -> the text its check cell printed."""
    cells = nb.cells
    return {cell.metadata["exercise"]: output_text(cells[i + 1]) for i, cell in enumerate(cells)
            if cell.cell_type == "code" and "exercise" in cell.metadata}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_with_reference_solutions_passes_every_check(path, tmp_path):
    nb = run_injected(path, tmp_path, lambda i, name: f'{name} = exercises.reference("{name}")')
    for name, text in check_outputs(nb).items():
        assert text.startswith("PASS") and "FAIL" not in text, (name, text)
    finish = [c for c in nb.cells if "round-finish" in c.metadata.get("tags", [])]
    for cell in finish:
        assert "Score: 3 of 3 passed" in output_text(cell)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_with_a_wrong_variant_names_the_mistake(path, tmp_path):
    def wrong(index, name):
        catalogue = exercises.mistakes(name)
        return f'{name} = exercises.mistakes("{name}")[{index % len(catalogue)}].variant'

    nb = run_injected(path, tmp_path, wrong)
    for index, (name, text) in enumerate(check_outputs(nb).items()):
        mistake = exercises.mistakes(name)[index % len(exercises.mistakes(name))]
        assert text.startswith("FAIL") and f"[{mistake.name}]" in text, (name, mistake.name, text)
