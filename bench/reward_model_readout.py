"""Why does the reward model not learn which sum is right? Where the score is read, measured.

    python bench/reward_model_readout.py            # every variant, one table (about 10 min on 2 cores)
    python bench/reward_model_readout.py --rl-steps 0   # without the RL runs
    python bench/reward_model_readout.py --rl-steps 100 --prompts-per-step 32 --only "gold reward itself" \
        "loglik, trunk lr 2e-4" "loglik, frozen trunk"     # GRPO's default batch, for 100 steps
    python bench/reward_model_readout.py --rl-steps 400 --prompts-per-step 32 --measure-prompts 96 \
        --measure-every 20 --rl-seeds 0 1 2 --only "loglik, frozen, verbose_c labels"   # three GRPO seeds

For each reward-model variant (trained on the shipped preference pairs, seed 0), on held-out data:

- `val_gold` / `val_majority`: pairwise accuracy on the validation pairs against the gold / the majority;
- `right_vs_wrong`: the same on the validation pairs where exactly one side is the right answer;
- `policy_auc`: on the RL starting policy's own samples (8 per held-out prompt, temperature 1), the
  share of (right, wrong) pairs of one prompt that the model orders right: what RL and best-of-n need;
- `pads_1`, `pads_2`: share of held-out prompts where it scores the right answer followed by 1 / 2
  random digits above the right answer (the gold never does: `verbosity_probe`);
- best-of-n from the RL starting policy (64 held-out prompts x 64 samples): the gold gain over n = 1
  at n = 2, 8, 32 with its paired standard error;
- GRPO against it (`--rl-steps`, `--prompts-per-step` prompts x 8 samples, lr 2e-4, beta 0, seed 0 or
  `--rl-seeds`): gold on `--measure-prompts` (48) held-out prompts x 4 samples every `--measure-every`
  (10) steps; the start, the best measurement, and the end. The row "gold reward itself" optimises the
  gold directly: the most any proxy could give in that budget.

Variants: the last-token readout (InstructGPT's) on the majority labels and, as a ceiling for that
readout, on the gold labels; the "last_token+loglik" readout with the trunk trained at two learning
rates and with the trunk frozen; and the SFT model's mean log-likelihood alone, untrained. Further
variants look for a proxy between the frozen one (gold only rises under GRPO) and the trunk-trained
ones (gold falls at once): lower trunk learning rates, fewer pairs, a length-biased rater's labels, and
the frozen-trunk probe fine-tuned afterwards ("probe then trunk", `after_probe`). The RL curve of each
run is printed as it is measured.
Writes bench/results/reward_model_readout.csv.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.preferences import (
    RewardConfig,
    RewardModel,
    RewardTrainer,
    gold_reward,
    load_preferences,
    pairwise_accuracy,
    verbosity_probe,
)
from rlhf_lab.preferences.overoptimization import (
    RewardTracker,
    best_of_n_curve,
    best_of_n_pool,
    completion_texts,
)
from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.rl.rollout import sample_and_score
from rlhf_lab.sampling import SamplingConfig

VARIANTS = {
    "last_token (shipped recipe)": dict(),
    "last_token, gold labels": dict(label="gold"),
    "loglik, trunk lr 1e-3": dict(readout="last_token+loglik"),
    "loglik, trunk lr 2e-4": dict(readout="last_token+loglik", learning_rate=2e-4),
    "loglik, frozen trunk": dict(readout="last_token+loglik", train_trunk=False, learning_rate=1e-2),
    "loglik, trunk lr 2e-4, gold labels": dict(readout="last_token+loglik", learning_rate=2e-4, label="gold"),
    "loglik, trunk lr 5e-5": dict(readout="last_token+loglik", learning_rate=5e-5),
    "loglik, trunk lr 1e-4, 60 steps": dict(readout="last_token+loglik", learning_rate=1e-4, steps=60),
    "loglik, frozen trunk, 100 pairs": dict(
        readout="last_token+loglik", train_trunk=False, learning_rate=1e-2, n_pairs=100
    ),
    "loglik, frozen trunk, 400 pairs": dict(
        readout="last_token+loglik", train_trunk=False, learning_rate=1e-2, n_pairs=400
    ),
    "loglik, frozen, verbose_c labels": dict(
        readout="last_token+loglik", train_trunk=False, learning_rate=1e-2, label="verbose_c"
    ),
    "loglik, frozen trunk, lr 1e-3": dict(readout="last_token+loglik", train_trunk=False, learning_rate=1e-3),
    # a linear probe (the "frozen trunk" variant), then the whole model fine-tuned (Kumar et al. 2022)
    "loglik, probe then trunk lr 2e-4": dict(
        readout="last_token+loglik", learning_rate=2e-4, after_probe=True
    ),
    "loglik, probe then trunk lr 5e-4": dict(
        readout="last_token+loglik", learning_rate=5e-4, after_probe=True
    ),
    "loglik, probe then trunk lr 1e-3": dict(
        readout="last_token+loglik", learning_rate=1e-3, after_probe=True
    ),
}
PROBE = VARIANTS["loglik, frozen trunk"]
MAX_LENGTH = 8  # as in the preference data


@torch.no_grad()
def policy_auc(reward_model, policy, tokenizer, task, examples, samples: int = 8) -> tuple[float, int]:
    """Share of (right, wrong) pairs of distinct completions of the same prompt, sampled from `policy`,
    that `reward_model` orders right (ties count one half); and how many such pairs there were."""
    sampling = SamplingConfig(do_sample=True, temperature=1.0, max_new_tokens=MAX_LENGTH)
    rollout = sample_and_score(policy, tokenizer, examples, samples, sampling, reward_model, task,
                               torch.Generator().manual_seed(0))
    texts = completion_texts(tokenizer, rollout)
    scores = rollout.rewards.reshape(len(examples), samples)
    wins = total = 0.0
    for i, example in enumerate(examples):
        rows = range(i * samples, (i + 1) * samples)
        right = [r for r in rows if texts[r] == example.answer and bool(rollout.finished[r])]
        wrong = [r for r in rows if r not in right and texts[r] != example.answer]
        for a in right:
            for b in wrong:
                sa, sb = scores.flatten()[a], scores.flatten()[b]
                wins += float(sa > sb) + 0.5 * float(sa == sb)
                total += 1
    return wins / max(total, 1), int(total)


def rl_row(reward, rl_steps: int, prompts_per_step: int, measure_prompts: int = 48, measure_every: int = 10,
           seed: int = 0) -> dict:
    """GRPO against `reward` from the RL starting checkpoint; gold, proxy and d measured on
    `measure_prompts` held-out prompts every `measure_every` steps."""
    settings = dict(steps=rl_steps, prompts_per_step=prompts_per_step, num_generations=8,
                    max_completion_length=MAX_LENGTH, eval_every=0, learning_rate=2e-4, seed=seed)
    tracker = RewardTracker(gold_reward, num_prompts=measure_prompts, every=measure_every)
    Trainer(make_config("grpo", settings), reward_fn=reward, callbacks=[tracker]).train()
    curve = tracker.history
    print(f"GRPO seed {seed}")
    print(
        curve[["step", "d", "proxy", "gold", "gold_se", "length"]].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"
        )
    )
    best = curve["gold"].idxmax()
    return {"rl_seed": seed, "rl_gold_start": curve["gold"].iloc[0], "rl_gold_best": curve["gold"].max(),
            "rl_best_step": int(curve["step"][best]), "rl_gold_end": curve["gold"].iloc[-1],
            "rl_gold_se": curve["gold_se"].iloc[-1], "rl_proxy_start": curve["proxy"].iloc[0],
            "rl_proxy_end": curve["proxy"].iloc[-1], "rl_d_end": curve["d"].iloc[-1]}


def measure(name: str, reward_model, probe: Trainer, args) -> list[dict]:
    """The offline measurements of `reward_model`, and one row per GRPO seed (`args.rl_seeds`)."""
    validation = load_preferences("validation")
    right_vs_wrong = [p for p in validation if (p.chosen == p.answer) != (p.rejected == p.answer)]
    auc, auc_pairs = policy_auc(reward_model, probe.policy, probe.tokenizer, probe.task,
                                probe.test_examples[:100])
    pads = verbosity_probe(reward_model, probe.test_examples[:200], extra_digits=(1, 2))
    pool = best_of_n_pool(probe.policy, probe.tokenizer, probe.task, probe.test_examples[:64], reward_model,
                          gold_reward, pool_size=64, max_new_tokens=MAX_LENGTH, seed=0)
    bon = best_of_n_curve(pool, [1, 2, 8, 32]).set_index("n")
    row = {"variant": name, "val_gold": pairwise_accuracy(reward_model, validation, "gold"),
           "val_majority": pairwise_accuracy(reward_model, validation),
           "right_vs_wrong": pairwise_accuracy(reward_model, right_vs_wrong, "gold"),
           "policy_auc": auc, "policy_pairs": auc_pairs,
           "pads_1": pads["rm_prefers_longer"].iloc[0], "pads_2": pads["rm_prefers_longer"].iloc[1],
           "loglik_weight": reward_model.loglik_weight.item()}
    for n in (2, 8, 32):
        row[f"bon{n}_gain"], row[f"bon{n}_se"] = bon.loc[n, "gold_gain"], bon.loc[n, "gold_gain_se"]
    if not args.rl_steps:
        return [row]
    return [{**row, **rl_row(reward_model, args.rl_steps, args.prompts_per_step, args.measure_prompts,
                             args.measure_every, seed)} for seed in args.rl_seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rl-steps", type=int, default=60)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    parser.add_argument("--measure-prompts", type=int, default=48,
                        help="held-out prompts (x 4 samples) for the gold")
    parser.add_argument("--measure-every", type=int, default=10, help="GRPO steps between measurements")
    parser.add_argument("--rl-seeds", type=int, nargs="*", default=[0], help="one GRPO run per seed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # the task, its test split, the start policy
    probe = Trainer(make_config("grpo", max_completion_length=MAX_LENGTH))
    rows = []
    wanted = lambda name: args.only is None or name in args.only  # noqa: E731
    if args.rl_steps and wanted("gold reward itself"):
        for seed in args.rl_seeds:
            rows.append(
                {
                    "variant": "gold reward itself",
                    **rl_row(
                        gold_reward,
                        args.rl_steps,
                        args.prompts_per_step,
                        args.measure_prompts,
                        args.measure_every,
                        seed,
                    ),
                }
            )
            print(rows[-1], flush=True)
    if wanted("SFT mean log-likelihood, untrained"):
        sft, tokenizer, _ = load_checkpoint("addition_sft")
        # zero head: loglik only
        untrained = RewardModel(sft, tokenizer, readout="last_token+loglik", loglik_weight=1.0)
        rows += measure("SFT mean log-likelihood, untrained", untrained, probe, args)
        print(rows[-1], flush=True)
    for name, settings in VARIANTS.items():
        if not wanted(name):
            continue
        start = time.perf_counter()
        settings = dict(settings)
        model = None
        if settings.pop("after_probe", False):
            probe_trainer = RewardTrainer(RewardConfig(eval_every=0, seed=0, **PROBE))
            probe_trainer.train()
            model = probe_trainer.model
        trainer = RewardTrainer(RewardConfig(eval_every=0, seed=0, **settings), model=model)
        trainer.train()
        measured = measure(name, trainer.model, probe, args)
        seconds = round(time.perf_counter() - start)
        rows += [{**row, "seconds": seconds} for row in measured]
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    default = args.rl_steps == 60 and args.prompts_per_step == 8
    suffix = "" if default else f"_rl{args.rl_steps}x{args.prompts_per_step}"
    table.to_csv(out / f"reward_model_readout{suffix}.csv", index=False)
    pd.set_option("display.width", 250)
    print(table.drop(columns=[c for c in table.columns if c.endswith("_se") and c.startswith("bon")])
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("(standard errors of the best-of-n gains are in the csv; an accuracy near 0.5 on n pairs has SE "
          f"{math.sqrt(0.25 / 449):.3f} at n = 449)")


if __name__ == "__main__":
    main()
