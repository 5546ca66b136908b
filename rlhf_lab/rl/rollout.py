"""Phase 1 of every step: prompts -> G sampled completions each -> rewards, plus what the loss needs.

    sampler = RolloutSampler(policy, tokenizer, task, reward_fn, train_examples, sampling, ...)
    rollout = sampler(32)                         draw 32 prompts, sample G completions each, score them
    out     = policy_forward(model, rollout, T)   teacher-forced log pi(token) (and entropy, values)

`Trainer.collect_rollout()` is this plus the algorithm's `shape_rollout` hook and the no-grad
forwards of the reference (and old policy, and critic). `encode_rollout` builds a Rollout from
texts you choose (no sampling), so `policy_forward` scores any completion, teacher-forced.

Shapes: N = prompts * G rows (the G completions of prompt b are rows b*G .. b*G+G-1),
P = prompt width (left-padded), T = completion width (right-padded after EOS).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from numbers import Real

import torch

from ..sampling import SamplingConfig, generate
from ..train.callbacks import NonFiniteLossError
from ..util import fast_paths
from ..util.device import autocast
from .losses import selective_log_softmax_and_entropy
from .prefix_sharing import shared_prompt_logits
from .routing import is_moe


@dataclass
class Rollout:
    input_ids: torch.Tensor  # (N, P + T) prompt then completion
    attention_mask: torch.Tensor  # (N, P + T) 1 = real token
    prompt_width: int  # P
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) float, 1 for generated tokens up to and including EOS
    rewards: torch.Tensor  # (N,) the score given to each completion
    correct: torch.Tensor  # (N,) exact-match 0/1, for the accuracy metric
    finished: torch.Tensor  # (N,) bool, emitted EOS
    num_generations: int  # G
    examples: list | None = None  # (N,) the task Example each row answers (rows of a group share one)
    max_completion_length: int | None = None  # the generation budget (Dr. GRPO's constant, DAPO's L_max)
    old_logprobs: torch.Tensor | None = None  # (N, T) log pi_old(token) at rollout time
    # (N, T) log-prob of each token under the distribution the sampler drew it from
    sampling_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None  # (N, T) log pi_ref(token)
    old_values: torch.Tensor | None = None  # (N, T) critic's V(s_t) at rollout time (PPO)
    advantages: torch.Tensor | None = None  # (N, T) filled by the algorithm
    returns: torch.Tensor | None = None  # (N, T) value targets (PPO)
    token_rewards: torch.Tensor | None = None  # (N, T) PPO's per-token reward (-kl_coef * kl + score)
    greedy_rewards: torch.Tensor | None = None  # (prompts,) ReMax's baseline: reward of the greedy answer
    # MoE policy: pi_old's experts, one (N, P + T - 1, k) long tensor per MoE layer (routing replay,
    # routing.py)
    old_expert_indices: tuple[torch.Tensor, ...] | None = None

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        return len(self) // self.num_generations

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)

    @property
    def truncated(self) -> torch.Tensor:
        return ~self.finished

    def select(self, rows: torch.Tensor) -> Rollout:
        """The same rollout restricted to `rows` (a minibatch); per-row tensors and lists are indexed."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == len(self):
                value = value[rows]
            elif isinstance(value, list) and len(value) == len(self):
                value = [value[i] for i in rows.tolist()]
            elif isinstance(value, tuple):  # one tensor per MoE layer
                value = tuple(v[rows] for v in value)
            out[f.name] = value
        return Rollout(**out)

    @staticmethod
    def concat(parts: list[Rollout]) -> Rollout:
        """Stack rollouts row-wise (dynamic sampling refills a batch from several draws)."""
        width_p = max(p.prompt_width for p in parts)
        width_t = max(p.completion_ids.shape[1] for p in parts)
        padded = [p.pad_to(width_p, width_t) for p in parts]
        out = {}
        for f in fields(Rollout):
            values = [getattr(p, f.name) for p in padded]
            if isinstance(values[0], torch.Tensor):
                out[f.name] = torch.cat(values, dim=0)
            elif isinstance(values[0], list):
                out[f.name] = [item for value in values for item in value]
            else:
                out[f.name] = values[0]
        out["prompt_width"] = width_p
        return Rollout(**out)

    def pad_to(self, prompt_width: int, completion_width: int) -> Rollout:
        """Left-pad prompts / right-pad completions (token id 0 = pad, mask 0)."""
        dp, dt = prompt_width - self.prompt_width, completion_width - self.completion_ids.shape[1]
        if dp == 0 and dt == 0:
            return self
        n = len(self)
        ids = self.input_ids
        zeros = lambda w, like: torch.zeros((n, w), dtype=like.dtype, device=like.device)  # noqa: E731
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["input_ids"] = torch.cat([zeros(dp, ids), ids, zeros(dt, ids)], 1)
        out["attention_mask"] = torch.cat([zeros(dp, self.attention_mask), self.attention_mask,
                                           zeros(dt, self.attention_mask)], 1)
        for name in ("completion_ids", "completion_mask", "old_logprobs", "sampling_logprobs", "ref_logprobs",
                     "old_values",
                     "advantages", "returns", "token_rewards"):
            value = out[name]
            if value is not None:
                out[name] = torch.cat([value, zeros(dt, value)], 1)
        out["prompt_width"] = prompt_width
        return Rollout(**out)


