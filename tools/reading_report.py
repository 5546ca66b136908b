"""How long the notebooks take to read: words in the core path and in the deeper sections, interview boxes,
sentence length and reading time.

    python -m tools.reading_report notebooks/*.ipynb            # one row per notebook, then the suite
    python -m tools.reading_report --check notebooks/*.ipynb    # and exit 1 when a limit is broken
    python -m tools.reading_report --readme README.md notebooks/*.ipynb   # rewrite the README's "read" column

Core path and deeper part
    Every markdown cell belongs to the core path, except what follows a heading (any level) whose text
    contains "Going deeper" or "深入", up to the next heading of the same or a higher level that does not,
    and except every ``<details>`` block (its ``<summary>`` included; a block ends with its cell, as it
    does when Jupyter renders the cell). Code cells and outputs are not read
    here: this counts the text a learner reads.

Words
    Counted on the prose only: fenced and inline code, LaTeX (``$...$``, ``$$...$$``, ``\\(...\\)``,
    ``\\[...\\]``), HTML tags and comments, images, link targets and bare URLs are removed first (a link's
    text stays, and so does the text between HTML tags). A word is a run of Latin letters and digits,
    joined by ``'``, ``-``, ``.`` or ``,`` (``well-known``, ``0.535``, ``1,000`` are one word each).
    Chinese counts as half a word per character (a common reading-speed equivalence: about 400 characters
    a minute against 200 English words); the drill's bilingual titles are read, so they count.

Interview boxes
    A box is a blockquote (consecutive ``>`` lines, and unquoted lines that continue its paragraph) whose
    first line starts with a bold label beginning "What to say" (``> **What to say in an interview.**``).
    Its length is the words after that label.
    In a box that holds both English and Chinese only the English counts (the Chinese translates it):
    the text before the Chinese twin's "面试怎么答" paragraph when both share one blockquote; a box in
    Chinese alone counts its characters / 2.

Sentences
    The mean sentence length is taken over the core path's paragraphs, list items and boxes; headings,
    table rows and lines in bold alone are not sentences, and a bold run-in label that ends a paragraph's
    first words with "." or ":" (``**Model answer.**``, ``**Prerequisites**:``) is not one either (its
    words still count). A sentence ends at ``.``, ``!``, ``?`` (or ``。！？``) followed by a space, at the end
    of a paragraph and at the end of a list item; "e.g.", "i.e.", "et al.", "vs.", "Dr." and the like do not
    end one.

Reading time
    Core words / 200 words per minute.

Limits (``--check``, issue 38)
    a notebook's core at most 2,500 words; the suite's core (every notebook given) at most 30,000 words;
    every box at most 60 words; each core path's mean sentence at most 22 words. A notebook whose file
    name contains "drill" is exempt from both word limits: the drill is the question bank, every answer in
    two languages, and it is read question by question rather than through.

README
    The README's notebook table has a "read" column: each notebook's core reading time, in whole
    minutes (``readme_minutes``). ``--readme`` rewrites it from the notebooks given.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    from tools.prose_check import NOT_PROSE
except ImportError:  # run as a script from tools/
    from prose_check import NOT_PROSE

WORDS_PER_MINUTE = 200
CORE_LIMIT = 2_500
SUITE_LIMIT = 30_000
BOX_LIMIT = 60
SENTENCE_LIMIT = 22.0
LONG_SENTENCE = 40  # words: reported as a count
EXEMPT_FROM_CORE_LIMIT = "drill"  # in the file name: the interview drill, with its 37 questions

_DEEPER_HEADING = re.compile(r"going deeper|深入", re.I)
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*)$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_BOX_START = re.compile(r"^\s*>\s*\*\*\s*what to say", re.I)
_ZH_BOX_LABEL = re.compile(r"^\s*\*\*\s*面试怎么答", re.M)
_BOX_LABEL = re.compile(r"^\s*\*\*[^*]+\*\*[.:]?")
_RUN_IN_LABEL = re.compile(r"^\s*(?:[-*+]\s+)?\*\*[^*\n]{1,60}?(?:[.:]\*\*|\*\*[.:])")
_BOLD_LINE = re.compile(r"^\*\*[^*]+\*\*:?$")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’.,-][A-Za-z0-9]+)*")
_REMOVE = [
    re.compile(r"<(style|script)\b.*?</\1>", re.S | re.I),  # before the tags: their content goes too
    *NOT_PROSE,
]
_ABBREVIATIONS = re.compile(
    r"\b(?:e\.g|i\.e|et al|vs|cf|approx|resp|Dr|Mr|Ms|No|Eq|Eqs|Fig|Figs|Sec|Ch|etc)\.", re.I
)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]*_]*\s+|(?<=[。！？])")


def prose(markdown: str) -> str:
    """The markdown without code, LaTeX, HTML, images, link targets and URLs (see the module docstring)."""
    for pattern in _REMOVE:
        markdown = pattern.sub(" ", markdown)
    return re.sub(r"[\[\]]", " ", markdown)  # a link's brackets (its text stays)


def count_words(text: str) -> float:
    """Words of already stripped text: Latin words, plus Chinese characters / 2."""
    chinese = len(_CJK.findall(text))
    return len(_WORD.findall(_CJK.sub(" ", text))) + chinese / 2


def box_words(text: str) -> float:
    """A box's length: its English words, or its Chinese characters / 2 when it has no English. When the
    Chinese twin shares the blockquote (a paragraph labelled "面试怎么答"), only the text before it counts:
    the Latin terms inside the Chinese (token, KV cache) are not the English box's words."""
    english_part = _ZH_BOX_LABEL.split(text, maxsplit=1)[0]
    if _WORD.findall(_CJK.sub(" ", english_part)):
        text = english_part
    english = len(_WORD.findall(_CJK.sub(" ", text)))
    return english if english else len(_CJK.findall(text)) / 2


