"""The checker diagnoses what learners actually write: functions written here the way a learner writes
them (not the catalogue's variants) get a one-line diagnosis, in English and in Chinese. Covers the
signature check, the output's type and shape, two mistakes at once, partial matches, the natural
variants of the catalogue, the time limit, and the smallest failing case printed so that it re-runs."""

from __future__ import annotations

import itertools
import re
import signal

import pytest
import torch

from rlhf_lab import exercises
from rlhf_lab.exercises import FixedWidthInt

CJK = re.compile(r"[\u4e00-\u9fff]")


def verdict(name, function, **kwargs):
    """The check in both languages; the English and the Chinese verdict name the same mistakes."""
    result = exercises.check(name, function, **kwargs)
    chinese = exercises.check(name, function, lang="zh", **kwargs)
    assert chinese.mistake_names == result.mistake_names and chinese.passed == result.passed
    assert CJK.search(chinese.text()) and not CJK.search(result.text())
    return result, chinese


def named_in_one_line(result, *names):
    """The line after the FAIL line names every one of `names`."""
    line = result.diagnosis_line
    return all(f"[{name}]" in line for name in names)


# ----------------------------------------------------------------------------------------------
# the examples, as a learner writes them


def group_advantages_population_eps_under_root(rewards, num_generations):
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1, keepdim=True)
    variance = ((grouped - mean) ** 2).mean(dim=1, keepdim=True)  # population variance
    return ((grouped - mean) / torch.sqrt(variance + 1e-8)).view(-1)


def test_population_std_with_eps_inside_the_sqrt_is_named_as_two_mistakes():
    result, chinese = verdict("group_advantages", group_advantages_population_eps_under_root)
    assert result.combination and set(result.mistake_names) == {"population_std", "eps_inside_sqrt"}
    assert named_in_one_line(result, "population_std", "eps_inside_sqrt")
    assert result.diagnosis_line.startswith("Likely two mistakes at once")
    assert chinese.diagnosis_line.startswith("很可能同时犯了两个错误")


def clipped_loss_bnpo_not_detached(logprobs, old_logprobs, advantages, mask, eps_low, eps_high):
    ratio = torch.exp(logprobs - old_logprobs)
    per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantages)
    return (per_token * mask).sum() / mask.sum()


def test_bnpo_aggregation_without_detach_is_named_as_two_mistakes():
    result, _ = verdict("clipped_policy_loss", clipped_loss_bnpo_not_detached)
    assert result.combination and named_in_one_line(result, "token_mean_over_batch", "ratio_not_detached")


def dpo_naive_without_smoothing(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                ref_rejected_logps, chosen_mask, rejected_mask, beta=0.1, label_smoothing=0.0,
                                loss_type="sigmoid"):
    def logp(token_logps, mask):
        total = (token_logps * mask).sum(-1)
        return total / mask.sum(-1) if loss_type == "ipo" else total

    h = (logp(policy_chosen_logps, chosen_mask) - logp(ref_chosen_logps, chosen_mask)) - (
        logp(policy_rejected_logps, rejected_mask) - logp(ref_rejected_logps, rejected_mask))
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return -torch.log(torch.sigmoid(beta * h))


def test_naive_log_sigmoid_with_label_smoothing_ignored_is_named_as_two_mistakes():
    result, _ = verdict("dpo_loss", dpo_naive_without_smoothing)
    assert result.combination and named_in_one_line(result, "naive_log_sigmoid", "label_smoothing_ignored")


def isqrt_leetcode(x):  # LeetCode 69 calls the argument x
    if x < 0:
        raise ValueError("x must be >= 0")
    lo, hi = 1, x
    while lo <= hi:
        mid = lo + (hi - lo) // 2
        if mid <= x // mid:
            lo = mid + 1
        else:
            hi = mid - 1
    return hi


def test_a_renamed_argument_is_checked_by_position_with_a_note():
    result, chinese = verdict("isqrt_binary_search", isqrt_leetcode)
    assert result.passed and "called by position" in str(result) and "x for n" in str(result)
    assert "x 对应 n" in str(chinese)


