"""The scale-up path on the CPU: HF tokenizer folders, the step engine (LoRA, gradient checkpointing,
bf16, reference off-loading), memory accounting, and `train --model FOLDER --task countdown`."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_checkpoints import parity_tolerance

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.cli import main
from rlhf_lab.model import LlamaModel, ModelConfig
from rlhf_lab.model.hf import save_pretrained
from rlhf_lab.model.lora import add_lora, merged_model
from rlhf_lab.rl import make_config
from rlhf_lab.rl.metrics import reward_parts
from rlhf_lab.rl.rollout import policy_forward
from rlhf_lab.rl.trainer import Trainer
from rlhf_lab.runs.scale_up import (
    active_parameter_count,
    describe_parameters,
    estimate_training_memory,
    known_config,
    parameter_count,
    tiny_qwen3_config,
)
from rlhf_lab.tasks import get_task
from rlhf_lab.text.hf_tokenizer import HFTokenizer, train_bpe_tokenizer

TASK = get_task("countdown")


@pytest.fixture(scope="module")
def tokenizer():
    train, _ = TASK.make_split(seed=0, n_train=150, n_test=0)
    return train_bpe_tokenizer([t for e in train for t in (e.prompt, e.completion)], vocab_size=400)


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    """A tiny random Qwen3 with its BPE tokenizer, saved as a Hugging Face folder."""
    torch.manual_seed(0)
    model = LlamaModel(tiny_qwen3_config(tokenizer, hidden_size=32, intermediate_size=64, head_dim=16))
    path = tmp_path_factory.mktemp("tiny") / "qwen3"
    save_pretrained(model, path, tokenizer=tokenizer)
    return path


def test_hf_tokenizer_folder_round_trip(tokenizer, folder):
    from transformers import AutoTokenizer

    loaded = HFTokenizer.from_pretrained(folder)
    prompt = TASK.make_split(seed=1, n_train=1, n_test=0)[0][0].prompt
    ids = loaded.encode(prompt, add_bos=True)
    assert ids == tokenizer.encode(prompt, add_bos=True)
    auto = AutoTokenizer.from_pretrained(folder)
    expected = auto.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    assert ids == list(expected)  # the prompt is one user turn plus the assistant header
    assert loaded.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    completion = "<think>\n1 + 2 = 3\n</think>\n<answer>1 + 2</answer>"
    row = loaded.encode(completion, add_eos=True) + [loaded.pad_token_id] * 3
    assert loaded.eos_token_id == auto.convert_tokens_to_ids("<|im_end|>")
    assert loaded.decode_until_eos(row) == (completion, True)
    assert loaded.decode_until_eos(row[:-4]) == (completion, False)
    with pytest.raises(ValueError, match="use_chat_template"):
        HFTokenizer(auto, use_chat_template="yes")


def test_load_checkpoint_pairs_a_qwen3_folder_with_its_own_tokenizer(folder):
    model, tokenizer, _ = load_checkpoint(folder)
    assert isinstance(tokenizer, HFTokenizer)
    assert model.config.model_type == "qwen3"
    assert model.config.eos_token_id == tokenizer.eos_token_id  # generation stops at the end of turn


def trainer_for(folder, **options) -> Trainer:
    config = make_config("grpo", init_checkpoint=str(folder), task="countdown", task_params={}, steps=1,
                         eval_every=0, prompts_per_step=2, num_generations=2, max_completion_length=12,
                         n_train=40, n_test=4, eval_examples=2, learning_rate=1e-2, **options)
    return Trainer(config)


def test_lora_trains_adapters_only_and_its_reference_is_the_base(folder):
    trainer = trainer_for(folder, lora_r=2, lora_alpha=4.0)
    base = {k: v.clone() for k, v in trainer.policy.state_dict().items() if "lora_" not in k}
    rollout = trainer.collect_rollout()
    # before any update B = 0: the adapters change nothing, so pi_ref equals the policy exactly. Exactly
    # only along the same path: the reference ran the prompt-shared forward, and the one-forward-per-row
    # path gives the same log-probs up to float rounding: bit-equal on some machines, not on others.
    policy = policy_forward(trainer.policy, rollout, trainer.config.temperature, share_prompts=True)
    assert torch.equal(rollout.ref_logprobs, policy.logprobs)
    trainer.train()
    after = trainer.policy.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items()), "LoRA must leave the base weights alone"
    trained = sum(p.numel() for p in trainer.trainable_parameters())
    memory = trainer.memory_bytes()
    assert memory["params_reference"] == 0 and memory["gradients"] == 4 * trained
    assert trained < parameter_count(trainer.policy.config) / 5


def test_lora_checkpoint_is_merged(folder, tmp_path):
    trainer = trainer_for(folder, lora_r=2, lora_alpha=4.0)
    with torch.no_grad():
        for name, param in trainer.policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a nonzero update, as after training
    rollout = trainer.collect_rollout()
    expected = policy_forward(trainer.policy, rollout).logprobs
    save_pretrained(merged_model(trainer.policy), tmp_path / "merged", tokenizer=trainer.tokenizer)  # as Trainer.save
    merged, _, _ = load_checkpoint(tmp_path / "merged")
    assert type(merged) is LlamaModel and not any("lora" in k for k in merged.state_dict())
    got = policy_forward(merged, rollout).logprobs
    atol, rtol = parity_tolerance(merged.config, expected)
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    assert (got - rollout.ref_logprobs).abs().max() > 100 * atol  # the update is really in the weights


def test_gradient_checkpointing_gives_the_same_gradient(folder):
    """Recomputation runs the very same ops again: equal up to fp32 rounding (the checkpointed
    backward may sum in another order), so the parity tolerance applies to the gradient's scale."""
    plain = trainer_for(folder)
    rollout = plain.collect_rollout()
    # a random model earns no reward, so GRPO's advantages would be 0: give every token one
    rollout.advantages = torch.randn(rollout.completion_mask.shape, generator=torch.Generator().manual_seed(0))
    recomputed = trainer_for(folder, gradient_checkpointing=True)
    a = plain.loss_and_gradient(rollout).gradient
    b = recomputed.loss_and_gradient(rollout).gradient
    assert recomputed.policy.gradient_checkpointing and a.abs().max() > 0
    rtol = 4 * torch.finfo(torch.float32).eps * math.sqrt(a.numel())
    torch.testing.assert_close(b, a, atol=rtol * a.abs().max().item(), rtol=rtol)