def sentences(text: str) -> list[str]:
    """The sentences of stripped markdown (see the module docstring): per paragraph and list item,
    headings and table rows left out, a bold run-in label dropped."""
    units, current = [], []

    def close():
        if current:
            units.append(" ".join(current))
            current.clear()

    for line in text.splitlines():
        stripped = re.sub(r"^\s*(?:>\s?)+", "", line).strip()  # blockquote markers
        if not stripped:
            close()
        elif _HEADING.match(stripped) or stripped.startswith("|") or _BOLD_LINE.match(stripped):
            close()  # headings, table rows, lines in bold alone ("**What you will learn**"): no sentences
        elif re.match(r"^(?:[-*+]|\d{1,3}[.)])\s+", stripped):
            close()
            current.append(re.sub(r"^(?:[-*+]|\d{1,3}[.)])\s+", "", stripped))
        else:
            current.append(stripped)
    close()
    found = []
    for unit in units:
        unit = _RUN_IN_LABEL.sub(" ", unit)
        protected = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "\0"), unit)
        for sentence in _SENTENCE_END.split(protected):
            sentence = sentence.replace("\0", ".").strip()
            if count_words(sentence) > 0:
                found.append(sentence)
    return found


@dataclass
class Box:
    """An interview box: the markdown cell it is in, its length in words, its text, and whether it is in a
    deeper section."""

    cell: int
    words: float
    text: str
    deeper: bool


@dataclass
class NotebookReport:
    name: str
    core_words: float = 0.0
    deeper_words: float = 0.0
    sentence_words: list[float] = field(default_factory=list)  # words of each core sentence
    boxes: list[Box] = field(default_factory=list)

    @property
    def mean_sentence(self) -> float:
        return statistics.fmean(self.sentence_words) if self.sentence_words else 0.0

    @property
    def long_sentences(self) -> int:
        return sum(words > LONG_SENTENCE for words in self.sentence_words)

    @property
    def reading_minutes(self) -> float:
        return self.core_words / WORDS_PER_MINUTE

    @property
    def exempt(self) -> bool:
        return EXEMPT_FROM_CORE_LIMIT in self.name