def isqrt_leetcode_overflowing(x):
    if x < 0:
        raise ValueError("x must be >= 0")
    lo, hi, answer = 0, x, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if mid * mid <= x:
            answer, lo = mid, mid + 1
        else:
            hi = mid - 1
    return answer


def test_a_renamed_argument_still_gets_its_mistake_named():
    result, _ = verdict("isqrt_binary_search", isqrt_leetcode_overflowing)
    assert not result.passed and result.certain and "square_overflow" in result.mistake_names
    assert "called by position" in str(result)
    assert "isqrt_leetcode_overflowing(FixedWidthInt(" in str(result)  # the pasted call is positional too


def dpo_short_names(pc, pr, rc, rr, cm, rm, beta=0.1, label_smoothing=0.0, loss_type="sigmoid"):
    return exercises.reference("dpo_loss")(pc, pr, rc, rr, cm, rm, beta, label_smoothing, loss_type)


def test_dpo_with_short_argument_names_passes_with_a_note():
    result, _ = verdict("dpo_loss", dpo_short_names)
    assert result.passed and "pc for policy_chosen_logps" in str(result)


def test_a_missing_or_unexpected_argument_is_named_in_one_line_before_any_case():
    def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1):
        raise AssertionError("a function that cannot be called with the exercise's arguments is not run")

    result, chinese = verdict("dpo_loss", dpo_loss)
    assert result.cases == 0 and result.diagnosis_line.startswith("Signature:")
    assert "chosen_mask, rejected_mask, label_smoothing, loss_type missing" in result.diagnosis_line
    assert chinese.diagnosis_line.startswith("函数签名：") and "chosen_mask" in chinese.diagnosis_line

    def isqrt_binary_search(n, lo):
        return lo

    result, _ = verdict("isqrt_binary_search", isqrt_binary_search)
    assert result.diagnosis_line == ("Signature: unexpected argument lo: your function takes (n, lo), the "
                                     "exercise passes (n).")


def test_an_optional_argument_left_out_is_called_without_it_and_named():
    def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                 chosen_mask, rejected_mask, beta=0.1, label_smoothing=0.0):
        reference = exercises.reference("dpo_loss")
        return reference(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                         chosen_mask, rejected_mask, beta, label_smoothing)

    result, _ = verdict("dpo_loss", dpo_loss)
    assert result.certain and result.mistake_names == ["loss_type_ignored"]
    pasted = str(result).split("(paste to re-run):")[1]
    assert "no parameter loss_type" in str(result) and "loss_type=" not in pasted  # the paste runs


def dpo_mean_of_pairs(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                      chosen_mask, rejected_mask, beta=0.1, label_smoothing=0.0, loss_type="sigmoid"):
    return dpo_short_names(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                           chosen_mask, rejected_mask, beta, label_smoothing, loss_type).mean()


def test_a_scalar_instead_of_per_pair_losses_is_named_as_such():
    result, chinese = verdict("dpo_loss", dpo_mean_of_pairs)
    assert result.diagnosis_line == ("Output: returns one number (shape ()) where one loss per pair is "
                                     "expected (shape (1,)); it equals their mean: drop the final .mean().")
    assert "每个偏好对各一个损失值" in chinese.diagnosis_line and ".mean()" in chinese.diagnosis_line


def dpo_always_summed(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                      chosen_mask, rejected_mask, beta=0.1, label_smoothing=0.0, loss_type="sigmoid"):
    h = ((policy_chosen_logps - ref_chosen_logps) * chosen_mask).sum(-1) - (
        (policy_rejected_logps - ref_rejected_logps) * rejected_mask).sum(-1)
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    logit = beta * h
    return -(1 - label_smoothing) * torch.nn.functional.logsigmoid(logit) - (
        label_smoothing * torch.nn.functional.logsigmoid(-logit))


