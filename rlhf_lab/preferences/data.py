"""Preference pairs: two completions of one prompt, sampled from the shipped models, labelled by a
panel of simulated annotators (annotators.py), with the hidden gold score of each side (gold.py).

    comparisons = make_comparisons(seed, n)            # prompts + two sampled completions each
    pairs = label_comparisons(comparisons, annotators, seed)   # votes, majority -> chosen / rejected
    pairs = make_preference_data(seed, n)              # both at once
    train = load_preferences("train")                  # the shipped set, data/preferences/

Where the completions come from (`DEFAULT_SOURCES`): the RL starting checkpoint and the converged SFT
checkpoint, at temperatures 1 and 2, and "verbose" variants that may not stop (EOS is forbidden)
before 5-8 characters (`SamplingConfig.min_new_tokens`). Real preference data mixes answers from
several models and sampling settings in the same way; the verbose ones give the pairs the spread of
lengths that a verbosity bias needs to show up in the labels.

The prompts are drawn from the task's TRAINING split (data seed 0), so the held-out test problems
that every accuracy in the lab is measured on stay unseen. Every file is byte-identical for a seed
on one machine (JSON with sorted keys); the labels are pure Python, identical on every machine.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..sampling import SamplingConfig, generate
from ..tasks import get_task
from ..tasks.jsonl import SPLIT_N_TRAIN, read_records
from ..util.validation import Validated, check_choice, check_number, setting
from .annotators import DEFAULT_ANNOTATORS, Annotator
from .gold import gold_reward

PREFERENCE_DIR = Path(os.environ.get("RLHF_LAB_PREFERENCES", Path(__file__).resolve().parents[2] / "data" / "preferences"))
SPLITS = ("train", "validation", "test")
DEFAULT_SIZES = {"train": 2000, "validation": 500, "test": 500}
DEFAULT_SEED = 0
MAX_NEW_TOKENS = 8  # the longest answer is 4 digits; room for verbose completions up to 8 characters
LABEL_SOURCES = ("majority", "gold")  # or an annotator's name


@dataclass(frozen=True)
class CompletionSource(Validated):
    """A way of sampling completions: a shipped checkpoint, a temperature and a minimum length."""

    name: str
    checkpoint: str
    temperature: float = setting(1.0, gt=0, help="sampling temperature")
    min_new_tokens: int = setting(0, ge=0, le=MAX_NEW_TOKENS, help="EOS forbidden before it: verbose")
    weight: float = setting(1.0, gt=0, help="how often this source is drawn, relative to the others")

    def sampling(self, seed: int) -> SamplingConfig:
        return SamplingConfig(do_sample=True, temperature=self.temperature, max_new_tokens=MAX_NEW_TOKENS,
                              min_new_tokens=self.min_new_tokens, seed=seed)


DEFAULT_SOURCES: tuple[CompletionSource, ...] = (
    CompletionSource("rl_start_t1", "addition_rl_start", 1.0, weight=2.0),
    CompletionSource("rl_start_t1.5", "addition_rl_start", 1.5),
    CompletionSource("sft_t1", "addition_sft", 1.0),
    CompletionSource("rl_start_min5", "addition_rl_start", 1.0, min_new_tokens=5),
    CompletionSource("sft_min5", "addition_sft", 1.0, min_new_tokens=5),
)


@dataclass(frozen=True)
class Comparison:
    """Two completions of one prompt, before anyone labelled them."""

    prompt: str
    answer: str
    first: str
    second: str
    first_finished: bool
    second_finished: bool
    first_source: str
    second_source: str


def _check_votes(name: str, votes: dict) -> None:
    for annotator, vote in votes.items():
        if not isinstance(annotator, str) or isinstance(vote, bool) or vote not in (0, 1):
            raise ValueError(f"{name} must map annotator names to 1 (chose `chosen`) or 0, got "
                             f"{annotator!r}: {vote!r}")


@dataclass(frozen=True)
class PreferencePair(Validated):
    """One labelled pair. `chosen` is what the annotators' majority preferred.

    votes: annotator name -> 1 if that annotator preferred `chosen`, 0 if `rejected`.
    gold_chosen, gold_rejected: the hidden gold scores (gold.py) of each side.
    chosen_first: whether `chosen` was the first of the two completions shown to the annotators.
        Agreement statistics need labels in that presentation order (`first_labels`): relative to
        `chosen`, which the majority itself picked, the labels would look skewed and correlated.
    """

    prompt: str = setting()
    answer: str = setting()
    chosen: str = setting()
    rejected: str = setting()
    chosen_finished: bool = setting(True)
    rejected_finished: bool = setting(True)
    chosen_source: str = setting("")
    rejected_source: str = setting("")
    votes: dict = setting(default_factory=dict, check=_check_votes, help="annotator name -> 1 (chosen) or 0")
    gold_chosen: float = setting(0.0)
    gold_rejected: float = setting(0.0)
    chosen_first: bool = setting(True)

    @property
    def gold_label(self) -> int | None:
        """1 if the gold prefers `chosen`, 0 if it prefers `rejected`, None on a gold tie."""
        if self.gold_chosen == self.gold_rejected:
            return None
        return int(self.gold_chosen > self.gold_rejected)

    def label(self, source: str = "majority") -> int | None:
        """Whether `source` prefers `chosen` (1) or `rejected` (0); None where it has no preference.
        source: "majority" (always 1, by construction), "gold", or an annotator's name."""
        if source == "majority":
            return 1
        if source == "gold":
            return self.gold_label
        if source not in self.votes:
            raise ValueError(f"label source must be one of {LABEL_SOURCES + tuple(self.votes)}, got {source!r}")
        return self.votes[source]

    def swapped(self) -> PreferencePair:
        """The same pair with chosen and rejected exchanged (votes inverted)."""
        return PreferencePair(
            prompt=self.prompt, answer=self.answer, chosen=self.rejected, rejected=self.chosen,
            chosen_finished=self.rejected_finished, rejected_finished=self.chosen_finished,
            chosen_source=self.rejected_source, rejected_source=self.chosen_source,
            votes={name: 1 - vote for name, vote in self.votes.items()},
            gold_chosen=self.gold_rejected, gold_rejected=self.gold_chosen, chosen_first=not self.chosen_first)

    def as_comparison(self) -> Comparison:
        """The unlabelled comparison, in the order it was shown (relabel it with `label_comparisons`)."""
        first, second = (self, self.swapped()) if self.chosen_first else (self.swapped(), self)
        return Comparison(self.prompt, self.answer, first.chosen, second.chosen, first.chosen_finished,
                          second.chosen_finished, first.chosen_source, second.chosen_source)

    def to_json(self) -> str:
        record = asdict(self)
        record["votes"] = dict(sorted(self.votes.items()))
        return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @classmethod
    def from_json(cls, line: str) -> PreferencePair:
        """One line of a file `save_preferences` wrote; each field is checked (`read_preferences`
        names the line of a bad one)."""
        record = json.loads(line)
        if not isinstance(record, dict):
            raise TypeError(f"a JSON object was expected, got {type(record).__name__}")
        return cls(**record)