def split_cells(cells) -> list[tuple[int, str, str]]:
    """(cell index, core markdown, deeper markdown) per markdown cell, following the deeper-section state
    from cell to cell (a "Going deeper" heading in one cell covers the cells after it)."""
    parts = []
    deeper_level: int | None = None  # the level of the open "Going deeper" heading
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        details = 0  # open <details> blocks: each cell renders on its own, so none spans two cells
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        core, deeper, fence = [], [], None
        for line in source.splitlines():
            if fence is None:
                heading = _HEADING.match(line)
                if heading and not details:
                    level, text = len(heading.group(1)), heading.group(2)
                    if _DEEPER_HEADING.search(text):
                        deeper_level = level if deeper_level is None else min(deeper_level, level)
                    elif deeper_level is not None and level <= deeper_level:
                        deeper_level = None
                opened = len(re.findall(r"<details\b", line, re.I))
                closed = len(re.findall(r"</details\s*>", line, re.I))
                in_deeper = deeper_level is not None or details > 0 or opened > 0
                details = max(0, details + opened - closed)
                fenced = _FENCE.match(line)
                if fenced:
                    fence = fenced.group(1)[0] * 3
            else:
                in_deeper = deeper_level is not None or details > 0
                if line.strip().startswith(fence):
                    fence = None
            (deeper if in_deeper else core).append(line)
        parts.append((index, "\n".join(core), "\n".join(deeper)))
    return parts


def find_boxes(markdown: str) -> list[str]:
    """The interview boxes of a markdown text: each box's text without its ">" markers."""
    boxes, current = [], None
    for line in markdown.splitlines():
        quoted = line.lstrip().startswith(">")
        if quoted and current is None and _BOX_START.match(line):
            current = []
        # A quoted line continues the box, and so does an unquoted one before the next blank line
        # (markdown's "lazy continuation" of a blockquote paragraph).
        if current is not None and line.strip() and (quoted or current):
            current.append(re.sub(r"^\s*(?:>\s?)+", "", line))
            continue
        if current is not None:
            boxes.append("\n".join(current))
            current = None
    if current is not None:
        boxes.append("\n".join(current))
    return boxes


def report_notebook(nb, name: str = "notebook") -> NotebookReport:
    """The reading report of one notebook (an nbformat node or a dict)."""
    report = NotebookReport(name)
    for index, core, deeper in split_cells(nb["cells"]):
        core_text, deeper_text = prose(core), prose(deeper)
        report.core_words += count_words(core_text)
        report.deeper_words += count_words(deeper_text)
        report.sentence_words += [count_words(s) for s in sentences(core_text)]
        for text, in_deeper in [(core, False), (deeper, True)]:
            for box in find_boxes(text):
                said = _BOX_LABEL.sub(" ", prose(box), count=1)
                report.boxes.append(Box(index, box_words(said), " ".join(box.split()), in_deeper))
    return report


def report_path(path: str | Path) -> NotebookReport:
    import nbformat

    path = Path(path)
    return report_notebook(nbformat.read(path, as_version=4), path.name)


def problems(reports: list[NotebookReport]) -> list[str]:
    """Every broken limit (see the module docstring), one line each."""
    found = []
    for r in reports:
        if not r.exempt and r.core_words > CORE_LIMIT:
            found.append(f"{r.name}: core path {r.core_words:,.0f} words > {CORE_LIMIT:,}")
        if r.mean_sentence > SENTENCE_LIMIT:
            found.append(
                f"{r.name}: mean sentence of the core path {r.mean_sentence:.1f} words > {SENTENCE_LIMIT:g}"
            )
        for box in r.boxes:
            if box.words > BOX_LIMIT:
                found.append(
                    f"{r.name}: cell {box.cell}: interview box of {box.words:.0f} words > {BOX_LIMIT}: "
                    f"{box.text[:70]}..."
                )
    total = sum(r.core_words for r in reports if not r.exempt)
    if total > SUITE_LIMIT:
        found.append(f"suite: core paths {total:,.0f} words > {SUITE_LIMIT:,} (the drill aside)")
    return found