def dpo_always_averaged(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                        chosen_mask, rejected_mask, beta=0.1, label_smoothing=0.0, loss_type="sigmoid"):
    chosen = ((policy_chosen_logps - ref_chosen_logps) * chosen_mask).sum(-1) / chosen_mask.sum(-1)
    rejected = ((policy_rejected_logps - ref_rejected_logps) * rejected_mask).sum(-1) / rejected_mask.sum(-1)
    h = chosen - rejected
    if loss_type == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    logit = beta * h
    return -(1 - label_smoothing) * torch.nn.functional.logsigmoid(logit) - (
        label_smoothing * torch.nn.functional.logsigmoid(-logit))


def test_dpo_sum_versus_mean_can_be_made_and_is_named():
    summed, _ = verdict("dpo_loss", dpo_always_summed)
    assert summed.certain and summed.mistake_names == ["ipo_summed"]  # IPO wants TRL's per-token mean
    averaged, _ = verdict("dpo_loss", dpo_always_averaged)
    assert averaged.certain and averaged.mistake_names == ["mean_instead_of_sum"]  # DPO wants the sum


def top_p_first_try(scores, temperature, top_k, top_p):
    scores = scores / temperature
    if top_k > 0:
        kth = torch.topk(scores, top_k).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    sorted_scores, order = torch.sort(scores, descending=True)
    cumulative = torch.softmax(sorted_scores, -1).cumsum(-1)
    remove = cumulative > top_p  # the top token is removed too when it alone has more than p
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


def test_the_natural_top_p_bug_that_empties_the_nucleus_is_named():
    result, _ = verdict("filter_logits", top_p_first_try)
    assert result.certain and result.mistake_names == ["top_p_empties_nucleus"]
    assert "[-inf, -inf, -inf, -inf]" in str(result)  # the case shown is the emptied nucleus


def gae_snippet_batched(rewards, values, mask, gamma, lam):
    """The interview-notes snippet, batched: values padded with a final 0, no dones, `gae + values[:-1]`."""
    batch, seq_len = rewards.shape
    values = torch.cat([values, torch.zeros(batch, 1)], dim=1)
    gae = torch.zeros(batch)
    advantages, returns = [], []
    for step in reversed(range(seq_len)):
        delta = rewards[:, step] + gamma * values[:, step + 1] - values[:, step]
        gae = delta + gamma * lam * gae
        advantages.insert(0, gae)
        returns.insert(0, gae[:, None] + values[:, :-1])
    return torch.stack(advantages, 1), torch.stack(returns, 1)


def gae_snippet_batched_literally(rewards, values, mask, gamma, lam):
    """The same with the snippet's line kept as it is: (batch,) + (batch, seq) does not broadcast."""
    batch, seq_len = rewards.shape
    gae = torch.zeros(batch)
    advantages, returns = [], []
    for step in reversed(range(seq_len)):
        next_value = values[:, step + 1] if step + 1 < seq_len else torch.zeros(batch)
        delta = rewards[:, step] + gamma * next_value - values[:, step]
        gae = delta + gamma * lam * gae
        advantages.insert(0, gae)
        returns.insert(0, gae + values[:, :-1])
    return torch.stack(advantages, 1), torch.stack(returns, 1)


def gae_snippet_with_correct_advantages(rewards, values, mask, gamma, lam):
    advantages, _ = exercises.reference("gae")(rewards, values, mask, gamma, lam)
    returns = [advantages[:, t, None] + values[:, :-1] for t in range(rewards.shape[1])]
    return advantages, torch.stack(returns, 1)


def test_a_batched_version_of_the_gae_snippet_is_named():
    result, _ = verdict("gae", gae_snippet_batched)
    assert result.combination and named_in_one_line(result, "values_vector_snippet", "mask_ignored")
    assert "output 2 (returns): shape" in str(result)
    literal, _ = verdict("gae", gae_snippet_batched_literally)  # raises on `gae + values[:, :-1]`
    assert "values_vector_snippet" in literal.mistake_names and literal.certain, str(literal)
    alone, _ = verdict("gae", gae_snippet_with_correct_advantages)
    assert alone.certain and alone.mistake_names == ["values_vector_snippet"]


def isqrt_squares_and_takes_negatives(n):
    lo, hi, answer = 0, n, 0
    while lo <= hi:
        mid = lo + (hi - lo) // 2
        if mid * mid <= n:
            answer, lo = mid, mid + 1
        else:
            hi = mid - 1
    return answer


