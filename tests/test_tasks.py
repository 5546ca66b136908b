"""Task generators: disjoint splits, determinism, correct answers, allowed characters, validation."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from rlhf_lab.tasks import (
    DEFAULT_DATASETS,
    TASK_CHARS,
    TASKS,
    AdditionTask,
    Example,
    SortTask,
    get_task,
    load_jsonl,
    write_datasets,
    write_jsonl,
)
from rlhf_lab.text.tokenizer import CHARS

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "tasks"
SMALL = {"n_train": 60, "n_test": 20, "n_ood": 10}  # keeps the file tests fast


def check_addition(example: Example, answer_format: str) -> None:
    """Recompute an addition example from scratch, without the package's helpers."""
    a_text, b_text = re.fullmatch(r"(\d+)\+(\d+)=", example.prompt).groups()
    assert len(a_text) == len(b_text), "operands are zero-padded to the same width"
    total = int(a_text) + int(b_text)
    assert example.answer == str(total)[::-1], f"{example.prompt} should give the reversed sum of {total}"
    if answer_format == "plain":
        assert example.completion == example.answer
        return
    if answer_format == "reasoning_first":
        scratchpad, answer = example.completion.split(">")
    else:
        answer, scratchpad = example.completion.split("<")
    assert answer == example.answer
    # Replay the column addition: step i adds the i-th digits (ones first) plus the carry.
    steps = scratchpad.split(";")
    assert steps[-1] == "", "the scratchpad ends with ';'"
    steps = steps[:-1]
    a_rev, b_rev = a_text[::-1], b_text[::-1]
    assert len(steps) == max(len(a_rev), len(b_rev))
    carry, digits = 0, ""
    for i, step in enumerate(steps):
        lhs, rhs = step.split("=")
        terms = [int(t) for t in lhs.split("+")]
        expected_a = int(a_rev[i]) if i < len(a_rev) else 0
        expected_b = int(b_rev[i]) if i < len(b_rev) else 0
        assert terms == [expected_a, expected_b] + ([1] if carry else []), f"step {i} of {example}"
        assert int(rhs) == sum(terms)
        digits += str(int(rhs) % 10)
        carry = int(rhs) // 10
    written = digits + ("1" if carry else "")
    # padded columns can add trailing zeros (012+030 -> digits '240'); the answer is the sum's digits: '24'
    assert (written.rstrip("0") or "0") == example.answer


def check_sort(example: Example) -> None:
    digits = re.fullmatch(r"sort:(\d+)=", example.prompt).group(1)
    assert example.answer == "".join(sorted(digits))
    assert Counter(example.answer) == Counter(digits)
    assert list(example.answer) == sorted(example.answer)
    assert example.completion == example.answer


def check_example(task, example: Example) -> None:
    if isinstance(task, SortTask):
        check_sort(example)
    else:
        check_addition(example, task.answer_format)


@pytest.mark.parametrize("name", list(TASKS))
def test_splits_are_disjoint_deduplicated_and_sized(name):
    task = get_task(name)
    train, test = task.make_split(seed=3, n_train=500, n_test=200)
    assert len(train) == 500 and len(test) == 200
    train_prompts, test_prompts = {e.prompt for e in train}, {e.prompt for e in test}
    assert len(train_prompts) == 500 and len(test_prompts) == 200, "duplicate prompts inside a split"
    assert not train_prompts & test_prompts, "train and test share prompts"
    ood = task.make_ood_test(seed=3, n_test=200)
    assert len({e.prompt for e in ood}) == 200
    assert not {e.prompt for e in ood} & (train_prompts | test_prompts)


CHAR_TASKS = [name for name in TASKS if get_task(name).chars is not None]  # the character tokenizer's tasks


@pytest.mark.parametrize("name", CHAR_TASKS)
def test_answers_are_correct_and_match_the_task_format(name):
    task = get_task(name)
    train, test = task.make_split(seed=1, n_train=300, n_test=100)
    for example in train + test + task.make_ood_test(seed=1, n_test=100):
        check_example(task, example)
        assert task.extract_answer(example.completion) == example.answer
        assert task.reward(example.prompt, example.completion, example.answer) == 1.0
        assert task.score(example.prompt, example.completion, example.answer) == 1.0


