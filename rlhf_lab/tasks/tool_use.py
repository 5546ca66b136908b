"""A multi-turn episode on the addition model: the environment feeds each answer back as a tool result.

Interview question Q11 asks how multi-turn agents differ from single-turn ones: errors accumulate
across turns, the context grows, the episode must know when to stop, and ONE reward for the whole
episode has to be assigned to the turns that earned it. This module makes the smallest episode that
has all four, with the lab's real addition model and no new training:

    turn 1   prompt  "047+085="            the model answers "231"   (132, digits reversed)
    tool     reads the answer, adds the next operand, and asks      "132+310="
    turn 2   the model answers "244"                                 (442 reversed)
    reward   1 if the last answer is the reversed sum of ALL operands (a + b + c), else 0

The tool is deterministic and honest (it re-writes the model's answer as an operand); a turn whose
answer cannot be read (no digits, no EOS, or a running sum with too many digits) ends the episode
with reward 0: the "when to stop" rule. Operands are drawn so that every partial sum fits the
model's training format (`digits` digits), so a wrong final answer is always some turn's mistake.

    from rlhf_lab.tasks.tool_use import make_chains, run_episodes, turn_advantages
    chains = make_chains(n=64, num_turns=2, seed=0)
    episodes = run_episodes(model, tokenizer, chains, num_generations=8)
    outcome = turn_advantages(episodes, credit="outcome")   # (N, turns) one reward, broadcast
    per_turn = turn_advantages(episodes, credit="per_turn")  # (N, turns) each turn judged itself
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from rlhf_lab.tasks.addition import AdditionTask
from rlhf_lab.tasks.formats import extract_answer
from rlhf_lab.util.validation import check_choice, check_number

CREDIT_MODES = ("outcome", "per_turn")


@dataclass(frozen=True)
class Chain:
    """One episode's problem: the operands added one per turn. `num_turns` = len(operands) - 1."""

    operands: tuple[int, ...]

    @property
    def num_turns(self) -> int:
        return len(self.operands) - 1

    @property
    def total(self) -> int:
        return sum(self.operands)


@dataclass
class Episode:
    """What happened in one sampled episode. Lists have one entry per turn actually played."""

    chain: Chain
    prompts: list[str]  # what the model saw at each turn
    completions: list[str]  # what it answered
    turn_correct: list[bool]  # was this turn's sum right, given the (possibly wrong) operand it was shown?
    on_track: list[bool]  # was the running total still right after this turn?
    reward: float  # the episode reward: 1.0 iff the final answer is the true total

    @property
    def transcript(self) -> str:
        """The whole conversation as one string: the context a multi-turn policy would condition on."""
        return self.transcript_upto(len(self.prompts) - 1)

    def transcript_upto(self, turn: int) -> str:
        """The conversation up to and including `turn` (0-based)."""
        return "".join(p + c + ";" for p, c in list(zip(self.prompts, self.completions))[: turn + 1])


def make_chains(n: int, num_turns: int = 2, digits: int = 3, seed: int = 0) -> list[Chain]:
    """`n` chains of `num_turns + 1` operands whose running sums all stay below 10**digits, so each
    turn's prompt is in the model's training format. Drawn by rejection (seeded)."""
    check_number("n", n, low=1, integer=True)
    check_number("num_turns", num_turns, low=1, integer=True)
    check_number("digits", digits, low=1, integer=True)
    rng, limit = random.Random(seed), 10**digits
    chains = []
    while len(chains) < n:
        operands = tuple(rng.randrange(limit) for _ in range(num_turns + 1))  # uniform, then rejected
        if sum(operands) < limit:
            chains.append(Chain(operands))
    return chains


def run_episodes(model, tokenizer, chains: list[Chain], num_generations: int = 8, temperature: float = 1.0,
                 digits: int = 3, seed: int = 0) -> list[Episode]:
    """Play every chain `num_generations` times, all episodes of a turn in one batched generate.

    Returns `len(chains) * num_generations` episodes, those of one chain contiguous (the GRPO group
    layout). Turn k's prompt is `running+operand=` where `running` is the model's own previous answer
    read back (reversed) by the tool; an unreadable answer stops the episode."""
    from rlhf_lab.sampling import SamplingConfig, generate
    from rlhf_lab.util.device import autocast

    check_number("num_generations", num_generations, low=1, integer=True)
    check_number("temperature", temperature, low=0, low_open=True)
    task = AdditionTask(digits=digits)
    sampling = SamplingConfig(do_sample=True, temperature=temperature, max_new_tokens=digits + 3)
    generator = torch.Generator(model.device).manual_seed(seed)
    episodes = [Episode(chain, [], [], [], [], 0.0) for chain in chains for _ in range(num_generations)]
    running = [chain.operands[0] for chain in chains for _ in range(num_generations)]  # what the tool holds
    alive = list(range(len(episodes)))
    for turn in range(max(c.num_turns for c in chains)):
        alive = [i for i in alive if turn < episodes[i].chain.num_turns]
        if not alive:
            break
        examples = [task.make_example(running[i], episodes[i].chain.operands[turn + 1]) for i in alive]
        prompts = [tokenizer.encode(example.prompt, add_bos=True) for example in examples]
        with autocast(model.device):
            out = generate(model, prompts, sampling, generator=generator)
        texts = [tokenizer.decode_until_eos(ids)[0] for ids in out.completion_ids.tolist()]
        still = []
        for i, example, text, done in zip(alive, examples, texts, out.finished.tolist()):
            episode = episodes[i]
            true_running = sum(episode.chain.operands[: turn + 2])
            answer = extract_answer(text) if done else None
            value = int(answer[::-1]) if answer else None
            episode.prompts.append(example.prompt)
            episode.completions.append(text)
            episode.turn_correct.append(bool(done) and text == example.answer)
            episode.on_track.append(value == true_running)
            if value is not None and value < 10**digits:  # the tool can read it: the episode goes on
                running[i] = value
                still.append(i)
        alive = still
    for episode in episodes:
        finished_all = len(episode.on_track) == episode.chain.num_turns
        episode.reward = float(finished_all and episode.on_track[-1])
    return episodes