def test_isqrt_square_overflow_is_named_when_n_minus_one_also_fails():
    result, _ = verdict("isqrt_binary_search", isqrt_squares_and_takes_negatives)
    assert result.certain and named_in_one_line(result, "square_overflow", "negative_not_rejected")
    cases = {result.case_list[i].name for i in result.failing}
    assert "n=-1" in cases and len(cases) > 1


def isqrt_squares_from_half(n):
    if n < 0:
        raise ValueError("n must be >= 0")
    lo, hi, answer = 1, n // 2, 0  # a slip of its own: the answer is at most n // 2, except for n = 1
    while lo <= hi:
        mid = lo + (hi - lo) // 2
        if mid * mid <= n:
            answer, lo = mid, mid + 1
        else:
            hi = mid - 1
    return answer


def test_a_mistake_that_explains_part_of_the_failures_is_named_with_the_part():
    result, chinese = verdict("isqrt_binary_search", isqrt_squares_from_half)
    assert result.partial and result.mistake_names == ["square_overflow"], str(result)
    explained = len(result.failing) - 1
    assert result.diagnosis_line.startswith(f"Partly explained: [square_overflow] reproduces {explained} of "
                                            f"the {len(result.failing)} failing cases")
    assert "The other 1 failing case(s) ('n=1 (int32)') have another cause" in str(result)
    assert "Smallest failing case 'n=1 (int32)'" in str(result)  # the unexplained one is shown
    assert chinese.diagnosis_line.startswith("部分解释：[square_overflow]")


def kappa_with_chance_one_half(labels_a, labels_b):
    p_o = sum(a == b for a, b in zip(labels_a, labels_b)) / len(labels_a)
    p_e = 0.5
    return (p_o - p_e) / (1 - p_e)


def test_kappa_with_chance_agreement_fixed_at_one_half_is_named():
    result, _ = verdict("cohen_kappa", kappa_with_chance_one_half)
    assert result.certain and result.mistake_names == ["chance_fixed_half"]


def test_kappa_hints_no_longer_invite_p_e_one_half():
    for hint in exercises.get("cohen_kappa").hints + exercises.get("cohen_kappa").hints_zh:
        assert "2 p_o - 1" not in hint and "p_e = 0.5" not in hint and "2 p_o − 1" not in hint


# ----------------------------------------------------------------------------------------------
# the checker's machinery


def test_every_pair_of_mistakes_that_can_be_told_apart_is_named():
    checked = 0
    for exercise in exercises.EXERCISES.values():
        if exercise.combine is None:
            continue
        for a, b in itertools.combinations(exercise.mistakes, 2):
            forms = exercise.combine(frozenset((a.name, b.name)))
            if not forms:
                continue  # two answers to one question (e.g. two epsilons): not makeable together
            result = exercise.check(forms[0])
            checked += 1
            if result.diagnosis.kind == "certain":  # one mistake hides the other on every case
                continue
            named = {a.name, b.name} <= set(result.mistake_names)
            assert result.combination and named, (exercise.name, str(result))
    assert checked >= 80


def test_the_smallest_failing_case_is_printed_in_full_and_re_runs():
    learners = (("dpo_loss", dpo_mean_of_pairs), ("clipped_policy_loss", clipped_loss_bnpo_not_detached),
                ("isqrt_binary_search", isqrt_squares_and_takes_negatives))
    for name, function in learners:
        result = exercises.check(name, function)
        text = str(result)
        assert "..." not in text and "…" not in text
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("Smallest failing case")) + 1
        end = next(i for i, line in enumerate(lines) if line.startswith(("  expected", "  output")))
        pasted = [line[4:] for line in lines[start:end]]
        namespace = {"torch": torch, function.__name__: function}
        exec("\n".join(line for line in pasted if line.startswith("from ")), namespace)
        rebuilt = eval("\n".join(line for line in pasted if not line.startswith("from ")), namespace)
        case = result.case_list[result.smallest]
        assert exercises.values_agree(rebuilt, function(**case.kwargs)), (name, rebuilt)