def test_small_space_is_sampled_without_replacement():
    task = AdditionTask(digits=1)  # 10 * 10 = 100 possible prompts
    train, test = task.make_split(seed=0, n_train=90, n_test=10)
    prompts = {e.prompt for e in train + test}
    assert prompts == {f"{a}+{b}=" for a in range(10) for b in range(10)}
    with pytest.raises(ValueError, match="n_train"):
        task.make_split(seed=0, n_train=95, n_test=6)
    sort_prompts = {e.prompt for e in SortTask(length=1).make_split(seed=0, n_train=7, n_test=3)[0]}
    assert len(sort_prompts) == 7


def test_operands_vary_in_length_and_ood_is_strictly_longer():
    task = AdditionTask(digits=3)
    train, _ = task.make_split(seed=0, n_train=2000, n_test=0)
    lengths = Counter(len(e.prompt.split("+")[0]) for e in train)
    assert set(lengths) == {3}  # zero-padded to the task's width
    values = [int(e.prompt.split("+")[0]) for e in train]
    assert 0.05 < sum(v < 100 for v in values) / 2000 < 0.15  # uniform in [0, 1000): ~10% below 100
    for example in task.make_ood_test(seed=0, n_test=200):
        a, b = example.prompt[:-1].split("+")
        assert len(a) == len(b) == 4
    for example in task.make_ood_test(seed=0, n_test=50, extra=2):
        assert all(len(operand) == 5 for operand in example.prompt[:-1].split("+"))
    for example in SortTask(length=5).make_ood_test(seed=0, n_test=50):
        assert len(example.answer) == 6


def test_addition_formats_share_problems_and_differ_only_in_completion():
    names = ("addition", "addition_cot", "addition_answer_first")
    splits = {name: get_task(name, digits=2).make_split(seed=5, n_train=50, n_test=20) for name in names}
    plain_train, plain_test = splits["addition"]
    for name in ("addition_cot", "addition_answer_first"):
        train, test = splits[name]
        assert [e.prompt for e in train] == [e.prompt for e in plain_train]
        assert [e.answer for e in test] == [e.answer for e in plain_test]
    cot = get_task("addition_cot").make_example(47, 85)
    first = get_task("addition_answer_first").make_example(47, 85)
    assert cot == Example("047+085=", "231", "7+5=12;4+8+1=13;0+0+1=1;>231")
    assert first == Example("047+085=", "231", "231<7+5=12;4+8+1=13;0+0+1=1;")
    assert sorted(cot.completion.replace(">", "<")) == sorted(first.completion), "same information"
    assert get_task("addition").make_example(47, 85) == Example("047+085=", "231", "231")
    assert get_task("addition", digits=2).make_example(47, 85) == Example("47+85=", "231", "231")
    assert get_task("sort").make_example("31940") == Example("sort:31940=", "01349", "01349")


def test_same_seed_same_split_different_seed_different_split():
    task = get_task("sort")
    assert task.make_split(7, 100, 50) == task.make_split(7, 100, 50)
    assert task.make_split(7, 100, 50) != task.make_split(8, 100, 50)
    assert task.make_ood_test(7, 30) == task.make_ood_test(7, 30)
    assert task.make_ood_test(7, 30) != task.make_ood_test(8, 30)


def test_only_allowed_characters_are_used():
    assert set(TASK_CHARS) <= set(CHARS), "every task character must be in the tokenizer's vocabulary"
    for name in CHAR_TASKS:
        task = get_task(name)
        train, test = task.make_split(seed=0, n_train=200, n_test=50)
        for example in train + test + task.make_ood_test(seed=0, n_test=50):
            for text in (example.prompt, example.answer, example.completion):
                assert set(text) <= set(TASK_CHARS), f"{name}: {text!r}"


