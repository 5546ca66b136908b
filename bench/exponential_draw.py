"""The sampler's Exp(1) draw: torch's `exponential_` against `exponential_like` (the same numbers from
float64 `uniform_` and one vectorised -log1p(-u)), interleaved in one process.

    python bench/exponential_draw.py    # (64, 58): a 64 x 32 benchmark call; (256, 58): a GRPO rollout

The two take turns (A B A B ...) for 15 rounds of 300 calls each at every shape; the line gives each
one's median microseconds per call and the median and quartiles of the per-round ratio, with the torch
thread count and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from rlhf_lab.sampling.fast import exponential_like


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    loads = [os.getloadavg()[0]]
    for shape in [(64, 58), (256, 58)]:
        probs = torch.empty(shape)
        contenders = {
            "exponential_": lambda probs=probs: torch.empty_like(probs).exponential_(generator=generator),
            "exponential_like": lambda probs=probs: exponential_like(probs, generator)}
        for fn in contenders.values():  # warm-up
            per_call_us(fn, 50)
        times = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                times[name].append(per_call_us(fn, args.calls))
        ratios = [a / b for a, b in zip(times["exponential_"], times["exponential_like"])]
        low, _, high = statistics.quantiles(ratios, n=4)
        print(f"{shape}: exponential_ {statistics.median(times['exponential_']):.1f} us, exponential_like "
              f"{statistics.median(times['exponential_like']):.1f} us; exponential_like "
              f"{statistics.median(ratios):.2f}x faster (quartiles {low:.2f}-{high:.2f}), "
              f"{args.rounds} interleaved rounds of {args.calls} calls")
    loads.append(os.getloadavg()[0])
    print(f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}, 1-minute load average "
          f"{min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
