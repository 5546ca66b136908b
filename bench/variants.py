"""Seeded histories and final weights of every RL variant, recorded once and compared after a change.

    python bench/variants.py --record before.json        # on the code before a refactor
    python bench/variants.py --compare before.json       # on the code after it: value for value

A refactor that claims "the same arithmetic" must leave each variant's history (every column but the
clocks and memory readings) and its final weights unchanged, bit for bit. Each variant trains a few
steps from a shipped checkpoint with seed 0, evaluates twice, and is summarised by its history and a
sha256 of every trained tensor. `--tree DIR` imports rlhf_lab from another checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys

# Columns that measure the machine, not the arithmetic.
CLOCKS = ("wall_time", "step_time", "rollout_time", "update_time", "tokens_per_s", "mem_params_bytes",
          "mem_optimizer_bytes", "mem_peak_bytes", "mem_update_peak_bytes")

SMALL = dict(steps=4, eval_every=2, eval_examples=40, prompts_per_step=16, num_generations=8, seed=0)
DAPO = dict(epsilon_high=0.28, loss_type="dapo", dynamic_sampling=False, mask_truncated_completions=False,
            overlong_buffer=0)  # every DAPO option given, so the variants do not depend on DAPOConfig's defaults

# name -> (algorithm, settings). A DAPO variant names "dapo" and runs as "grpo" where no DAPO class exists.
VARIANTS = {
    "ppo_head": ("ppo", {}),
    "ppo_separate": ("ppo", {"critic": "separate"}),
    "ppo_adaptive_k3": ("ppo", {"adaptive_kl": True, "kl_estimator": "k3", "whiten_rewards": True}),
    "grpo": ("grpo", {}),
    "grpo_off_policy": ("grpo", {"num_iterations": 2, "num_minibatches": 2}),
    "grpo_beta": ("grpo", {"beta": 0.04}),
    "grpo_all_kl_rows": ("grpo", {"kl_metric_samples": None}),
    "grpo_bnpo_batch": ("grpo", {"loss_type": "bnpo", "scale_rewards": "batch"}),
    "dr_grpo": ("grpo", {"scale_rewards": "none", "loss_type": "dr_grpo"}),
    "dapo_dynamic": ("dapo", {**DAPO, "dynamic_sampling": True}),
    "dapo_overlong": ("dapo", {**DAPO, "overlong_buffer": 2}),
    "dapo_mask_truncated": ("dapo", {**DAPO, "mask_truncated_completions": True, "max_completion_length": 4}),
    "gspo": ("gspo", {}),
    "gspo_token": ("gspo", {"importance_sampling_level": "sequence_token"}),
    "rloo": ("rloo", {}),
    "reinforce": ("reinforce", {}),
    "reinforce_mean": ("reinforce", {"baseline": "mean"}),
    "remax": ("remax", {}),
    "grpo_lora": ("grpo", {"lora_r": 4}),
    "grpo_checkpointing_bf16": ("grpo", {"gradient_checkpointing": True, "bf16": True}),
    "moe_grpo": ("grpo", {"init_checkpoint": "addition_moe_rl_start"}),
    "moe_grpo_replay": ("grpo", {"init_checkpoint": "addition_moe_rl_start", "routing_replay": True,
                                 "num_minibatches": 2}),
    "moe_gspo": ("gspo", {"init_checkpoint": "addition_moe_rl_start"}),
}


def run(name: str) -> dict:
    import torch

    from rlhf_lab.rl import ALGORITHMS, Trainer, make_config

    algo, settings = VARIANTS[name]
    if algo not in ALGORITHMS:
        algo = "grpo"
    torch.set_num_threads(1)
    trainer = Trainer(make_config(algo, {**SMALL, **settings}))
    history = trainer.train()
    rows = [{k: v for k, v in row.items() if k not in CLOCKS} for row in history.to_dict("records")]
    digest = hashlib.sha256()
    for module_name, module in sorted(trainer.state_modules().items()):
        for key, tensor in sorted(module.state_dict().items()):
            digest.update(f"{module_name}.{key}".encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return {"rows": rows, "weights_sha256": digest.hexdigest()}


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(before: dict, after: dict) -> list[str]:
    problems = []
    for name in VARIANTS:
        if name not in before:
            continue
        b, a = before[name], after[name]
        if b["weights_sha256"] != a["weights_sha256"]:
            problems.append(f"{name}: final weights differ")
        if len(b["rows"]) != len(a["rows"]):
            problems.append(f"{name}: {len(b['rows'])} rows before, {len(a['rows'])} after")
        for i, (rb, ra) in enumerate(zip(b["rows"], a["rows"])):
            for key in sorted(set(rb) | set(ra)):
                if not same(rb.get(key), ra.get(key)):
                    problems.append(f"{name}: row {i} column {key}: {rb.get(key)!r} before, {ra.get(key)!r} after")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", metavar="JSON", help="write every variant's history and weight hash")
    group.add_argument("--compare", metavar="JSON", help="run again and compare with this record")
    parser.add_argument("--tree", help="import rlhf_lab from this checkout")
    parser.add_argument("--only", nargs="*", choices=sorted(VARIANTS), help="a subset of the variants")
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    names = args.only or list(VARIANTS)
    results = {}
    for name in names:
        results[name] = run(name)
        print(f"{name}: {len(results[name]['rows'])} rows, weights {results[name]['weights_sha256'][:12]}", flush=True)
    if args.record:
        with open(args.record, "w") as f:
            json.dump(results, f, indent=1)
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    problems = compare({k: v for k, v in before.items() if k in results}, results)
    for line in problems[:50]:
        print(line)
    print(f"{len(names)} variants compared: {'identical' if not problems else f'{len(problems)} differences'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
