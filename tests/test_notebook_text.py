"""Every number a notebook's prose states comes from its committed outputs (tools.prose_check):
the rules on small synthetic notebooks, a planted wrong number in each real notebook, and the real
check of every committed notebook."""

from __future__ import annotations

from collections import Counter
from copy import deepcopy
from decimal import Decimal
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from tools.prose_check import (
    ALLOWED,
    check_notebook,
    main,
    printed_run_time,
    prose_numbers,
    run_time_findings,
    stated_full_mode_times,
)

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))


def code(source: str = "pass", stdout: str | None = None, result: str | None = None, html: str | None = None):
    cell = new_code_cell(source, execution_count=1)
    if stdout is not None:
        cell.outputs.append(new_output("stream", name="stdout", text=stdout))
    if result is not None or html is not None:
        data = {"text/plain": result or ""}
        if html is not None:
            data["text/html"] = html
        cell.outputs.append(new_output("execute_result", data=data, execution_count=1))
    return cell


def md(text: str, **metadata):
    cell = new_markdown_cell(text)
    cell.metadata.update(metadata)
    return cell


INTRO = new_markdown_cell("# A notebook\n\nWhat you will learn: nothing measured.")


def unmatched(*cells) -> list[str]:
    """Unsupported numbers of a notebook made of an introduction (cell 0, which is checked against the
    whole notebook's outputs) and then `cells`."""
    return [f.number for f in check_notebook(new_notebook(cells=[INTRO, *cells]), "test.ipynb")]


def test_the_first_cell_is_checked_against_the_whole_notebook():
    first = new_markdown_cell("Run time: full mode 290 s.")
    later = new_code_cell("print(290)",
                          outputs=[nbformat.v4.new_output("stream", name="stdout", text="run time 290 s\n")])
    assert check_notebook(new_notebook(cells=[first, later]), "t.ipynb") == []
    wrong = new_markdown_cell("Run time: full mode 310 s.")
    # reported twice: as the run time the last cell does not print, and as a number no output supports
    findings = check_notebook(new_notebook(cells=[wrong, later]), "t.ipynb")
    assert [f.number for f in findings] == ["310 s", "310 s"]


def stated(text: str) -> list[str]:
    return [n.text for n in prose_numbers(text)]


# --- what counts as a stated number -----------------------------------------------------------------


def test_decimals_percentages_scientific_multipliers_and_units_are_stated():
    text = ("0.535 and 1.24; 28% and 0.8% and 3 percent; -1.40e-08 and 3.6e-07; 12x and 4×; "
            "12 s, 290 s, 1.6 min")
    assert stated(text) == ["0.535", "1.24", "28%", "0.8%", "3 percent", "1.40e-08", "3.6e-07", "12x", "4×",
                            "12 s", "290 s", "1.6 min"]
    assert stated("15.6 s, 1504 KiB, 42 MB, 512 B, 2 GiB, 3 minutes, 15ms") == [
        "15.6 s", "1504 KiB", "42 MB", "512 B", "2 GiB", "3 minutes", "15ms"]
    kinds = {n.text: n.kind for n in prose_numbers("0.5, 12%, 3x, 20 s")}
    assert kinds == {"0.5": "plain", "12%": "percent", "3x": "multiplier", "20 s": "unit"}


def test_plain_integers_names_versions_and_references_are_not_stated():
    text = ("## 3.1 Setup\n\n1. First, Q19 with 32 prompts in notebook 04 (2024), 4,971 problems, "
            "96k parameters.\n"
            "2. See section 3.2, §4.1, Eq. 2.3, Figure 1.2 and Table 2.1; arXiv 2402.03300 and 2309.06180.\n"
            "torch 2.13.0+cpu, transformers 5.24, torch>=2.2, v0.6; Llama 3.1, Qwen2.5-1.5B, Llama-3.1-8B, "
            "GPT-3.5, fp16, GRPO 2x2, 32 x 4096 tokens, the 1990s, 12s.")
    assert stated(text) == []


def test_latex_code_urls_and_html_are_ignored():
    text = ("$\\epsilon = 0.37$ and $$x = 0.91$$ and \\(0.44\\) and `lr=0.3` and\n```python\ny = 0.9\n```\n"
            "[a link](https://example.com/0.7) https://example.com/v1.5 ![img](fig_0.8.png) "
            "<img width=\"0.6\">"
            "<!-- 0.123 -->")
    assert stated(text) == []
    assert stated("between $a$ and $b$ lies 0.25") == ["0.25"]  # LaTeX does not swallow the prose after it


