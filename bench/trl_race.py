"""The lab's GRPO trainer against TRL's GRPOTrainer: same checkpoint, same settings, same reward.

    pip install -e ".[bench]"                                   # trl: only this script needs it
    python bench/trl_race.py --check                            # step 1 computes the same thing in both
    python bench/trl_race.py --rounds 3 --budget 60             # the race: s/step, accuracy after equal time
    python bench/trl_race.py --rounds 3 --budget 30 --clock cpu # the same on a machine shared with other jobs
    python bench/trl_race.py --rounds 3 --budget 60 --lab-without-kl-metric   # + the matched lab (below)

`--check` lets TRL sample one batch (32 prompts x 8 completions) from the shipped `addition_rl_start`
checkpoint and take its first step; the lab then scores the very same token ids with its own trainer
(`Trainer.loss_and_gradient`, on-policy) and the two must agree on the rewards (exactly), the group
advantages, the loss and the gradient norm, within the float tolerances printed beside them.

The race runs the two trainers in turn, each in a fresh process (round 1: lab, TRL; round 2: lab,
TRL; ...), for `--budget` seconds each (of wall time, or with `--clock cpu` of the process's CPU
time, which a machine shared with other jobs disturbs far less) or `--steps` steps, from the same
checkpoint, with round r's seed = r. The clock starts when the training loop starts (after both
trainers are built) and reads the time at the end of every optimiser step through each library's
own callback hooks, so it covers everything a step does: sampling, scoring, forwards, backward,
optimiser, metrics, logging. Reported per run: the median seconds per step, wall and CPU (step 1
excluded: first-call warm-up), and afterwards held-out greedy accuracy on the same 500 test
problems, measured for both by the lab's `greedy_accuracy` (TRL's final model comes back through
`from_hf`). The table gives the median over rounds, the median and range of the per-round ratio
TRL / lab (> 1: the lab is faster), the load average and the torch thread count; `--out` keeps
every run's step times.

`--lab-without-kl-metric` races a third trainer in every round (lab, lab without KL metric, TRL, ...):
the lab with `kl_metric_samples=0`, the matched setting. At beta = 0 TRL builds no reference model
and logs no KL; the default lab still runs its frozen reference on 32 completions per step for the
KL-to-reference columns of its dashboard (a metric, not part of the loss). With the metric off the lab
runs no reference forward at all and computes what TRL computes; the table then gives TRL's time over
each lab's, both measured in the same interleaved run.

Matched (SETTINGS below, with TRL's names): 32 prompts x num_generations 8 = one generation batch of
256 completions and one optimiser step per batch (TRL: per_device_train_batch_size 256,
gradient_accumulation_steps 1, steps_per_generation 1, num_iterations 1; lab: num_minibatches 1,
num_iterations 1), learning_rate 2e-4 constant (TRL's default is a linear decay: set to constant),
no warm-up, AdamW betas (0.9, 0.99) (TRL's adam_beta2 default 0.999: set to 0.99), eps 1e-8,
weight_decay 0, max_grad_norm 1.0, beta 0, epsilon 0.2, loss_type "grpo" (TRL's default "dapo": set),
scale_rewards "group", mask_truncated_completions False, temperature 1.0 with no top-k / top-p,
max_completion_length = the lab's completion budget, float32 (TRL's bf16 defaults to True, even on
a CPU: set False), no gradient checkpointing (TRL's default True: set False), no evaluation during
training, no checkpoint saving, no reporting (report_to "none"), no progress bar, the same torch
thread count, the same train split (20,000 problems) and the same reward (the lab's addition reward
on the completion's token ids, decoded by the lab's tokenizer up to EOS).

Not matched (each library does it its own way):
- Generation: TRL calls transformers' `generate` (the model from `to_hf`, eager attention, its
  dynamic cache and logits processors); the lab its own cached `generate`. Different samplers,
  different RNG streams: the same seed gives different completions.
- Prompts: TRL's RepeatSampler shuffles the train split (each prompt once per epoch, repeated G
  times); the lab draws each step's 32 prompts with replacement.
- Old log-probs: both skip the extra forward when the update is exactly on-policy (TRL: old =
  current.detach() when gradient_accumulation_steps is a multiple of steps_per_generation x
  num_iterations; the lab: the same rule).
- Reference model: at beta = 0 TRL builds none; the lab keeps a frozen copy and, for its KL metric
  only, runs it on `kl_metric_samples` (32, one per prompt) of the 256 completions every step:
  lab overhead. Matched by `--lab-without-kl-metric` (kl_metric_samples=0: no reference forward).
- Teacher-forced forward: the lab computes each distinct prompt once and shares its keys and values
  with its G completions; TRL runs the whole prompt + completion row for each completion.
- Log-probs: TRL patches the model with a fused, tiled LM head (log-probs and entropy without the full
  logits); the lab takes a float32 log-softmax of the (N, T, vocab) logits (a vocabulary of 58).
- Optimiser implementation: TRL's default `adamw_torch_fused`; the lab's `torch.optim.AdamW`, fused
  where torch has it. Same update rule.
- Bookkeeping: TRL computes its metrics every step (entropy, clip ratios, reward stats) and logs every
  `logging_steps` (10, its default); the lab computes its history row every step (entropy, KL, clip
  fractions, the per-step distributions its live plots show), snapshots the weights and optimiser
  so a failed step leaves no trace, and checks the weights are finite. Each keeps its defaults.
- Evaluation: neither evaluates while it trains (TRL: eval_strategy "no"; the lab: eval_every 0, its
  row-0 evaluation done before the clock starts, on 1 problem); both are evaluated once, after.
- Seeds: round r seeds both with r, but the two libraries draw different random numbers from it, so
  the runs are different samples of the same experiment (the accuracy spread over rounds says how
  much that matters).
- Data loading: TRL goes through a torch DataLoader (num_workers 0) of a `datasets.Dataset`; the lab
  indexes a Python list.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from rlhf_lab.checkpoints import checkpoint_folder, load_checkpoint
from rlhf_lab.model.hf import from_hf, to_hf
from rlhf_lab.rl import PolicyOutput, Rollout, Trainer, make_config, score_completions
from rlhf_lab.text.hf_tokenizer import HFTokenizer
from rlhf_lab.train.callbacks import Callback
from rlhf_lab.train.evaluate import greedy_accuracy, standard_error
from rlhf_lab.util.allocator import keep_freed_memory
from rlhf_lab.util.device import cpu_name

CHECKPOINT = "addition_rl_start"
# The lab's names; TRL's are given where they differ (trl_config maps them).
SETTINGS = dict(
    init_checkpoint=CHECKPOINT,
    prompts_per_step=32,  # TRL: per_device_train_batch_size = 32 * num_generations completions
    num_generations=8,
    learning_rate=2e-4,
    beta=0.0,
    epsilon=0.2,
    loss_type="grpo",
    scale_rewards="group",
    temperature=1.0,
    max_grad_norm=1.0,
    num_iterations=1,
    num_minibatches=1,  # TRL: steps_per_generation = gradient_accumulation_steps = 1
    bf16=False,  # float32 on both sides
    gradient_checkpointing=False,
    warmup_steps=0,
    weight_decay=0.0,
)
ADAM_BETAS = (0.9, 0.99)  # the lab's AdamW (rlhf_lab/rl/trainer.py); TRL is told the same
FP32_EPS = torch.finfo(torch.float32).eps


def lab_config(seed: int = 0, **overrides):
    """The lab's GRPO config with SETTINGS; no evaluation during training (the race evaluates after)."""
    return make_config("grpo", SETTINGS, seed=seed, eval_every=0, eval_examples=1, **overrides)


