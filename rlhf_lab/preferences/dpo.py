"""DPO and IPO: learn from preference pairs directly, without a reward model or a sampling loop.

DPO (Rafailov et al. 2023, arXiv 2305.18290) shows that the policy maximising
E[r] - beta KL(pi || pi_ref) makes r(x, y) = beta log pi(y|x)/pi_ref(y|x) + const, so the Bradley-Terry
likelihood of the preferences can be written with the policy itself in place of a reward model.
For a pair (x, y_w chosen, y_l rejected), with log pi(y|x) summed over the completion's tokens:

    r_hat(x, y) = beta * (log pi(y|x) - log pi_ref(y|x))                      implicit reward
    h           = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)]
    "sigmoid"   loss = -log sigmoid(beta h)                                  DPO, eq. 7
    label_smoothing eps:  -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)   conservative DPO
    "ipo"       loss = (h - 1 / (2 beta))^2                                  IPO (Azar et al. 2023, eq. 17)

Names are TRL's DPOTrainer / DPOConfig ones (`beta`, `loss_type`, `label_smoothing`; the metrics
`rewards/chosen`, `rewards/rejected`, `rewards/margins`, `rewards/accuracies`, `logps/chosen`,
`logps/rejected`).

Which log-probabilities IPO uses: the IPO paper writes sums over tokens, as DPO does; TRL's
`loss_type="ipo"` divides each completion's summed log-prob by its number of tokens before forming h
(`DPOTrainer.concatenated_forward` in trl/trainer/dpo_trainer.py, TRL main branch, 2025). The lab follows TRL: with loss_type="ipo" the
trainer averages over completion tokens (and so do its implicit rewards); `ipo_loss` itself takes
whatever log-probs it is given. The `logps/*` metrics are always the summed log-probs: the
log-probability of the whole completion.

    trainer = DPOTrainer(DPOConfig(beta=0.1), pairs=pairs)        # offline: the fixed pairs
    trainer = DPOTrainer(DPOConfig(online=True), judge=reward_model)  # online: fresh pairs each step
    trainer.train(steps=100)
    trainer.history[["rewards/margins", "logps/chosen", "logps/rejected"]]

The reference model's log-probs of every offline pair are computed once, at construction (pi_ref
never changes); an online step scores its fresh pairs under pi_ref as it makes them.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..rl.rollout import Rollout, encode_rollout, policy_forward, sample_and_score
from ..sampling import SamplingConfig
from ..tasks import get_task, task_names
from ..tasks.jsonl import SPLIT_N_TRAIN
from ..tasks.rewards import check_reward_fn
from ..train.evaluate import completion_budget, greedy_accuracy
from ..train.loop import SupervisedLoop, backward_and_step
from ..train.run_state import weights_sha256
from ..util.device import autocast, check_device, pick_device
from ..util.limits import (
    check_memory,
    check_positions,
    check_sequence_length,
    generation_bytes,
    training_bytes,
)
from ..util.validation import Validated, check_choice, check_number, setting
from .overoptimization import sequence_kl

LOSS_TYPES = ("sigmoid", "ipo")  # TRL's names: "sigmoid" is DPO's loss

# ----------------------------------------------------------------------------------------------
# the losses (pure functions of four (B,) tensors of sequence log-probs)


def check_loss_settings(beta, loss_type: str = "sigmoid", label_smoothing=0.0) -> None:
    check_number("beta", beta, low=0, low_open=True)
    check_choice("loss_type", loss_type, LOSS_TYPES)
    # eps = 0.5 would weigh "y_w wins" and "y_l wins" equally: no preference left to learn
    check_number("label_smoothing", label_smoothing, low=0, high=0.5, high_open=True)
    if loss_type == "ipo" and label_smoothing:
        raise ValueError(f"label_smoothing must be 0 with loss_type='ipo' (it is conservative DPO's, for "
                         f"loss_type='sigmoid'), got {label_smoothing!r}")


def preference_logits(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
                      ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor) -> torch.Tensor:
    """h = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)], (B,): how much more the
    policy (relative to the reference) prefers the chosen completion than the rejected one.
    TRL calls it `logits`."""
    return (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)


def implicit_rewards(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward r_hat(x, y) = beta * (log pi(y|x) - log pi_ref(y|x)), same shape as the inputs.
    The reward model hidden in the policy; 0 for every completion before training (pi = pi_ref)."""
    check_number("beta", beta, low=0, low_open=True)
    return beta * (policy_logps - ref_logps)