def test_pasted_values_rebuild_the_inputs_exactly():
    from rlhf_lab.exercises.core import paste_text

    values = [torch.tensor([[0.1, -2.5e-12, 3.0]]), torch.tensor([1, 2], dtype=torch.int32),
              torch.tensor([0.1], dtype=torch.float64), torch.tensor([float("-inf"), float("nan")]),
              FixedWidthInt(2**31 - 1, 32), 0.30000000000000004, [1, 0, 2]]
    for value in values:
        rebuilt = eval(paste_text(value), {"torch": torch, "FixedWidthInt": FixedWidthInt})
        if isinstance(value, torch.Tensor):
            assert rebuilt.dtype == value.dtype and torch.equal(rebuilt.isnan(), value.isnan())
            assert torch.equal(rebuilt[~value.isnan()], value[~value.isnan()])
        else:
            assert rebuilt == value and type(rebuilt) is type(value)


def test_a_loop_that_never_ends_is_stopped_with_a_message_that_fits_the_exercise():
    def group_advantages(rewards, num_generations):
        while True:
            pass

    result, chinese = verdict("group_advantages", group_advantages, time_limit=0.2)
    assert "Stopped: a case ran longer than 0.2 s" in str(result) and "loop that never ends" in str(result)
    assert "已中止" in str(chinese)

    def isqrt_binary_search(n):  # lo = mid never moves; int() escapes the operation budget
        n, lo, hi = int(n), 0, int(n)
        if n < 0:
            raise ValueError("n must be >= 0")
        while lo < hi:
            mid = (lo + hi) // 2
            if mid * mid <= n:
                lo = mid
            else:
                hi = mid - 1
        return lo

    result, _ = verdict("isqrt_binary_search", isqrt_binary_search, time_limit=0.2)
    assert result.certain and "no_progress" in result.mistake_names  # running out of time = of operations


def test_the_runaway_message_speaks_of_the_method_the_exercise_asks_for():
    def isqrt_newton(n):  # steps down one at a time from n: right, but linear, not Newton
        if n < 0:
            raise ValueError("n must be >= 0")
        x = n
        while x > n // x if x else False:
            x = x - 1
        return x

    result, _ = verdict("isqrt_newton", isqrt_newton)
    stopped = next(line for line in str(result).splitlines() if line.startswith("Stopped"))
    assert "x <= n // x" in stopped and "lo" not in stopped and "binary" not in stopped
    binary = exercises.get("isqrt_binary_search").runaway
    assert "lo = mid + 1" in binary
    with pytest.raises(Exception) as raised:  # the operation budget itself names no method
        counter = FixedWidthInt(5, 32, budget=[0])
        counter + 1
    assert "binary" not in str(raised.value) and "lo = mid" not in str(raised.value)


def test_the_time_limit_leaves_the_alarm_as_it_found_it():
    from rlhf_lab.exercises.core import CaseTimeout, time_limit

    before = signal.getsignal(signal.SIGALRM)
    exercises.check("group_advantages", exercises.reference("group_advantages"), time_limit=0.5)
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with pytest.raises(CaseTimeout):
        with time_limit(0.05):
            while True:
                pass
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_output_type_and_shape_are_checked_before_values():
    def kl_estimators(logprobs, ref_logprobs):
        x = ref_logprobs - logprobs
        return -x, x**2 / 2  # k3 forgotten

    result, _ = verdict("kl_estimators", kl_estimators)
    assert "Output: returns 2 values; the exercise expects 3 (k1, k2, k3)." in str(result)

    def clipped_value_loss(values, old_values, returns, mask, clip_range_value):
        reference = exercises.reference("clipped_value_loss")
        return reference(values, old_values, returns, mask, clip_range_value)[0].item()

    result, _ = verdict("clipped_value_loss", clipped_value_loss)
    assert "returns a Python number where a tensor of shape () is expected" in str(result)


# ----------------------------------------------------------------------------------------------
# both languages


