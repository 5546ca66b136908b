"""Data-parallel learners: W processes, each with a copy of the policy and 1/W of the batch.

After each backward, DDP averages the gradients over the processes (an all-reduce, overlapped with
the backward in buckets). That average is the full batch's gradient only if every process's loss
is normalised like the full batch's. Each rank's loss is a mean over its own shard, in the unit of
the loss's denominator: sequences for loss_type grpo and dr_grpo, tokens for bnpo, dapo and PPO.
Shards hold different numbers of tokens, so a token mean per rank weighs the ranks wrongly. Scaling
rank r's loss by

    scale_r = W * units_r / units_total        (units_total: an all-reduced sum over the ranks)

makes the average (1/W) sum_r scale_r * mean_r = (1/units_total) sum_r sum_r-units = the full mean.
Gradient accumulation is the same sum inside one process: micro-batch k weighs units_k / units_total.
(DAPO's loss and TRL's num_items_in_batch carry the global token count for the same reason.)

Ring all-reduce (what gloo and NCCL run for large tensors): N ranks, D bytes each. A reduce-scatter
then an all-gather, N - 1 steps each: every rank sends and receives 2 (N - 1) / N * D bytes,
almost 2D however many ranks, so it is bandwidth-optimal; the 2 (N - 1) steps make its latency
grow with N.

    ddp = DistributedDataParallel(ShardLoss(trainer))      one per process, after init_process_group
    gradient = data_parallel_gradient(trainer, ddp, minibatch)
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from ..rl.off_policy import corrected_minibatch
from ..rl.rollout import Rollout
from ..util.validation import check_number
from .config import check_divides, free_port

TOKEN_LOSSES = ("bnpo", "dapo")  # loss types whose denominator counts tokens (PPO's masked mean too)


def loss_unit(config) -> str:
    """"sequences" or "tokens": what the algorithm's loss averages over (its denominator's unit)."""
    if config.algo == "ppo" or getattr(config, "loss_type", "grpo") in TOKEN_LOSSES:
        return "tokens"
    return "sequences"


def count_units(rollout: Rollout, unit: str) -> float:
    """How many sequences (rows) or real completion tokens `rollout` holds."""
    return float(len(rollout)) if unit == "sequences" else float(rollout.completion_mask.sum())


def shard_rows(size: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous 1/world_size of `size` rows (world_size must divide size)."""
    check_divides(size, world_size, "the minibatch's rows")
    per = size // world_size
    return torch.arange(rank * per, (rank + 1) * per)


class ShardLoss(torch.nn.Module):
    """The trainer's algorithm loss on one shard, times a scale: a module, so DDP can wrap it and
    all-reduce the gradients of the policy (and of the algorithm's own models) in its backward."""

    def __init__(self, trainer) -> None:
        super().__init__()
        self.trainer = trainer
        self.policy = trainer.policy
        self.others = torch.nn.ModuleDict(trainer.algorithm.models())

    def forward(self, shard: Rollout, scale: float) -> torch.Tensor:
        policy = self.trainer.policy_outputs(shard)
        shard = corrected_minibatch(shard, policy.logprobs, self.trainer.config)  # as Trainer.minibatch_step
        loss, _ = self.trainer.algorithm.loss(shard, policy)
        return loss * scale


def flat_gradient(parameters) -> torch.Tensor:
    return torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in parameters])


def data_parallel_gradient(trainer, ddp, minibatch: Rollout, group=None) -> torch.Tensor:
    """This rank's shard of `minibatch` (the same minibatch on every rank) through `ddp` (a
    DistributedDataParallel(ShardLoss(trainer))): the averaged gradient, flat over
    `trainer.trainable_parameters()`; the full minibatch's gradient up to float rounding."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    shard = minibatch.select(shard_rows(len(minibatch), rank, world).to(minibatch.rewards.device))
    unit = loss_unit(trainer.config)
    here = count_units(shard, unit)
    total = torch.tensor([here], dtype=torch.float64)
    dist.all_reduce(total, group=group)  # units_total: the sum over the ranks
    trainer.optimizer.zero_grad(set_to_none=True)
    ddp(shard, world * here / float(total)).backward()  # DDP averages the gradients over the ranks
    return flat_gradient(trainer.trainable_parameters())


def accumulated_gradient(trainer, minibatch: Rollout, micro_batches: int) -> torch.Tensor:
    """Gradient accumulation in one process: the minibatch in `micro_batches` pieces, each loss
    weighted units_k / units_total, the backwards summed; the unsplit minibatch's gradient."""
    check_number("micro_batches", micro_batches, low=1, integer=True)
    unit = loss_unit(trainer.config)
    total = count_units(minibatch, unit)
    trainer.optimizer.zero_grad(set_to_none=True)
    for k in range(micro_batches):
        piece = minibatch.select(shard_rows(len(minibatch), k, micro_batches).to(minibatch.rewards.device))
        loss, _ = trainer.algorithm.loss(piece, trainer.policy_outputs(piece))
        (loss * count_units(piece, unit) / total).backward()
    return flat_gradient(trainer.trainable_parameters())


# ----------------------------------------------------------------------------------------------
# running W processes


def run_data_parallel(world_size: int, target, *args, timeout: float = 120.0):
    """target(rank, world_size, *args) on `world_size` ranks joined in a gloo group on 127.0.0.1 (a
    free port), one torch thread each: rank 0 in this process (its return value is returned), the
    others in processes started by torch.multiprocessing (spawn: `target` must be a module-level
    function, and a script that calls this needs the `if __name__ == "__main__":` guard)."""
    import torch.multiprocessing as mp

    check_number("world_size", world_size, low=1, integer=True)
    port, context = free_port(), mp.get_context("spawn")
    others = [context.Process(target=joined, args=(rank, world_size, port, timeout, target, args),
                              daemon=True) for rank in range(1, world_size)]
    for process in others:
        process.start()
    try:
        return joined(0, world_size, port, timeout, target, args)
    finally:
        for process in others:
            process.join(timeout)
        failed = [p.exitcode for p in others if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"a data-parallel rank failed (exit codes {failed})")


def joined(rank: int, world_size: int, port: int, timeout: float, target, args):
    """Run target(rank, world_size, *args) inside the process group (one torch thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        return target(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)


def gradient_worker(rank: int, world_size: int, config) -> torch.Tensor:
    """run_data_parallel() target: build the trainer of `config` (every rank the same: same seed, same
    rollout), take one rollout and its advantages, and return its data-parallel gradient."""
    from torch.nn.parallel import DistributedDataParallel

    from ..rl import Trainer

    trainer = Trainer(config)
    rollout = trainer.collect_rollout()
    trainer.compute_advantages(rollout)
    ddp = DistributedDataParallel(ShardLoss(trainer))
    return data_parallel_gradient(trainer, ddp, rollout)


def allreduce_seconds(numels: list[int], repeats: int = 20, group=None) -> dict[int, float]:
    """{numel: median seconds of one all-reduce of that many float32 values} in this group (call on
    every rank). The first call per size is a warm-up."""
    out = {}
    for numel in numels:
        buffer = torch.ones(numel)
        dist.all_reduce(buffer, group=group)
        times = []
        for _ in range(repeats):
            dist.barrier(group=group)
            start = time.perf_counter()
            dist.all_reduce(buffer, group=group)
            times.append(time.perf_counter() - start)
        out[numel] = sorted(times)[len(times) // 2]
    return out
