"""Rule-based reward functions for the tasks: pure functions of strings, no model involved.

Contract (every reward function in this module, and every function `combine` returns):

    reward(prompt: str, completion: str, reference: str, finished: bool = True) -> float

- `prompt` is the task prompt, e.g. `'47+85='` (used by the `steps` reward only).
- `completion` is the decoded text the model generated AFTER the prompt, with the EOS token and
  everything after it (padding) removed. It never contains the EOS marker itself.
- `reference` is the reference ANSWER (`Example.answer`, e.g. `'231'`), not the full target
  completion: the scratchpad is not compared character by character.
- `finished` is True iff the model emitted EOS, i.e. it ended its answer itself rather than being
  cut off at the generation limit. An unfinished completion is not an answer yet: EVERY reward is
  0.0 when `finished` is False, whatever the text.
- A keyword-only `answer_format` ("plain", "reasoning_first", "answer_first", or "auto", the
  default) says where the answer sits in the completion; `Task.reward_fn` binds the task's format.
  "auto" takes the text after the last '>' if there is one, else the text before the first '<'
  (the whole text when there is no '<'). See `formats.py` for the formats themselves.

Rewards are always in [0, 1] for a single function, and never raise on a model's output: an
empty string, garbage, characters outside the digits, a missing answer or a missing EOS all get
a defined value (0.0 unless stated). A reference that is not a string of digits is a caller bug
and raises ValueError.

    correct  1.0 iff the extracted answer equals the reference exactly (the accuracy metric).
    partial  fraction of digit positions that match: sum_i [pred_i == ref_i] / max(|pred|, |ref|).
             Dividing by the longer length means extra digits cost credit (no padding hack).
             For reversed addition, position i is the 10^i digit; for sort, the i-th smallest.
    format   1.0 iff the whole completion has the exact shape of the format (and EOS came).
    steps    a process reward for the scratchpad formats: fraction of the carry steps of an
             addition prompt that are written correctly, in place (0.0 for other prompts).

`combine({"correct": 1.0, "format": 0.1})` returns a weighted sum of named rewards, and
`score_batch` applies any reward function to a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from rlhf_lab.tasks.formats import (
    AUTO,
    STEP_END,
    carry_steps,
    check_answer_format,
    extract_answer,
    is_digits,
    is_well_formed,
    parse_addition_prompt,
    split_completion,
)
from rlhf_lab.util.validation import check_choice, check_number

RewardFn = Callable[..., float]  # (prompt, completion, reference, finished=True) -> float


def check_reward_fn(reward_fn, field: str = "reward_fn") -> None:
    """Raise ValueError naming `field` unless `reward_fn` can be called as a reward: a callable
    (prompt, completion, answer, finished) -> float, or an object whose `score_batch(prompts,
    completions, answers, finished)` scores a batch. Checked when a trainer is built, not at its
    first step."""
    import inspect

    function = getattr(reward_fn, "score_batch", reward_fn)
    contract = (f"{field} must be a callable (prompt, completion, answer, finished) -> float, or an object "
                "with score_batch(prompts, completions, answers, finished)")
    if not callable(function):
        raise ValueError(f"{contract}, got {reward_fn!r}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind("prompt", "completion", "answer", True)
    except TypeError:
        name = getattr(function, "__qualname__", type(function).__name__)
        raise ValueError(f"{contract}; {name}{signature} cannot take those four arguments") from None


def _check_inputs(completion: str, reference: str) -> None:
    # A non-string completion (e.g. token ids) is a bug in the caller, not a model mistake.
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a decoded str, got {type(completion).__name__}")
    if not isinstance(reference, str) or not is_digits(reference):
        raise ValueError(f"reference must be a non-empty string of digits (the answer), got {reference!r}")


def correctness_reward(
    prompt: str, completion: str, reference: str, finished: bool = True, *, answer_format: str = AUTO
) -> float:
    """1.0 iff the model finished and its extracted answer equals `reference` exactly, else 0.0."""
    _check_inputs(completion, reference)
    check_answer_format(answer_format, allow_auto=True)
    if not finished:
        return 0.0
    return 1.0 if extract_answer(completion, answer_format) == reference else 0.0


def partial_credit_reward(
    prompt: str, completion: str, reference: str, finished: bool = True, *, answer_format: str = AUTO
) -> float:
    """Fraction of answer positions that are right: sum_i [pred_i == ref_i] / max(|pred|, |ref|).

    '231' vs reference '231' -> 1.0; '201' -> 2/3; '2310' -> 3/4 (the extra digit counts as wrong);
    no extractable answer -> 0.0.
    """
    _check_inputs(completion, reference)
    check_answer_format(answer_format, allow_auto=True)
    if not finished:
        return 0.0
    predicted = extract_answer(completion, answer_format)
    if predicted is None:
        return 0.0
    matches = sum(p == r for p, r in zip(predicted, reference))
    return matches / max(len(predicted), len(reference))


def format_reward(
    prompt: str, completion: str, reference: str, finished: bool = True, *, answer_format: str = AUTO
) -> float:
    """1.0 iff the model emitted EOS right after a completion of exactly the format's shape.

    Shapes: plain `231`; reasoning_first `7+5=12;4+8+1=13;>231`; answer_first `231<7+5=12;4+8+1=13;`.
    Whether the answer or the arithmetic is right does not matter here.
    """
    _check_inputs(completion, reference)
    check_answer_format(answer_format, allow_auto=True)
    return 1.0 if finished and is_well_formed(completion, answer_format) else 0.0


def steps_reward(
    prompt: str, completion: str, reference: str, finished: bool = True, *, answer_format: str = AUTO
) -> float:
    """Process reward: fraction of the scratchpad's carry steps that are right, compared in place.

    For `47+85=` the expected steps are ['7+5=12;', '4+8+1=13;']; the score is
    (number of positions where the written step equals the expected one) / max(#written, #expected),
    so missing and extra steps both cost credit. 0.0 for a prompt that is not an addition, and for a
    completion with no scratchpad (the plain format).
    """
    _check_inputs(completion, reference)
    check_answer_format(answer_format, allow_auto=True)
    operands = parse_addition_prompt(prompt) if isinstance(prompt, str) else None
    if not finished or operands is None:
        return 0.0
    expected = carry_steps(*operands, width=len(prompt.split("+")[0]))  # one step per padded column
    _, scratchpad = split_completion(completion, answer_format)
    pieces = scratchpad.split(STEP_END)
    written = [piece + STEP_END for piece in pieces[:-1]]
    if pieces[-1]:  # text after the last ';' is an unterminated (so wrong) extra step
        written.append(pieces[-1])
    matches = sum(w == e for w, e in zip(written, expected))
    return matches / max(len(written), len(expected))


REWARDS: dict[str, RewardFn] = {
    "correct": correctness_reward,
    "partial": partial_credit_reward,
    "format": format_reward,
    "steps": steps_reward,
}


def get_reward(name: str, answer_format: str = AUTO) -> RewardFn:
    """The named reward with `answer_format` bound: get_reward('correct', 'answer_first')."""
    check_choice("reward name", name, tuple(REWARDS))
    check_answer_format(answer_format, allow_auto=True)
    return partial(REWARDS[name], answer_format=answer_format)


class WeightedReward:
    """A weighted sum of named rewards: r = sum_k w_k * r_k(prompt, completion, reference, finished).

    Call it like any reward function; `breakdown` returns the unweighted parts, to log
    the mean of each reward separately (as TRL does per reward function).

    `rewards`: the named reward functions to draw from (default: this module's REWARDS, which take
    `answer_format`); a task with its own rules (the think/answer tasks) passes its own mapping of
    plain `(prompt, completion, reference, finished)` functions, and `answer_format` is then a label.
    A part may also be an object with `score_batch(prompts, completions, references, finished)`,
    such as a learned reward model: it is scored in one batch (one forward pass), not per completion.
    That is how an RLHF reward is designed from parts (a preference score plus rules):

        WeightedReward({"preference": 1.0, "length": -0.1}, rewards={"preference": reward_model,
                                                                       "length": length_rule})
    """

    def __init__(self, weights: Mapping[str, float], answer_format: str = AUTO,
                 rewards: Mapping[str, RewardFn] | None = None):
        if not weights:
            raise ValueError("weights must name at least one reward, got an empty mapping")
        self.rewards = dict(REWARDS if rewards is None else rewards)
        for name, weight in weights.items():
            check_choice("weights key", name, tuple(self.rewards))
            check_number(f"weights[{name!r}]", weight)  # any finite number: a negative weight is a penalty
        if rewards is None:
            check_answer_format(answer_format, allow_auto=True)
            self.rewards = {name: partial(fn, answer_format=answer_format) for name, fn in self.rewards.items()}
        self.weights = {name: float(weight) for name, weight in weights.items()}
        self.answer_format = answer_format

    def breakdown(
        self, prompt: str, completion: str, reference: str, finished: bool = True
    ) -> dict[str, float]:
        """Each component's unweighted value, keyed by reward name."""
        parts = self.breakdown_batch([prompt], [completion], [reference], [finished])
        return {name: values[0] for name, values in parts.items()}

    def breakdown_batch(self, prompts: Sequence[str], completions: Sequence[str], references: Sequence[str],
                        finished: Sequence[bool] | None = None) -> dict[str, list[float]]:
        """Each component's unweighted values over a batch, keyed by reward name: one `score_batch`
        call per named reward (a reward model among them scores the whole batch at once)."""
        return {name: score_batch(self.rewards[name], prompts, completions, references, finished)
                for name in self.weights}

    def __call__(self, prompt: str, completion: str, reference: str, finished: bool = True) -> float:
        return self.score_batch([prompt], [completion], [reference], [finished])[0]

    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], references: Sequence[str],
                    finished: Sequence[bool] | None = None) -> list[float]:
        """[self(p, c, r, f) for each completion], the same values: one pass per named reward over the
        batch, no per-completion dict (the trainer scores every rollout through this)."""
        parts = self.breakdown_batch(prompts, completions, references, finished)
        return [sum(self.weights[name] * values[i] for name, values in parts.items()) for i in range(len(completions))]

    def __repr__(self) -> str:
        return f"WeightedReward({self.weights}, answer_format={self.answer_format!r})"