def test_ranges_are_two_numbers_and_share_the_unit():
    numbers = prose_numbers("0.530-0.565, 0.735–0.770, 20.4-38.2%, 1.4-1.8 ms, 2-4x, 1-2 min, 10.6x to 132x")
    assert [n.text for n in numbers] == ["0.530", "0.565", "0.735", "0.770", "20.4", "38.2%", "1.4", "1.8 ms",
                                         "2", "4x", "1", "2 min", "10.6x", "132x"]
    assert all(n.value > 0 for n in numbers)  # the dash is not a minus
    by_text = {n.text: n for n in numbers}
    assert by_text["20.4"].kind == "percent" and by_text["1.4"].unit == "ms"
    assert by_text["2"].kind == "multiplier" and by_text["1"].unit == "min"


def test_thousands_separators_and_signs():
    (n,) = prose_numbers("a loss of -4,971.5")
    assert n.text == "4,971.5" and n.value == Decimal("4971.5")
    assert unmatched(code(stdout="loss -4971.52"), md("a loss of 4,971.5 and a change of -0.12")) == ["0.12"]
    assert unmatched(code(stdout="change -0.12 and 1.40e-08"),
                     md("a change of 0.12 (1.4e-08 in the cell)")) == []


# --- matching ---------------------------------------------------------------------------------------


def test_decimals_match_by_rounding_to_the_written_digits():
    above = code(stdout="held-out accuracy 0.5349 (std 0.0456)")
    assert unmatched(above, md("accuracy 0.535, roughly 0.53 or 0.5; std 0.046")) == []
    assert unmatched(above, md("accuracy 0.536 and 0.54")) == ["0.536", "0.54"]
    assert unmatched(code(stdout="0.5345"), md("0.534 or 0.535")) == []  # a tie rounds either way


def test_numbers_must_come_from_outputs_above_not_below():
    assert unmatched(md("it reaches 0.875"), code(stdout="0.875")) == ["0.875"]
    assert unmatched(code(stdout="0.875"), md("it reaches 0.875")) == []
    assert unmatched(code(stdout="0.875"), md("first 0.875"), md("restated 0.875")) == []
    # earlier prose is no evidence
    assert unmatched(md("the value 0.612"), code(stdout="nothing"), md("again 0.612")) == ["0.612", "0.612"]


def test_percentages_match_fractions_and_printed_percentages():
    above = code(stdout="accuracy 0.283, clipped 12.5%, small 0.0083", result="acc (%)  41.7")
    assert unmatched(above, md("28.3% and 28% right, 12.5% (0.125) clipped, 0.8% small, "
                               "41.7% in the table")) == []
    assert unmatched(above, md("29% and 14%")) == ["29%", "14%"]


def test_multipliers_round_or_truncate_and_are_never_computed():
    above = code(stdout="speed-up 12.436, ratio 1.42, range 667x")
    assert unmatched(above, md("12x faster (12.4x), 1.4x, about 670x")) == []
    assert unmatched(above, md("13x faster")) == ["13x"]
    # 0.45 / 0.19 = 2.4, but the notebook must print the ratio it quotes
    assert unmatched(code(stdout="0.45 s vs 0.19 s"), md("2.4x as much")) == ["2.4x"]


def test_units_round_convert_within_their_family_and_need_outputs():
    above = code(stdout="elapsed 290.4 s, step 0.189 s, total 96 s, saved 1504.0 KiB")
    assert unmatched(above, md("290 s, about 300 s, 189 ms per step, 1.6 min, 1504 KiB")) == []
    assert unmatched(above, md("about 400 s and 12 s")) == ["400 s", "12 s"]
    # a small integer in the code above is no evidence for a measurement
    assert unmatched(code("for step in range(20):\n    pass"), md("it takes 20 s")) == ["20 s"]


def test_settings_in_code_count_above_and_in_the_cell_the_text_introduces():
    assert unmatched(code("config = make_config(learning_rate=2e-4, beta=0.04)"),
                     md("at learning rate 2e-4")) == []
    assert unmatched(md("we train at learning rate 3e-3:"), code("train(learning_rate=3e-3)")) == []
    assert unmatched(md("the 5-95 % band:"), code("q = x.quantile(torch.tensor([0.05, 0.95]))")) == []
    # only the first code cell after the text, and only its source
    later = [md("rate 3e-3"), code("pass"), code("train(learning_rate=3e-3)")]
    assert unmatched(*later) == ["3e-3"]
    assert unmatched(md("accuracy 0.875"), code("pass", stdout="0.875")) == ["0.875"]


