"""A Bradley-Terry reward model: the lab's tiny Llama trunk with a scalar head, trained on preference pairs.

    P(y_w > y_l | x) = sigmoid(r(x, y_w) - r(x, y_l))            (Bradley & Terry 1952)
    loss = -log sigmoid(r_w - r_l - margin)  [+ c * (r_w + r_l)^2]   (TRL RewardTrainer's optional centring)

As in InstructGPT (arXiv 2203.02155): the trunk starts from the SFT model, a linear head maps the
final hidden state to one number, and the score is read at the completion's LAST token (the EOS
when the model finished). That is `readout="last_token"`.

`readout="last_token+loglik"` adds a learned multiple of the completion's mean log-likelihood under
the reward model's own language-model head (initialised from the SFT model's):

    r(x, y) = v(h_last) + w * (1/|y|) sum_t log p(y_t | x, y_<t)        (w starts at 0: chance)

Why: a 2-layer trunk read at one position cannot re-check a sum, so a last-token head learns the
cheap cues (stopping, length, stray characters) and little arithmetic, even on gold labels. The SFT
model already knows the answer: it is in its next-token predictions, which rank a right answer
above a wrong one. This readout lets the Bradley-Terry loss use that knowledge, which is the reason
InstructGPT starts the reward model from the SFT model. `RewardConfig.train_trunk=False` trains only
the head and w (a linear probe on the frozen SFT model), so fine-tuning cannot wash the knowledge
out. The measurements behind this choice: bench/RESULTS.md, "Reward-model readout".

Only differences of scores are learned, so a constant can be added to every score without changing
the loss: `RewardModel.offset` centres the scores on the training completions after training, which
is what an RL trainer without per-group normalisation (PPO) wants.

    rm = RewardModel.from_sft()                                  # addition_sft trunk + a fresh head
    trainer = RewardTrainer(RewardConfig(steps=300), rm)         # a rlhf_lab.train.loop.TrainingLoop
    trainer.train()
    rm.score(prompts, completions)                               # (batch,) tensor
    rl.Trainer(config, reward_fn=rm)                             # RL against it (score_batch)
    rm.save_pretrained(folder); RewardModel.from_pretrained(folder)  # or the shipped "reward_model"
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoints import load_checkpoint
from ..model import LlamaModel
from ..rl.rollout import encode_rollout
from ..train.loop import SupervisedLoop, backward_and_step
from ..util.device import autocast, check_device, pick_device
from ..util.limits import check_memory, check_sequence_length, training_bytes
from ..util.validation import Validated, check_choice, check_number, setting
from .data import LABEL_SOURCES, PreferencePair, load_preferences, orient

SHIPPED_REWARD_MODEL = "reward_model"  # data/checkpoints/reward_model
READOUTS = ("last_token", "last_token+loglik")  # where the score is read (module docstring)


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin=0.0,
                       center_rewards_coefficient: float | None = None) -> torch.Tensor:
    """Mean over pairs of -log sigmoid(r_w - r_l - margin), plus c * mean((r_w + r_l)^2) when
    `center_rewards_coefficient` c is set (TRL's RewardTrainer; Eisenstein et al. 2023).

    chosen_rewards, rejected_rewards: (batch,). margin: a float or a (batch,) tensor (Llama 2 used a
    margin from the rated preference strength). r_w = 1, r_l = 0, margin 0 -> log(1 + e^-1) = 0.31326.
    """
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(f"chosen_rewards and rejected_rewards must have the same shape, got "
                         f"{tuple(chosen_rewards.shape)} and {tuple(rejected_rewards.shape)}")
    loss = -F.logsigmoid(chosen_rewards - rejected_rewards - margin).mean()  # -log sigmoid(r_w - r_l - m)
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


class RewardModel(nn.Module):
    """r(x, y): a `LlamaModel` trunk whose scalar head (`value_head`, hidden -> 1) is read at the last
    token of prompt + completion (+ EOS when finished).

    offset: subtracted from every score (set by `RewardTrainer` to centre the scores; see module doc).
    readout: "last_token" or "last_token+loglik" (module docstring); loglik_weight: w, the weight of
    the mean log-likelihood term (a trainable scalar; unused with "last_token").
    Scoring inputs are strings; `score` keeps the autograd graph (training), `score_batch` does not.
    """

    def __init__(self, model: LlamaModel, tokenizer, offset: float = 0.0, readout: str = "last_token",
                 loglik_weight: float = 0.0) -> None:
        super().__init__()
        check_choice("readout", readout, READOUTS)
        check_number("loglik_weight", loglik_weight)
        if model.value_head is None:
            model.add_value_head()
        self.model = model
        self.tokenizer = tokenizer
        self.offset = float(offset)
        self.readout = readout
        self.loglik_weight = nn.Parameter(torch.tensor(float(loglik_weight), device=model.device),
                                          requires_grad=readout != "last_token")

    @classmethod
    def from_sft(cls, checkpoint: str | os.PathLike = "addition_sft", device: str = "cpu",
                 readout: str = "last_token") -> RewardModel:
        """The SFT model's trunk with a fresh scalar head initialised to zero (and w = 0): every
        score starts at 0, so the untrained model is exactly at chance (a random head would already
        rank pairs by whatever its random direction happens to pick up from the trunk)."""
        model, tokenizer, _ = load_checkpoint(checkpoint, device=device)
        model.value_head = None
        model.add_value_head()  # zero-initialised
        return cls(model, tokenizer, readout=readout)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, last_index: torch.Tensor,
                completion_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Raw scores (batch,): the head's value at `last_index` of each row of input_ids (batch, seq),
        plus, with readout "last_token+loglik", w times the mean log-likelihood of the completion
        tokens: the last `completion_mask.shape[1]` columns of input_ids, where completion_mask
        (batch, T) is 1."""
        loglik = self.readout != "last_token"
        with autocast(self.device):  # logits of every position only when the log-likelihood is read
            out = self.model(input_ids, attention_mask=attention_mask, num_logits_to_keep=0 if loglik else 1)
        values = out.values  # (batch, seq) float32
        score = values.gather(1, last_index[:, None]).squeeze(1)  # v(h_last)
        if not loglik:
            return score
        if completion_mask is None:
            raise ValueError("readout 'last_token+loglik' needs the completion_mask (RewardModel.encode gives it)")
        T = completion_mask.shape[1]
        prompt_width = input_ids.shape[1] - T
        logits = out.logits[:, prompt_width - 1: -1].float()  # (batch, T, vocab): position t-1 predicts token t
        token_logp = torch.log_softmax(logits, dim=-1).gather(2, input_ids[:, prompt_width:, None]).squeeze(2)
        # mean over the completion's tokens (EOS included); an empty completion has mean 0
        mean_logp = (token_logp * completion_mask).sum(1) / completion_mask.sum(1).clamp(min=1)
        return score + self.loglik_weight * mean_logp  # v(h_last) + w * mean_t log p(y_t | x, y_<t)

    def encode(self, prompts: Sequence[str], completions: Sequence[str], finished: Sequence[bool] | None = None):
        """(input_ids (B, L), attention_mask (B, L), last_index (B,), completion_mask (B, T)):
        left-padded prompts with BOS, right-padded completions with EOS where finished (default:
        everywhere); the completion is the last T columns."""
        batch = encode_rollout(self.tokenizer, list(prompts), list(completions), finished, device=self.device)
        check_sequence_length(self.model.config, batch.input_ids.shape[1], "the longest prompt + completion")
        last_index = batch.prompt_width + batch.completion_mask.sum(dim=1).long() - 1  # EOS, or the last prompt token
        return batch.input_ids, batch.attention_mask, last_index, batch.completion_mask

    def score(self, prompts: Sequence[str], completions: Sequence[str], finished: Sequence[bool] | None = None) -> torch.Tensor:
        """(batch,) float32 scores r(x, y) - offset, with gradients when the model is trainable."""
        return self(*self.encode(prompts, completions, finished)) - self.offset

    @torch.no_grad()
    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str] | None = None,
                    finished: Sequence[bool] | None = None, batch_size: int = 512) -> list[float]:
        """Scores as floats, batched, without gradients: the interface `rl.Trainer(reward_fn=rm)` calls.
        `answers` is ignored (a reward model does not see the reference answer; it is in the
        signature so the RL trainer can pass the same arguments as to a rule)."""
        was_training = self.training
        self.eval()
        try:
            finished = [True] * len(prompts) if finished is None else [bool(f) for f in finished]
            scores = []
            for start in range(0, len(prompts), batch_size):
                end = start + batch_size
                scores += self.score(prompts[start:end], completions[start:end], finished[start:end]).tolist()
        finally:
            self.train(was_training)
        return scores

    def save_pretrained(self, folder: str | os.PathLike, metadata: dict | None = None) -> Path:
        """A Hugging Face Llama folder (the trunk) plus value_head.safetensors (the scalar head); the
        offset and `metadata` go to config.json["rlhf_lab"]. `load_checkpoint(folder)` loads the trunk
        with its head; `RewardModel.from_pretrained(folder)` the reward model."""
        from ..model import save_pretrained

        meta = {"kind": "reward_model", "reward_offset": self.offset, "readout": self.readout,
                "loglik_weight": float(self.loglik_weight.detach()), **(metadata or {})}
        return save_pretrained(self.model, folder, tokenizer=self.tokenizer, metadata=meta)

    @classmethod
    def from_pretrained(cls, name: str | os.PathLike = SHIPPED_REWARD_MODEL, device: str = "cpu") -> RewardModel:
        """A saved reward model: a shipped name ("reward_model", "reward_model_seed1", ...) or a folder."""
        model, tokenizer, meta = load_checkpoint(name, device=device)
        if model.value_head is None:
            raise ValueError(f"{name!r} has no value_head.safetensors: it is a language model, not a reward model")
        return cls(model, tokenizer, offset=meta.get("reward_offset", 0.0), readout=meta.get("readout", "last_token"),
                   loglik_weight=meta.get("loglik_weight", 0.0))