def format_report(reports: list[NotebookReport]) -> str:
    width = max([len(r.name) for r in reports] + [8])
    head = (
        f"{'notebook':<{width}}  {'core':>6}  {'deeper':>6}  {'sentence':>8}  {'>40':>4}  {'read':>7}  "
        f"{'boxes':>5}  {'box words (median, max, >60)':<28}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        words = [b.words for b in r.boxes]
        boxes = (
            f"{statistics.median(words):.0f}, {max(words):.0f}, {sum(w > BOX_LIMIT for w in words)}"
            if words
            else "-"
        )
        lines.append(
            f"{r.name:<{width}}  {r.core_words:>6,.0f}  {r.deeper_words:>6,.0f}  {r.mean_sentence:>8.1f}  "
            f"{r.long_sentences:>4}  {r.reading_minutes:>5.1f} m  {len(r.boxes):>5}  {boxes}"
        )
    total = sum(r.core_words for r in reports)
    deeper = sum(r.deeper_words for r in reports)
    exempt = sum(r.core_words for r in reports if r.exempt)
    lines.append("-" * len(head))
    lines.append(
        f"{'suite':<{width}}  {total:>6,.0f}  {deeper:>6,.0f}  {'':>8}  "
        f"{sum(r.long_sentences for r in reports):>4}  {total / WORDS_PER_MINUTE:>5.0f} m  "
        f"{sum(len(r.boxes) for r in reports):>5}"
    )
    lines.append(
        f"suite core words: {total:,.0f} (limit {SUITE_LIMIT:,}; without the drill: {total - exempt:,.0f}); "
        f"reading time of the core paths at {WORDS_PER_MINUTE} words a minute: "
        f"{total / WORDS_PER_MINUTE / 60:.1f} h"
    )
    lines.append("")
    lines.append("interview boxes, words per box (cell:words; * over the limit, d in a deeper section):")
    for r in reports:
        if r.boxes:
            listed = " ".join(
                f"{b.cell}:{b.words:.0f}{'*' if b.words > BOX_LIMIT else ''}{'d' if b.deeper else ''}"
                for b in r.boxes
            )
            lines.append(f"  {r.name}: {listed}")
    return "\n".join(lines)


def readme_minutes(report: NotebookReport) -> str:
    """The README's "read" cell for a notebook: its core reading time in whole minutes (at least 1)."""
    return f"{max(1, round(report.reading_minutes))} min"


_README_ROW = re.compile(r"^\| \[`(?P<name>[^`]+)`\]\([^)]*\) \| (?P<read>[^|]*?) \|", re.M)


def readme_reading_times(text: str) -> dict[str, str]:
    """{notebook name without .ipynb: its "read" cell} from the README's notebook table."""
    return {m["name"]: m["read"] for m in _README_ROW.finditer(text)}


def rewrite_readme(text: str, reports: list[NotebookReport]) -> str:
    """The README with the "read" cell of each reported notebook's row set by `readme_minutes`."""
    minutes = {Path(r.name).stem: readme_minutes(r) for r in reports}

    def cell(m: re.Match) -> str:
        read = minutes.get(m["name"], m["read"])
        return m[0][: m.start("read") - m.start()] + read + " |"

    return _README_ROW.sub(cell, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--check", action="store_true", help="exit 1 when a limit is broken, listing each")
    parser.add_argument("--readme", metavar="PATH", help="rewrite the \"read\" column of this README's table")
    args = parser.parse_args(argv)
    reports = [report_path(path) for path in args.notebooks]
    print(format_report(reports))
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(rewrite_readme(readme.read_text(encoding="utf-8"), reports), encoding="utf-8")
    if not args.check:
        return 0
    found = problems(reports)
    print()
    print(f"{len(found)} limit(s) broken" + (":" if found else ""))
    for line in found:
        print(f"  {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