def test_offloaded_reference_stays_on_the_cpu_and_gives_the_same_logprobs(folder):
    on_device, offloaded = trainer_for(folder), trainer_for(folder, offload_reference=True)
    rollout = on_device.collect_rollout()
    assert torch.equal(offloaded.reference_logprobs(rollout), on_device.reference_logprobs(rollout))
    assert offloaded.ref_model.device.type == "cpu"


def test_bf16_step_runs_on_the_cpu_with_fp32_logprobs(folder):
    trainer = trainer_for(folder, bf16=True, attn_implementation="sdpa")
    rollout = trainer.collect_rollout()
    assert rollout.ref_logprobs.dtype == torch.float32
    with trainer.autocast():
        out = policy_forward(trainer.policy, rollout)
    assert out.logprobs.dtype == torch.float32
    trainer.train()
    assert math.isfinite(trainer.history["policy_loss"].iloc[-1]) and math.isfinite(trainer.history["grad_norm"].iloc[-1])
    with pytest.raises(ValueError, match="bf16"):
        make_config("grpo", bf16="yes")


@pytest.mark.parametrize("overrides", [
    dict(model_type="llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    dict(model_type="qwen2", tie_word_embeddings=True),
    dict(model_type="qwen3", head_dim=24),
])
def test_parameter_count_matches_a_built_model(overrides):
    config = ModelConfig(vocab_size=50, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, **overrides)
    assert parameter_count(config) == LlamaModel(config).num_parameters()


MOE_SHAPES = [
    dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
    dict(model_type="qwen3_moe", num_local_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
         head_dim=16, tie_word_embeddings=True),
]


def moe_config(**overrides) -> ModelConfig:
    return ModelConfig(vocab_size=50, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, **overrides)


@pytest.mark.parametrize("overrides", MOE_SHAPES)
def test_moe_parameter_counts_match_a_built_model(overrides):
    """Total: every parameter of the built model. Active: the total less, in each layer, the experts a
    token was not routed to, measured by which experts' slices got a gradient from a one-token forward
    (a routed expert's gradient is a sum of nonzero products of random weights: never exactly 0 here)."""
    config = moe_config(**overrides)
    torch.manual_seed(0)
    model = LlamaModel(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    model(torch.tensor([[7]])).logits.sum().backward()
    unused = 0
    for layer in model.model.layers:
        experts = layer.mlp.experts
        touched = [bool(experts.gate_up_proj.grad[e].any() or experts.down_proj.grad[e].any())
                   for e in range(config.num_local_experts)]
        assert sum(touched) == config.num_experts_per_tok  # top-k routing: k experts per token
        one_expert = (experts.gate_up_proj.numel() + experts.down_proj.numel()) // config.num_local_experts
        unused += touched.count(False) * one_expert
    assert active_parameter_count(config) == parameter_count(config) - unused
    assert describe_parameters(config).endswith(
        f"active per token ({config.num_experts_per_tok} of {config.num_local_experts} experts)")


def test_moe_counts_give_the_published_sizes_and_the_memory_holds_every_expert():
    # Mixtral 8x7B: "46.7B total, 12.9B active" (arXiv 2401.04088 section 2); Qwen3-30B-A3B: "30.5B in
    # total, 3.3B activated" (its model card). The formula counts from the shapes alone. The published
    # figures have one decimal, cut or rounded (Qwen's 3.35 B reads "3.3B"): within 0.06 B of each.
    for name, total, active in (("Mixtral-8x7B", 46.7, 12.9), ("Qwen3-30B-A3B", 30.5, 3.3)):
        config = known_config(name)
        assert abs(parameter_count(config) / 1e9 - total) < 0.06, name
        assert abs(active_parameter_count(config) / 1e9 - active) < 0.06, name
        memory = estimate_training_memory(config, 8, 16, 16)
        assert memory.policy == memory.gradients == 4 * parameter_count(config)  # all experts are trained
    dense = known_config("Qwen3-0.6B")
    assert active_parameter_count(dense) == parameter_count(dense)
    assert describe_parameters(dense) == "596.0 M parameters"  # a dense model has one number
    with pytest.raises(ValueError, match="name must be one of"):
        known_config("Qwen3-0.7B")


@pytest.mark.parametrize("overrides", MOE_SHAPES)
def test_moe_lora_estimate_counts_the_adapters_peft_adds(overrides):
    """An MoE layer's experts are 3-D parameters, not Linear layers: peft adapts Qwen3-MoE's as such (rank
    r per expert, 2r on the fused gate_up_proj) and leaves Mixtral's alone (attention only). The formula
    must count what peft really adds."""
    config = moe_config(**overrides)
    with warnings.catch_warnings():  # peft notes that its own fused-rank pattern matched no Linear layer
        warnings.simplefilter("ignore", RuntimeWarning)
        lora = add_lora(LlamaModel(config), r=4, alpha=8.0)
    trained = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert estimate_training_memory(config, 8, 16, 16, lora_r=4).gradients == 4 * trained


def test_memory_estimate_accounts_for_each_setting():
    config = known_config("Qwen3-0.6B")
    assert 590e6 < parameter_count(config) < 600e6  # "0.6B": 596 M with tied embeddings
    full = estimate_training_memory(config, rollout_rows=64, prompt_len=128, completion_len=512, minibatch_rows=8)
    assert full.optimizer == 2 * full.gradients == 2 * full.policy  # AdamW: two fp32 moments per weight
    lora = estimate_training_memory(config, 64, 128, 512, minibatch_rows=8, lora_r=16)
    assert lora.reference == 0 and lora.optimizer < full.optimizer / 20
    checkpointed = estimate_training_memory(config, 64, 128, 512, minibatch_rows=8, gradient_checkpointing=True)
    assert checkpointed.activations < full.activations / 5
    assert full.total == sum(v for k, v in full.as_dict().items() if k != "total")


def test_cli_trains_a_folder_on_countdown(folder, tmp_path, capsys):
    code = main(["train", "--algo", "grpo", "--model", str(folder), "--task", "countdown", "--steps", "1",
                 "--eval-every", "0", "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", "prompts_per_step=2", "--set", "num_generations=2", "--set", "max_completion_length=8",
                 "--set", "n_train=20", "--set", "n_test=4", "--set", "eval_examples=2"])
    assert code == 0
    assert "grpo: held-out accuracy" in capsys.readouterr().out
    reloaded, tokenizer, meta = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert reloaded.config.model_type == "qwen3" and isinstance(tokenizer, HFTokenizer) and meta["step"] == 1
    with pytest.raises(SystemExit):
        main(["train", "--algo", "grpo", "--model", str(folder), "--init", "addition_rl_start", "--out", str(tmp_path)])


def test_reward_parts_are_the_mean_of_each_named_reward_over_the_rollout(folder):
    # The think/answer task logs reward_<name> per step: each the mean over the rollout of that reward,
    # scored over the batch (breakdown_batch) with the same values as completion by completion.
    trainer = trainer_for(folder)
    rollout = trainer.collect_rollout()
    parts = reward_parts(trainer.task, trainer.reward_fn, trainer.tokenizer, rollout)
    assert set(parts) == {f"reward_{name}" for name in trainer.reward_fn.weights} and len(parts) >= 2
    decoded = [trainer.tokenizer.decode_until_eos(row) for row in rollout.completion_ids.tolist()]
    one_by_one = [trainer.reward_fn.breakdown(e.prompt, text, e.answer, done)
                  for e, (text, done) in zip(rollout.examples, decoded)]
    for name in trainer.reward_fn.weights:
        assert parts[f"reward_{name}"] == sum(p[name] for p in one_by_one) / len(one_by_one)