class RewardEnsemble:
    """Several reward models scored together (Coste et al. 2023, arXiv 2310.02743).

    aggregate: "mean" (average), "min" (worst case over members), or "mean_minus_std"
    (mean - std_coef * std over members: uncertainty-weighted, conservative where they disagree).
    """

    AGGREGATES = ("mean", "min", "mean_minus_std")

    def __init__(self, members: Sequence[RewardModel], aggregate: str = "mean", std_coef: float = 1.0) -> None:
        if len(members) == 0:
            raise ValueError("members must hold at least one RewardModel")
        check_choice("aggregate", aggregate, self.AGGREGATES)
        check_number("std_coef", std_coef, low=0)
        self.members, self.aggregate, self.std_coef = list(members), aggregate, std_coef

    def member_scores(self, prompts, completions, finished=None) -> torch.Tensor:
        """(members, batch) scores."""
        return torch.stack([m.score(prompts, completions, finished) for m in self.members])

    def combine(self, scores: torch.Tensor) -> torch.Tensor:
        """(members, batch) -> (batch,) by `aggregate`."""
        if self.aggregate == "mean":
            return scores.mean(dim=0)
        if self.aggregate == "min":
            return scores.min(dim=0).values
        return scores.mean(dim=0) - self.std_coef * scores.std(dim=0, unbiased=False)

    def score(self, prompts, completions, finished=None) -> torch.Tensor:
        return self.combine(self.member_scores(prompts, completions, finished))

    @torch.no_grad()
    def score_batch(self, prompts, completions, answers=None, finished=None) -> list[float]:
        scores = torch.tensor([m.score_batch(prompts, completions, answers, finished) for m in self.members])
        return self.combine(scores).tolist()