# ----------------------------------------------------------------------------------------------
# TRL's side, built from the same local files


class RecordedReward:
    """The lab's reward in TRL's reward-function signature:

        f(prompts, completions, completion_ids, answer, **kwargs) -> list[float], one per completion

    Each completion's token ids are decoded by the lab's tokenizer up to EOS (finished = an EOS was
    emitted), exactly as the lab's rollout does, and scored by the lab's reward function. The last
    call's inputs and rewards are kept (`last`) for the step-1 check."""

    def __init__(self, reward_fn, tokenizer) -> None:
        self.reward_fn, self.tokenizer = reward_fn, tokenizer
        self.__name__ = "lab_reward"  # TRL names its reward metrics after the function
        self.last: dict | None = None

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
        texts, finished = zip(*(self.tokenizer.decode_until_eos(ids) for ids in completion_ids))
        rewards = score_completions(self.reward_fn, prompts, texts, answer, finished)
        self.last = {"prompts": list(prompts), "completion_ids": [list(ids) for ids in completion_ids],
                     "rewards": rewards}
        return rewards.tolist()


def trl_config(output_dir: str, seed: int, max_steps: int, max_completion_length: int, logging_steps: int = 10):
    from trl import GRPOConfig

    s = SETTINGS
    return GRPOConfig(
        output_dir=output_dir, seed=seed, max_steps=max_steps, use_cpu=True,
        per_device_train_batch_size=s["prompts_per_step"] * s["num_generations"], gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=s["num_generations"], num_iterations=s["num_iterations"],
        learning_rate=s["learning_rate"], lr_scheduler_type="constant", warmup_steps=s["warmup_steps"],
        adam_beta1=ADAM_BETAS[0], adam_beta2=ADAM_BETAS[1], weight_decay=s["weight_decay"],
        max_grad_norm=s["max_grad_norm"], beta=s["beta"], epsilon=s["epsilon"], loss_type=s["loss_type"],
        scale_rewards=s["scale_rewards"], mask_truncated_completions=False,  # DAPO's option (rl/dapo.py): off
        temperature=s["temperature"], top_k=0, top_p=1.0, max_completion_length=max_completion_length,
        bf16=False, fp16=False, gradient_checkpointing=s["gradient_checkpointing"],
        eval_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        logging_steps=logging_steps, dataloader_num_workers=0,
    )