def test_write_datasets_is_byte_deterministic(tmp_path):
    first = write_datasets(tmp_path / "a", seed=0, **SMALL)
    second = write_datasets(tmp_path / "b", seed=0, **SMALL)
    other = write_datasets(tmp_path / "c", seed=1, **SMALL)
    expected = {f"{name}_{split}.jsonl" for name, _ in DEFAULT_DATASETS for split in ("train", "test", "ood")}
    assert set(first) == expected | {"manifest.json"}
    for file_name in expected:
        assert first[file_name].read_bytes() == second[file_name].read_bytes(), file_name
        assert first[file_name].read_bytes() != other[file_name].read_bytes(), file_name
    assert first["manifest.json"].read_bytes() == second["manifest.json"].read_bytes()
    train = load_jsonl(first["addition_cot_train.jsonl"])
    assert len(train) == SMALL["n_train"] and all(isinstance(e, Example) for e in train)
    assert train == get_task("addition_cot", digits=3).make_split(0, SMALL["n_train"], SMALL["n_test"])[0]
    line = first["addition_train.jsonl"].read_text().splitlines()[0]
    assert re.fullmatch(r'\{"answer":"\d+","completion":"\d+","prompt":"\d+\+\d+="\}', line), line


def test_shipped_data_files_are_what_the_generator_writes(tmp_path):
    # The files in data/tasks were written by write_datasets(seed=0) with default sizes; if this fails,
    # the generator changed (or Python's random did): regenerate with `python -m rlhf_lab.tasks`.
    fresh = write_datasets(tmp_path, seed=0)
    total = 0
    for file_name, path in fresh.items():
        shipped = DATA_DIR / file_name
        assert shipped.read_bytes() == path.read_bytes(), f"{shipped} is stale"
        total += shipped.stat().st_size
    assert total < 2_000_000
    assert len(load_jsonl(DATA_DIR / "addition_train.jsonl")) >= 2000


def test_load_jsonl_roundtrip_and_malformed_line(tmp_path):
    examples = [Example("1+2=", "3", "3"), Example("sort:21=", "12", "12")]
    path = write_jsonl(tmp_path / "x.jsonl", examples)
    assert load_jsonl(path) == examples
    path.write_text('{"prompt":"1+2=","answer":"3","completion":"3"}\n{"prompt":"1+2="}\n')
    with pytest.raises(ValueError, match=r"x\.jsonl:2"):
        load_jsonl(path)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: AdditionTask(digits=0), "digits"),
        (lambda: AdditionTask(digits=-2), "digits"),
        (lambda: AdditionTask(digits=2.5), "digits"),
        (lambda: AdditionTask(digits=True), "digits"),
        (lambda: AdditionTask(digits=99), "digits"),
        (lambda: AdditionTask(answer_format="xml"), "answer_format"),
        (lambda: SortTask(length=0), "length"),
        (lambda: SortTask(length="4"), "length"),
        (lambda: get_task("multiplication"), "name"),
        (lambda: get_task("sort", digits=3), "digits"),
        (lambda: get_task("addition_cot", answer_format="plain"), "answer_format"),
        (lambda: get_task("addition", digits=0), "digits"),
        (lambda: AdditionTask().make_split(seed=-1, n_train=1, n_test=1), "seed"),
        (lambda: AdditionTask().make_split(seed=0, n_train=-1, n_test=1), "n_train"),
        (lambda: AdditionTask().make_split(seed=0, n_train=1, n_test=-5), "n_test"),
        (lambda: AdditionTask().make_ood_test(seed=0, n_test=5, extra=0), "extra"),
        (lambda: write_datasets("unused", seed=0, n_ood=-1), "n_ood"),
    ],
)
def test_invalid_settings_raise_value_error_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: AdditionTask(digits=99), "digits must satisfy 1 <= digits <= 12, got 99"),
        (lambda: SortTask(length="4"), "length must be an integer, got '4'"),
        (lambda: AdditionTask(answer_format="xml"), "answer_format must be one of .*'plain'.*'answer_first'"),
        (lambda: get_task("multiplication"), "name must be one of .*'addition_cot'.*'sort'"),
        (lambda: AdditionTask().make_ood_test(seed=0, n_test=5, extra=0), "extra must satisfy 1 <= extra"),
    ],
)
def test_invalid_settings_message_gives_the_allowed_values(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_addition_names_match_the_registry():
    for name, (cls, _) in TASKS.items():
        assert get_task(name).name == name, (
            f"{cls.__name__} calls itself {get_task(name).name!r}, not {name!r}"
        )
    assert {"addition", "addition_cot", "addition_answer_first", "sort", "countdown",
            "word_problems"} == set(TASKS)
