"""The interview drill (notebook 13, rlhf_lab.teach.drill), its glossary, the multi-turn tool-use episodes
(rlhf_lab.tasks.tool_use) and the runnable implementation mistakes (rlhf_lab.teach.mistakes)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from urllib.parse import unquote

import nbformat
import pytest
import torch
from bilingual import (
    MAX_BOX_WORDS,
    cell_problems,
    english_sentences,
    language_problems,
    mean_sentence_words,
    notebook_problems,
    word_count,
)
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from rlhf_lab.rl import PPO
from rlhf_lab.rl.advantages import gae
from rlhf_lab.tasks.tool_use import Chain, Episode, credit_report, make_chains, turn_advantages
from rlhf_lab.teach import drill
from rlhf_lab.teach.mistakes import (
    MISTAKES,
    NO_CLIP,
    ForwardGAEPPO,
    LowPrecisionLogprobsPPO,
    forward_gae,
    mistake_run,
)

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
DRILL = NOTEBOOKS / "13_interview_drill.ipynb"
GLOSSARY = NOTEBOOKS / "GLOSSARY.md"


@pytest.fixture(scope="module")
def notebook():
    return nbformat.read(DRILL, as_version=4)


# --- the notebook covers every question --------------------------------------------------------------


def question_sections(nb) -> dict[int, dict]:
    """For each `## Q<n> ...` heading: its cell index, the heading line, the markdown under it (up to
    the next heading) and how many code cells follow before the next `#`/`##` heading."""
    sections, current = {}, None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            match = re.match(r"##\s+Q(\d+)\b", first)
            if match:
                current = int(match.group(1))
                sections[current] = {"index": index, "heading": first[2:].strip(), "text": cell.source,
                                     "code_cells": 0, "after": ""}
                continue
            if re.match(r"#{1,2}\s", first):
                current = None
            elif current is not None:
                sections[current]["after"] += cell.source + "\n\n"
        elif cell.cell_type == "code" and current is not None:
            sections[current]["code_cells"] += 1
    return sections


def coverage_problems(nb) -> list[str]:
    """What the drill lacks: a question without a heading, out of order, or without a code cell."""
    sections = question_sections(nb)
    problems = [f"Q{n}: no heading" for n in range(1, len(drill.QUESTIONS) + 1) if n not in sections]
    problems += [f"Q{n}: no code cell" for n, s in sections.items() if s["code_cells"] == 0]
    order = [n for n, _ in sorted(sections.items(), key=lambda item: item[1]["index"])]
    if order != sorted(order):
        problems.append(f"questions out of order: {order}")
    return problems


def test_the_coverage_check_can_fail():
    cells = []
    for q in drill.QUESTIONS:
        if q.number == 5:
            continue  # no heading for Q5
        cells.append(new_markdown_cell(f"## {q.heading}"))
        if q.number != 9:
            cells.append(new_code_cell("pass"))  # Q9 gets none
    cells.append(new_markdown_cell("## The myth table"))
    cells.append(new_code_cell("pass"))  # a code cell under another heading counts for no question
    assert coverage_problems(new_notebook(cells=cells)) == ["Q5: no heading", "Q9: no code cell"]


def test_every_question_has_a_heading_and_a_code_cell_in_order(notebook):
    assert coverage_problems(notebook) == []
    assert len(question_sections(notebook)) == len(drill.QUESTIONS) == 37
    assert [q.number for q in drill.QUESTIONS] == list(range(1, 38))
    parts = [cell.source.strip()[2:] for cell in notebook.cells
             if cell.cell_type == "markdown" and re.match(r"#\s[A-E]\.", cell.source.strip())]
    assert parts == [drill.part_heading(p) for p in drill.PARTS]


def test_the_notebook_shows_the_question_bank(notebook):
    """Titles, model answers, links and interview boxes in the notebook are the bank's, not a copy that
    drifted from it."""
    sections = question_sections(notebook)
    for q in drill.QUESTIONS:
        section = sections[q.number]
        assert section["heading"] == q.heading
        assert drill.question_markdown(q.number) in section["text"], f"Q{q.number}'s answer differs"
        assert drill.box_markdown(q.number) in section["after"], f"Q{q.number}'s box differs from the bank"


# --- both languages, and boxes a candidate can say -----------------------------------------------------


def test_the_bilingual_check_can_fail():
    box = drill.box_markdown(1)
    assert cell_problems(box) == []
    english_only = box.split("\n>\n")[0]
    assert cell_problems(english_only) == ["1 English interview box(es) but 0 Chinese one(s)"]
    answer = drill.question_markdown(2)
    assert cell_problems(answer) == []
    english, chinese = drill.question_markdown(2, lang="en"), drill.question_markdown(2, lang="zh")
    assert cell_problems(english) == ["1 English model answer(s) but 0 Chinese one(s)"]
    assert cell_problems(chinese) == ["0 English model answer(s) but 1 Chinese one(s)"]
    untranslated = box.replace(drill.question(1).say_zh, drill.question(1).say_en)
    assert "Chinese box holds no Chinese" in cell_problems(untranslated)
    not_bold = box.replace(drill.question(1).say_en, drill.question(1).say_en.replace("**", ""))
    assert "en box does not start with one bold sentence" in cell_problems(not_bold)
    assert language_problems(not_bold) == []  # both languages are there; only a box rule is broken
    two_bold = box.replace("**Report kappa, not raw agreement.**", "**Report kappa. Not raw agreement.**")
    assert "English box: the bold part is more than one sentence" in cell_problems(two_bold)
    long = box.replace(drill.question(1).say_en, drill.question(1).say_en + " One more. And another one.")
    assert "en box has 5 sentences (at most 3)" in cell_problems(long)
    wordy = box.replace(drill.question(1).say_en, "**Short.** " + " ".join(["word"] * MAX_BOX_WORDS))
    assert f"English box has {MAX_BOX_WORDS + 1} words (at most {MAX_BOX_WORDS})" in cell_problems(wordy)
    chinese_in_english = box.replace("Report kappa", "Report 卡帕")
    assert "English box holds Chinese characters" in cell_problems(chinese_in_english)


def test_every_answer_and_box_exists_in_both_languages_and_can_be_said():
    for q in drill.QUESTIONS:
        assert cell_problems(drill.question_markdown(q.number)) == [], f"Q{q.number}"
        assert cell_problems(drill.box_markdown(q.number)) == [], f"Q{q.number}"
        assert re.search(r"[\u4e00-\u9fff]", q.title_zh) and not re.search(r"[\u4e00-\u9fff]", q.title_en)


def test_the_notebook_has_no_box_or_answer_without_its_other_language(notebook):
    assert notebook_problems(notebook) == []


def test_answers_are_told_in_short_sentences():
    """The course rule: sentences average at most about 22 words (here over every English answer)."""
    sentences = [s for q in drill.QUESTIONS for s in english_sentences(q.answer_en)]
    assert sum(word_count(s) for s in sentences) / len(sentences) <= 22
    assert all(mean_sentence_words(q.answer_en) <= 22 for q in drill.QUESTIONS)


def test_titles_use_the_terms_chinese_interviewers_use():
    assert drill.question(3).title_zh.endswith("？")  # a question, not a fragment
    assert "On-Policy 还是 Off-Policy（同策略/异策略）" in drill.question(8).title_zh
    assert "手撕代码" in drill.question(12).title_zh
    assert (
        "组序列策略优化" in drill.question(14).title_zh and "序列级重要性比率" in drill.question(14).title_zh
    )


def test_the_myth_table_quotes_the_write_ups_in_chinese():
    quotes = ["大模型输出本质是高维连续分布", "天然适配MoE架构的负载不均衡特性",
              "使用更大的裁剪比例（通常比GRPO高10-100倍）",
              "显存占用降低约40%", "GSPO的收敛速度通常比GRPO快2-3倍",
              "GRPO（Generalized Reinforcement Learning with Policy Optimization）是2023年提出的"]
    claims = {myth.key: myth for myth in drill.MYTHS}
    assert len(claims) == len(drill.MYTHS)
    for quote in quotes:
        assert any(quote in myth.claim_zh and myth.quoted for myth in drill.MYTHS), quote
    fabricated = claims["grpo_fabricated"]
    assert "Group Relative Policy Optimization" in fabricated.verdict_en
    assert "2402.03300" in fabricated.verdict_en
    assert "2024" in fabricated.verdict_en and fabricated.verdict_en.startswith("fabricated")
    assert all(re.search(r"[\u4e00-\u9fff]", m.claim_zh) and re.search(r"[\u4e00-\u9fff]", m.verdict_zh)
               for m in drill.MYTHS)


def test_the_first_cell_states_the_run_time_the_last_cell_printed(notebook):
    stated = re.search(r"full mode (\d+) s", notebook.cells[0].source)
    printed = re.search(r"run time: (\d+) s \(full mode", notebook.cells[-1].outputs[0]["text"])
    assert stated and printed and stated.group(1) == printed.group(1)


def test_question_lookup_validates_and_mock_interview_has_a_static_fallback():
    assert drill.question(11).number == 11
    with pytest.raises(ValueError, match="number"):
        drill.question(len(drill.QUESTIONS) + 1)
    card = drill.mock_interview(seed=3, use_widgets=False).data
    assert "<details>" in card and "Reveal" in card
    assert any(f"<b>Q{q.number}. " in card for q in drill.QUESTIONS)
    chinese_answer = f"<b>{drill.ANSWER_ZH}：</b>"
    assert f"<b>{drill.ANSWER_EN}.</b>" in card and chinese_answer in card
    assert chinese_answer not in drill.question_card(3, lang="en")
    with pytest.raises(ValueError, match="lang"):
        drill.question_markdown(3, lang="fr")
    with pytest.raises(ValueError, match="part"):
        drill.part_heading("F")


# --- links resolve ---------------------------------------------------------------------------------


def notebook_headings(path: Path) -> set[str]:
    nb = nbformat.read(path, as_version=4)
    return {line.lstrip("#").strip() for cell in nb.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if re.match(r"#{1,6}\s", line)}


def link_problems(links: list[tuple[str, str]]) -> list[str]:
    """(target file relative to notebooks/, anchor or "") pairs that do not resolve: a missing file, or
    an anchor that is no heading of that notebook. Planned notebooks are skipped."""
    problems, cache = [], {}
    for target, anchor in links:
        if target in drill.PLANNED_NOTEBOOKS or target.startswith("http"):
            continue
        path = NOTEBOOKS / target
        if not path.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor:
            if path not in cache:
                cache[path] = {h.replace(" ", "-") for h in notebook_headings(path)}
            if anchor not in cache[path]:
                problems.append(f"{target}#{anchor}: no such heading")
    return problems


def markdown_links(text: str) -> list[tuple[str, str]]:
    links = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path, _, anchor = unquote(target).partition("#")
        links.append((path, anchor))
    return links


def test_link_check_can_fail():
    links = [("06_ppo.ipynb", "No-such-section"), ("99_nothing.ipynb", ""), ("12_dpo.ipynb", "x")]
    assert link_problems(links) == [
        "06_ppo.ipynb#No-such-section: no such heading", "99_nothing.ipynb: no such file",
        "12_dpo.ipynb#x: no such heading"]


def test_question_links_resolve():
    links = [(s.notebook, s.anchor) for q in drill.QUESTIONS for s in q.deep]
    assert link_problems(links) == []
    # every question links to where it goes deep, except those whose whole answer runs in the drill
    assert [q.number for q in drill.QUESTIONS if not q.deep] == [28]


def test_notebook_links_resolve(notebook):
    links = [link for cell in notebook.cells if cell.cell_type == "markdown"
             for link in markdown_links(cell.source)]
    assert links and link_problems(links) == []


def test_glossary_file_is_the_rendered_glossary_and_its_links_resolve():
    text = GLOSSARY.read_text(encoding="utf-8")
    assert text == drill.glossary_file()
    assert link_problems(markdown_links(text)) == []
    assert "13_interview_drill.ipynb" in text


def test_drill_links_to_the_glossary(notebook):
    assert any("](GLOSSARY.md)" in cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def resolve_lab_name(name: str):
    """`rlhf_lab.x.y` (module or attribute) or `SomeConfig.field` (a dataclass field of a config class
    of one of drill.CONFIG_MODULES)."""
    if not name.startswith("rlhf_lab."):
        cls_name, field = name.split(".")
        for module in drill.CONFIG_MODULES:
            cls = getattr(importlib.import_module(module), cls_name, None)
            if cls is not None:
                assert field in {f.name for f in dataclasses.fields(cls)}, name
                return cls
        raise AttributeError(f"no config class {cls_name} in {drill.CONFIG_MODULES}")
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def test_glossary_names_exist_in_the_package():
    for term in drill.GLOSSARY:
        for name in term.lab:
            assert resolve_lab_name(name) is not None
    with pytest.raises(AttributeError):
        resolve_lab_name("rlhf_lab.rl.advantages.no_such_function")
    with pytest.raises(AssertionError):
        resolve_lab_name("PPOConfig.no_such_field")
    with pytest.raises(AttributeError):
        resolve_lab_name("NoSuchConfig.lam")


def test_glossary_has_every_term_learners_search_for_mapped_to_its_function():
    terms = " | ".join(term.zh for term in drill.GLOSSARY)
    required = ("蒸馏", "信任域", "TRPO", "策略梯度", "演员-评论家", "偏好对", "Bradley-Terry", "拒绝采样",
                "Best-of-N", "过拟合", "断点续训", "分布式训练", "手撕代码", "二分", "牛顿迭代",
                "注意力梯度推导", "离线强化学习", "优势函数", "重要性采样比率", "裁剪", "广义优势估计",
                "价值函数", "评论家", "参考模型", "KL 散度", "奖励模型", "奖励黑客", "奖励过优化",
                "组相对", "同策略", "异策略", "熵坍缩", "组序列策略优化")
    assert [t for t in required if t not in terms] == []
    by_zh = {term.zh: term for term in drill.GLOSSARY}
    assert by_zh["奖励模型"].lab[0] == "rlhf_lab.preferences.RewardModel"
    for zh in ("标注一致性", "直接偏好优化", "过度优化"):
        assert by_zh[zh].lab and all(callable(resolve_lab_name(name)) for name in by_zh[zh].lab), zh
    assert len(by_zh) == len(drill.GLOSSARY), "a term listed twice"


def test_the_committed_outputs_show_the_current_bank(notebook):
    """The mock-interview card and the glossary table were printed from the bank as it is now."""
    cells = {cell.get("id"): cell for cell in notebook.cells}
    card = drill.mock_interview(seed=0, use_widgets=False).data
    assert cells["mock-static"].outputs[0]["data"]["text/html"] == card
    assert cells["glossary"].outputs[0]["data"]["text/markdown"] == drill.glossary_markdown()


def test_the_committed_myth_table_shows_every_claim(notebook):
    myths = next(cell for cell in notebook.cells if cell.get("id") == "myths")
    text = myths.outputs[0]["data"]["text/markdown"]
    assert all(myth.claim_zh in text and myth.verdict_en in text for myth in drill.MYTHS)


# --- multi-turn tool use ---------------------------------------------------------------------------


def episode(turn_correct: list[bool], reward: float, turns: int = 2) -> Episode:
    chain = Chain(tuple(range(1, turns + 2)))
    n = len(turn_correct)
    return Episode(chain, ["p"] * n, ["c"] * n, turn_correct, [reward == 1.0] * n, reward)


def test_turn_advantages_outcome_vs_per_turn():
    # A group of 4: (right, right) wins; (right, wrong) and (wrong, -) lose; (wrong, right) loses too.
    group = [episode([True, True], 1.0), episode([True, False], 0.0), episode([False], 0.0),
             episode([False, True], 0.0)]
    outcome = turn_advantages(group, 4, "outcome")
    # Episode rewards 1, 0, 0, 0: turn 1 mean over 4 episodes 0.25; turn 2 played by 3, mean 1/3.
    expected = torch.tensor([[0.75, 2 / 3], [-0.25, -1 / 3], [-0.25, 0.0], [-0.25, -1 / 3]])
    torch.testing.assert_close(outcome, expected)
    per_turn = turn_advantages(group, 4, "per_turn")
    # Turn 1 right in 2 of 4 (mean 0.5); turn 2 right in 2 of the 3 that played it (mean 2/3).
    expected = torch.tensor([[0.5, 1 / 3], [0.5, -2 / 3], [-0.5, 0.0], [-0.5, 1 / 3]])
    torch.testing.assert_close(per_turn, expected)
    report = credit_report(group, 4)
    assert report["blamed_correct_turns"] == pytest.approx(2 / 4)  # of 4 correct turns, 2 get A < 0
    assert report["turn_accuracy"] == pytest.approx([0.5, 2 / 3])
    with pytest.raises(ValueError, match="credit"):
        turn_advantages(group, 4, "per_token")
    with pytest.raises(ValueError, match="num_generations"):
        turn_advantages(group, 3)


def test_chains_stay_in_the_model_format():
    chains = make_chains(50, num_turns=3, digits=3, seed=1)
    assert len(chains) == 50 and all(c.num_turns == 3 for c in chains)
    assert all(sum(c.operands[: k + 1]) < 1000 for c in chains for k in range(4))
    assert make_chains(5, seed=2) == make_chains(5, seed=2)
    with pytest.raises(ValueError, match="num_turns"):
        make_chains(5, num_turns=0)


# --- mistakes --------------------------------------------------------------------------------------


def test_forward_gae_is_the_wrong_direction():
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3)
    # deltas [0, 0, 0.5]: forwards, only the last token sees the score (0.5); backwards, all do.
    advantages, returns = forward_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.0, 0.5]]))
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0.5, 1.0]]))
    right, _ = gae(rewards, values, mask, 1.0, 0.95)
    torch.testing.assert_close(right, torch.tensor([[0.45125, 0.475, 0.5]]))
    # Padding: nothing leaks from a padded position, whichever the direction.
    one_token = torch.tensor([[1.0, 0.0]])
    padded, _ = forward_gae(one_token, torch.zeros(1, 2), one_token, 1.0, 1.0)
    torch.testing.assert_close(padded, torch.tensor([[1.0, 0.0]]))


def test_mistake_runs_change_one_thing():
    base = {"steps": 1, "prompts_per_step": 2}
    config, algorithm = mistake_run("reference", base)
    assert type(algorithm) is PPO and config.whiten_advantages and config.max_grad_norm == 1.0
    assert not mistake_run("no_advantage_normalisation", base)[0].whiten_advantages
    assert mistake_run("no_gradient_clipping", base)[0].max_grad_norm == NO_CLIP
    assert isinstance(mistake_run("forward_gae", base)[1], ForwardGAEPPO)
    assert isinstance(mistake_run("low_precision_logprobs", base)[1], LowPrecisionLogprobsPPO)
    assert len(MISTAKES) == 5
    with pytest.raises(ValueError, match="name"):
        mistake_run("no_such_mistake")


def test_bfloat16_old_logprobs_move_on_policy_ratios():
    """The symptom the drill shows: with pi_old's log-probs rounded to bf16 the on-policy ratio is no
    longer exactly 1. bf16 keeps 8 significant bits, so |log r| <= |log p| * 2**-8 (round to nearest)."""
    from rlhf_lab.rl import PolicyOutput, Rollout
    from rlhf_lab.rl.ppo import PPOConfig

    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 6, generator=generator) * 5
    mask = torch.ones(4, 6)
    minibatch = Rollout(input_ids=torch.zeros(4, 8, dtype=torch.long), attention_mask=torch.ones(4, 8),
                        prompt_width=2,
                        completion_ids=torch.zeros(4, 6, dtype=torch.long), completion_mask=mask,
                        rewards=torch.zeros(4), correct=torch.zeros(4),
                        finished=torch.ones(4, dtype=torch.bool),
                        num_generations=2, old_logprobs=logprobs.clone(), old_values=torch.zeros(4, 6),
                        advantages=torch.randn(4, 6, generator=generator), returns=torch.zeros(4, 6))
    policy = PolicyOutput(logprobs=logprobs.clone(), entropy=None, values=torch.zeros(4, 6))
    config = PPOConfig(steps=1, prompts_per_step=2)
    _, exact = PPO(config).loss(minibatch, policy)
    assert (exact.token_ratio == 1).all()
    _, rounded = LowPrecisionLogprobsPPO(config).loss(minibatch, policy)
    log_ratio = rounded.token_ratio.log()
    assert (log_ratio != 0).any()
    # fp32 epsilon of exp/log on top of the bf16 rounding bound
    assert (log_ratio.abs() <= logprobs.abs() * 2**-8 + 4 * torch.finfo(torch.float32).eps).all()
