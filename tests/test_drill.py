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


# --- the notebook covers every question --------------------------------------------------------------


def question_sections(nb) -> dict[int, dict]:
    """For each `## Q<n> ...` heading: its cell index, the heading line, the markdown under it and how
    many code cells follow before the next `#`/`##` heading."""
    sections, current = {}, None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            match = re.match(r"##\s+Q(\d+)\b", first)
            if match:
                current = int(match.group(1))
                sections[current] = {"index": index, "heading": first[2:].strip(), "text": cell.source, "code_cells": 0}
                continue
            if re.match(r"#{1,2}\s", first):
                current = None
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
    cells.append(new_code_cell("pass"))  # a code cell under another heading does not count for Q26
    assert coverage_problems(new_notebook(cells=cells)) == ["Q5: no heading", "Q9: no code cell"]


def test_every_question_has_a_heading_and_a_code_cell_in_order():
    nb = nbformat.read(DRILL, as_version=4)
    assert coverage_problems(nb) == []
    assert len(question_sections(nb)) == 26


def test_the_notebook_shows_the_question_bank():
    """Titles (both languages), model answers and links in the notebook are the bank's, not a copy that
    drifted from it."""
    sections = question_sections(nbformat.read(DRILL, as_version=4))
    for q in drill.QUESTIONS:
        section = sections[q.number]
        assert section["heading"] == q.heading
        assert re.search(r"[\u4e00-\u9fff]", q.title_zh) and re.search(r"[A-Za-z]", q.title_en)
        assert drill.question_markdown(q.number) in section["text"], f"Q{q.number}'s text differs from rlhf_lab.teach.drill"


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
    assert link_problems([("06_ppo.ipynb", "No-such-section"), ("99_nothing.ipynb", ""), ("12_dpo.ipynb", "x")]) == [
        "06_ppo.ipynb#No-such-section: no such heading", "99_nothing.ipynb: no such file",
        "12_dpo.ipynb#x: no such heading"]


def test_question_links_resolve():
    links = [(s.notebook, s.anchor) for q in drill.QUESTIONS for s in q.deep]
    assert link_problems(links) == []
    assert all(q.deep for q in drill.QUESTIONS), "every question links to where it goes deep"


def test_glossary_file_is_the_rendered_glossary_and_its_links_resolve():
    text = GLOSSARY.read_text(encoding="utf-8")
    assert drill.glossary_markdown() in text
    assert link_problems(markdown_links(text)) == []
    assert "13_interview_drill.ipynb" in text
    for term in ("优势函数", "重要性采样", "信用分配", "奖励黑客"):
        assert f"| {term} |" in text


def test_drill_links_to_the_glossary():
    nb = nbformat.read(DRILL, as_version=4)
    assert any("](GLOSSARY.md)" in cell.source for cell in nb.cells if cell.cell_type == "markdown")


def resolve_lab_name(name: str):
    """`rlhf_lab.x.y` (module or attribute) or `SomeConfig.field` (a field of an rlhf_lab.rl config)."""
    if not name.startswith("rlhf_lab."):
        cls_name, field = name.split(".")
        cls = getattr(importlib.import_module("rlhf_lab.rl"), cls_name)
        assert field in {f.name for f in dataclasses.fields(cls)}, name
        return cls
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


def test_question_lookup_validates_and_mock_interview_has_a_static_fallback():
    assert drill.question(11).number == 11
    with pytest.raises(ValueError, match="number"):
        drill.question(27)
    card = drill.mock_interview(seed=3, use_widgets=False).data
    assert "<details>" in card and "Reveal" in card
    assert any(f"<b>Q{q.number}. " in card for q in drill.QUESTIONS)


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
    padded, _ = forward_gae(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), 1.0, 1.0)
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
    minibatch = Rollout(input_ids=torch.zeros(4, 8, dtype=torch.long), attention_mask=torch.ones(4, 8), prompt_width=2,
                        completion_ids=torch.zeros(4, 6, dtype=torch.long), completion_mask=mask,
                        rewards=torch.zeros(4), correct=torch.zeros(4), finished=torch.ones(4, dtype=torch.bool),
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
