"""Checks on a notebook's interview text, reusable for every notebook: each interview box and each
model answer exists in English and in Chinese, and each box is something a candidate can say.

    import nbformat
    from bilingual import language_problems, notebook_problems
    nb = nbformat.read(path, as_version=4)
    assert notebook_problems(nb, language_problems) == []   # every box and answer in both languages
    assert notebook_problems(nb) == []                      # ... and every box sayable

A box is a blockquote paragraph that starts with the bold label `BOX_EN` ("What to say in an
interview") or `BOX_ZH` ("面试怎么答"); each English box needs a Chinese one in the same cell, and
the other way round. Its text after the label is one bold sentence, then at most two more: at most
three sentences and 60 English words. A model answer is a paragraph that starts with the bold label
`ANSWER_EN` or `ANSWER_ZH`, and it too needs its other language in the same cell. The English text
holds no Chinese characters; the Chinese text holds some. (The labels are rlhf_lab.teach.drill's.)
"""

from __future__ import annotations

import re

from rlhf_lab.teach.drill import ANSWER_EN, ANSWER_ZH, BOX_EN, BOX_ZH

MAX_BOX_WORDS = 60
MAX_BOX_SENTENCES = 3
CJK = re.compile(r"[\u3400-\u9fff]")
_LABEL_END = r"[.。:：]?\*\*[.。:：]?"  # "**Label.**", "**Label：**" or "**Label**:"
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$|`[^`\n]+`", re.S)
_ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|Dr|Mr|vs|et al|cf|etc|Fig|Eq)\.", re.I)


def has_chinese(text: str) -> bool:
    return bool(CJK.search(_MATH.sub(" ", text)))


def plain(text: str) -> str:
    """Text as read aloud: formulas and code become one word, markdown emphasis and links go."""
    text = _MATH.sub(" X ", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return text.replace("**", "").replace("__", "")


def english_sentences(text: str) -> list[str]:
    """Sentences of English prose (abbreviations such as "e.g." and "Dr." do not end one)."""
    text = _ABBREVIATIONS.sub(lambda m: m.group(0).replace(".", "<dot>"), plain(text))
    parts = re.split(r"(?<=[.!?])\s+(?=[\"'(A-Z0-9])", text.strip())
    return [p.replace("<dot>", ".").strip() for p in parts if p.strip()]


def chinese_sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[。！？])", plain(text).strip())
    return [p.strip() for p in parts if p.strip()]


def word_count(text: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][\w'’-]*", plain(text)))


def mean_sentence_words(text: str) -> float:
    sentences = english_sentences(text)
    return sum(word_count(s) for s in sentences) / max(len(sentences), 1)


def _paragraphs(markdown: str) -> list[str]:
    """Paragraphs of a markdown cell, with a blockquote's "> " markers removed (one paragraph per
    blank-quote line or blank line)."""
    paragraphs, current = [], []
    for line in markdown.splitlines():
        stripped = re.sub(r"^\s*>\s?", "", line) if line.lstrip().startswith(">") else line
        if not stripped.strip():
            if current:
                paragraphs.append(" ".join(current))
            current = []
        else:
            current.append(stripped.strip())
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def labelled(markdown: str, label: str) -> list[str]:
    """The text after `label` of every paragraph of `markdown` that starts with it in bold."""
    pattern = re.compile(r"^\*\*" + re.escape(label) + _LABEL_END + r"\s*(.*)$", re.S)
    return [m.group(1).strip() for p in _paragraphs(markdown) if (m := pattern.match(p))]


def box_text_problems(text: str, language: str) -> list[str]:
    """What makes one box's text (after its label) hard to say: `language` is "en" or "zh"."""
    problems = []
    if language == "en":
        first = re.match(r"\*\*(.+?[.!?])\*\*", text)
        sentences = english_sentences(text)
        if word_count(text) > MAX_BOX_WORDS:
            problems.append(f"English box has {word_count(text)} words (at most {MAX_BOX_WORDS})")
        if first and len(english_sentences(first.group(1))) != 1:
            problems.append("English box: the bold part is more than one sentence")
    else:
        first = re.match(r"\*\*(.+?[。！？])\*\*", text)
        sentences = chinese_sentences(text)
        if first and len(chinese_sentences(first.group(1))) != 1:
            problems.append("Chinese box: the bold part is more than one sentence")
    if not first:
        problems.append(f"{language} box does not start with one bold sentence")
    if len(sentences) > MAX_BOX_SENTENCES:
        problems.append(f"{language} box has {len(sentences)} sentences (at most {MAX_BOX_SENTENCES})")
    return problems


def language_problems(markdown: str) -> list[str]:
    """Interview boxes and model answers of one markdown cell that lack their other language."""
    problems = []
    boxes_en, boxes_zh = labelled(markdown, BOX_EN), labelled(markdown, BOX_ZH)
    if len(boxes_en) != len(boxes_zh):
        problems.append(f"{len(boxes_en)} English interview box(es) but {len(boxes_zh)} Chinese one(s)")
    problems += ["English box holds Chinese characters" for text in boxes_en if has_chinese(text)]
    problems += ["Chinese box holds no Chinese" for text in boxes_zh if not has_chinese(text)]
    answers_en, answers_zh = labelled(markdown, ANSWER_EN), labelled(markdown, ANSWER_ZH)
    if len(answers_en) != len(answers_zh):
        problems.append(f"{len(answers_en)} English model answer(s) but {len(answers_zh)} Chinese one(s)")
    problems += ["English model answer holds Chinese characters" for text in answers_en if has_chinese(text)]
    problems += ["Chinese model answer holds no Chinese" for text in answers_zh if not has_chinese(text)]
    return problems


def box_rule_problems(markdown: str) -> list[str]:
    """Boxes of one markdown cell that a candidate could not say: not one bold sentence and at most two
    more, or over MAX_BOX_WORDS English words."""
    return ([p for text in labelled(markdown, BOX_EN) for p in box_text_problems(text, "en")]
            + [p for text in labelled(markdown, BOX_ZH) for p in box_text_problems(text, "zh")])


def cell_problems(markdown: str) -> list[str]:
    """`language_problems` and `box_rule_problems` of one markdown cell."""
    return language_problems(markdown) + box_rule_problems(markdown)


def notebook_problems(nb, check=cell_problems) -> list[str]:
    """`check` (default: every rule) on every markdown cell of a notebook (an nbformat node), as
    "cell N: ...". `check=language_problems` asks only that each box and answer has its other language."""
    return [f"cell {index}: {problem}" for index, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for problem in check(cell.source)]