def build_trl(seed: int, max_steps: int, callbacks=(), trainer_class=None, logging_steps: int = 10):
    """TRL's GRPOTrainer on the shipped checkpoint (converted with `to_hf`, its tokenizer through
    `HFTokenizer`), the lab's train split and reward. Returns (trainer, reward, lab pieces)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    lab = Trainer(lab_config(seed))  # the split, the completion budget and the reward, exactly as the lab has them
    model, _, _ = load_checkpoint(CHECKPOINT)
    hf_model = to_hf(model).train()
    hf_tokenizer = HFTokenizer.from_pretrained(checkpoint_folder(CHECKPOINT)).hf
    dataset = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in lab.train_examples])
    reward = RecordedReward(lab.reward_fn, lab.tokenizer)
    args = trl_config(tempfile.mkdtemp(prefix="trl_race_"), seed, max_steps, lab.max_completion_length,
                      logging_steps=logging_steps)
    trainer = (trainer_class or GRPOTrainer)(model=hf_model, reward_funcs=[reward], args=args,
                                             train_dataset=dataset, processing_class=hf_tokenizer,
                                             callbacks=list(callbacks))
    return trainer, reward, lab


# ----------------------------------------------------------------------------------------------
# One run of the race (a fresh process each)


class Clock:
    """Wall time and this process's CPU time at the end of each step, from the start of the training
    loop; says when the budget (on the `budget_clock`) or the step count is used up.

    CPU time (`time.process_time`, every thread of the process) counts only the time the process ran:
    on a machine shared with other jobs it stays close to what the step costs, where wall time also
    counts the waits for a core. With one torch thread on an idle machine the two agree."""

    def __init__(self, budget: float | None, steps: int | None, budget_clock: str = "wall") -> None:
        self.budget, self.steps, self.budget_clock = budget, steps, budget_clock
        self.start: dict[str, float] = {}
        self.ends: dict[str, list[float]] = {"wall": [], "cpu": []}

    @staticmethod
    def now() -> dict[str, float]:
        return {"wall": time.perf_counter(), "cpu": time.process_time()}

    def begin(self) -> None:
        self.start = self.now()

    def tick(self) -> bool:
        """Record a step's end; True when the budget (or the step count) is used up."""
        for name, value in self.now().items():
            self.ends[name].append(value - self.start[name])
        return (self.budget is not None and self.ends[self.budget_clock][-1] >= self.budget) or (
            self.steps is not None and len(self.ends["wall"]) >= self.steps)

    def summary(self) -> dict:
        out = {"steps": len(self.ends["wall"])}
        for name, ends in self.ends.items():
            times = [b - a for a, b in zip([0.0] + ends, ends)]
            later = times[1:] or times  # step 1 pays first-call warm-up in both libraries
            out |= {f"{name}_train_s": ends[-1], f"{name}_step_s": statistics.median(later),
                    f"{name}_first_step_s": times[0], f"{name}_step_times": [round(t, 4) for t in times]}
        return out