def combine(weights: Mapping[str, float], answer_format: str = AUTO) -> WeightedReward:
    """combine({'correct': 1.0, 'format': 0.1}) -> reward function returning 1.0*correct + 0.1*format."""
    return WeightedReward(weights, answer_format)


def score_batch(
    reward_fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    references: Sequence[str],
    finished: Sequence[bool] | None = None,
) -> list[float]:
    """[reward_fn(p, c, r, f) for each example]; `finished=None` means every completion ended with EOS.
    A reward with its own `score_batch` method (a reward model, a `WeightedReward`) is called once
    with the whole batch.

    `finished` may be any sequence of truthy values, e.g. a (batch,) bool tensor's `.tolist()`.
    """
    if finished is None:
        finished = [True] * len(prompts)
    lengths = {"prompts": len(prompts), "completions": len(completions), "references": len(references)}
    lengths["finished"] = len(finished)
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"prompts, completions, references and finished must have equal lengths, got {lengths}"
        )
    if hasattr(reward_fn, "score_batch"):
        values = reward_fn.score_batch(list(prompts), list(completions), list(references), [bool(f) for f in finished])
        return [float(v) for v in values]
    return [
        float(reward_fn(p, c, r, bool(f))) for p, c, r, f in zip(prompts, completions, references, finished)
    ]
