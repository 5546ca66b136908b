"""`AsyncTrainer`: the learner of a rollout/learner split. It IS a `Trainer` (same algorithm, loop,
metrics, callbacks, save/resume); only its rollouts come from rollout workers instead of its own sampler.

    trainer = AsyncTrainer(make_config("grpo"), SplitConfig(rollout_workers=1, max_staleness=1))
    trainer.train()          starts the rollout processes, trains, stops them

Per step, the same phases as `Trainer`:
  1. collect_rollout: the sampler is a `RemoteSampler`, whose call returns the next rollout from the
     tier (at most K versions old); then, on the learner, the algorithm's shaping, log pi_ref, the
     proximal log pi_old (this learner's weights, before the update) and the critic's values.
  2. compute_advantages, 3. update: unchanged.
  4. publish: the new weights become version `step`; the next grants carry them.

What crosses the wire: weights (learner -> worker, broadcast on the worker's own group), rollouts
(worker -> learner: tokens, rewards, the behaviour policy's log-probs mu, the version).

Each row of the history adds: `rollout_version` (the policy version that sampled the step's rollout),
`staleness` (this step's version minus that), `queue_length`, `dropped_rollouts` and
`worker_restarts` (run totals), `queue_wait_time` (seconds this step waited for a rollout) and
`sync_time` (seconds spent sending weights during this step).

Resuming: the saved state is the Trainer's (weights, optimiser, generators, rows) plus the policy
version (= step). The generators hold the streams' positions after the last rollout trained on: the
queue's position. At K = 0 nothing else is in flight and a resumed run continues exactly; at K >= 1
the rollouts that were queued or in flight at the stop are sampled again, from the same stream
positions (same prompts) but with the newer weights, so the run differs from there on.
"""

from __future__ import annotations

import time

from ..rl.config import RLConfig
from ..rl.rollout import RolloutSampler
from ..rl.trainer import Trainer
from .config import SplitConfig
from .tiers import make_tier
from .weights import trainable_tensors, weight_payload
from .worker import rollout_to

SPLIT_COLUMNS = ("rollout_version", "staleness", "queue_length", "dropped_rollouts", "worker_restarts",
                 "queue_wait_time", "sync_time")


class RemoteSampler(RolloutSampler):
    """The learner's sampler: the attributes of its own sampler (tokenizer, task, reward, streams), but
    a call returns the next rollout from the rollout tier. ReMax's greedy baseline still decodes here,
    with the learner's weights. DAPO's dynamic sampling refills a batch with whole rollouts from the
    tier, so after a refill the prompts differ from the single process's (which draws just enough)."""

    def __init__(self, local: RolloutSampler, trainer: AsyncTrainer) -> None:
        super().__init__(local.policy, local.tokenizer, local.task, local.reward_fn, local.train_examples,
                         local.sampling, local.num_generations, sample_generator=local.sample_generator,
                         data_generator=local.data_generator, accuracy_fn=local.accuracy_fn)
        self.trainer = trainer

    def __call__(self, count: int):
        if count != self.trainer.config.prompts_per_step:
            raise ValueError(f"rollout workers sample prompts_per_step "
                             f"({self.trainer.config.prompts_per_step}) prompts at a time, asked for {count}")
        return self.trainer.receive_rollout()


class AsyncTrainer(Trainer):
    """A `Trainer` whose rollouts come from rollout workers (`split`): see the module docstring."""

    dashboard_kind = "split"  # LiveDashboard's view: staleness, queue, drops, clip fractions, throughput

    def __init__(self, config: RLConfig, split: SplitConfig | None = None, model=None, tokenizer=None,
                 reward_fn=None, callbacks=()) -> None:
        super().__init__(config, model=model, tokenizer=tokenizer, reward_fn=reward_fn, callbacks=callbacks)
        self.split = split or SplitConfig()
        self.local_sampler = self.sampler
        self.sampler = RemoteSampler(self.local_sampler, self)
        self.tier = None
        self.step_messages: list = []  # the rollout messages of the step running now
        self.step_wait = self.step_sync = 0.0
        self.restarts_before = self.dropped_before = 0  # totals of earlier train() calls

    # ------------------------------------------------------------------------------------ the loop

    def train(self, steps: int | None = None, time_budget: float | None = None):
        """`Trainer.train`, with the rollout workers started first and stopped at the end, however it ends."""
        self.tier = make_tier(self, self.split, self.local_sampler)
        try:
            self.tier.start(self.step, self.payload(), (self.sampler.sample_generator.get_state(),
                                                        self.sampler.data_generator.get_state()))
            return super().train(steps=steps, time_budget=time_budget)
        finally:
            self.tier.close()
            self.restarts_before += self.tier.restarts
            self.dropped_before += self.tier.dropped
            self.tier = None

    def payload(self):
        return weight_payload(trainable_tensors(self.policy), self.split.sync)

    def receive_rollout(self):
        """The next rollout from the tier: set the streams to where it leaves them, and move it here."""
        if self.tier is None:
            raise RuntimeError("an AsyncTrainer's rollouts come from its rollout workers, which run while "
                               "train() runs: call train() (or train(steps=1))")
        start, sync_before = time.perf_counter(), self.tier.sync_seconds
        message = self.tier.next_message(self.step)
        self.step_wait += time.perf_counter() - start
        self.step_sync += self.tier.sync_seconds - sync_before
        self.step_messages.append(message)
        # the update's shuffles start where the worker left the data stream after its prompt draws
        self.sampler.data_generator.set_state(message.data_state)
        self.sampler.sample_generator.set_state(message.next_sample_state)
        return rollout_to(message.rollout, self.device)

    def train_step(self) -> dict:
        """`Trainer.train_step`, then publish the new weights (version = step) and log the split's columns."""
        self.step_messages, self.step_wait, self.step_sync = [], 0.0, 0.0
        metrics = super().train_step()
        sync_before = self.tier.sync_seconds
        self.tier.publish(self.step, self.payload())
        self.step_sync += self.tier.sync_seconds - sync_before
        versions = [m.version for m in self.step_messages]
        metrics.update({
            "rollout_version": min(versions), "staleness": self.step - 1 - min(versions),
            "queue_length": self.tier.queue_length,
            "dropped_rollouts": self.dropped_before + self.tier.dropped,
            "worker_restarts": self.restarts_before + self.tier.restarts,
            "queue_wait_time": self.step_wait, "sync_time": self.step_sync,
        })
        return metrics

    @property
    def worker_pids(self) -> list[int]:
        """The rollout processes' ids while train() runs (spawn), else []."""
        return self.tier.pids if self.tier is not None else []

    def extra_state(self) -> dict:
        return {**super().extra_state(), "policy_version": self.step, "dropped_rollouts": self.dropped_before,
                "worker_restarts": self.restarts_before}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        self.dropped_before, self.restarts_before = state["dropped_rollouts"], state["worker_restarts"]