def turn_advantages(episodes: list[Episode], num_generations: int, credit: str = "outcome") -> torch.Tensor:
    """Group-relative advantages per turn, (len(episodes), max_turns); turns not played are 0.

    credit="outcome": the one episode reward R is every turn's reward, A_{i,k} = R_i - mean_group(R)
      (what GRPO does with a single trajectory-level reward: each token of each turn gets the same A).
    credit="per_turn": turn k is rewarded for its own sum, r_{i,k} = turn_correct, and
      A_{i,k} = r_{i,k} - mean over the group's turn-k rewards (a process reward per turn).
    No division by the std, so the sign alone says who is pushed up (Dr. GRPO's choice)."""
    check_choice("credit", credit, CREDIT_MODES)
    check_number("num_generations", num_generations, low=1, integer=True)
    if len(episodes) % num_generations:
        raise ValueError(f"len(episodes) ({len(episodes)}) must be a multiple of num_generations "
                         f"({num_generations})")
    turns = max(e.chain.num_turns for e in episodes)
    rewards = torch.zeros(len(episodes), turns)
    played = torch.zeros(len(episodes), turns)
    for row, episode in enumerate(episodes):
        k = len(episode.completions)
        played[row, :k] = 1.0
        if credit == "outcome":
            rewards[row, :k] = episode.reward  # r_{i,k} = R_i for every turn played
        else:
            # r_{i,k} = turn k right
            rewards[row, :k] = torch.tensor(episode.turn_correct, dtype=torch.float32)
    grouped = rewards.view(-1, num_generations, turns)
    counts = played.view(-1, num_generations, turns).sum(1, keepdim=True).clamp(min=1)
    group_mean = grouped.sum(1, keepdim=True) / counts  # mean over the group's episodes that played turn k
    return ((grouped - group_mean).reshape(len(episodes), turns)) * played


def credit_report(episodes: list[Episode], num_generations: int) -> dict:
    """Error accumulation and credit assignment, measured (fractions in [0, 1]). `episodes` as
    `run_episodes` returns them (groups of `num_generations` contiguous episodes).


    turn_accuracy[k]      share of played turns k whose own sum was right
    on_track[k]           share of episodes whose running total is still right after turn k
    episode_reward        mean episode reward (= on_track of the last turn when every turn is played)
    blamed_correct_turns  share of CORRECT turns that get a negative advantage under outcome credit:
                          a later turn's mistake punishes them (per-turn credit never does)
    rewarded_wrong_turns  share of WRONG turns with a positive advantage under outcome credit (two
                          wrong sums that cancel out still win the episode)
    context_chars[k]      mean length of the transcript after turn k, in characters (= tokens for
                          the lab's character tokenizer): the context a multi-turn policy conditions on
    """
    turns = max(e.chain.num_turns for e in episodes)
    outcome = turn_advantages(episodes, num_generations, "outcome")
    played_right, played_wrong = [], []
    for row, episode in enumerate(episodes):
        for k, right in enumerate(episode.turn_correct):
            (played_right if right else played_wrong).append(float(outcome[row, k]))
    turn_accuracy, on_track = [], []
    for k in range(turns):
        played = [e.turn_correct[k] for e in episodes if len(e.turn_correct) > k]
        turn_accuracy.append(sum(played) / max(len(played), 1))
        on_track.append(sum(len(e.on_track) > k and e.on_track[k] for e in episodes) / len(episodes))
    return {
        "turn_accuracy": turn_accuracy,
        "on_track": on_track,
        "episode_reward": sum(e.reward for e in episodes) / len(episodes),
        "blamed_correct_turns": sum(a < 0 for a in played_right) / max(len(played_right), 1),
        "rewarded_wrong_turns": sum(a > 0 for a in played_wrong) / max(len(played_wrong), 1),
        "context_chars": [
            sum(len(e.transcript_upto(k)) for e in episodes) / len(episodes) for k in range(turns)
        ],
    }