def orient(pairs: Iterable[PreferencePair], source: str = "majority") -> list[PreferencePair]:
    """The pairs with `chosen` set to what `source` ("majority", "gold" or an annotator) prefers;
    pairs where it has no preference (gold ties) are left out."""
    oriented = []
    for pair in pairs:
        label = pair.label(source)
        if label is not None:
            oriented.append(pair if label == 1 else pair.swapped())
    return oriented


def first_labels(pairs: Sequence[PreferencePair]) -> dict[str, list[int]]:
    """Each annotator's labels in presentation order: 1 where it preferred the completion shown
    first. What `cohen_kappa` and `fleiss_kappa` should be given."""
    names = list(pairs[0].votes) if pairs else []
    return {name: [vote if p.chosen_first else 1 - vote for p in pairs for vote in (p.votes[name],)] for name in names}


def _decode(tokenizer, rows: list[list[int]]) -> list[tuple[str, bool]]:
    return [tokenizer.decode_until_eos(row) for row in rows]


def make_comparisons(seed: int = DEFAULT_SEED, n: int = 100, sources: Sequence[CompletionSource] = DEFAULT_SOURCES,
                     task: str = "addition", task_params: dict | None = None) -> list[Comparison]:
    """n comparisons on n distinct training prompts; each side from a source drawn uniformly.

    A pair whose two completions are the same text says nothing about preferences, so it is
    redrawn (a fresh prompt); the result is still a function of the seed alone.
    """
    from ..checkpoints import load_checkpoint

    check_number("seed", seed, low=0, integer=True)
    check_number("n", n, low=1, integer=True)
    if not sources:
        raise ValueError("sources must name at least one CompletionSource")
    task_obj = get_task(task, **(task_params or {"digits": 3}))
    train, _ = task_obj.make_split(0, SPLIT_N_TRAIN, 500)
    rng = random.Random(seed)
    models = {}
    comparisons: list[Comparison] = []
    round_ = 0
    while len(comparisons) < n:
        need = n - len(comparisons)
        examples = rng.sample(train, min(len(train), 2 * need + 8))  # over-draw: identical pairs are dropped
        weights = [source.weight for source in sources]
        sides = [tuple(rng.choices(range(len(sources)), weights, k=2)) for _ in examples]
        texts: dict[tuple[int, int], tuple[str, bool]] = {}
        for s, source in enumerate(sources):
            jobs = [(i, side) for i, pair in enumerate(sides) for side in (0, 1) if pair[side] == s]
            if not jobs:
                continue
            if source.checkpoint not in models:
                models[source.checkpoint] = load_checkpoint(source.checkpoint)[:2]
            model, tokenizer = models[source.checkpoint]
            prompts = [tokenizer.encode(examples[i].prompt, add_bos=True) for i, _ in jobs]
            with torch.no_grad():
                out = generate(model, prompts, source.sampling(seed=seed * 1000 + round_ * 100 + s))
            for job, decoded in zip(jobs, _decode(tokenizer, out.completion_ids.tolist())):
                texts[job] = decoded
        for i, example in enumerate(examples):
            (first, first_finished), (second, second_finished) = texts[(i, 0)], texts[(i, 1)]
            if (first, first_finished) == (second, second_finished):
                continue
            comparisons.append(Comparison(example.prompt, example.answer, first, second, first_finished,
                                          second_finished, sources[sides[i][0]].name, sources[sides[i][1]].name))
            if len(comparisons) == n:
                break
        round_ += 1
    return comparisons