def test_tables_in_html_outputs_count():
    html = "<table><tr><td>0.9062</td><td>55.7</td></tr></table>"
    assert unmatched(code(result="<pandas.io.formats.style.Styler>", html=html),
                     md("0.906 after 55.7 s")) == []


def test_cell_metadata_allows_quoted_numbers_exactly():
    quote = {"prose_check": {"allow": ["37.6-55.2%", "2.6x"], "reason": "vLLM and KIVI papers"}}
    text = "the paper saved 37.6-55.2% and 2.6x less memory"
    assert unmatched(code(stdout="nothing"), md(text, **quote)) == []
    assert unmatched(code(stdout="nothing"), md(text)) == ["37.6", "55.2%", "2.6x"]
    assert unmatched(md("38%, 0.376 and 2.7x", **quote)) == ["38%", "0.376", "2.7x"]  # exact; % only as %
    with pytest.raises(ValueError, match="reason"):
        unmatched(md(text, prose_check={"allow": ["37.6%"]}))


def test_global_allow_list_is_small_documented_and_exact():
    assert len(ALLOWED) <= 10
    assert all(len(source) > 20 for source in ALLOWED.values()), "every global constant names its source"
    assert unmatched(md("PPO clips at 0.2, GSPO at 3e-4 / 4e-4")) == []
    assert unmatched(md("a clip of 0.3 and 0.25")) == ["0.3", "0.25"]