# ----------------------------------------------------------------------------------------------
# scoring


def reward_name(reward_fn) -> str:
    return getattr(reward_fn, "__qualname__", None) or type(reward_fn).__name__


def score_completions(reward_fn, prompts: Sequence[str], completions: Sequence[str], answers: Sequence[str],
                      finished: Sequence[bool]) -> torch.Tensor:
    """Rewards of a batch of completions, (N,) float32. `reward_fn` is a per-completion callable
    (prompt, completion, answer, finished) -> float like the tasks' rewards (`rlhf_lab.tasks.RewardFn`),
    or has `score_batch(prompts, completions, answers, finished)` with the same lists (a learned reward
    model scores the whole batch at once).

    Every reward must be a real number: a None, a string or a tensor of the wrong size raises an
    error naming the reward function and the bad value (a NaN is a number: the trainer stops on it
    and keeps the last good weights). A number beyond float32's range (1e39, 10**400) would become
    inf: it raises NonFiniteLossError saying so, which stops the trainer the same way."""
    if hasattr(reward_fn, "score_batch"):
        values = reward_fn.score_batch(list(prompts), list(completions), list(answers), list(finished))
        if not isinstance(values, (Sequence, torch.Tensor)):
            raise TypeError(f"reward {reward_name(reward_fn)}.score_batch must return a sequence of "
                            f"{len(completions)} numbers, got {values!r:.80}")
        values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
        if len(values) != len(completions):
            raise ValueError(f"reward {reward_name(reward_fn)}.score_batch returned {len(values)} values for "
                             f"{len(completions)} completions")
    else:
        values = [reward_fn(p, c, a, f) for p, c, a, f in zip(prompts, completions, answers, finished)]
    largest = torch.finfo(torch.float32).max
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"reward {reward_name(reward_fn)} must return a number, got {value!r} for "
                            f"completion {completions[i]!r} of prompt {prompts[i]!r}")
        try:
            number = float(value)
            beyond = math.isfinite(number) and abs(number) > largest  # NaN, inf: the trainer stops on them
        except OverflowError:  # an int too large for any float
            beyond = True
        if beyond:
            digits = int(abs(int(value)).bit_length() * 0.30103) + 1 if not isinstance(value, float) else 0
            shown = f"{value:.3e}" if isinstance(value, float) else f"an integer of about {digits} digits"
            raise NonFiniteLossError(f"reward {reward_name(reward_fn)} returned {shown} for completion "
                                     f"{completions[i][:80]!r}: beyond float32's range (|r| <= "
                                     f"{largest:.3e}), in which the trainer computes; scale the reward down")
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def learned_models(reward, depth: int = 3) -> list[torch.nn.Module]:
    """The torch modules a reward holds: itself, or those among its attributes and their containers
    (a WeightedReward's parts, a TimedReward's reward, an ensemble's members), `depth` levels down."""
    if isinstance(reward, torch.nn.Module):
        return [reward]
    if depth == 0 or isinstance(reward, (str, bytes, type)):
        return []
    if isinstance(reward, dict):
        parts = list(reward.values())
    elif isinstance(reward, (list, tuple)):
        parts = list(reward)
    else:
        parts = list(getattr(reward, "__dict__", {}).values())
    found = {id(module): module for part in parts for module in learned_models(part, depth - 1)}
    return list(found.values())


