"""Check that the numbers a notebook's prose states come from its committed outputs.

    python -m tools.prose_check notebooks/07_grpo.ipynb        # list unsupported numbers, exit 1
    python -m tools.prose_check --summary notebooks/*.ipynb    # counts per notebook

The rule (notebooks/README.md, rule 6): every number a markdown cell states must appear in the
committed outputs of the code cells *above* it. The first cell (what you will learn, run time) is the
exception: it summarises the run, so the outputs of the whole notebook support it (the last cell prints
the run time). A setting written in code counts as stated too
(``learning_rate=2e-4``): in the code cells above, or in the code cell the text introduces (the first
code cell after it; its source, not its outputs). Numbers quoted from a paper are allowed per cell.

What counts as a stated number
    * decimals: ``0.535``, ``1.24``, ``1,234.5`` (thousands separators are part of the number);
    * scientific notation: ``-1.40e-08``, ``3e-4``;
    * percentages: ``28%``, ``0.8%``, ``28 %``, ``3 percent``, ``2.5 pp`` / ``percentage points``;
    * multipliers: ``12x``, ``1.4x``, ``4×`` (glued to the number; ``32 x 4096`` is a product, not one);
    * integers with a unit that marks a measurement: time (``12 s``, ``290 s``, ``15 ms``, ``2 min``,
      ``1 h``), memory (``512 B``, ``512 bytes``, ``1504 KiB``, ``42 MB``, ``2 GiB``), throughput
      (``tokens/s``, ``it/s``); decimals with a unit are decimals anyway (``1.6 min``). A unit glued to
      an integer counts only where it cannot be a plural (``15ms`` yes; ``12s``, ``1990s`` no);
    * a decimal with a scale suffix glued to it is the scaled value (``1.5k`` = 1500, ``6.74B``).
    Not checked: plain integers (section numbers, ``Q19``, ``32 prompts``, ``500 steps``, years,
    ``notebook 04``, ``4,971``, ``96k``), numbers written as words, anything inside LaTeX (``$...$``,
    ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``), inline and fenced code, HTML tags and comments, URLs and
    link targets, arXiv ids (``arXiv 2402.03300``, bare ``2402.03300``), version numbers (``2.13.0``,
    ``torch 2.2``, ``transformers 5.24``, ``v0.6``, ``torch>=2.2``; but ``TRL 0.05`` is a number), numbers
    that are part of a name (``Qwen2.5-1.5B``, ``Llama 3.1``, ``Llama-3.1-8B``, ``GPT-3.5``, ``fp16``,
    ``GRPO 2x2``), heading numbers (``## 3.1 ...``), ordered-list markers (``1. ...``) and references
    (``section 3.2``, ``§4.1``, ``Eq. 2.3``, ``Figure 1.2``, ``Table 2.1``).

Ranges
    ``0.530-0.565``, ``0.735–0.770``, ``20.4-38.2%``, ``1.4-1.8 ms``, ``2-4x``, ``10.6x to 132x`` are two
    numbers; the dash is never read as a minus, and a unit, ``%`` or ``x`` written after the second
    number applies to the first too.

Matching (``matches``)
    * Signs are ignored: prose and output numbers are compared as absolute values (prose says "a drop
      of 0.12" for a printed -0.12, "1.4e-08" for -1.40e-08, and a range dash must not become a minus).
    * A prose number matches an output number when the output, rounded to the prose number's last
      written digit, gives the prose value (``0.535`` matches 0.5349 and 0.5351; ``1.4e-08`` matches
      1.40e-08; ``1.0`` matches 0.98); a tie rounds either way (0.5345 gives ``0.534`` or ``0.535``).
      Trailing zeros of an integer measurement or multiplier may be rounding, by at most 5%:
      ``about 300 s`` matches 290 s, ``about 670x`` matches 667x. Elsewhere integers are exact.
    * A percentage ``p%`` matches an output fraction ``f`` with round(100 f) == p, an output
      percentage, or a bare output number p (a column headed "accuracy (%)"). A decimal also matches
      an output percentage divided by 100.
    * A multiplier ``12x`` matches an output number that rounds or truncates to 12 (12.4, 12.0x, 11.6,
      12.7); ``1.4x`` matches by rounding.
    * Units: the checker does not read the output's unit (``2 GiB`` matches any printed 2), but it
      converts within time (ns, µs, ms, s, min, h) and within bytes (B, KiB, MiB, ...; B, KB, MB, ...):
      ``189 ms`` matches a printed 0.189 s, ``1.6 min`` a printed 96 s.
    * Nothing else is computed: no ratios, differences or sums. ``2.4x as much (0.45 vs 0.19 s)`` needs
      the notebook to print the 2.4.
    * Outputs are ``text/plain``, ``text/markdown``, ``text/latex`` and ``text/html`` (tags removed) of
      execute_result / display_data, and stream text; ``96,192`` in an output is 96192 (and its pieces),
      ``28.3%`` is 28.3 and 0.283, ``1.5k`` is 1.5 and 1500. Markdown above never counts: a number restated
      from earlier prose needs an output above it anyway.
    * Settings (code source) support only plain decimals (by rounding, as above) and percentages written
      as a fraction in code (exactly: ``5-95 %`` for ``quantile(x, [0.05, 0.95])``). Measurements with a
      unit, multipliers and other percentages must come from outputs, since a small integer in the code
      (``range(20)``) says nothing about "20 s".

The full-mode run time (``run_time_findings``)
    The first cell's full-mode run time must be the time the notebook's last code cell prints
    (``notebook run time: 20 s``), within the rounding of the written digits: ``32 s`` fails against a
    printed 20 s even when a 32 is printed elsewhere; ``about 20 s`` passes against 20.2 s, ``about 6
    minutes`` against 339 s. A statement is a time attached to the words "full mode": ``32 s in full
    mode``, ``full mode 93 s``, ``full mode about 6 minutes``, ``full mode (two runs of 80 steps) 37 s``;
    a time written right after it in apposition is checked too (``432 s (about 7 minutes)``, ``170 s,
    about 3 minutes``). Times attached to "FAST mode" are not (they are allowed by cell metadata, see
    below). When the last code cell prints a full-mode run time, the first cell must state it in one of
    these forms; a last cell that prints a FAST-mode time (``FAST = True``) or no time, under a first cell
    that states one, is reported too.

Allowing a quoted number
    * ``ALLOWED``, a short global list of constants from papers that the prose names everywhere without
      printing them, each with its source. A global entry matches exactly (``0.28`` allows ``0.28`` but
      not ``0.3``; ``10%`` would allow ``10%`` but not ``0.1``).
    * Per cell: a markdown cell whose metadata carries
      ``{"prose_check": {"allow": ["37.6%", "55.2%"], "reason": "vLLM paper, Table 2"}}`` may state
      those numbers, matched exactly in the same way (``"20.4-38.2%"`` allows both ends; an entry must
      be a number the checker checks, so ``"32"`` is refused). The reason is required (a ``ValueError``
      otherwise), so that a reviewer sees why a number is not from the run.
      Prefer this to growing ``ALLOWED``.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

# Constants the prose may state without a committed output: published hyper-parameters and library
# defaults that every RL-fine-tuning text quotes. Exact match only. Keep this short; a number quoted in
# one cell belongs in that cell's metadata ("prose_check": {"allow": [...], "reason": ...}).
ALLOWED: dict[str, str] = {
    "0.2": "PPO clip range epsilon (Schulman et al. 2017, arXiv 1707.06347); GRPO's default too",
    "0.27": "GRPO's clip-higher epsilon_high in the GSPO paper (Zheng et al. 2025, arXiv 2507.18071)",
    "0.28": "DAPO clip-higher epsilon_high (Yu et al. 2025, arXiv 2503.14476)",
    "3e-4": "GSPO sequence-ratio clip range, lower (Zheng et al. 2025, arXiv 2507.18071)",
    "4e-4": "GSPO sequence-ratio clip range, upper (Zheng et al. 2025, arXiv 2507.18071)",
    "0.04": "GRPO KL coefficient beta (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300)",
}

_SCALE = {"k": Decimal(10) ** 3, "K": Decimal(10) ** 3, "M": Decimal(10) ** 6, "B": Decimal(10) ** 9}

_UNITS = (
    r"ns|µs|μs|us|ms|s|secs?|seconds?|min|mins|minutes?|h|hrs?|hours?|days?"
    r"|bytes?|KB|kB|KiB|MB|MiB|GB|GiB|TB|TiB"
    r"|tokens/s|tok/s|it/s|steps/s|samples/s|sequences/s|FLOP/s|TFLOPS|GFLOPS|GHz|MHz"
)
# Time and memory units: a prose number also matches the same quantity printed in another unit of its
# family (no other arithmetic is done).
_UNIT_NAMES = {
    "ns": ("ns",), "us": ("µs", "μs", "us"), "ms": ("ms",), "s": ("s", "sec", "secs", "second", "seconds"),
    "min": ("min", "mins", "minute", "minutes"), "h": ("h", "hr", "hrs", "hour", "hours"),
    "B": ("B", "byte", "bytes"), "KiB": ("KiB",), "MiB": ("MiB",), "GiB": ("GiB",), "TiB": ("TiB",),
    "KB": ("KB", "kB"), "MB": ("MB",), "GB": ("GB",), "TB": ("TB",),
}
_UNIT_FACTORS = {
    "time": {"ns": Decimal("1e-9"), "us": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1),
             "min": Decimal(60), "h": Decimal(3600)},
    "binary bytes": {"B": Decimal(1), "KiB": Decimal(2**10), "MiB": Decimal(2**20), "GiB": Decimal(2**30),
                     "TiB": Decimal(2**40)},
    "decimal bytes": {"B": Decimal(1), "KB": Decimal(10**3), "MB": Decimal(10**6), "GB": Decimal(10**9),
                      "TB": Decimal(10**12)},
}

_SUFFIX_RE = re.compile(
    r"(?P<percent>\s?(?:%|percent\b|pp\b|percentage points?\b))"
    r"|(?P<mult>[x×](?!\w))"
    r"|(?P<unit>\s?(?:" + _UNITS + r")(?![\w/])|\sB(?![\w/]))"  # "512 B" with a space; "1.5B" is a scale
    r"|(?P<scale>[kKMB](?![\w]))"
    r"|(?P<glued>[A-Za-z_])"
)
# glued units like "12s" are fine, but "1990s", "20s" are plural years/decades: a bare "s" glued to an
# integer is not a unit, nor "B" / "h" without a space.
_GLUE_OK = re.compile(r"ns|µs|μs|us|ms|min|KiB|MiB|GiB|KB|MB|GB|TB|TiB|tokens/s|it/s")

_NUM_RE = re.compile(
    r"(?<![\w.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d+\.\d+|\d+|\.\d+)"
    r"(?P<exp>[eE][-+−]?\d+)?"
)
_OUT_NUM_RE = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+")

_SECTION_WORDS = (
    r"(?:sections?|§|sec\.|secs\.|eq\.|eqs\.|equations?|fig\.|figs\.|figures?|tables?|chapters?|cells?"
    r"|appendix|theorem|lemma|algorithm|notebooks?)"
)
# What is not prose in a markdown cell: code, LaTeX, HTML, images, link targets, URLs (the reading
# report removes the same before counting words).
NOT_PROSE = [
    re.compile(r"^(?P<f>`{3,}|~{3,}).*?^(?P=f)[ \t]*$", re.S | re.M),  # fenced code
    re.compile(r"(?P<b>`+).+?(?P=b)", re.S),  # inline code
    re.compile(r"<!--.*?-->", re.S),  # HTML comments
    re.compile(r"\$\$.+?\$\$", re.S),  # display LaTeX
    re.compile(r"\\\[.+?\\\]", re.S),
    re.compile(r"\\\(.+?\\\)", re.S),
    re.compile(r"(?<![\\$])\$(?!\s)(?:[^$\\\n]|\\.|\n(?!\s*\n))+?(?<!\s)\$(?!\d)"),  # inline LaTeX
    re.compile(r"!\[[^\]]*\]\([^)]*\)"),  # images
    re.compile(r"(?<=\])\([^)\s]*(?:\s+\"[^\"]*\")?\)"),  # link targets
    re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$", re.M),  # reference-style link definitions
    re.compile(r"<[^>\n]+>"),  # HTML tags (their text stays)
    re.compile(r"(?:https?://|www\.)\S+"),  # bare URLs
]
_MASKS = [
    *NOT_PROSE,
    re.compile(r"\barXiv[:\s]*\d{4}\.\d{4,5}(?:v\d+)?", re.I),
    re.compile(r"(?<![\d.])\d{2}(?:0[1-9]|1[0-2])\.\d{5}(?:v\d+)?(?!\d|\.\d)"),  # bare new-style arXiv id
    re.compile(r"(?<![\w.])v?\d+\.\d+\.\d+(?:[.\w+-]*)"),  # 2.13.0, v1.2.3, 2.13.0+cpu
    re.compile(r"(?<=[\w\]])(?:>=|<=|==|~=|!=|<|>)\d+(?:\.\d+)*"),  # version pins: torch>=2.2
    re.compile(
        r"\b(?:version|versions|python|torch|pytorch|transformers|tokenizers|safetensors|numpy|pandas"
        r"|matplotlib|nbformat|nbclient|jupyterlab|ipywidgets|cuda|cudnn|vllm|trl|ruff|pytest|triton"
        r"|flash-attn|flashattention|deepspeed|accelerate|peft)\s+v?\d+\.(?!0\d)\d+(?:\.\d+)*(?:\.x)?",
        re.I,
    ),
    re.compile(  # model names with a version: Llama 3.1, Qwen2.5, GPT-3.5, DeepSeek-V3
        r"\b(?:Llama|LLaMA|Qwen|GPT|Mistral|Mixtral|Gemma|Phi|Claude|Gemini|DeepSeek|OLMo|Falcon|PaLM|Pythia"
        r"|SmolLM|T5|BERT)[-\s]?[vVrR]?\d+(?:\.\d+)*(?:-[\w.]*\d[\w.]*)*"
    ),
    re.compile(r"^\s{0,3}#{1,6}\s*(?:Q\d+\s*[—–:-]?\s*)?\d+(?:\.\d+)*\.?", re.M),  # heading numbers
    re.compile(r"^[ \t]*(?:[-*+>][ \t]+)*\d{1,3}[.)](?=\s)", re.M),  # ordered-list markers
    re.compile(
        r"(?<![A-Za-z])(?:(?i:" + _SECTION_WORDS + r")|Q)\s*\d+(?:\.\d+)*"
        r"(?:\s*(?:,|and|or|-|–|to)\s*\d+(?:\.\d+)*)*"
    ),
]


@dataclass(frozen=True)
class ProseNumber:
    """A number a markdown cell states: ``text`` as written, ``value`` (absolute, scaled),
    ``quantum`` (the place of its last significant digit) and ``kind``."""

    text: str
    value: Decimal
    quantum: Decimal
    kind: str  # "plain", "percent", "multiplier" or "unit"
    start: int
    end: int
    unit: str = ""

    @property
    def canonical(self) -> tuple[bool, Decimal]:
        """(is a percentage, value) for exact allow-list matches: "10%" allows "10%", not "0.1"."""
        return self.kind == "percent", self.value.normalize()


@dataclass(frozen=True)
class Finding:
    """A number in a markdown cell that no output above supports."""

    notebook: str
    cell: int
    number: str
    context: str

    def __str__(self) -> str:
        return f"{self.notebook}: cell {self.cell}: {self.number}  | {self.context}"


def _mask(text: str) -> str:
    """Blank (same length, newlines kept) every region whose numbers are not prose numbers."""
    for pattern in _MASKS:
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text


def _decimal(num: str, exp: str | None, rounded_integer: bool = False) -> tuple[Decimal, Decimal]:
    """Value and quantum of a written number (`rounded_integer`: trailing zeros may be rounding)."""
    digits = num.replace(",", "")
    value = abs(Decimal(digits + (exp or "").replace("−", "-")))
    if "." in digits:
        quantum = Decimal(1).scaleb(-len(digits.split(".")[1]))
    elif not rounded_integer:
        quantum = Decimal(1)
    else:
        # "about 300 s" for 290 s, "about 670x" for 667x: the zeros are rounding, but never by more than 5%
        stripped = digits.rstrip("0")
        quantum = Decimal(1).scaleb(len(digits) - len(stripped) if stripped else 0)
        quantum = max(Decimal(1), min(quantum, value / 10))
    if exp:
        quantum = quantum.scaleb(int(exp[1:].replace("−", "-")))
    return value, quantum


def prose_numbers(markdown: str) -> list[ProseNumber]:
    """The checked numbers of a markdown source, in order (see the module docstring for the rules)."""
    masked = _mask(markdown)
    tokens = []  # [match, kind or None, end with suffix, part of a name, scale or None, unit]
    prev_end, prev_name = -2, False
    for m in _NUM_RE.finditer(masked):
        before = masked[m.start() - 1] if m.start() else " "
        before2 = masked[m.start() - 2] if m.start() > 1 else " "
        joined_to_prev = prev_end == m.start() - 1 and before in "-_./"
        is_name = ((before in "-_/" and (before2.isalpha() or before2 == "_"))
                   or (joined_to_prev and prev_name))
        kind, end, scale, unit = None, m.end(), None, ""
        s = _SUFFIX_RE.match(masked, m.end())
        if s:
            group = s.lastgroup
            glued = not s.group(0)[0].isspace()
            is_int = "." not in m.group("num") and not m.group("exp")
            if group == "glued":
                is_name = True
            elif group == "scale":
                if is_int:
                    is_name = True  # "96k-parameter", "7B": a rounded count or a model name
                else:
                    scale, end = _SCALE[s.group(0)], s.end()
            elif glued and is_int and group == "unit" and not _GLUE_OK.fullmatch(s.group(0)):
                is_name = True  # "1990s", "8B"
            else:
                kind, end = {"percent": "percent", "mult": "multiplier", "unit": "unit"}[group], s.end()
                unit = s.group(0).strip() if group == "unit" else ""
        tokens.append([m, kind, end, is_name, scale, unit])
        prev_end, prev_name = end, is_name
    # a suffix after the second number of a range applies to the first: "20.4-38.2%", "2-4x", "1-2 min"
    for first, second in zip(tokens, tokens[1:]):
        gap = masked[first[2] : second[0].start()]
        if first[1] is None and second[1] is not None and re.fullmatch(r"\s*[-–—]\s*|\s+to\s+", gap):
            first[1], first[5] = second[1], second[5]
    numbers = []
    for m, kind, end, is_name, scale, unit in tokens:
        if is_name:
            continue
        is_int = "." not in m.group("num") and not m.group("exp")
        if is_int and kind is None:
            continue
        value, quantum = _decimal(m.group("num"), m.group("exp"),
                                  rounded_integer=kind in ("unit", "multiplier"))
        if scale is not None:
            value, quantum = value * scale, quantum * scale
        numbers.append(
            ProseNumber(markdown[m.start() : end], value, quantum, kind or "plain", m.start(), end,
                        _unit_name(unit))
        )
    return numbers


def output_numbers(text: str) -> list[Decimal]:
    """Every number in an output (or code) text, absolute; ``96,192`` gives 96192 and its pieces,
    ``28.3%`` gives 28.3 and 0.283, ``1.5k`` gives 1.5 and 1500."""
    values = []
    for m in _OUT_NUM_RE.finditer(text):
        try:
            value = Decimal(m.group(0))
        except InvalidOperation:
            continue
        values.append(value)
        after = text[m.end() : m.end() + 2]
        if after[:1] == "%" or after == " %":
            values.append(value / 100)
        elif after[:1] in _SCALE and not after[1:2].isalnum():
            values.append(value * _SCALE[after[:1]])
    for m in re.finditer(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", text):
        values.append(Decimal(m.group(0).replace(",", "")))
    return values


class _Pool:
    """Sorted output numbers; answers 'is there a number within [lo, hi]?'."""

    def __init__(self) -> None:
        self.values: list[Decimal] = []

    def extend(self, values: list[Decimal]) -> None:
        self.values = sorted({*self.values, *values})

    def any_between(self, lo: Decimal, hi: Decimal, hi_open: bool = False) -> bool:
        i = bisect.bisect_left(self.values, lo)
        if i == len(self.values):
            return False
        return self.values[i] < hi if hi_open else self.values[i] <= hi


def _unit_name(unit: str) -> str:
    """The canonical name of a time or memory unit ("seconds" -> "s"), else ""."""
    for name, spellings in _UNIT_NAMES.items():
        if unit in spellings:
            return name
    return ""


def matches(number: ProseNumber, pool: _Pool, convert: bool = True) -> bool:
    """Whether some number of `pool`, rounded to the prose number's last digit, gives it
    (`convert`: also in another unit of the prose number's time or memory unit)."""
    half = number.quantum / 2
    v = number.value
    if pool.any_between(v - half, v + half):
        return True
    if convert and number.unit:  # the same quantity printed in another unit of its family: 189 ms for 0.189 s
        for family in (f for f in _UNIT_FACTORS.values() if number.unit in f):
            for other, factor in family.items():
                ratio = family[number.unit] / factor
                if other != number.unit and pool.any_between((v - half) * ratio, (v + half) * ratio):
                    return True
    if number.kind == "percent" and pool.any_between((v - half) / 100, (v + half) / 100):
        return True
    if number.kind == "multiplier" and v == v.to_integral_value() and pool.any_between(v, v + 1, True):
        return True  # "12x" for 12.6: truncated
    return False


def _allowed_set(entries) -> set[tuple[bool, Decimal]]:
    allowed = set()
    for entry in entries:
        found = prose_numbers(str(entry))
        if not found:
            raise ValueError(f"prose_check allow entry {entry!r} is not a number the checker checks")
        allowed.update(n.canonical for n in found)
    return allowed


GLOBAL_ALLOWED = _allowed_set(ALLOWED)


def _cell_allow(cell) -> set[tuple[bool, Decimal]]:
    meta = cell.get("metadata", {}).get("prose_check", {})
    if not meta:
        return set()
    if not meta.get("reason"):
        raise ValueError("prose_check metadata needs a 'reason' next to 'allow'")
    return _allowed_set(meta.get("allow", []))


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _html_text(html: str) -> str:
    html = re.sub(r"<style.*?</style>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def _output_texts(cell) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            text = output.get("text", "")
            texts.append("".join(text) if isinstance(text, list) else text)
        elif output.get("output_type") in ("execute_result", "display_data"):
            data = output.get("data", {})
            for mime in ("text/plain", "text/markdown", "text/latex"):
                if mime in data:
                    value = data[mime]
                    texts.append("".join(value) if isinstance(value, list) else value)
            if "text/html" in data:
                value = data["text/html"]
                texts.append(_html_text("".join(value) if isinstance(value, list) else value))
    return texts


def _context(source: str, start: int, end: int, width: int = 60) -> str:
    half = max(0, (width - (end - start)) // 2)
    left = source[max(0, start - half) : start]
    right = source[end : end + half]
    return " ".join(f"{left}[{source[start:end]}]{right}".split())


def check_notebook(nb, name: str = "notebook") -> list[Finding]:
    """Unsupported numbers of one notebook (an nbformat node or a dict), in cell order."""
    cells = nb["cells"]
    outputs, code = _Pool(), _Pool()  # numbers printed above; numbers written in the code above
    everything = _Pool()  # the whole notebook's outputs: what the introduction (cell 0) summarises
    for cell in cells:
        if cell["cell_type"] == "code":
            for text in _output_texts(cell):
                everything.extend(output_numbers(text))
    findings = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            for text in _output_texts(cell):
                outputs.extend(output_numbers(text))
            code.extend(output_numbers(_source(cell)))
        elif cell["cell_type"] == "markdown":
            source = _source(cell)
            allowed = GLOBAL_ALLOWED | _cell_allow(cell)
            settings = _Pool()  # the code above and the code cell this text introduces (its source only)
            settings.values = code.values
            introduced = next((c for c in cells[index + 1 :] if c["cell_type"] == "code"), None)
            if introduced is not None:
                settings.extend(output_numbers(_source(introduced)))
            printed = everything if index == 0 else outputs
            for number in prose_numbers(source):
                if number.canonical in allowed or matches(number, printed):
                    continue
                if number.kind == "plain" and matches(number, settings, convert=False):
                    continue
                fraction = number.value / 100
                if number.kind == "percent" and settings.any_between(fraction, fraction):
                    continue  # "the 5-95 % band" for quantile(..., [0.05, 0.95]): exact, as a fraction
                findings.append(Finding(name, index, number.text, _context(source, number.start, number.end)))
    return run_time_findings(nb, name) + findings


# ----------------------------------------------------------------------------------------------------
# the full-mode run time: the first cell states it, the last code cell prints it

_MODE = r"(?P<mode>full|FAST)[\s-]+mode"
_TIME = r"(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>s|secs?|seconds?|min|mins|minutes?|h|hours?)(?![\w/])"
_APPROX = r"(?:(?:about|roughly|approximately|around|~)\s*)?"
# "32 s in full mode" (the time before the words) and "full mode (...) about 93 s" (after them)
_TIME_IN_MODE = re.compile(_TIME + r"\s+in\s+(?:the\s+)?" + _MODE, re.I)
_MODE_THEN_TIME = re.compile(_MODE + r"\s*(?:\([^()]*\))?\s*[:,]?\s*" + _APPROX + _TIME, re.I)
_APPOSITION = re.compile(r"\s*[(,]\s*" + _APPROX + _TIME, re.I)
_PRINTED_RUN_TIME = re.compile(r"run time:?\s*" + _TIME + r"(?P<rest>[^\n]*)", re.I)


@dataclass(frozen=True)
class RunTime:
    """A run time written in a text: as written, in seconds, and half its last written digit (seconds)."""

    text: str
    seconds: Decimal
    tolerance: Decimal
    start: int = 0
    end: int = 0


def _run_time(match: re.Match) -> RunTime:
    """The time a `_TIME` match wrote, in seconds, with half its last written digit as the tolerance
    (trailing zeros of an integer may be rounding, as for any measurement: see `_decimal`)."""
    factor = _UNIT_FACTORS["time"][_unit_name(match.group("unit").lower())]
    value, quantum = _decimal(match.group("num"), None, rounded_integer=True)
    start, end = match.start("num"), match.end("unit")
    return RunTime(match.string[start:end], value * factor, quantum * factor / 2, start, end)


def stated_full_mode_times(markdown: str) -> list[RunTime]:
    """The full-mode run times a first cell states (see the module docstring), in order."""
    masked = _mask(markdown)
    found: dict[int, RunTime] = {}
    for pattern in (_TIME_IN_MODE, _MODE_THEN_TIME):
        for match in pattern.finditer(masked):
            if match.group("mode").lower() != "full":
                continue
            time = _run_time(match)
            found[time.start] = time
            after = _APPOSITION.match(masked, match.end("unit"))
            if after:
                extra = _run_time(after)
                found[extra.start] = extra
    return [found[start] for start in sorted(found)]


def printed_run_time(nb) -> tuple[int, RunTime | None, bool]:
    """(index of the last code cell, the run time it prints or None, whether that is a FAST-mode time).
    The index is -1 when the notebook has no code cell."""
    cells = nb["cells"]
    index = next((i for i in range(len(cells) - 1, -1, -1) if cells[i]["cell_type"] == "code"), -1)
    if index < 0:
        return index, None, False
    matches = [m for text in _output_texts(cells[index]) for m in _PRINTED_RUN_TIME.finditer(text)]
    if not matches:
        return index, None, False
    last = matches[-1]
    fast = bool(re.search(r"FAST\s*=\s*True|FAST mode|\(FAST\)", last.group("rest")))
    return index, _run_time(last), fast


def run_time_findings(nb, name: str = "notebook") -> list[Finding]:
    """The first cell's full-mode run time against the time the last code cell prints (module docstring)."""
    cells = nb["cells"]
    if not cells or cells[0]["cell_type"] != "markdown":
        return []
    source = _source(cells[0])
    stated = stated_full_mode_times(source)
    last, printed, fast = printed_run_time(nb)
    findings = []
    if printed is None or fast:
        what = "prints no run time" if printed is None else f"prints a FAST-mode run time ({printed.text})"
        for time in stated:
            findings.append(Finding(name, 0, time.text,
                                    f"full mode, but the last code cell (cell {last}) {what}"))
        return findings
    if not stated:
        return [Finding(name, 0, "(none)",
                        f"the last code cell (cell {last}) prints a run time of {printed.text}, and the "
                        "first cell states no full-mode run time (\"N s in full mode\")")]
    for time in stated:
        if abs(time.seconds - printed.seconds) > time.tolerance:
            context = _context(source, time.start, time.end)
            findings.append(Finding(name, 0, time.text,
                                    f"{context}  -- the last code cell (cell {last}) prints {printed.text}"))
    return findings


def check_path(path: str | Path) -> list[Finding]:
    """`check_notebook` on a notebook file."""
    import nbformat

    path = Path(path)
    return check_notebook(nbformat.read(path, as_version=4), path.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--summary", action="store_true", help="print only the count per notebook")
    args = parser.parse_args(argv)
    total = 0
    for path in args.notebooks:
        findings = check_path(path)
        total += len(findings)
        if args.summary:
            print(f"{path}: {len(findings)} unsupported number(s)")
        else:
            for finding in findings:
                print(finding)
    if not args.summary:
        print(f"{total} unsupported number(s) in {len(args.notebooks)} notebook(s)", file=sys.stderr)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