def test_cli_reports_and_exits_1(tmp_path, capsys):
    path = tmp_path / "01_x.ipynb"
    nbformat.write(new_notebook(cells=[code(stdout="0.5"), md("we got 0.5 and 0.77 here")]), path)
    clean = tmp_path / "02_y.ipynb"
    nbformat.write(new_notebook(cells=[code(stdout="0.5"), md("we got 0.5")]), clean)
    assert main([str(path), str(clean)]) == 1
    out = capsys.readouterr().out
    assert "01_x.ipynb: cell 1: 0.77" in out and "we got 0.5 and [0.77] here" in out
    assert main([str(clean)]) == 0
    assert main(["--summary", str(path), str(clean)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: 1 unsupported number(s)" in out and f"{clean}: 0 unsupported number(s)" in out


# --- the full-mode run time: the first cell states it, the last cell prints it ------------------------


def timed(intro: str, printed: str | None, *middle):
    """A notebook: the introduction, `middle` cells, and a last code cell that prints `printed`."""
    last = code('print(f"notebook run time: {elapsed:.0f} s")', stdout=printed)
    return new_notebook(cells=[new_markdown_cell(intro), *middle, last])


def run_time_numbers(nb) -> list[str]:
    return [f.number for f in run_time_findings(nb, "t.ipynb")]


def test_the_stated_full_mode_time_must_be_the_printed_one():
    """The blind spot of the number check: 01_sampling said "32 s in full mode" while its last cell printed
    20 s, and passed because a 32 was printed elsewhere."""
    intro = "**Run time**: about 11 s in FAST mode and 32 s in full mode (the last cell prints it)."
    elsewhere = code("pass", stdout="32 prompts; FAST mode took 11 s\n")
    nb = timed(intro, "notebook run time: 20 s (FAST = False)\n", elsewhere)
    assert [f.number for f in check_notebook(nb, "t.ipynb") if f.cell == 0] == ["32 s"]
    (finding,) = run_time_findings(nb, "t.ipynb")
    assert "prints 20 s" in finding.context and "[32 s] in full mode" in finding.context
    assert run_time_numbers(timed(intro, "notebook run time: 32 s (FAST = False)\n", elsewhere)) == []


@pytest.mark.parametrize("intro, printed", [
    ("about 40 s in FAST mode; 276 s in full\nmode on the committed run, 209 s of training (0.23 s per step)",
     "notebook run time: 276 s"),
    ("on a 2-core CPU about 20 s in full mode and about 19 s in FAST mode",
     "notebook run time: 20.2 s (FAST = False)"),
    ("FAST mode (`RLHF_LAB_FAST=1`) 15 s; full mode (nine SFT runs of 800 steps: three seeds) 331 s.",
     "notebook run time: 331 s"),
    ("full mode about\n6 minutes (339 s; two dozen short runs); FAST mode about 23 s",
     "notebook run time: 339 s"),
    ("about 3 minutes in full mode (the committed run: 180 s of execution)", "notebook run time: 180 s"),
    ("full mode 432 s (about 7 minutes) on the committed run (55 s of training for each of six runs)",
     "notebook run time: 432 s"),
    ("full mode 170 s, about 3 minutes, while other jobs ran", "notebook run time: 170 s (FAST = False)"),
    ("full mode 1137 s (the last cell), FAST\nmode 43 s", "run time: 1137 s (full mode)"),
    ("FAST mode (a smoke test)\n19 s and full mode 242 s", "notebook run time: 242 s"),
    ("about 5 minutes in full mode on a laptop CPU; about 1 minute in FAST mode", "notebook run time: 281 s"),
], ids=["00", "02", "04", "05", "07", "09", "12", "13", "15", "minutes"])
def test_how_the_notebooks_state_their_run_time_is_read(intro, printed):
    nb = timed("**Run time**: " + intro + ".", printed + "\n")
    assert stated_full_mode_times(nb.cells[0].source), "no full-mode time found"
    assert run_time_numbers(nb) == []
    # the same statement against a time a third longer is reported, every full-mode time in it
    seconds = float(printed_run_time(nb)[1].seconds)
    wrong = timed(nb.cells[0].source, f"notebook run time: {seconds * 4 / 3:.0f} s\n")
    assert run_time_numbers(wrong) == [t.text for t in stated_full_mode_times(nb.cells[0].source)]


def test_fast_times_are_not_full_mode_times_and_a_missing_statement_is_reported():
    intro = "**Run time**: about 11 s in FAST mode and 20 s in full mode."
    assert [t.text for t in stated_full_mode_times(intro)] == ["20 s"]
    # a committed FAST-mode run, or a last cell that prints no time, cannot support a full-mode statement
    assert run_time_numbers(timed(intro, "notebook run time: 11 s (FAST = True)\n")) == ["20 s"]
    assert run_time_numbers(timed(intro, "done\n")) == ["20 s"]
    # the last cell prints a run time, the first cell states none in full mode
    assert run_time_numbers(timed("**Run time**: a few minutes.", "notebook run time: 20 s\n")) == ["(none)"]
    # nothing stated, nothing printed: nothing to check
    assert run_time_numbers(timed("# A notebook", None)) == []


# --- the committed notebooks ------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checker_reports_a_planted_wrong_run_time(path):
    """Each committed notebook's run-time statement, made a third too long, is reported."""
    nb = nbformat.read(path, as_version=4)
    stated = stated_full_mode_times(nb.cells[0].source)
    if not stated:
        pytest.skip(f"{path.name} states no full-mode run time")
    before = {(f.cell, f.number) for f in run_time_findings(nb, path.name)}
    time = stated[0]
    planted = f"{float(time.seconds) * 4 / 3:.0f} s"
    copy = deepcopy(nb)
    copy.cells[0].source = nb.cells[0].source[: time.start] + planted + nb.cells[0].source[time.end :]
    after = {(f.cell, f.number) for f in run_time_findings(copy, path.name)}
    assert (0, planted) in after and (0, planted) not in before


def _planted(nb):
    """Yield (notebook copy, cell index, planted text): one accepted plain decimal raised by 111 units of
    its last digit (0.535 -> 0.646), those with the most decimals first."""
    reported = {(f.cell, f.number) for f in check_notebook(nb)}
    candidates = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for number in prose_numbers(cell.source):
            if number.kind != "plain" or "." not in number.text or not number.text.replace(".", "").isdigit():
                continue
            if (index, number.text) not in reported:  # a number the checker currently accepts
                candidates.append((index, number))
    candidates.sort(key=lambda c: -len(c[1].text.split(".")[1]))
    for index, number in candidates:
        decimals = len(number.text.split(".")[1])
        text = f"{number.value + 111 * number.quantum:.{decimals}f}"
        copy = deepcopy(nb)
        source = copy.cells[index].source
        copy.cells[index].source = source[: number.start] + text + source[number.end :]
        yield copy, index, text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checker_reports_a_planted_wrong_number(path):
    nb = nbformat.read(path, as_version=4)
    before = Counter((f.cell, f.number) for f in check_notebook(nb, path.name))
    tried = 0
    for copy, index, text in _planted(nb):
        tried += 1
        after = Counter((f.cell, f.number) for f in check_notebook(copy, path.name))
        if after != before:  # the planted value may round to another printed number; then try the next
            assert after - before == Counter({(index, text): 1}) and before - after == Counter()
            return
        if tried == 20:
            break
    if tried == 0:
        pytest.skip(f"{path.name} states no decimal the checker accepts")
    pytest.fail(f"none of {tried} planted numbers in {path.name} was reported")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_numbers_come_from_committed_outputs(path):
    """Rule 6 of notebooks/README.md. Fix a failure by printing the number in a cell above the text, by
    rewriting the text from the output, or, for a number quoted from a paper, by cell metadata
    {"prose_check": {"allow": [...], "reason": "..."}}."""
    findings = check_notebook(nbformat.read(path, as_version=4), path.name)
    assert not findings, (f"{len(findings)} number(s) in the prose of {path.name} that no output above "
                          "supports:\n" + "\n".join(f"  {f}" for f in findings))


# Printed source: cells that show the package's code with `inspect.getsource` keep what they printed
# when they last ran. The code may change after that; a reader must never see code the package no
# longer has, so every printed def/class block must still be in rlhf_lab/ verbatim.
PACKAGE_SOURCE = "\n".join(p.read_text() for p in sorted((NOTEBOOK_DIR.parent / "rlhf_lab").rglob("*.py")))


def printed_blocks(text: str) -> list[str]:
    """The def/class blocks in printed text: decorators, the header line, then every line that is blank,
    indented deeper, or closes a multi-line signature (`) -> ...:` at the header's indentation), up to a
    definition after a blank line (a method printed after a function; a nested def is checked on its own)."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        start, stripped = i, lines[i].lstrip()
        while stripped.startswith("@") and i + 1 < len(lines):  # decorators belong to the def below
            i += 1
            stripped = lines[i].lstrip()
        if not stripped.startswith(("def ", "class ", "async def ")):
            i = start + 1
            continue
        indent = len(lines[i]) - len(stripped)
        i += 1
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
                                  or lines[i].lstrip().startswith(")")):
            new_definition = lines[i].lstrip().startswith(("def ", "class ", "async def ", "@"))
            if not lines[i - 1].strip() and new_definition:
                break  # after a blank line, a new definition: the next printed block (or a nested one)
            i += 1
        block = "\n".join(lines[start:i]).rstrip()
        blocks.append(block.removesuffix("\n...").removesuffix("..."))  # "..." ends a deliberately cut print
    return blocks


def source_printed_by(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [block for cell in nb.cells if cell.cell_type == "code" and "getsource" in cell.source
            for output in cell.outputs if output.output_type == "stream"
            for block in printed_blocks(output.text)]


def test_printed_blocks_are_found_and_a_changed_line_is_not_in_the_package():
    blocks = [block for path in NOTEBOOKS for block in source_printed_by(path)]
    assert len(blocks) >= 10, "expected the notebooks to print the package's code in several places"
    text = ("note\ndef f(x):\n    return x\n\n    # inside\nprint me\n    @property\n    def g(\n"
            "        self,\n"
            "    ) -> int:\n        return 1\n\n    def h(self):\n        pass\n")
    assert printed_blocks(text) == ["def f(x):\n    return x\n\n    # inside",
                                    "    @property\n    def g(\n        self,\n    ) -> int:\n"
                                    "        return 1",
                                    "    def h(self):\n        pass"]
    changed = blocks[0].replace("\n", "\n# a line the package does not have\n", 1)
    assert changed not in PACKAGE_SOURCE


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_printed_source_is_the_package_source(path):
    stale = [block.splitlines()[0].strip() for block in source_printed_by(path)
             if block not in PACKAGE_SOURCE]
    assert not stale, (f"{path.name} prints code the package no longer has ({stale}): re-run the notebook "
                       "(python -m tools.notebook_runner) and check the prose around it")


# --- interview boxes in both languages, and the reading limits ------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_interview_box_has_its_chinese_twin_and_can_be_said(path):
    """Each "What to say in an interview" box is followed by its "面试怎么答" box (tests/bilingual.py):
    one bold sentence and at most two more, at most 60 English words."""
    from bilingual import notebook_problems

    assert notebook_problems(nbformat.read(path, as_version=4)) == []


def test_the_committed_notebooks_keep_the_reading_limits():
    """The course's limits (tools/reading_report.py): each core path within 2,500 words and the suite's
    within 30,000 (the drill aside), sentences of at most 22 words on average, boxes within 60 words."""
    from tools.reading_report import problems, report_path

    assert problems([report_path(path) for path in NOTEBOOKS]) == []