def exact_match_reward(task):
    """The task's exact-match score as a batch reward (`task.score`, built once): the accuracy metric."""
    return task.reward_fn({task.accuracy_reward: 1.0})


@torch.no_grad()
def sample_and_score(policy, tokenizer, examples: Sequence, num_generations: int, sampling: SamplingConfig,
                     reward_fn, task, generator: torch.Generator | None = None, accuracy_fn=None,
                     cache: dict | None = None) -> Rollout:
    """Sample `num_generations` completions for each example with the lab's cached `generate`, decode
    them, and score them with `reward_fn` (the reward the optimiser sees) and the exact match
    (`accuracy_fn`, default `exact_match_reward(task)`: the accuracy we report). When `accuracy_fn` is
    `reward_fn` itself (the default reward of a task is often its exact match), the completions are
    scored once. `cache`: generate's cache arguments, e.g. {"cache": "int8", "residual_length": 8} (default
    its static cache). Returns a Rollout with the sampler's log-probs when `sampling` asks for them."""
    device = policy.device
    prompts = [tokenizer.encode(e.prompt, add_bos=True) for e in examples]
    with autocast(device):
        out = generate(policy, prompts, sampling, num_return_sequences=num_generations, generator=generator,
                       **(cache or {}))
    rows = [examples[row // num_generations] for row in range(len(examples) * num_generations)]
    texts, finished = zip(*(tokenizer.decode_until_eos(ids) for ids in out.completion_ids.tolist()))
    prompts, answers = [e.prompt for e in rows], [e.answer for e in rows]
    rewards = score_completions(reward_fn, prompts, texts, answers, finished)
    accuracy_fn = accuracy_fn or exact_match_reward(task)
    correct = (rewards.clone() if accuracy_fn is reward_fn
               else score_completions(accuracy_fn, prompts, texts, answers, finished))
    return Rollout(
        input_ids=out.sequences, attention_mask=out.attention_mask, prompt_width=out.prompt_ids.shape[1],
        completion_ids=out.completion_ids, completion_mask=out.completion_mask.float(),
        rewards=rewards.to(device), correct=correct.to(device),
        finished=out.finished, num_generations=num_generations, examples=rows,
        max_completion_length=sampling.max_new_tokens, sampling_logprobs=out.logprobs,
    )


class RolloutSampler:
    """Draws training prompts and turns them into scored rollouts with the current policy.

    `sampler(count)` draws `count` prompts (seeded by `data_generator`) and samples
    `num_generations` completions for each (seeded by `sample_generator`). Algorithms that need more
    samples (DAPO's dynamic sampling) or a greedy answer (ReMax) call it from `shape_rollout`.
    `accuracy_fn` scores the accuracy (default `exact_match_reward(task)`); pass `reward_fn` itself when
    the reward is that exact match, and each completion is scored once.
    """

    def __init__(self, policy, tokenizer, task, reward_fn, train_examples: Sequence, sampling: SamplingConfig,
                 num_generations: int, sample_generator: torch.Generator, data_generator: torch.Generator,
                 accuracy_fn=None, cache: dict | None = None) -> None:
        self.policy, self.tokenizer, self.task, self.reward_fn = policy, tokenizer, task, reward_fn
        self.cache = cache  # generate's cache arguments (a rollout copy with an int8 KV cache); None: static
        self.accuracy_fn = accuracy_fn or exact_match_reward(task)
        self.train_examples = train_examples
        self.sampling = sampling
        self.num_generations = num_generations
        self.sample_generator = sample_generator
        self.data_generator = data_generator

    def draw_prompts(self, count: int) -> list:
        index = torch.randint(len(self.train_examples), (count,), generator=self.data_generator)
        return [self.train_examples[i] for i in index.tolist()]

    def sample(self, examples: Sequence, num_generations: int | None = None,
               sampling: SamplingConfig | None = None) -> Rollout:
        """Completions for the given examples (default: G each, at the training temperature)."""
        return sample_and_score(self.policy, self.tokenizer, examples,
                                num_generations or self.num_generations, sampling or self.sampling,
                                self.reward_fn, self.task, self.sample_generator, self.accuracy_fn,
                                self.cache)

    def greedy_rewards(self, examples: Sequence) -> torch.Tensor:
        """(len(examples),) the reward of each example's greedy completion."""
        greedy = SamplingConfig(do_sample=False, max_new_tokens=self.sampling.max_new_tokens)
        return self.sample(examples, 1, greedy).rewards

    def __call__(self, count: int) -> Rollout:
        return self.sample(self.draw_prompts(count))


def encode_rollout(tokenizer, prompts: Sequence[str], completions: Sequence[str],
                   finished: Sequence[bool] | None = None,
                   num_generations: int = 1, device=None) -> Rollout:
    """A Rollout of completions you give (no sampling): left-padded prompts (with BOS), right-padded
    completions, EOS appended where `finished` (default: everywhere). Rewards are zeros; the rollout
    is for `policy_forward` (teacher-forced log-probs, entropy, values) and for hand-made losses."""
    if len(prompts) != len(completions):
        raise ValueError(f"prompts and completions must have the same length, "
                         f"got {len(prompts)} and {len(completions)}")
    finished = [True] * len(prompts) if finished is None else list(finished)
    prompt_ids = [tokenizer.encode(p, add_bos=True) for p in prompts]
    completion_ids = [tokenizer.encode(c, add_eos=bool(f)) for c, f in zip(completions, finished)]
    P, T = max(map(len, prompt_ids)), max(max(map(len, completion_ids)), 1)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(prompts), P + T), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), P + T), dtype=torch.long)
    for row, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[row, P - len(p): P] = torch.tensor(p)
        ids[row, P: P + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[row, P - len(p): P + len(c)] = 1
    n = len(prompts)
    return Rollout(
        input_ids=ids.to(device), attention_mask=attention.to(device), prompt_width=P,
        completion_ids=ids[:, P:].to(device), completion_mask=attention[:, P:].float().to(device),
        rewards=torch.zeros(n, device=device), correct=torch.zeros(n, device=device),
        finished=torch.tensor(finished, dtype=torch.bool, device=device), num_generations=num_generations,
    )


# ----------------------------------------------------------------------------------------------
# teacher-forced forward passes


@dataclass
class PolicyOutput:
    logprobs: torch.Tensor  # (N, T) float32 log pi(token) at temperature
    entropy: torch.Tensor | None  # (N, T) float32 entropy of pi(. | prefix), detached
    values: torch.Tensor | None  # (N, T) V(s_t): the value of the state before token t
    # MoE policy only (None for a dense one), the model's outputs at all N x (P + T - 1) positions:
    router_logits: tuple[torch.Tensor, ...] | None = None  # per MoE layer (N, P + T - 1, E) float32
    # per MoE layer (N, P + T - 1, k) long: experts used
    expert_indices: tuple[torch.Tensor, ...] | None = None
    aux_loss: torch.Tensor | None = None  # scalar: router_aux_loss_coef * balance + router_z_loss_coef * z


def rollout_forward(model, rollout: Rollout, expert_indices: tuple[torch.Tensor, ...] | None = None,
                    num_logits_to_keep: int = 0):
    """The model's output (ModelOutput) on prompt + completion minus the last token, teacher-forced.
    expert_indices: an MoE model uses these experts (routing replay, rlhf_lab.rl.routing);
    num_logits_to_keep: the lm_head runs on the last positions only (0 = all)."""
    replay = {} if expert_indices is None else {"expert_indices": expert_indices}
    return model(rollout.input_ids[:, :-1], attention_mask=rollout.attention_mask[:, :-1],
                 num_logits_to_keep=num_logits_to_keep, **replay)


def completion_logits(model, rollout: Rollout, temperature: float = 1.0, share_prompts: bool = False,
                      output=None):
    """(logits (N, T, V) float32 / temperature, values (N, T) or None) at the completion positions.

    The logit at position P-1+t predicts completion token t, so we keep positions P-1 .. P+T-2 (the
    last T of the P+T-1 inputs: the lm_head runs on those only) and divide by the sampling
    temperature (the distribution the tokens were drawn from).

    share_prompts=True lets the fast path run when it is on (rlhf_lab.util.fast_paths): the rows of a
    group share a prompt, which then goes through the model once (prefix_sharing.py). False keeps one
    forward per row, whose bits do not depend on what else is in the batch (DPO compares pi and
    pi_ref computed in different batches and counts exact ties).

    output: a `rollout_forward` already run over every row's whole sequence (what an MoE policy
    needs for its router outputs); its logits are sliced, nothing is recomputed.
    """
    P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
    if output is None and share_prompts and fast_paths.enabled():
        shared = shared_prompt_logits(model, rollout)
        if shared is not None:
            return at_temperature(shared[0], temperature), shared[1]
    if output is None:
        output = rollout_forward(model, rollout, num_logits_to_keep=T)
    values = output.values[:, P - 1 : P - 1 + T] if output.values is not None else None
    return at_temperature(output.logits[:, -T:], temperature), values


def at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature; at temperature 1 the logits themselves (x / 1 is x exactly: one op
    less forward and backward)."""
    logits = logits.float()
    return logits if temperature == 1 else logits / temperature


def policy_forward(model, rollout: Rollout, temperature: float = 1.0, with_entropy: bool = False,
                   with_values: bool = False, share_prompts: bool = False,
                   expert_indices: tuple[torch.Tensor, ...] | None = None) -> PolicyOutput:
    """Log-probs (and optionally entropy, values) of the rollout's completion tokens under `model`:
    a float32 log-softmax of `completion_logits` at the chosen ids.

    An MoE model always takes one forward over every row's whole sequence (share_prompts does not
    apply): its router outputs, returned here, and routing replay's `expert_indices` (one (N, P+T-1, k)
    tensor per layer, rlhf_lab.rl.routing) cover every position of every row."""
    out = None
    if is_moe(model) or expert_indices is not None:
        T = rollout.completion_ids.shape[1]
        out = rollout_forward(model, rollout, expert_indices, num_logits_to_keep=T)
    logits, values = completion_logits(model, rollout, temperature, share_prompts, output=out)
    logprobs, entropy = selective_log_softmax_and_entropy(logits, rollout.completion_ids, with_entropy)
    return PolicyOutput(logprobs=logprobs, entropy=entropy, values=values if with_values else None,
                        router_logits=None if out is None else out.router_logits,
                        expert_indices=None if out is None else out.expert_indices,
                        aux_loss=None if out is None else out.aux_loss)


def next_token_logprobs(model, rollout: Rollout, temperature: float = 1.0,
                        dtype: torch.dtype = torch.float32):
    """(N, T, V) log pi(. | prefix) over the whole vocabulary at every completion position, e.g. for
    an exact KL(pi || pi_ref) = sum_v pi_v (log pi_v - log pi_ref_v). float64 makes sums exact."""
    logits, _ = completion_logits(model, rollout, temperature)
    return torch.log_softmax(logits.to(dtype), dim=-1)
