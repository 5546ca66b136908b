"""Measurements of the split, shared by bench/distributed.py and notebook 16.

    steps_per_second(trainer, warmup=3)        train, then steps / s after the first `warmup` steps
    run_data_parallel(2, sync_seconds, configs, repeats)
                                               {model: {"bucket": [s, ...], "tensor": [...]}, ...} on rank 0

A sync is timed from a barrier to the receiver's acknowledgement (one value broadcast back after it
loaded the weights): the payload copy, the broadcast(s), the load and one small message.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..model import LlamaModel
from ..train.callbacks import Callback
from .ddp import allreduce_seconds
from .weights import (
    load_weights,
    receive_buffers,
    receive_weights,
    send_weights,
    trainable_tensors,
    weight_payload,
)

SYNC_MODES = ("bucket", "tensor")


class StepClock(Callback):
    """perf_counter at the end of every step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, trainer, metrics, distributions=None):
        self.ends.append(time.perf_counter())


def steps_per_second(trainer, warmup: int = 3) -> float:
    """Run `trainer.train()` and return its steps per second after the first `warmup` steps (process
    start-up and first-call allocations excluded)."""
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    ends = clock.ends[warmup - 1:] if warmup else clock.ends
    if len(ends) < 2:
        raise ValueError(f"steps_per_second needs more than {warmup + 1} steps, the run made "
                         f"{len(clock.ends)}")
    return (len(ends) - 1) / (ends[-1] - ends[0])


def sync_seconds(rank: int, world_size: int, model_configs: dict, repeats: int = 20) -> dict | None:
    """run_data_parallel target (2 ranks): rank 0 sends the weights of each model in `model_configs`
    ({name: ModelConfig}) to rank 1, as a bucket and tensor by tensor in alternating order, `repeats`
    times each; then all-reduces of 1e4 .. 4e6 values. Returns the seconds on rank 0, None on rank 1."""
    results = {}
    ack = torch.zeros(1)
    for name, config in model_configs.items():
        torch.manual_seed(0)
        tensors = trainable_tensors(LlamaModel(config))
        buffers = {mode: receive_buffers(tensors, mode) for mode in SYNC_MODES}
        times = {mode: [] for mode in SYNC_MODES}
        for repeat in range(repeats):
            for mode in SYNC_MODES if repeat % 2 == 0 else SYNC_MODES[::-1]:
                dist.barrier()
                start = time.perf_counter()
                if rank == 0:
                    send_weights(weight_payload(tensors, mode), None)
                else:
                    receive_weights(buffers[mode], None)
                    load_weights(tensors, buffers[mode], mode)
                dist.broadcast(ack, 1)  # the receiver has loaded them
                times[mode].append(time.perf_counter() - start)
        results[name] = {"parameters": sum(t.numel() for t in tensors), "tensors": len(tensors), **times}
    results["allreduce"] = allreduce_seconds([10_000, 100_000, 1_000_000, 4_000_000], repeats=repeats)
    return results if rank == 0 else None


def lab_model_sizes() -> dict:
    """The shipped model's config and a 4.5M-parameter one of the same family (hidden 320, 4 layers)."""
    from ..sft import lab_model_config
    from ..text.tokenizer import default_tokenizer

    tokenizer = default_tokenizer()
    big = dict(hidden_size=320, intermediate_size=864, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=80)
    return {"shipped": lab_model_config(tokenizer), "4.5M": lab_model_config(tokenizer, **big)}


def two_process_measurements(rank: int, world_size: int, model_configs: dict, repeats: int,
                             config) -> dict | None:
    """run_data_parallel target for one start-up of two processes: `sync_seconds`, then the data-parallel
    gradient of one rollout of `config` (rlhf_lab.distributed.ddp.gradient_worker) next to the full
    batch's gradient computed on rank 0 alone. Rank 0 gets {"sync": ..., "ddp": (parallel, full)}."""
    from .ddp import gradient_worker

    sync = sync_seconds(rank, world_size, model_configs, repeats)
    parallel = gradient_worker(rank, world_size, config)
    if rank != 0:
        return None
    from ..rl import Trainer

    trainer = Trainer(config)
    rollout = trainer.collect_rollout()
    trainer.compute_advantages(rollout)
    return {"sync": sync, "ddp": (parallel, trainer.loss_and_gradient(rollout).gradient)}