def label_comparisons(comparisons: Sequence[Comparison], annotators: Sequence[Annotator] = DEFAULT_ANNOTATORS,
                      seed: int = DEFAULT_SEED) -> list[PreferencePair]:
    """Every annotator labels every comparison; the majority decides `chosen` (an odd panel never ties)."""
    if not annotators or len(annotators) % 2 == 0:
        raise ValueError(f"annotators must be an odd number (>= 1) of Annotators for a majority, got {len(annotators)}")
    names = [a.name for a in annotators]
    if len(set(names)) != len(names):
        raise ValueError(f"annotator names must be distinct, got {names}")
    votes_first = [a.label(comparisons, seed) for a in annotators]  # (annotators, comparisons)
    pairs = []
    for j, c in enumerate(comparisons):
        votes = {a.name: votes_first[k][j] for k, a in enumerate(annotators)}
        first_wins = 2 * sum(votes.values()) > len(annotators)
        gold_first = gold_reward(c.prompt, c.first, c.answer, c.first_finished)
        gold_second = gold_reward(c.prompt, c.second, c.answer, c.second_finished)
        pair = PreferencePair(c.prompt, c.answer, c.first, c.second, c.first_finished, c.second_finished,
                              c.first_source, c.second_source, votes, gold_first, gold_second, chosen_first=True)
        pairs.append(pair if first_wins else pair.swapped())
    return pairs


