"""The reading report (tools.reading_report) on small synthetic notebooks: which text is core and which is
deeper, what counts as a word, a box and a sentence, and the limits of --check."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tools.reading_report import (
    BOX_LIMIT,
    CORE_LIMIT,
    count_words,
    main,
    problems,
    prose,
    readme_minutes,
    readme_reading_times,
    report_notebook,
    report_path,
    rewrite_readme,
    sentences,
)


def notebook(*markdown: str, name: str = "01_x.ipynb"):
    cells = [new_markdown_cell(text) for text in markdown]
    cells.insert(1, new_code_cell("print('code and outputs are not read here')"))
    return report_notebook(new_notebook(cells=cells), name)


def words(n: int, word: str = "word") -> str:
    """n words in sentences of 10."""
    sentences_ = [" ".join([word] * 10) + "." for _ in range(n // 10)]
    return " ".join(sentences_ + ([" ".join([word] * (n % 10)) + "."] if n % 10 else []))


def test_going_deeper_sections_and_details_blocks_are_not_core():
    report = notebook(
        "# Title\n\n" + words(30),
        "## 1. Idea\n\n" + words(20) + "\n\n## Going deeper: why\n\n" + words(40),
        "### A subsection of the deeper part\n\n" + words(10),  # the deeper part goes on in the next cell
        "## 2. Next idea\n\n"
        + words(20)
        + "\n\n<details><summary>Seed spreads</summary>\n\n"
        + words(50)
        + "\n\n</details>\n\n"
        + words(10),
        "<details>\n\n" + words(10),  # an unclosed block ends with its cell
        "## 深入: 细节\n\n" + words(10) + "\n\n# 3. Last\n\n" + words(10),
    )
    # core: "Title", 30, "1. Idea" (2), 20, "2. Next idea" (3), 20, 10, "3. Last" (2), 10
    assert report.core_words == 1 + 30 + 2 + 20 + 3 + 20 + 10 + 2 + 10
    # deeper: "Going deeper: why" (3), 40, "A subsection of the deeper part" (6), 10, "Seed spreads" (2),
    # 50, 10, the Chinese heading (4 characters: 2 words), 10
    assert report.deeper_words == 3 + 40 + 6 + 10 + 2 + 50 + 10 + 2 + 10
    assert report.reading_minutes == pytest.approx(report.core_words / 200)


def test_words_leave_out_code_latex_html_and_links_and_count_chinese_by_half():
    text = (
        "The loss $-\\log \\sigma(\\beta m)$ and $$x^2 + y^2$$ with `torch.nn.functional` in "
        "<b>bold</b> <!-- a comment --> see [the paper](https://arxiv.org/abs/2305.18290) or "
        "https://example.com ![a plot](plot.png) \\(a + b\\)\n```python\nprint('not prose at all')\n```\n"
    )
    assert prose(text).split() == ["The", "loss", "and", "with", "in", "bold", "see", "the", "paper", "or"]
    assert count_words(prose(text)) == 10
    assert count_words("well-known 0.535 1,000 GRPO's k3") == 5
    assert count_words("奖励模型 reward model") == 2 + 2  # four characters, two English words


def test_interview_boxes_are_measured_without_their_label():
    report = notebook(
        "# T\n\n> **What to say in an interview.** "
        + words(12)
        + "\n> "
        + words(8)
        + "\nlazy continuation.\n\n"
        "Not in the box.",
        "> A quote that is no box.\n\n"
        "> **What to say (Q3).** 奖励模型会被利用。 The reward model gets gamed.",
        "> **What to say in an interview.** 奖励模型会被利用",
        "> **What to say in an interview.** " + words(10)
        + "\n>\n> **面试怎么答：** 用 token 和 KV cache 说。",
        "## Going deeper\n\n> **What to say in an interview.** " + words(70),
    )
    assert [(box.cell, box.words, box.deeper) for box in report.boxes] == [
        (0, 12 + 8 + 2, False),
        (2, 5, False),  # bilingual: the English only
        (3, 4, False),  # Chinese alone: 8 characters / 2
        (4, 10, False),  # the Chinese twin in the same quote: its Latin terms are not counted
        (5, 70, True),
    ]
    found = problems([report])
    assert len(found) == 1 and f"interview box of 70 words > {BOX_LIMIT}" in found[0]


def test_sentences_and_their_mean_length():
    text = prose(
        "# A heading is no sentence\n\n**What you will learn**\n\n"
        "**Model answer.** Dr. GRPO removes two normalisations, e.g. the length term. It is short!\n"
        "- a list item without a full stop\n- another one, 0.535 of it\n\n"
        "| a | table | row |\n|---|---|---|\n\n奖励模型会被利用。这是一个问题。"
    )
    assert sentences(text) == [
        "Dr. GRPO removes two normalisations, e.g. the length term.",
        "It is short!",
        "a list item without a full stop",
        "another one, 0.535 of it",
        "奖励模型会被利用。",
        "这是一个问题。",
    ]
    report = notebook("# T\n\n" + words(25) + " " + words(5), "## Going deeper\n\n" + words(90))
    assert report.sentence_words == [10, 10, 5, 5]  # the core path only
    assert report.mean_sentence == 7.5


def test_check_exits_1_on_each_limit_and_0_within_them(tmp_path, capsys):
    def write(name: str, *markdown: str):
        path = tmp_path / name
        nbformat.write(new_notebook(cells=[new_markdown_cell(text) for text in markdown]), path)
        return str(path)

    fine = write(
        "01_fine.ipynb", "# Fine\n\n" + words(300), "> **What to say in an interview.** " + words(40)
    )
    assert main(["--check", fine]) == 0
    out = capsys.readouterr().out
    assert "01_fine.ipynb" in out and "0 limit(s) broken" in out
    long_core = write("02_long.ipynb", words(CORE_LIMIT + 10))
    assert main(["--check", long_core]) == 1
    assert f"core path {CORE_LIMIT + 10:,} words > {CORE_LIMIT:,}" in capsys.readouterr().out
    drill = write("13_interview_drill.ipynb", words(CORE_LIMIT + 10))  # the drill may run longer
    assert main(["--check", drill]) == 0
    capsys.readouterr()
    long_sentences = write("03_wordy.ipynb", " ".join(["word"] * 23) + ".")
    assert main(["--check", long_sentences]) == 1
    assert "mean sentence of the core path 23.0 words > 22" in capsys.readouterr().out
    box = write("04_box.ipynb", "> **What to say in an interview.** " + words(61))
    assert main(["--check", box]) == 1
    assert "interview box of 61 words > 60" in capsys.readouterr().out
    suite = [write(f"{i:02d}_part.ipynb", words(2_400)) for i in range(20, 33)]  # 13 x 2,400 = 31,200
    assert main(["--check", *suite]) == 1
    assert "suite: core paths 31,200 words > 30,000" in capsys.readouterr().out
    assert main(suite) == 0  # without --check: the report only


# --- the committed notebooks and the README ----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_readme_rewrite_sets_a_stale_reading_time():
    report = notebook(words(1_000), name="01_x.ipynb")  # 5 minutes at 200 words a minute
    table = ("| notebook | read | what |\n| --- | --- | --- |\n"
             "| [`01_x`](notebooks/01_x.ipynb) | 9 min | x |\n")
    assert readme_reading_times(table) == {"01_x": "9 min"}
    assert readme_reading_times(rewrite_readme(table, [report])) == {"01_x": readme_minutes(report)} \
        == {"01_x": "5 min"}


def test_the_readme_shows_each_notebooks_reading_time():
    """Fix a failure with `python -m tools.reading_report --readme README.md notebooks/*.ipynb`."""
    shown = readme_reading_times((ROOT / "README.md").read_text(encoding="utf-8"))
    expected = {path.stem: readme_minutes(report_path(path)) for path in NOTEBOOKS}
    assert shown == expected
