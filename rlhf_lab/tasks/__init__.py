"""Tasks with rule-based rewards: the problems the tiny model is fine-tuned on.

    from rlhf_lab.tasks import get_task
    task = get_task("addition", digits=3)             # '047+085=' -> '231' (reversed sum)
    train, test = task.make_split(seed=0, n_train=4000, n_test=500)
    ood = task.make_ood_test(seed=0, n_test=500)       # operands with 4 digits
    task.reward("047+085=", "231", "231", finished=True)  # -> 1.0

Registered tasks (`TASKS`): "addition", "addition_cot" (carry scratchpad, then the answer),
"addition_answer_first" (answer, then the scratchpad), "sort" (sort digits, graded reward), and two
reasoning tasks in think/answer form for real tokenizers: "countdown" (TinyZero's numbers game) and
"word_problems" (GSM8K-style templates); their rewards are in `reasoning.py`.
Formats are described in `formats.py`, the reward contract in `rewards.py`, the files in `jsonl.py`.
"""

from __future__ import annotations

from rlhf_lab.tasks.addition import AdditionTask
from rlhf_lab.tasks.base import Example, Task
from rlhf_lab.tasks.countdown import CountdownTask
from rlhf_lab.tasks.formats import ANSWER_FORMATS, TASK_CHARS, extract_answer, is_well_formed
from rlhf_lab.tasks.jsonl import DEFAULT_DATASETS, load_jsonl, write_datasets, write_jsonl
from rlhf_lab.tasks.reasoning import (
    ThinkAnswerTask,
    countdown_answer_reward,
    extract_tagged_answer,
    is_think_answer,
    number_answer_reward,
    think_answer_format_reward,
)
from rlhf_lab.tasks.registry import TASKS, get_task, task_names
from rlhf_lab.tasks.rewards import (
    REWARDS,
    RewardFn,
    WeightedReward,
    combine,
    correctness_reward,
    format_reward,
    get_reward,
    partial_credit_reward,
    score_batch,
    steps_reward,
)
from rlhf_lab.tasks.sorting import SortTask
from rlhf_lab.tasks.word_problems import WordProblemTask

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_DATASETS",
    "REWARDS",
    "TASKS",
    "TASK_CHARS",
    "AdditionTask",
    "CountdownTask",
    "ThinkAnswerTask",
    "WordProblemTask",
    "countdown_answer_reward",
    "extract_tagged_answer",
    "is_think_answer",
    "number_answer_reward",
    "think_answer_format_reward",
    "Example",
    "RewardFn",
    "SortTask",
    "Task",
    "WeightedReward",
    "combine",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "get_reward",
    "get_task",
    "is_well_formed",
    "load_jsonl",
    "partial_credit_reward",
    "score_batch",
    "steps_reward",
    "task_names",
    "write_datasets",
    "write_jsonl",
]