@torch.no_grad()
def pair_scores(reward_model, pairs: Sequence[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen scores (N,), rejected scores (N,)) of the pairs as they are oriented."""
    prompts = [p.prompt for p in pairs]
    chosen = torch.tensor(reward_model.score_batch(prompts, [p.chosen for p in pairs], None,
                                                   [p.chosen_finished for p in pairs]))
    rejected = torch.tensor(reward_model.score_batch(prompts, [p.rejected for p in pairs], None,
                                                     [p.rejected_finished for p in pairs]))
    return chosen, rejected


def pairwise_accuracy(reward_model, pairs: Sequence[PreferencePair], label: str = "majority") -> float:
    """Fraction of pairs where the model scores higher the side `label` prefers ("majority",
    "gold" or an annotator's name); pairs without a preference (gold ties) are left out, equal
    scores count one half. nan when no pair has a `label` preference."""
    oriented = orient(pairs, label)
    if not oriented:
        return math.nan
    chosen, rejected = pair_scores(reward_model, oriented)
    return float(((chosen > rejected).float() + 0.5 * (chosen == rejected).float()).mean())


def _check_label(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be one of {LABEL_SOURCES} or an annotator's name, got {value!r}")


@dataclass
class RewardConfig(Validated):
    """Settings of one reward-model run (names as TRL's RewardConfig where it has them); each field
    declares what it accepts (rlhf_lab.util.validation), checked at construction and on assignment."""

    init_checkpoint: str = setting("addition_sft", help="the trunk's start (InstructGPT: the SFT model)")
    readout: str = setting("last_token", choices=READOUTS, help="last_token+loglik adds w * mean log-lik")
    train_trunk: bool = setting(True, help="False: train only the scalar head and w (a probe)")
    label: str = setting("majority", check=_check_label, help="majority, gold, or an annotator's name")
    n_pairs: int | None = setting(None, ge=1, help="use the first n training pairs (None: all)")
    steps: int = setting(300, ge=0, help="optimiser steps")
    batch_size: int = setting(32, ge=1, help="pairs per step")
    learning_rate: float = setting(1e-3, gt=0, le=1, help="peak AdamW learning rate")
    warmup_steps: int = setting(20, ge=0, help="linear warm-up steps")
    weight_decay: float = setting(0.0, ge=0, help="AdamW's weight decay")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clipping norm")
    margin: float = setting(0.0, help="-log sigmoid(r_w - r_l - margin)")
    center_rewards_coefficient: float | None = setting(None, ge=0, help="TRL: + c * (r_w + r_l)^2")
    eval_every: int = setting(25, ge=0, help="steps between evaluations; 0: never evaluate")
    time_budget: float | None = setting(None, gt=0, help="seconds of training (evaluation excluded)")
    seed: int = setting(0, ge=0, help="batch order")
    device: str = setting("cpu", check=check_device, help="cpu, cuda, cuda:N, mps or auto")


HISTORY_COLUMNS = ("step", "wall_time", "loss", "batch_accuracy", "train_accuracy", "eval_accuracy",
                   "eval_gold_accuracy", "lr", "grad_norm")


class RewardTrainer(SupervisedLoop):
    """Train a `RewardModel` with the Bradley-Terry loss on preference pairs.

    Args:
        config: the run's settings.
        model: the reward model to train; None: `RewardModel.from_sft(config.init_checkpoint)`.
        train_pairs / eval_pairs: default the shipped "train" / "validation" splits. The training pairs
            are oriented by `config.label` (gold ties dropped when it is "gold") and cut to `config.n_pairs`.
        callbacks: `rlhf_lab.train.callbacks.Callback`s.

    Each evaluation row holds `train_accuracy` (on the training pairs, against config.label),
    `eval_accuracy` (validation, against config.label) and `eval_gold_accuracy` (validation, against
    the gold). After training, `model.offset` centres the scores on the training completions.
    """

    dashboard_kind = "sft"  # LiveDashboard draws loss and accuracy
    history_columns = HISTORY_COLUMNS

    def __init__(self, config: RewardConfig, model: RewardModel | None = None,
                 train_pairs: Sequence[PreferencePair] | None = None,
                 eval_pairs: Sequence[PreferencePair] | None = None, callbacks=()) -> None:
        self.config = config
        self.device = pick_device(config.device)
        torch.manual_seed(config.seed)
        train_pairs = load_preferences("train") if train_pairs is None else list(train_pairs)
        self.eval_pairs = load_preferences("validation") if eval_pairs is None else list(eval_pairs)
        if config.n_pairs is not None:
            train_pairs = train_pairs[: config.n_pairs]
        self.train_pairs = orient(train_pairs, config.label)
        if not self.train_pairs or not self.eval_pairs:
            raise ValueError(f"need training and evaluation pairs, got {len(self.train_pairs)} and {len(self.eval_pairs)}")
        self.model = model if model is not None else RewardModel.from_sft(config.init_checkpoint, device=str(self.device),
                                                                           readout=config.readout)
        self.model.to(self.device)
        # train_trunk=False: only the scalar head and w learn, the SFT model stays as it was. True sets every
        # parameter trainable again, also of a model a frozen-trunk run trained first (a linear probe, then
        # fine-tuning: Kumar et al. 2022, arXiv 2202.10054)
        for name, parameter in self.model.model.named_parameters():
            parameter.requires_grad_(config.train_trunk or name.startswith("value_head."))
        pairs = self.train_pairs  # every pair's length checked once: the longest sets a step's width
        self.max_length = self.model.encode([p.prompt for p in pairs] * 2, [p.chosen for p in pairs]
                                            + [p.rejected for p in pairs])[0].shape[1]
        self.check_batch_fits()
        self.start(callbacks)

    def check_batch_fits(self) -> None:
        """Refuse a batch_size whose step cannot fit in memory, before anything is allocated (also
        when it was raised after construction)."""
        rows = 2 * min(self.config.batch_size, len(self.train_pairs))
        check_memory(training_bytes(self.model.model.config, rows, self.max_length), self.device,
                     f"a reward-model step of {rows // 2} pairs", "batch_size")

    def evaluate(self, pairs: Sequence[PreferencePair] | None = None) -> float:
        """Pairwise accuracy on `pairs` (default the evaluation pairs) against config.label."""
        return pairwise_accuracy(self.model, self.eval_pairs if pairs is None else pairs, self.config.label)

    def evaluation(self) -> dict:
        if not self.config.eval_every:
            return {"eval_accuracy": math.nan}
        # train accuracy on (at most) the first eval_pairs-many training pairs: the same cost as validation
        seen = self.train_pairs[: max(len(self.eval_pairs), 1)]
        return {"train_accuracy": pairwise_accuracy(self.model, seen, "majority"),  # already oriented
                "eval_accuracy": self.evaluate(),
                "eval_gold_accuracy": pairwise_accuracy(self.model, self.eval_pairs, "gold")}

    def before_train(self) -> None:
        self.check_batch_fits()
        self.model.train()

    def after_train(self) -> None:
        self.model.eval()
        self.model.offset = 0.0
        chosen, rejected = pair_scores(self.model, self.train_pairs)
        self.model.offset = float(torch.cat([chosen, rejected]).mean())  # centred on the training completions

    def _step(self) -> dict:
        c = self.config
        step = self.step + 1
        lr = self.set_learning_rate(step)
        t0 = time.perf_counter()
        index = torch.randint(0, len(self.train_pairs), (min(c.batch_size, len(self.train_pairs)),),
                              generator=self.batch_generator).tolist()
        batch = [self.train_pairs[i] for i in index]
        n = len(batch)
        # chosen and rejected in one forward pass: rows 0..n-1 chosen, n..2n-1 rejected
        scores = self.model.score([p.prompt for p in batch] * 2, [p.chosen for p in batch] + [p.rejected for p in batch],
                                  [p.chosen_finished for p in batch] + [p.rejected_finished for p in batch])
        chosen, rejected = scores[:n], scores[n:]
        loss = bradley_terry_loss(chosen, rejected, c.margin, c.center_rewards_coefficient)
        grad_norm = backward_and_step(loss, self.optimizer, self.model.parameters(), c.max_grad_norm, step,
                                      "reward-model")
        step_time = time.perf_counter() - t0
        self.step = step
        self.train_time += step_time
        return {"step": step, "wall_time": self.train_time, "loss": loss.item(),
                "batch_accuracy": float((chosen > rejected).float().mean()), "lr": lr, "grad_norm": grad_norm,
                "eval_accuracy": math.nan}


# The shipped reward models (data/checkpoints/reward_model, reward_model_seed1, ...): the same run
# with different seeds (head initialisation and batch order), on the shipped training pairs.
SHIPPED_CONFIG = RewardConfig()
ENSEMBLE_SEEDS = (1, 2)


def train_reward_model(config: RewardConfig, folder: str | os.PathLike | None = None, progress: bool = True,
                       train_pairs=None, eval_pairs=None) -> tuple[RewardModel, pd.DataFrame]:
    """Train a reward model with `config` (default data: the shipped splits) and, if `folder` is given,
    save it there with its validation accuracies (against the majority and the gold) in the metadata."""
    from ..train.callbacks import ProgressBar

    trainer = RewardTrainer(config, train_pairs=train_pairs, eval_pairs=eval_pairs,
                            callbacks=[ProgressBar(desc=f"reward model seed {config.seed}")] if progress else [])
    history = trainer.train()
    if trainer.stop_reason in ("interrupted", "non_finite"):
        raise RuntimeError(f"reward-model training stopped: {trainer.stop_reason}; nothing saved")
    if folder is not None:
        meta = {"reward_config": asdict(config), "train_pairs": len(trainer.train_pairs),
                "validation_pairs": len(trainer.eval_pairs), "train_seconds": round(trainer.train_time, 1),
                "validation_accuracy": pairwise_accuracy(trainer.model, trainer.eval_pairs, config.label),
                "validation_gold_accuracy": pairwise_accuracy(trainer.model, trainer.eval_pairs, "gold")}
        trainer.model.save_pretrained(folder, metadata=meta)
        history.to_csv(Path(folder) / "history.csv", index=False)
    return trainer.model, history


def build_shipped_reward_models(out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Retrain data/checkpoints/reward_model and the ensemble members reward_model_seed{1,2}."""
    from ..checkpoints import CHECKPOINT_DIR

    out_dir = Path(out_dir or CHECKPOINT_DIR)
    folders = []
    for seed in (SHIPPED_CONFIG.seed, *ENSEMBLE_SEEDS):
        name = SHIPPED_REWARD_MODEL if seed == SHIPPED_CONFIG.seed else f"{SHIPPED_REWARD_MODEL}_seed{seed}"
        train_reward_model(dataclasses.replace(SHIPPED_CONFIG, seed=seed), out_dir / name)
        folders.append(out_dir / name)
    return folders


def verbosity_probe(reward_model, examples, extra_digits: Sequence[int] = (1, 2, 3, 4), seed: int = 0) -> pd.DataFrame:
    """Does the reward model pay for length? For each example (prompt, answer), the exact answer
    against the same answer followed by k random digits, which the gold scores lower
    (0.5 * 0 + 0.5 * |answer| / (|answer| + k)).

    Returns one row per k: `rm_prefers_longer` (share of examples where the model scores the padded
    answer above the exact one), `mean_score_gap` (padded - exact), and `gold_prefers_longer` (0 by
    construction of the gold; computed, not assumed).
    """
    import random

    from .gold import gold_reward

    rng = random.Random(seed)
    prompts, answers = [e.prompt for e in examples], [e.answer for e in examples]
    exact = torch.tensor(reward_model.score_batch(prompts, answers, answers, [True] * len(prompts)))
    rows = []
    for k in extra_digits:
        check_number("extra_digits", k, low=1, integer=True)
        padded = [a + "".join(rng.choice("0123456789") for _ in range(k)) for a in answers]
        longer = torch.tensor(reward_model.score_batch(prompts, padded, answers, [True] * len(prompts)))
        gold = [gold_reward(p, c, a) > gold_reward(p, a, a) for p, c, a in zip(prompts, padded, answers)]
        rows.append({"extra_digits": k, "rm_prefers_longer": float((longer > exact).float().mean()),
                     "mean_score_gap": float((longer - exact).mean()), "gold_prefers_longer": sum(gold) / len(gold)})
    return pd.DataFrame(rows)


def reward_models_table(out_dir: str | os.PathLike | None = None) -> str:
    """Markdown rows (one per saved reward model in out_dir) for data/checkpoints/README.md."""
    from ..checkpoints import CHECKPOINT_DIR
    from ..model.hf import read_config

    out_dir = Path(out_dir or CHECKPOINT_DIR)
    rows = []
    for folder in sorted(p for p in out_dir.iterdir() if (p / "config.json").is_file()):
        meta = read_config(folder).get("rlhf_lab") or {}
        if meta.get("kind") != "reward_model" or "reward_config" not in meta:
            continue
        size_kb = sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1024
        rows.append(f"| `{folder.name}` | `{meta['reward_config']['init_checkpoint']}` | {meta['train_pairs']} | "
                    f"{meta['reward_config']['steps']} | {meta['validation_accuracy']:.1%} | "
                    f"{meta['validation_gold_accuracy']:.1%} | {size_kb:.0f} KB |")
    return "\n".join(rows)
