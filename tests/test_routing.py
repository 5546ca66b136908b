"""MoE in the RL loop: routing metrics, routing replay (GSPO paper section 5), the experiment's helpers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from rlhf_lab.model import LlamaModel
from rlhf_lab.rl import Trainer, make_config, policy_forward
from rlhf_lab.rl.algorithm import LossInfo
from rlhf_lab.rl.metrics import UpdateStats
from rlhf_lab.rl.routing import (
    RoutingMonitor,
    expert_load,
    expert_set_changed,
    routed_experts,
    routing_change,
)
from rlhf_lab.runs.moe_experiment import mean_and_se, method_config, one_step_routing_change, run_summary
from rlhf_lab.sft import lab_model_config
from rlhf_lab.text.tokenizer import CharTokenizer

TOK = CharTokenizer()
SMALL = dict(prompts_per_step=4, num_generations=4, eval_every=0, eval_examples=8, n_train=100, n_test=20,
             num_minibatches=4, steps=1)
# fp32 log-probs of a few-token completion: a few ulps of values of order 10 (log-probs of a 30-token
# vocabulary); same operations in the same order differ by nothing, a different reduction order by ~1e-6
ATOL = 64 * torch.finfo(torch.float32).eps * 10


def tiny_moe(seed: int = 0, experts: int = 4, top_k: int = 2, aux: float = 0.001) -> LlamaModel:
    torch.manual_seed(seed)
    return LlamaModel(lab_model_config(TOK, model_type="mixtral", hidden_size=32, num_hidden_layers=2,
                                       intermediate_size=32, initializer_range=0.5, num_local_experts=experts,
                                       num_experts_per_tok=top_k, router_aux_loss_coef=aux))


def length_reward(prompt, completion, reference, finished=True):
    return len(completion) / 10  # varies within a group, so the advantages (and the gradients) are not 0


def moe_trainer(algo: str = "grpo", model=None, **overrides) -> Trainer:
    config = make_config(algo, **{**SMALL, **overrides})
    return Trainer(config, model=model or tiny_moe(), tokenizer=TOK, reward_fn=length_reward)


# ---------------------------------------------------------------------------------------------
# pure metrics on hand-made tensors


def test_routing_change_ignores_order_and_counts_sets_and_experts():
    before = (torch.tensor([[[0, 1], [2, 3], [0, 3], [1, 2]]]),)  # (N=1, T=4, k=2), one layer
    after = (torch.tensor([[[1, 0], [2, 0], [1, 2], [1, 2]]]),)  # same set, one expert swapped, both, same
    change = routing_change(before, after, torch.ones(1, 4))
    assert expert_set_changed(before, after).tolist() == [[False, True, True, False]]
    assert change["token"] == pytest.approx(2 / 4)  # tokens 1 and 2 have a different set
    assert change["expert"] == pytest.approx(3 / 8)  # 1 + 2 of the 8 activated experts are gone
    masked = routing_change(before, after, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    assert masked["token"] == pytest.approx(1 / 2) and masked["layers"] == [pytest.approx(1 / 2)]


def test_expert_load_counts_slots_per_layer():
    indices = (torch.tensor([[[0, 1], [0, 2], [3, 0]]]), torch.tensor([[[1, 1], [1, 1], [2, 3]]]))
    load = expert_load(indices, num_experts=4, mask=torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.equal(load, torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.0, 1.0, 0.0, 0.0]]))


def test_update_stats_ratio_spread_and_sequence_clip_fraction():
    ratio = torch.tensor([[1.5, 0.9, 1.0], [1.0, 1.1, 7.0]])  # 7.0 sits on padding: not counted
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    clipped = torch.tensor([[True, False, False], [False, False, True]])  # row 2's clip is on padding
    info = LossInfo(policy_loss=0.0, ratio=ratio, token_ratio=ratio, sequence_ratio=torch.tensor([1.2, 0.95]),
                    clipped_low=clipped, clipped_high=torch.zeros_like(clipped), old_logprobs=torch.zeros(2, 3))
    minibatch = SimpleNamespace(completion_mask=mask, ref_logprobs=None)
    policy = SimpleNamespace(logprobs=torch.zeros(2, 3), entropy=torch.zeros(2, 3))
    stats = UpdateStats()
    stats.add(info, minibatch, policy, grad_norm=1.0, first_pass=True, keep=False)
    m = stats.metrics()
    deviations = torch.tensor([0.5, -0.1, 0.0, 0.0, 0.1], dtype=torch.float64)
    assert m["ratio_dev_std"] == pytest.approx(deviations.std(unbiased=False).item())
    assert m["ratio_dev_max"] == pytest.approx(0.5)
    assert m["seq_ratio_dev_max"] == pytest.approx(0.2)
    assert m["seq_clip_frac"] == 0.5
    assert m["kl_old"] == 0.0 and "routing_change" not in m


def test_only_an_moe_policy_gets_the_routing_monitor():
    assert any(isinstance(c, RoutingMonitor) for c in moe_trainer().callbacks)
    dense = Trainer(make_config("grpo", prompts_per_step=2, num_generations=2, eval_every=0, n_train=50, n_test=10,
                                eval_examples=5))
    assert not any(isinstance(c, RoutingMonitor) for c in dense.callbacks)
    row = dense.train_step()
    assert "routing_change" not in row and "aux_loss" not in row


# ---------------------------------------------------------------------------------------------
# routing replay in the trainer


def test_routing_replay_reproduces_old_routing_and_router_still_learns():
    trainer = moe_trainer(learning_rate=0.05, routing_replay=True)
    rollout = trainer.collect_rollout()
    old = rollout.old_expert_indices
    assert len(old) == 2 and old[0].shape == (*rollout.input_ids[:, :-1].shape, 2)
    trainer.algorithm.compute_advantages(rollout)
    trainer.update(rollout)  # 4 optimiser steps at a large learning rate: the router now picks differently
    free = policy_forward(trainer.policy, rollout)
    natural = routed_experts(free.router_logits, 2)
    assert any(not torch.equal(o, n) for o, n in zip(old, natural)), "the update should have moved the routing"
    replayed = trainer.policy_outputs(rollout)
    assert all(torch.equal(o, r) for o, r in zip(old, replayed.expert_indices))  # exactly pi_old's experts
    assert not torch.allclose(replayed.logprobs, free.logprobs)  # and that changes the log-probs
    replayed.logprobs.sum().backward()
    gate = trainer.policy.model.layers[0].mlp.gate.weight.grad
    assert gate is not None and gate.abs().sum() > 0  # the gate weights are the current router's: it learns


def test_replay_ratios_equal_the_dense_formula_when_routing_does_not_change():
    trainer = moe_trainer(routing_replay=True)
    rollout = trainer.collect_rollout()
    trainer.algorithm.compute_advantages(rollout)
    with torch.no_grad():  # change the weights after the last router only: the routing cannot move
        trainer.policy.model.norm.weight.mul_(1.5)
    replayed = trainer.policy_outputs(rollout)
    free = policy_forward(trainer.policy, rollout)
    assert all(torch.equal(o, n) for o, n in zip(rollout.old_expert_indices, routed_experts(free.router_logits, 2)))
    _, info = trainer.algorithm.loss(rollout, replayed)
    dense = torch.exp(free.logprobs.detach() - rollout.old_logprobs)  # r_t = pi / pi_old
    mask = rollout.completion_mask.bool()
    assert torch.allclose(info.token_ratio[mask], dense[mask], rtol=ATOL, atol=0)
    assert (dense[mask] - 1).abs().max() > 1e-3  # the ratios are not trivially 1


def test_moe_step_logs_routing_metrics_and_adds_the_aux_loss():
    trainer = moe_trainer(learning_rate=0.01)
    history = trainer.train()
    last = history.iloc[-1]
    for column in ("routing_change", "expert_change", "routing_change_one_update", "routing_change_l0",
                   "routing_change_l1", "expert_load_max", "aux_loss", "ratio_dev_std", "seq_clip_frac", "kl_old"):
        assert math.isfinite(last[column]), column
    assert 0 <= last["routing_change"] <= 1 and 0 <= last["expert_change"] <= last["routing_change"]
    loads = [last[f"expert_load_l0_e{j}"] for j in range(4)]
    assert sum(loads) == pytest.approx(1.0) and 1 <= last["expert_load_max"] <= 4
    # aux = 0.001 * L_aux, L_aux = E sum_e f_e P_e lies in (0, E * k]
    assert 0 < last["aux_loss"] <= 0.001 * 4 * 2
    no_aux = moe_trainer(model=tiny_moe(aux=0.0)).train().iloc[-1]
    assert no_aux["aux_loss"] == 0.0


def test_dense_model_logs_ratio_spread_but_no_routing():
    from test_rl import tiny_model

    trainer = Trainer(make_config("gspo", **SMALL), model=tiny_model(), tokenizer=TOK, reward_fn=length_reward)
    last = trainer.train().iloc[-1]
    assert math.isfinite(last["ratio_dev_std"]) and math.isfinite(last["seq_clip_frac"])
    assert "routing_change" not in trainer.history


def test_routing_replay_is_validated():
    with pytest.raises(ValueError, match="routing_replay"):
        make_config("grpo", routing_replay="yes")
    from test_rl import tiny_model

    with pytest.raises(ValueError, match="routing_replay=True needs a mixture-of-experts"):
        Trainer(make_config("grpo", **SMALL, routing_replay=True), model=tiny_model(), tokenizer=TOK)


# ---------------------------------------------------------------------------------------------
# the experiment's helpers


def test_method_configs_and_their_validation():
    assert method_config("GRPO + replay").routing_replay and method_config("GSPO").algo == "gspo"
    assert method_config("GRPO", {"num_minibatches": 4}).epsilon_high == 0.27
    with pytest.raises(ValueError, match="method must be one of"):
        method_config("PPO")


def test_one_step_routing_change_grows_with_the_learning_rate():
    trainer = moe_trainer()
    rollout = trainer.collect_rollout()
    small = one_step_routing_change(trainer.policy, rollout, 1e-9)
    large = one_step_routing_change(trainer.policy, rollout, 0.1)
    assert small["token"] <= large["token"] and large["token"] > 0
    assert small["token"] < 0.05  # a step of 1e-9 on weights of order 0.5 flips only exact near-ties


def test_short_run_sweep_gives_one_row_per_setting(tmp_path):
    from rlhf_lab.model.hf import save_pretrained
    from rlhf_lab.runs.moe_experiment import short_run_sweep

    save_pretrained(tiny_moe(), tmp_path / "moe", tokenizer=TOK)
    settings = {**SMALL, "init_checkpoint": str(tmp_path / "moe")}
    table = short_run_sweep([{"learning_rate": 1e-6}, {"learning_rate": 0.05}], settings, steps=1)
    assert list(table["learning_rate"]) == [1e-6, 0.05]
    assert table["routing_change"].iloc[0] <= table["routing_change"].iloc[1]  # a 50 000x larger step moves more


def test_run_summary_and_mean_and_se():
    history = pd.DataFrame({"step": [0, 1, 2], "eval_accuracy": [0.5, float("nan"), 0.3],
                            "ratio_dev_max": [float("nan"), 0.5, 2.0], "kl_k3": [float("nan"), 0.01, 0.02]})
    row = run_summary(history, "GRPO", 0, 1.0, eval_examples=100, collapse_drop=0.1, ratio_spike=1.0)
    assert row["collapsed"] and row["ratio_spikes"] == 1 and row["steps"] == 2
    assert row["final_accuracy_se"] == pytest.approx(math.sqrt(0.3 * 0.7 / 100))
    mean, se = mean_and_se([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5) and se == pytest.approx(0.1 / math.sqrt(3))


def test_experiment_runs_every_method_with_steps_from_its_cpu_time(tmp_path):
    from rlhf_lab.model.hf import save_pretrained
    from rlhf_lab.runs.moe_experiment import moe_routing_experiment, stability_table

    save_pretrained(tiny_moe(), tmp_path / "moe", tokenizer=TOK)
    settings = {**SMALL, "init_checkpoint": str(tmp_path / "moe"), "eval_every": 100}  # evaluate at the start and end
    result = moe_routing_experiment(seeds=(0, 1), cpu_budget=0.1, settings=settings, calibration_steps=1)
    assert set(result.cpu_per_step) == {"GRPO", "GRPO + replay", "GSPO"}
    for method, cpu in result.cpu_per_step.items():
        assert result.steps[method] == max(1, int(0.1 // cpu))
    assert sorted(result.runs.groupby("method").size().tolist()) == [2, 2, 2]
    table = stability_table(result)
    assert list(table.index) == ["GRPO", "GRPO + replay", "GSPO"]
    assert table["routing_change"].between(0, 1).all() and table["collapsed"].str.endswith("/2").all()
    assert (result.history.groupby(["method", "seed"])["step"].max() == pd.Series(
        {(m, s): result.steps[m] for m in result.steps for s in (0, 1)})).all()