# token, logit and "KV cache" stay in English: that is how Chinese interviews say them (the drill and the
# notebooks' boxes do the same); every other word here has an accepted Chinese name.
FORBIDDEN_IN_CHINESE = re.compile(
    r"\b(padding|padded|mask(ed|s)?|batch(es)?|loss(es)?|rewards?|advantages?|gradients?|"
    r"clip(ped|ping)?|reference|policy|baseline|samples?|overflows?|ratios?|returns?|critic|entropy|"
    r"temperature|penalty|(?<!KV )cache|attention|query|queries|annotators?|chance|smoothing|margin|"
    r"underflows?|sequence|completion|prompt|whiten(ing)?|estimator|the|and|of|is|not)\b", re.IGNORECASE)


def english_words_outside_code(text: str) -> list[str]:
    """English words with an accepted Chinese name, outside `code` spans (code and formulas stay)."""
    return [m.group(0) for m in FORBIDDEN_IN_CHINESE.finditer(re.sub(r"`[^`]*`", "", text))]


MISTAKES = [(e, m) for e in exercises.EXERCISES.values() for m in e.mistakes]


@pytest.mark.parametrize("exercise,mistake", MISTAKES, ids=lambda x: getattr(x, "name", None))
def test_every_catalogued_mistake_has_both_languages(exercise, mistake):
    assert mistake.message and not CJK.search(mistake.message)
    assert CJK.search(mistake.zh), (exercise.name, mistake.name)
    assert english_words_outside_code(mistake.zh) == [], (exercise.name, mistake.name)
    assert mistake.text("zh") == mistake.zh and mistake.text("en") == mistake.message


@pytest.mark.parametrize("exercise", list(exercises.EXERCISES.values()), ids=lambda e: e.name)
def test_every_exercise_has_its_title_question_and_hints_in_both_languages(exercise):
    texts = [exercise.title_zh, exercise.question_zh, exercise.explanation_zh, *exercise.hints_zh]
    assert all(CJK.search(text) for text in texts)
    assert len(exercise.hints_zh) == len(exercise.hints) and exercise.question and exercise.explanation
    for text in texts + [exercise.runaway_zh, exercise.output_unit_zh]:
        assert english_words_outside_code(text) == [], (exercise.name, text)
    for case in exercise.make_cases(0):  # the verdict shows a case by its name: in Chinese too
        assert case.name_zh and english_words_outside_code(case.name_zh) == [], case.name


def test_the_language_switch_applies_to_verdicts_hints_and_tables():
    wrong = exercises.mistakes("whiten")[0].variant
    try:
        exercises.set_language("zh")
        assert exercises.get_language() == "zh"
        assert str(exercises.check("whiten", wrong)).startswith("未通过 whiten（优势白化）")
        assert exercises.hint("whiten", 1).startswith("提示 1/")
        assert exercises.list_exercises()["title"].str.contains(CJK).all()
        assert str(exercises.check("whiten", wrong, lang="en")).startswith("FAIL")  # lang= wins
    finally:
        exercises.set_language("en")
    assert str(exercises.check("whiten", wrong)).startswith("FAIL")
    with pytest.raises(ValueError, match="lang must be one of"):
        exercises.set_language("fr")


# ----------------------------------------------------------------------------------------------
# other practice tools


def test_a_blind_round_shows_only_the_questions(capsys):
    names = ("clipped_policy_loss", "dpo_loss", "gae")
    exercises.interview_round(names=names, use_widgets=False, blind=True)
    shown = capsys.readouterr().out
    for name in names:
        exercise = exercises.get(name)
        assert exercise.question in shown and exercise.def_line in shown
        docstring = exercise.signature[len(exercise.def_line):]
        formula_lines = [line.strip() for line in docstring.splitlines() if "=" in line]
        assert formula_lines and not any(line in shown for line in formula_lines), name
    assert "Returns: (advantages, returns)" in shown and "Returns: one loss per pair" in shown
    exercises.interview_round(names=names, use_widgets=False, blind=True, lang="zh")
    shown = capsys.readouterr().out
    assert all(exercises.get(name).question_zh in shown for name in names) and "盲答" in shown
    exercises.interview_round(names=names, use_widgets=False)
    shown = capsys.readouterr().out
    assert all(exercises.get(name).signature in shown for name in names)  # not blind: the whole stub
