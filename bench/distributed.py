"""The rollout/learner split on two CPU cores: throughput against the single process, the cost of a
weight sync, and the staleness table.

    throughput   steps per second, interleaved repeats (each configuration in turn, the order rotated):
                 single process at 1 and at 2 torch threads; the split (one rollout process and the
                 learner, 1 thread each) at K = 1 and 2. The overlap bound
                 (t_rollout + t_learner) / max(t_rollout, t_learner) comes from the inline split at K = 0
                 (1 thread): its queue wait is the sampling, the rest of its step the learner's work.
                 Workloads: the shipped model's default GRPO step, and the same with a reward that takes
                 50 ms per batch (a reward model elsewhere: SlowReward).
    sync         two processes over gloo on 127.0.0.1: one weight sync (payload copy, broadcast, the
                 receiver's load and a one-value acknowledgement) as one flat bucket and tensor by tensor,
                 for the shipped model and a 4.5M-parameter one; an all-reduce against its size; one
                 rollout message (256 completions) learner-bound.
    staleness    rlhf_lab.runs.staleness.staleness_sweep: K = 0, 1, 2, 4, 8 x none / naive / decoupled x
                 3 seeds, 60 GRPO steps, held-out accuracy on 200 problems every 20 steps.
    target       training seconds to 95% held-out accuracy (500 problems every 10 steps, evaluation
                 excluded), GRPO with 4 minibatches (bench/rl_race.py's setting), seed 0: the single
                 process against the split at K = 1 with the naive and the decoupled correction. While
                 the learner evaluates, a split's worker may sample its next rollout: that time is free.

Prints medians with the spread (min-max) and the 1-minute load average before and after each part.

    python bench/distributed.py [--parts throughput sync staleness target] [--repeats 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import date

import torch
import torch.distributed as dist
from rlhf_lab.runs.staleness import final_accuracy_table, staleness_sweep

from rlhf_lab.distributed import AsyncTrainer, SplitConfig
from rlhf_lab.distributed.ddp import run_data_parallel
from rlhf_lab.distributed.measure import lab_model_sizes, steps_per_second, sync_seconds
from rlhf_lab.distributed.wire import recv_object, send_object
from rlhf_lab.distributed.workloads import SlowReward
from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.tasks import get_task
from rlhf_lab.util.device import cpu_name

WARMUP = 3  # steps before the clock starts (process start-up, first-call allocations)
REWARD_DELAYS = {"default": 0.0, "slow_reward": 0.05}


def load() -> float:
    return os.getloadavg()[0]


def trainer_for(kind: str, workload: str, steps: int):
    config = make_config("grpo", steps=WARMUP + steps, eval_every=0, eval_examples=1, seed=0)
    delay = REWARD_DELAYS[workload]
    reward = SlowReward(get_task(config.task, **config.task_params).reward_fn(None), delay) if delay else None
    if kind.startswith("single"):
        return Trainer(config, reward_fn=reward)
    launch, k = ("inline", 0) if kind == "inline_k0" else ("spawn", int(kind[-1]))
    return AsyncTrainer(config, SplitConfig(launch=launch, max_staleness=k), reward_fn=reward)


def run(kind: str, workload: str, steps: int) -> tuple[float, object]:
    """(steps per second, history) of one run of `kind` ("single_1t", "single_2t", "split_k1", ...)."""
    torch.set_num_threads(2 if kind == "single_2t" else 1)
    trainer = trainer_for(kind, workload, steps)
    return steps_per_second(trainer, WARMUP), trainer.history


def spread(values) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def throughput(repeats: int, steps: int) -> None:
    kinds = ["single_1t", "single_2t", "split_k1", "split_k2", "inline_k0"]
    for workload in REWARD_DELAYS:
        loads, rates, bounds, sync_shares = [load()], {k: [] for k in kinds}, [], []
        for repeat in range(repeats):
            for kind in kinds[repeat % len(kinds):] + kinds[: repeat % len(kinds)]:  # rotate the order
                rate, history = run(kind, workload, steps)
                rates[kind].append(rate)
                rows = history.iloc[1 + WARMUP:]
                if kind == "inline_k0":  # the two sides of a step, from the split's own profile
                    sample, learner = rows["queue_wait_time"], rows["step_time"] - rows["queue_wait_time"]
                    bounds.append(statistics.median((sample + learner) / pd_max(sample, learner)))
                if kind.startswith("split"):
                    sync_shares.append(statistics.median(rows["sync_time"] / rows["step_time"]))
            loads.append(load())
        print(f"\n## throughput, workload {workload} ({repeats} repeats x {steps} steps, load average "
              f"{loads[0]:.1f} -> {loads[-1]:.1f})")
        print("| run | steps/s median [min-max] | vs single 1 thread | vs single 2 threads |")
        print("| --- | --- | --- | --- |")
        base1, base2 = statistics.median(rates["single_1t"]), statistics.median(rates["single_2t"])
        for kind in kinds:
            median = statistics.median(rates[kind])
            print(f"| {kind} | {spread(rates[kind])} | {median / base1:.2f}x | {median / base2:.2f}x |")
        bound = statistics.median(bounds)
        best = max(statistics.median(rates["split_k1"]), statistics.median(rates["split_k2"]))
        print(f"overlap bound (inline K=0 profile): {spread(bounds)}; best split / single 1 thread = "
              f"{best / base1:.2f}x = {best / base1 / bound:.0%} of the bound")
        print(f"weight sync share of a split step: median {spread(sync_shares)}")


def pd_max(a, b):
    return a.where(a > b, b)


def sync_and_message(rank: int, world_size: int, repeats: int) -> dict | None:
    """Weight syncs and all-reduces (rlhf_lab.distributed.measure), then one rollout message rank 1 -> 0."""
    results = sync_seconds(rank, world_size, lab_model_sizes(), repeats)
    trainer = Trainer(make_config("grpo", eval_every=0, seed=0))
    rollout = trainer.sampler(trainer.config.prompts_per_step)
    message_times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        if rank == 1:
            send_object(rollout, 0)
        else:
            recv_object(1)
        message_times.append(time.perf_counter() - start)
    if rank == 0:
        results["rollout_message"] = {"rows": len(rollout), "width": rollout.input_ids.shape[1],
                                      "seconds": message_times}
    return results


def sync(repeats: int) -> None:
    before = load()
    results = run_data_parallel(2, sync_and_message, repeats)
    print(f"\n## weight sync over gloo, 2 processes ({repeats} repeats, load average {before:.1f} -> "
          f"{load():.1f})")
    print("| model | parameters | tensors | bucket ms | tensor by tensor ms | tensor / bucket |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in lab_model_sizes():
        r = results[name]
        bucket, tensor = [1e3 * t for t in r["bucket"]], [1e3 * t for t in r["tensor"]]
        print(f"| {name} | {r['parameters']:,} | {r['tensors']} | {spread(bucket)} | {spread(tensor)} | "
              f"{statistics.median(tensor) / statistics.median(bucket):.1f}x |")
    print("all-reduce of n float32 values (median ms): " + ", ".join(
        f"{n:,}: {1e3 * s:.2f}" for n, s in results["allreduce"].items()))
    message = results["rollout_message"]
    print(f"one rollout message ({message['rows']} x {message['width']} tokens, pickled): "
          f"{spread([1e3 * t for t in message['seconds']])} ms")


def staleness(seeds: int) -> None:
    before = load()
    start = time.perf_counter()
    settings = dict(steps=60, eval_every=20, eval_examples=200)
    sweep = staleness_sweep(seeds=tuple(range(seeds)), settings=settings, progress=print)
    torch.set_num_threads(1)
    print(f"\n## staleness sweep ({seeds} seeds, {time.perf_counter() - start:.0f} s, load average "
          f"{before:.1f} -> {load():.1f}): held-out accuracy after 60 steps, mean (std over seeds)")
    print(final_accuracy_table(sweep).round(3).to_string())


def target() -> None:
    before = load()
    config = make_config("grpo", num_minibatches=4, eval_every=10, eval_examples=500, stop_at_accuracy=0.95,
                         steps=600, time_budget=300.0, seed=0)
    runs = {"single process": lambda: Trainer(config),
            "split K=1, naive": lambda: AsyncTrainer(config.replace(off_policy="naive"),
                                                     SplitConfig(max_staleness=1)),
            "split K=1, decoupled": lambda: AsyncTrainer(config.replace(off_policy="decoupled"),
                                                         SplitConfig(max_staleness=1))}
    print(f"\n## time to 95% held-out accuracy (GRPO, 4 minibatches, seed 0, load average {before:.1f})")
    print("| run | reached | steps | training seconds | s/step |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, make in runs.items():
        trainer = make()
        history = trainer.train()
        last = history.iloc[-1]
        reached = trainer.stop_reason == "stop_at_accuracy"
        steps = int(last["step"])
        print(f"| {name} | {'yes' if reached else 'no'} ({last['eval_accuracy']:.3f}) | {steps} | "
              f"{trainer.train_time:.1f} | {trainer.train_time / max(steps, 1):.3f} |")
    print(f"load average after: {load():.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["throughput", "sync", "staleness", "target"],
                        choices=["throughput", "sync", "staleness", "target"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# bench/distributed.py, {date.today()}, {cpu_name()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}")
    if "sync" in args.parts:
        sync(args.repeats * 4)
    if "throughput" in args.parts:
        throughput(args.repeats, args.steps)
    if "staleness" in args.parts:
        staleness(args.seeds)
    if "target" in args.parts:
        target()


if __name__ == "__main__":
    main()