class LabClock(Callback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_begin(self, trainer) -> None:
        self.clock.begin()

    def on_step_end(self, trainer, metrics, distributions=None) -> None:
        if self.clock.tick():
            trainer.request_stop("budget")


# The lab's variants in the race: its defaults, and the setting matched to TRL at beta = 0 (no KL
# metric, so no reference forward: TRL builds no reference model).
LAB_VARIANTS = {"lab": {}, "lab-no-kl": {"kl_metric_samples": 0}}
TRAINER_NAMES = {"lab": "lab rl.Trainer", "lab-no-kl": "lab rl.Trainer, no KL metric (matched)",
                 "trl": "TRL GRPOTrainer"}


def run_lab(seed: int, budget: float | None, steps: int | None, budget_clock: str, variant: str = "lab") -> dict:
    clock = Clock(budget, steps, budget_clock)
    trainer = Trainer(lab_config(seed, steps=10**9, **LAB_VARIANTS[variant]))
    trainer.train(steps=0)  # row 0 (the start) outside the clock
    trainer.add_callback(LabClock(clock))
    trainer.train()
    accuracy = greedy_accuracy(trainer.policy, trainer.tokenizer, trainer.task, trainer.test_examples,
                               max_new_tokens=trainer.max_completion_length)
    return {**clock.summary(), "accuracy": accuracy, "n_test": len(trainer.test_examples)}


def run_trl(seed: int, budget: float | None, steps: int | None, budget_clock: str) -> dict:
    from transformers import TrainerCallback

    clock = Clock(budget, steps, budget_clock)

    class TRLClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, args, state, control, **kwargs):
            if clock.tick():
                control.should_training_stop = True

    trainer, _, lab = build_trl(seed, max_steps=10**9 if steps is None else steps, callbacks=[TRLClock()])
    trainer.train()
    model = from_hf(trainer.model)  # TRL's weights in the lab's model: the same evaluation for both
    accuracy = greedy_accuracy(model, lab.tokenizer, lab.task, lab.test_examples,
                               max_new_tokens=lab.max_completion_length)
    return {**clock.summary(), "accuracy": accuracy, "n_test": len(lab.test_examples)}


def worker(args) -> None:
    torch.set_num_threads(args.threads)
    if args.worker == "trl":
        result = run_trl(args.seed, args.budget, args.steps, args.clock)
    else:
        result = run_lab(args.seed, args.budget, args.steps, args.clock, variant=args.worker)
    result["threads"] = torch.get_num_threads()  # after training: neither library changed it
    print(json.dumps(result))