def make_preference_data(seed: int = DEFAULT_SEED, n: int = 100, annotators: Sequence[Annotator] = DEFAULT_ANNOTATORS,
                         sources: Sequence[CompletionSource] = DEFAULT_SOURCES) -> list[PreferencePair]:
    """n labelled pairs, deterministic from `seed`: `make_comparisons` then `label_comparisons`."""
    return label_comparisons(make_comparisons(seed, n, sources), annotators, seed)


def save_preferences(path: str | os.PathLike, pairs: Iterable[PreferencePair]) -> Path:
    """One JSON object per line, sorted keys, compact separators, '\\n' line ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for pair in pairs:
            f.write(pair.to_json() + "\n")
    return path


def read_preferences(path: str | os.PathLike) -> list[PreferencePair]:
    """Read a file written by `save_preferences`; a malformed line raises ValueError naming it."""
    return read_records(path, PreferencePair.from_json, "a preference pair")


def load_preferences(split: str = "train", folder: str | os.PathLike = PREFERENCE_DIR) -> list[PreferencePair]:
    """The shipped pairs of one split: "train", "validation" or "test" (data/preferences/DATASHEET.md)."""
    check_choice("split", split, SPLITS)
    path = Path(folder) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; regenerate it with "
                                "`python -c 'from rlhf_lab.preferences import write_preference_data; write_preference_data()'`")
    return read_preferences(path)


def write_preference_data(folder: str | os.PathLike = PREFERENCE_DIR, seed: int = DEFAULT_SEED,
                          sizes: dict | None = None, annotators: Sequence[Annotator] = DEFAULT_ANNOTATORS,
                          sources: Sequence[CompletionSource] = DEFAULT_SOURCES) -> dict[str, Path]:
    """Generate the splits from one seed (distinct prompts throughout) and write them, with a
    manifest.json, into `folder`. Returns {split: path}."""
    sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
    for split in sizes:
        check_choice("sizes key", split, SPLITS)
        check_number(f"sizes[{split!r}]", sizes[split], low=1, integer=True)
    pairs = make_preference_data(seed, sum(sizes.values()), annotators, sources)
    folder = Path(folder)
    paths, start = {}, 0
    for split in SPLITS:
        if split in sizes:
            paths[split] = save_preferences(folder / f"{split}.jsonl", pairs[start: start + sizes[split]])
            start += sizes[split]
    manifest = {"seed": seed, "sizes": sizes, "max_new_tokens": MAX_NEW_TOKENS,
                "annotators": [asdict(a) for a in annotators], "sources": [asdict(s) for s in sources]}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    write_datasheet(folder)
    return paths


def agreement_table(pairs: Sequence[PreferencePair]) -> tuple[dict[tuple[str, str], float], float]:
    """({(annotator a, annotator b): Cohen's kappa}, Fleiss' kappa of the whole panel) on `pairs`."""
    from .agreement import cohen_kappa, fleiss_kappa, rating_counts

    labels = first_labels(pairs)
    names = list(labels)
    pairwise = {(a, b): cohen_kappa(labels[a], labels[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    return pairwise, fleiss_kappa(rating_counts(list(zip(*labels.values())), categories=(0, 1)))


def gold_agreement(pairs: Sequence[PreferencePair], source: str = "majority") -> float:
    """Fraction of the pairs without a gold tie on which `source` (the majority or an annotator) agrees with the gold."""
    decided = [p for p in pairs if p.gold_label is not None]
    return sum(p.label(source) == p.gold_label for p in decided) / len(decided)


def write_datasheet(folder: str | os.PathLike = PREFERENCE_DIR) -> Path:
    """folder/DATASHEET.md from the files in `folder` and its manifest.json: every number in it is
    computed here, so regenerating the data regenerates the sheet."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    splits = {split: read_preferences(folder / f"{split}.jsonl") for split in SPLITS if (folder / f"{split}.jsonl").is_file()}
    train = splits["train"]
    pairwise, fleiss = agreement_table(train)
    lengths = [len(c) - len(p.answer) for p in train for c in (p.chosen, p.rejected)]
    differ = [p for p in train if len(p.chosen) != len(p.rejected)]
    lines = [
        "# Preference data: datasheet",
        "",
        "Pairs of completions of the same reversed-addition prompt (`047+085=` -> `231`), labelled by five",
        "simulated annotators. Regenerate with",
        "`python -c 'from rlhf_lab.preferences import write_preference_data; write_preference_data()'`",
        "(deterministic from the seed; this sheet is rewritten from the files).",
        "",
        "## How it was made",
        "",
        f"- **Prompts**: distinct problems from the addition task's training split (data seed 0), so the "
        f"held-out test problems stay unseen. Seed {manifest['seed']}.",
        f"- **Completions**: each side of a pair from one of these sources, drawn with the given weights; "
        f"at most {manifest['max_new_tokens']} tokens, so a completion can be cut off (`finished` false). "
        "Pairs whose two sides are the same text are redrawn.",
        "",
        "| source | checkpoint | temperature | EOS forbidden before | weight |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for s in manifest["sources"]:
        lines.append(f"| `{s['name']}` | `{s['checkpoint']}` | {s['temperature']:g} | {s['min_new_tokens']} tokens | {s['weight']:g} |")
    lines += [
        "",
        "- **Gold** (`gold.py`, plays the human as in Gao et al. 2022): 0.5 * exact answer + 0.5 * digit credit,",
        "  where digit credit divides by the longer of answer and completion, so extra characters cost.",
        "- **Annotators** (`annotators.py`): utility = gold + length_bias * characters for a finished completion",
        "  (0 for one cut off before EOS); prefer the higher,",
        "  then flip with the flip rate. Three of five prefer longer answers (verbosity bias, Singhal et al. 2023).",
        "  `chosen` is the majority's pick.",
        "",
        "| annotator | flip rate | length bias (per character) | agrees with gold (train) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for a in manifest["annotators"]:
        lines.append(f"| `{a['name']}` | {a['flip_rate']:.2f} | {a['length_bias']:.2f} | {gold_agreement(train, a['name']):.1%} |")
    lines += [
        f"| majority | | | {gold_agreement(train, 'majority'):.1%} |",
        "",
        "## Sizes",
        "",
        "| split | pairs | gold ties | chosen longer than rejected (of pairs of unequal length) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for split, pairs in splits.items():
        unequal = [p for p in pairs if len(p.chosen) != len(p.rejected)]
        longer = sum(len(p.chosen) > len(p.rejected) for p in unequal) / max(len(unequal), 1)
        lines.append(f"| {split} | {len(pairs)} | {sum(p.gold_label is None for p in pairs)} | {longer:.1%} |")
    lines += [
        "",
        f"Completion length minus answer length (train, both sides): mean {sum(lengths) / len(lengths):.2f} characters; "
        f"{sum(x > 0 for x in lengths) / len(lengths):.1%} of completions are longer than the answer. "
        f"{len(differ)} of {len(train)} training pairs differ in length.",
        "",
        "## Agreement (train split, labels in presentation order)",
        "",
        "| annotator pair | Cohen's kappa |",
        "| --- | ---: |",
    ]
    for (a, b), kappa in pairwise.items():
        lines.append(f"| `{a}` - `{b}` | {kappa:.3f} |")
    lines += [
        "",
        f"Fleiss' kappa of the five: {fleiss:.3f}.",
        "",
        "Fields of each JSON line: `prompt`, `answer`, `chosen`, `rejected`, `chosen_finished`, `rejected_finished`,",
        "`chosen_source`, `rejected_source`, `votes` (annotator -> 1 if it preferred `chosen`), `gold_chosen`,",
        "`gold_rejected`, `chosen_first` (which side was shown first).",
        "",
    ]
    path = folder / "DATASHEET.md"
    path.write_text("\n".join(lines))
    return path