def ipo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """IPO's loss per pair, (B,): (h - 1 / (2 beta))^2 (Azar et al. 2023, eq. 17; beta is their tau).

    A squared loss with a finite target: h is pulled to 1/(2 beta) and no further, where DPO's
    -log sigmoid(beta h) keeps rewarding a larger h (so a pair that is always won can be pushed to
    h -> infinity, the overfitting IPO was written to prevent)."""
    check_number("beta", beta, low=0, low_open=True)
    h = preference_logits(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    return (h - 1 / (2 * beta)) ** 2


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float = 0.1,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> torch.Tensor:
    """The preference loss per pair, (B,) (take `.mean()` for a batch's loss).

    Args:
        policy_chosen_logps, policy_rejected_logps: (B,) log pi(y_w|x), log pi(y_l|x) under the policy
            being trained (summed over completion tokens; averaged for TRL's IPO, see the module docstring).
        ref_chosen_logps, ref_rejected_logps: (B,) the same under the frozen reference pi_ref.
        beta: the KL strength of the objective the loss optimises; a larger beta keeps pi closer to pi_ref.
        loss_type: "sigmoid" (DPO) or "ipo".
        label_smoothing: eps, the assumed probability that a label is flipped (conservative DPO,
            Mitchell 2023); "sigmoid" only.
    """
    check_loss_settings(beta, loss_type, label_smoothing)
    if loss_type == "ipo":
        return ipo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    h = preference_logits(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    eps = label_smoothing
    # -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h); logsigmoid is exact for large |beta h|
    return -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)


# ----------------------------------------------------------------------------------------------
# sequence log-probs of pairs


def pair_texts(pair) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) of a pair: an object with those attributes or a 3-tuple."""
    if all(hasattr(pair, name) for name in ("prompt", "chosen", "rejected")):
        return pair.prompt, pair.chosen, pair.rejected
    if isinstance(pair, (tuple, list)) and len(pair) == 3:
        return tuple(pair)
    raise ValueError(f"a pair must have prompt, chosen and rejected (attributes or a 3-tuple), got {pair!r}")


def encode_pairs(tokenizer, pairs: Sequence, device=None) -> Rollout:
    """The pairs as one Rollout of 2B rows (no sampling): rows 0..B-1 the chosen completions, rows
    B..2B-1 the rejected ones, prompts left-padded (`rl.encode_rollout`). A completion ends with EOS
    unless its pair says it was cut off (`chosen_finished` / `rejected_finished` False): the EOS is
    part of what the policy chose, and its log-prob counts."""
    if not pairs:
        raise ValueError("pairs must hold at least one (prompt, chosen, rejected) pair, got none")
    prompts, chosen, rejected = zip(*(pair_texts(p) for p in pairs))
    finished = ([bool(getattr(p, "chosen_finished", True)) for p in pairs]
                + [bool(getattr(p, "rejected_finished", True)) for p in pairs])
    return encode_rollout(tokenizer, list(prompts) * 2, list(chosen) + list(rejected), finished, device=device)


def sequence_logprobs(model, rollout: Rollout, chunk_size: int | None = None) -> torch.Tensor:
    """log pi(y|x) of every row's completion, (N,): the token log-probs (EOS included) summed over the
    completion mask. Under autocast on a GPU; float32 log-softmax. `chunk_size` rows per forward
    (no-grad scoring of many pairs); None: one forward, with gradient if enabled."""
    if chunk_size is None:
        with autocast(rollout.input_ids.device):
            token_logps = policy_forward(model, rollout).logprobs  # (N, T)
        return (token_logps * rollout.completion_mask).sum(1)
    rows = torch.arange(len(rollout), device=rollout.input_ids.device)
    return torch.cat([sequence_logprobs(model, rollout.select(part)) for part in rows.split(chunk_size)])


@torch.no_grad()
def greedy_scores(model, tokenizer, task, examples: Sequence, reward_fn, max_new_tokens: int | None = None,
                  return_completions: bool = False):
    """(exact match (N,) 0/1, `reward_fn` (N,)) of `model`'s greedy completions of `examples`, from one
    generation: the held-out gold metric of any policy (DPO's, or an RL `Trainer.policy`). With
    return_completions=True also the completions' texts (as `greedy_accuracy` returns them), so one
    generation serves every measurement of the same answers."""
    greedy = SamplingConfig(do_sample=False, max_new_tokens=max_new_tokens or completion_budget(examples))
    was_training = model.training
    model.eval()
    try:
        rollout = sample_and_score(model, tokenizer, examples, 1, greedy, reward_fn, task)
    finally:
        model.train(was_training)
    scores = rollout.correct.cpu(), rollout.rewards.cpu()
    if not return_completions:
        return scores
    return (*scores, [tokenizer.decode_until_eos(row)[0] for row in rollout.completion_ids.tolist()])


@torch.no_grad()
def sampled_kl(policy, ref_model, tokenizer, task, examples: Sequence, num_generations: int = 4,
               temperature: float = 1.0, max_new_tokens: int | None = None, seed: int = 0) -> torch.Tensor:
    """KL(pi || pi_ref) per prompt, (len(examples),) in nats per completion: how far DPO moved the
    policy, the quantity beta prices. `num_generations` fresh samples y ~ pi per prompt (eval mode, a
    generator seeded with `seed`), each scored by `overoptimization.sequence_kl` (the exact next-token
    KL summed along the sampled path: never negative, and less noisy than log pi(y) - log pi_ref(y)),
    averaged per prompt. Take the standard error over prompts: the samples of a prompt are correlated."""
    sampling = SamplingConfig(do_sample=True, temperature=temperature,
                              max_new_tokens=max_new_tokens or completion_budget(examples))
    was_training = policy.training
    policy.eval()
    try:
        rollout = sample_and_score(policy, tokenizer, examples, num_generations, sampling, lambda *args: 0.0, task,
                                   torch.Generator(policy.device).manual_seed(seed))
        kl = sequence_kl(policy, ref_model, rollout, temperature)
    finally:
        policy.train(was_training)
    return kl.view(-1, num_generations).mean(1).cpu()


# ----------------------------------------------------------------------------------------------
# the trainer


@dataclass
class DPOConfig(Validated):
    """Settings of one DPO / IPO run (names from TRL's DPOConfig where it has them); each field
    declares what it accepts (rlhf_lab.util.validation), checked at construction and on assignment."""

    beta: float = setting(0.1, gt=0, help="TRL's default; IPO's tau")
    loss_type: str = setting("sigmoid", choices=LOSS_TYPES, help="sigmoid (DPO) or ipo")
    # eps = 0.5 would weigh "y_w wins" and "y_l wins" equally: no preference left to learn
    label_smoothing: float = setting(0.0, ge=0, lt=0.5, help="conservative DPO's eps")
    # --- where we start
    init_checkpoint: str = setting("addition_rl_start", help="policy and reference: a checkpoint or folder")
    task: str = setting("addition", choices=task_names, help="held-out evaluation, and online DPO's prompts")
    task_params: dict = setting(default_factory=lambda: {"digits": 3}, help="the task's parameters")
    n_train: int = setting(SPLIT_N_TRAIN, ge=1, help="the split every lab trainer uses")
    n_test: int = setting(500, ge=1, help="held-out split")
    # --- online DPO: fresh pairs from the current policy, labelled by a judge (a reward model)
    online: bool = setting(False, help="sample fresh pairs each step and let the judge label them")
    temperature: float = setting(1.0, gt=0, help="sampling temperature of online pairs")
    max_completion_length: int | None = setting(None, ge=1, help="None: the task's longest answer + EOS + 2")
    # --- optimisation
    batch_size: int = setting(32, ge=1, help="pairs per step (online: prompts per step, two samples each)")
    learning_rate: float = setting(1e-4, gt=0, le=1, help="AdamW learning rate")
    warmup_steps: int = setting(0, ge=0, help="linear warm-up steps")
    weight_decay: float = setting(0.0, ge=0, help="AdamW's, on weight matrices only (as SFT)")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    # --- schedule and bookkeeping
    steps: int = setting(100, ge=0, help="optimiser steps")
    time_budget: float | None = setting(None, gt=0, help="seconds of training (evaluation excluded)")
    eval_every: int = setting(20, ge=0, help="steps between evaluations; 0: never evaluate")
    eval_examples: int = setting(200, ge=1, help="held-out problems per evaluation (<= n_test)")
    seed: int = setting(0, ge=0, help="batch order and online sampling")
    device: str = setting("cpu", check=check_device, help="cpu, cuda, cuda:N, mps or auto")

    def check(self) -> None:
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError(f"label_smoothing must be 0 with loss_type='ipo' (it is conservative DPO's, for "
                             f"loss_type='sigmoid'), got {self.label_smoothing!r}")
        if self.eval_examples > self.n_test:
            raise ValueError(f"eval_examples ({self.eval_examples}) must be <= n_test ({self.n_test}): "
                             "evaluation draws its problems from the test split")
        get_task(self.task, **self.task_params)  # validates the task's own parameters

    def to_dict(self) -> dict:
        return asdict(self)


HISTORY_COLUMNS = (
    "step", "wall_time", "step_time", "loss", "rewards/chosen", "rewards/rejected", "rewards/margins",
    "rewards/accuracies", "logps/chosen", "logps/rejected", "eval_accuracy", "eval_gold_reward",
    "eval_rewards/accuracies", "eval_rewards/margins", "eval_logps/chosen", "eval_logps/rejected", "pairs",
    "grad_norm", "lr",
)


class DPOTrainer(SupervisedLoop):
    """DPO / IPO fine-tuning of `model` (default: `config.init_checkpoint`) on preference pairs.

    Args:
        config: the run's settings.
        model, tokenizer: the policy to train (moved to `config.device`); its frozen copy is pi_ref.
            None loads `config.init_checkpoint`.
        pairs: offline training pairs: objects with `prompt`, `chosen`, `rejected` (e.g. the shipped
            `PreferencePair`s) or (prompt, chosen, rejected) tuples. Required unless `config.online`.
        judge: online DPO's labeller: a reward callable (prompt, completion, answer, finished) -> float or
            an object with `score_batch` (a reward model). Of two samples the higher-scored is chosen;
            ties (often two identical samples) are dropped.
        gold_fn: the held-out gold metric: a reward callable scoring the greedy completions of
            `eval_examples` (column `eval_gold_reward`); None: no gold column.
        eval_pairs: held-out pairs, oriented by the gold preference: `eval_rewards/accuracies` is the
            fraction whose implicit reward ranks them as gold does (ties count half).
        train_examples: online DPO's prompts (task `Example`s); default the task's training split.
        eval_examples: held-out `Example`s; default the first `config.eval_examples` of the test split.
        callbacks: `rlhf_lab.train.callbacks.Callback`s (LiveDashboard, ProgressBar, ...).

    After `train()`: `history` (row 0 = the model before training; TRL's metric names), `step`,
    `train_time` and `stop_reason`, as for the other trainers.
    """

    dashboard_kind = "dpo"  # LiveDashboard draws the DPO panels for this trainer
    history_columns = HISTORY_COLUMNS
    # The optimiser, checkpointing and NaN handling are SupervisedLoop's (as SFT's and the reward
    # model's); DPO keeps the RL trainer's AdamW betas and a constant rate after the warm-up.
    adam_betas = (0.9, 0.99)
    lr_schedule = "constant"

    def __init__(self, config: DPOConfig, model=None, tokenizer=None, pairs: Sequence | None = None, judge=None,
                 gold_fn=None, eval_pairs: Sequence | None = None, train_examples: Sequence | None = None,
                 eval_examples: Sequence | None = None, callbacks=()) -> None:
        self.config = config
        self.device = pick_device(config.device)
        torch.manual_seed(config.seed)
        from ..checkpoints import model_and_tokenizer

        model, tokenizer = model_and_tokenizer(model, tokenizer, config.init_checkpoint)
        if config.online and judge is None:
            raise ValueError("judge is required when config.online is True: it labels the fresh pairs")
        for name, reward in (("judge", judge), ("gold_fn", gold_fn)):
            if reward is not None:
                check_reward_fn(reward, name)
        if not config.online and not pairs:
            raise ValueError("pairs must hold at least one (prompt, chosen, rejected) pair when config.online "
                             "is False")
        self.tokenizer = tokenizer
        self.model = model.to(self.device).train()
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.judge, self.gold_fn = judge, gold_fn
        self.task = get_task(config.task, **config.task_params)
        train, test = self.task.make_split(0, config.n_train, config.n_test)  # data seed fixed, as in RL
        self.train_examples = list(train if train_examples is None else train_examples)
        self.eval_examples = list(test[: config.eval_examples] if eval_examples is None else eval_examples)
        self.max_completion_length = config.max_completion_length or completion_budget(self.train_examples)
        self.sampling = SamplingConfig(do_sample=True, temperature=config.temperature,
                                       max_new_tokens=self.max_completion_length)
        self.pairs = list(pairs or [])
        self.eval_pairs = list(eval_pairs or [])
        # pi_ref is frozen: the log-probs of every fixed pair are computed here, once.
        self.pair_rollout = self.pair_ref_logps = None
        if self.pairs:
            self.pair_rollout = encode_pairs(tokenizer, self.pairs, self.device)
            check_sequence_length(self.model.config, self.pair_rollout.input_ids.shape[1],
                                  "the longest training pair (prompt + completion)")
        self.eval_rollout = self.eval_ref_logps = None
        if self.eval_pairs:
            self.eval_rollout = encode_pairs(tokenizer, self.eval_pairs, self.device)
            check_sequence_length(self.model.config, self.eval_rollout.input_ids.shape[1],
                                  "the longest eval pair (prompt + completion)")
        self._prompt_tokens = None
        if config.online:  # the longest training prompt, then a generated completion
            check_positions(self.model.config, self.prompt_tokens(), self.max_completion_length,
                            "max_completion_length")
        self.check_batch_fits()
        if self.pairs:
            self.pair_ref_logps = self.reference_logprobs(self.pair_rollout)  # (2B,)
        if self.eval_pairs:
            self.eval_ref_logps = self.reference_logprobs(self.eval_rollout)
        self.sample_generator = torch.Generator(self.device).manual_seed(config.seed)  # online samples
        self.start(callbacks)  # AdamW, the batch-order generator (pairs / online prompts), bookkeeping
        self._identity = None

    def check_batch_fits(self) -> None:
        """Refuse a batch_size whose step (2 x batch_size sequences, and online their sampling) cannot
        fit in memory, before anything is allocated (also when it was raised after construction)."""
        c, model_config = self.config, self.model.config
        rows = 2 * c.batch_size
        if c.online:
            length = self.prompt_tokens() + self.max_completion_length
            needed = generation_bytes(model_config, rows, self.prompt_tokens(), self.max_completion_length)
        else:
            length, needed = self.pair_rollout.input_ids.shape[1], 0
        check_memory(needed + training_bytes(model_config, rows, length), self.device,
                     f"a DPO step of {c.batch_size} pairs", "batch_size")

    def prompt_tokens(self) -> int:
        """Tokens of the longest training prompt (online DPO samples after it), counted once."""
        if self._prompt_tokens is None:
            encode = self.tokenizer.encode
            self._prompt_tokens = max(len(encode(e.prompt, add_bos=True)) for e in self.train_examples)
        return self._prompt_tokens

    def before_train(self) -> None:
        self.check_batch_fits()

    def identity(self) -> dict[str, str]:
        """sha256 of the reference (the starting weights) and of a learned judge: a resume from other
        weights is refused (rlhf_lab.train.run_state)."""
        if self._identity is None:
            self._identity = {"reference": weights_sha256([self.ref_model])}
            if isinstance(self.judge, torch.nn.Module):
                self._identity["judge"] = weights_sha256([self.judge])
        return self._identity

    # ------------------------------------------------------------------------------------------
    # Public API

    @property
    def policy(self):
        """The model being trained (the RL `Trainer`'s name for it)."""
        return self.model

    @torch.no_grad()
    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        """log pi_ref(y|x) of every row, (N,), summed over the completion tokens."""
        return sequence_logprobs(self.ref_model, rollout, chunk_size=256)

    def loss_inputs(self, policy_logps: torch.Tensor, ref_logps: torch.Tensor, lengths: torch.Tensor):
        """The (policy, reference) log-probs the loss and the implicit rewards use, (2B,) each: the sums,
        or for loss_type="ipo" the per-token means (TRL's convention, see the module docstring)."""
        if self.config.loss_type == "ipo":
            return policy_logps / lengths, ref_logps / lengths
        return policy_logps, ref_logps

    @torch.no_grad()
    def pair_metrics(self, rollout: Rollout, ref_logps: torch.Tensor | None = None) -> dict:
        """TRL's metrics for a fixed set of pairs under the current policy (no training): the implicit
        rewards' accuracy (ties count half) and margin, and the mean summed log-probs of the chosen and
        of the rejected completions. `rollout` from `encode_pairs`; `ref_logps` (2B,) from
        `reference_logprobs(rollout)`, computed here when not given."""
        ref_logps = self.reference_logprobs(rollout) if ref_logps is None else ref_logps
        logps = sequence_logprobs(self.model, rollout, chunk_size=256)
        policy, ref = self.loss_inputs(logps, ref_logps, rollout.lengths)
        rewards = implicit_rewards(policy, ref, self.config.beta)
        B = len(rewards) // 2
        margins = rewards[:B] - rewards[B:]
        wins = (margins > 0).float() + 0.5 * (margins == 0).float()
        return {"rewards/accuracies": wins.mean().item(), "rewards/margins": margins.mean().item(),
                "logps/chosen": logps[:B].mean().item(), "logps/rejected": logps[B:].mean().item()}

    def evaluate(self, examples: Sequence | None = None) -> float:
        """Held-out greedy exact-match accuracy on `examples` (default `eval_examples`)."""
        examples = self.eval_examples if examples is None else examples
        return greedy_accuracy(self.model, self.tokenizer, self.task, examples,
                               max_new_tokens=self.max_completion_length)

    @torch.no_grad()
    def evaluation(self) -> dict:
        """eval_accuracy, and the gold metrics when given: eval_gold_reward (mean gold reward of the greedy
        completions), and `pair_metrics` of `eval_pairs` prefixed with eval_ (eval_rewards/accuracies...)."""
        if self.gold_fn is None:
            out = {"eval_accuracy": self.evaluate()}
        else:
            correct, gold = greedy_scores(self.model, self.tokenizer, self.task, self.eval_examples, self.gold_fn,
                                          self.max_completion_length)
            out = {"eval_accuracy": correct.mean().item(), "eval_gold_reward": gold.mean().item()}
        if self.eval_rollout is not None:
            out.update({f"eval_{k}": v for k, v in self.pair_metrics(self.eval_rollout, self.eval_ref_logps).items()})
        return out

    def start_row(self) -> dict:
        # eval_every = 0: no evaluation at all, not even before training (as SFT)
        return {"step": 0, "wall_time": 0.0, **(self.evaluation() if self.config.eval_every else {"eval_accuracy": math.nan})}

    def save(self, folder):
        """The policy as a Hugging Face folder plus history.csv beside it."""
        from ..model import save_pretrained

        folder = save_pretrained(self.model, folder, tokenizer=self.tokenizer,
                                 metadata={"algo": f"dpo-{self.config.loss_type}", "step": self.step})
        self.history.to_csv(folder / "history.csv", index=False)
        return folder

    # ------------------------------------------------------------------------------------------
    # One step

    def offline_batch(self) -> tuple[Rollout, torch.Tensor]:
        """`batch_size` fixed pairs drawn with replacement: (rollout of 2B rows, pi_ref log-probs (2B,))."""
        M = len(self.pairs)
        index = torch.randint(0, M, (self.config.batch_size,), generator=self.batch_generator).to(self.device)
        rows = torch.cat([index, index + M])  # chosen rows, then the same pairs' rejected rows
        return self.pair_rollout.select(rows), self.pair_ref_logps[rows]

    @torch.no_grad()
    def online_batch(self) -> tuple[Rollout, torch.Tensor]:
        """Fresh pairs: two samples per prompt from the current policy, the judge's higher-scored one
        chosen; pairs the judge scores equal are dropped. Returns (rollout of 2B' rows, pi_ref log-probs)."""
        index = torch.randint(len(self.train_examples), (self.config.batch_size,), generator=self.batch_generator)
        examples = [self.train_examples[i] for i in index.tolist()]
        self.model.eval()
        try:
            samples = sample_and_score(self.model, self.tokenizer, examples, 2, self.sampling, self.judge, self.task,
                                       self.sample_generator)  # rows 2b, 2b + 1 answer prompt b
        finally:
            self.model.train()
        scores = samples.rewards.view(-1, 2)
        first_wins = scores[:, 0] > scores[:, 1]
        keep = (scores[:, 0] != scores[:, 1]).nonzero().squeeze(1)
        base = 2 * keep
        chosen = base + (~first_wins[keep]).long()
        rejected = base + first_wins[keep].long()
        pairs = samples.select(torch.cat([chosen, rejected]))
        return pairs, self.reference_logprobs(pairs)

    # what `save_state` / `resume` keep and a failed step restores (pi_ref and its log-probs are rebuilt
    # from the same config), and the weights checked for NaN after every step
    def state_modules(self) -> dict[str, torch.nn.Module]:
        return {"policy": self.model}

    def state_generators(self) -> dict[str, torch.Generator]:
        return {"batch": self.batch_generator, "sample": self.sample_generator}

    def _step(self) -> dict:
        c = self.config
        step = self.step + 1
        lr = self.set_learning_rate(step)
        t0 = time.perf_counter()
        batch, ref_logps = self.online_batch() if c.online else self.offline_batch()
        B = len(batch) // 2
        row = {"step": step, "pairs": B, "eval_accuracy": math.nan, "lr": lr}
        if B == 0:  # online, every pair a tie: nothing to learn from this step
            self.step = step
            self.train_time += time.perf_counter() - t0
            return {**row, "wall_time": self.train_time, "step_time": time.perf_counter() - t0, "loss": math.nan}
        logps = sequence_logprobs(self.model, batch)  # (2B,) with gradient
        policy, ref = self.loss_inputs(logps, ref_logps, batch.lengths)
        loss = dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], c.beta, c.loss_type, c.label_smoothing).mean()
        grad_norm = backward_and_step(loss, self.optimizer, self.model.parameters(), c.max_grad_norm, step,
                                      c.loss_type.replace("sigmoid", "dpo").upper())
        step_time = time.perf_counter() - t0
        self.step = step
        self.train_time += step_time
        rewards = implicit_rewards(policy.detach(), ref, c.beta)  # (2B,) as the loss saw them
        chosen, rejected = rewards[:B], rewards[B:]
        return {**row, "wall_time": self.train_time, "step_time": step_time, "loss": loss.item(),
                "rewards/chosen": chosen.mean().item(), "rewards/rejected": rejected.mean().item(),
                "rewards/margins": (chosen - rejected).mean().item(),
                "rewards/accuracies": (chosen > rejected).float().mean().item(),
                "logps/chosen": logps[:B].detach().mean().item(), "logps/rejected": logps[B:].detach().mean().item(),
                "grad_norm": grad_norm}