def spawn(name: str, seed: int, args) -> dict:
    command = [sys.executable, __file__, "--worker", name, "--seed", str(seed), "--threads", str(args.threads),
               "--clock", args.clock]
    if args.budget is not None:
        command += ["--budget", str(args.budget)]
    if args.steps is not None:
        command += ["--steps", str(args.steps)]
    load_before = os.getloadavg()[0]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{name} run failed:\n{out.stderr[-4000:]}")
    return {"trainer": name, "seed": seed, "load": [load_before, os.getloadavg()[0]],
            **json.loads(out.stdout.strip().splitlines()[-1])}


def race(args) -> None:
    import transformers
    import trl

    runs = {"lab": [], "lab-no-kl": [], "trl": []} if args.lab_without_kl_metric else {"lab": [], "trl": []}
    for round_ in range(args.rounds):
        for name in runs:  # lab, TRL, lab, TRL, ...: load drift hits every trainer alike
            runs[name].append(spawn(name, round_, args))
            r = runs[name][-1]
            print(f"round {round_ + 1} {name:9s} seed {round_}: {r['steps']} steps in {r['wall_train_s']:.1f} s "
                  f"({r['cpu_train_s']:.1f} s CPU), {r['wall_step_s'] * 1000:.0f} ms/step ({r['cpu_step_s'] * 1000:.0f} "
                  f"CPU; medians, step 1 excluded), accuracy {r['accuracy']:.3f}, "
                  f"load {r['load'][0]:.2f}-{r['load'][1]:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps([r for rs in runs.values() for r in rs], indent=1))
    loads = [load for rs in runs.values() for r in rs for load in r["load"]]
    limit = f"{args.budget:g} s ({args.clock} clock)" if args.budget is not None else f"{args.steps} steps"
    threads = sorted({r["threads"] for rs in runs.values() for r in rs})
    print(f"\nRace against TRL, {date.today()}, {cpu_name()}, "
          f"{os.cpu_count()} cores, {'/'.join(map(str, threads))} torch thread(s), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, trl {trl.__version__}; 1-minute load average "
          f"{min(loads):.2f}-{max(loads):.2f}; {args.rounds} interleaved rounds of {limit} per run\n")
    print("| trainer | s/step | CPU s/step | steps | accuracy after the run (round 1, 2, ...) | mean accuracy "
          "| TRL / this s/step (median, range) | TRL / this CPU s/step (median, range) |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for name, rs in runs.items():
        accuracies = [r["accuracy"] for r in rs]
        mean = statistics.mean(accuracies)
        spread = (f"{statistics.stdev(accuracies) / math.sqrt(len(accuracies)):.3f} (s.e. over seeds)" if len(rs) > 1
                  else f"{standard_error(mean, rs[0]['n_test']):.3f} (binomial s.e.)")
        ratios = []
        for clock in ("wall", "cpu"):  # TRL's step over this trainer's, round by round (> 1: this one is faster)
            r = [t[f"{clock}_step_s"] / this[f"{clock}_step_s"] for this, t in zip(rs, runs["trl"])]
            ratios.append(f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
        print(f"| {TRAINER_NAMES[name]} | "
              f"{statistics.median(r['wall_step_s'] for r in rs):.3f} | {statistics.median(r['cpu_step_s'] for r in rs):.3f} | "
              f"{statistics.median(r['steps'] for r in rs):.0f} | {', '.join(f'{a:.3f}' for a in accuracies)} | "
              f"{mean:.3f} +- {spread} | {' | '.join(ratios)} |")
    start = load_checkpoint(CHECKPOINT)[2].get("accuracy")
    print(f"\ns/step: median over rounds of each run's median step (step 1 excluded). Accuracy: greedy exact match "
          f"on the same {rs[0]['n_test']} held-out problems, by the lab's greedy_accuracy for both (the start "
          f"checkpoint: {start})")


# ----------------------------------------------------------------------------------------------
# --check: step 1 of both on the same batch


def rollout_from_ids(prompts_ids, completions_ids, rewards, num_generations, tokenizer, max_completion_length):
    """A lab Rollout of given token ids (no sampling): left-padded prompts, right-padded completions,
    rows in generation order (the G completions of a prompt are contiguous)."""
    n = len(prompts_ids)
    P, T = max(map(len, prompts_ids)), max(max(map(len, completions_ids)), 1)
    ids = torch.full((n, P + T), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, P + T), dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompts_ids, completions_ids)):
        ids[row, P - len(p): P] = torch.tensor(p)
        ids[row, P: P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[row, P - len(p): P + len(c)] = 1
    finished = torch.tensor([bool(c) and c[-1] == tokenizer.eos_token_id for c in completions_ids])
    return Rollout(input_ids=ids, attention_mask=attention, prompt_width=P, completion_ids=ids[:, P:],
                   completion_mask=attention[:, P:].float(), rewards=rewards.float(), correct=torch.zeros(n),
                   finished=finished, num_generations=num_generations, max_completion_length=max_completion_length)


def float64_reference(lab, rollout) -> tuple[float, float]:
    """(loss, gradient norm) of the same batch in float64: the starting weights in transformers' Llama
    (`to_hf`) cast to float64, the lab's GRPO loss on its log-probs. What both float32 results approximate."""
    model = to_hf(lab.policy).double().train()
    P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
    logits = model(rollout.input_ids[:, :-1], attention_mask=rollout.attention_mask[:, :-1]).logits
    logits = logits[:, P - 1: P - 1 + T] / SETTINGS["temperature"]  # position P-1+t predicts completion token t
    logprobs = torch.log_softmax(logits, -1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    batch = dataclasses.replace(rollout, advantages=rollout.advantages.double(), old_logprobs=logprobs.detach(),
                                completion_mask=rollout.completion_mask.double())
    loss, _ = lab.algorithm.loss(batch, PolicyOutput(logprobs=logprobs, entropy=None, values=None))
    gradients = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return loss.item(), float(torch.cat([g.flatten() for g in gradients]).norm())


def check(args) -> bool:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(args.threads)
    recorded = {}

    class RecordingGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that keeps the batch its loss saw (compute_loss is the Trainer's override hook)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            recorded["inputs"] = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            recorded["loss"] = loss.item()
            return loss

    class GradNorm(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "grad_norm" in logs:
                recorded["grad_norm"] = float(logs["grad_norm"])

    trl_trainer, reward, lab = build_trl(args.seed, max_steps=1, callbacks=[GradNorm()],
                                         trainer_class=RecordingGRPOTrainer, logging_steps=1)
    trl_trainer.train()

    # The lab, at the same starting weights, on TRL's batch in generation order.
    tokenizer, G = lab.tokenizer, SETTINGS["num_generations"]
    prompts_ids = [tokenizer.encode(p, add_bos=True) for p in reward.last["prompts"]]
    rollout = rollout_from_ids(prompts_ids, reward.last["completion_ids"], reward.last["rewards"], G, tokenizer,
                               lab.max_completion_length)
    lab.algorithm.compute_advantages(rollout)
    lab_advantages = rollout.advantages[:, 0]
    result = lab.loss_and_gradient(rollout, on_policy=True)
    lab_grad_norm = float(result.gradient.norm())

    # TRL shuffled the batch before its loss: match its rows to ours by their tokens.
    inputs = recorded["inputs"]
    trl_by_row = {}
    for p, pm, c, cm, a in zip(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                               inputs["completion_mask"], inputs["advantages"]):
        trl_by_row[tuple(p[pm.bool()].tolist()), tuple(c[cm.bool()].tolist())] = float(a)
    keys = [(tuple(p), tuple(c)) for p, c in zip(prompts_ids, reward.last["completion_ids"])]
    trl_advantages = torch.tensor([trl_by_row[k] for k in keys])

    n_tokens = int(rollout.completion_mask.sum())
    scale = float(lab_advantages.abs().max())
    # Tolerances, from fp32 rounding (eps = 2^-23) and the size of each reduction:
    #  - advantages: (r - mean) / (std + 1e-4) over a group of 8, a few roundings each: 8 eps x |A|max.
    #  - loss: on-policy the ratio is exactly 1, so loss = -mean_i A_i (in exact arithmetic 0: each group's
    #    advantages sum to 0); a sum of n terms rounds by at most ~log2(n) eps x mean|A| per
    #    implementation, so 2 log2(N) eps x |A|max covers both.
    #  - gradient norm: two different forward/backward codes (the lab's attention and log-softmax against
    #    transformers' and TRL's fused LM head) whose float32 errors add up over the ~n_tokens terms each
    #    gradient entry sums: random-walk growth, sqrt(n_tokens) eps, with a safety factor of 10, relative.
    tolerances = {
        "advantages": 8 * FP32_EPS * scale,
        "loss": 2 * math.log2(len(rollout)) * FP32_EPS * scale,
        "grad_norm": 10 * math.sqrt(n_tokens) * FP32_EPS * lab_grad_norm,
    }
    rewards_equal = bool(torch.equal(reward.last["rewards"].float(), rollout.rewards))
    exact_loss, exact_grad_norm = float64_reference(lab, rollout)
    rows = [  # name, lab - TRL, tolerance, lab - float64, TRL - float64
        ("advantages (max abs diff)", float((lab_advantages - trl_advantages).abs().max()), tolerances["advantages"],
         None, None),
        ("loss", abs(result.loss - recorded["loss"]), tolerances["loss"], result.loss - exact_loss,
         recorded["loss"] - exact_loss),
        ("grad norm (pre-clip)", abs(lab_grad_norm - recorded["grad_norm"]), tolerances["grad_norm"],
         lab_grad_norm - exact_grad_norm, recorded["grad_norm"] - exact_grad_norm),
    ]
    print(f"Step 1 on TRL's batch: {len(rollout)} completions ({n_tokens} completion tokens), "
          f"mean reward {float(rollout.rewards.mean()):.4f}, rewards identical: {'yes' if rewards_equal else 'NO'}")
    print(f"lab loss {result.loss:.6e}  TRL loss {recorded['loss']:.6e}  |  "
          f"lab grad norm {lab_grad_norm:.8f}  TRL grad norm {recorded['grad_norm']:.8f}")
    print(f"float64 reference: loss {exact_loss:.6e}, grad norm {exact_grad_norm:.8f}\n")
    print("| quantity | abs(lab - TRL) | tolerance | within | lab - float64 | TRL - float64 |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    ok = rewards_equal
    for name, diff, tol, lab_error, trl_error in rows:
        ok &= diff <= tol
        errors = " | ".join("-" if e is None else f"{e:.2e}" for e in (lab_error, trl_error))
        print(f"| {name} | {diff:.2e} | {tol:.2e} | {'yes' if diff <= tol else 'NO'} | {errors} |")
    print("check passed" if ok else "check FAILED")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="step 1 of both on the same batch, then exit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=None, help="seconds of training per run (default 60)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (instead of, or as well as, --budget)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="what --budget counts: wall time, or the process's CPU time (fairer on a loaded machine)")
    parser.add_argument("--seed", type=int, default=0, help="--check's seed (the race uses seed = round)")
    parser.add_argument("--out", default=None, help="also write every run (with each step's time) to this JSON file")
    parser.add_argument("--lab-without-kl-metric", action="store_true",
                        help="also race the lab with kl_metric_samples=0 (no reference forward, as TRL at beta = 0)")
    parser.add_argument("--worker", choices=tuple(TRAINER_NAMES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    keep_freed_memory()  # the allocator tuning the CLI turns on (rlhf_lab/util/allocator.py)
    if args.budget is None and args.steps is None:
        args.budget = 60.0
    if args.worker:
        worker(args)
    elif args.check:
        sys.exit(0 if check(args) else 1)
    else:
        race(args)


if __name__ == "__main__":
    main()
