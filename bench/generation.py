"""Generation speed: the lab's generate with each KV cache and without one, vs transformers' generate.

    python bench/generation.py            # prints a markdown table (tokens/s, ms/step, peak memory)
    python bench/generation.py --impls lab-static hf-generate --settings 64x32 8x256 --threads 2 \
        --sampling both --rounds 7       # the question of issue 12: the lab's sampler vs transformers'
    python bench/generation.py --in-process --impls lab-static lab-compiled hf-generate --settings 64x32 \
        --threads 2 --sampling both --rounds 9   # the same question, call by call in one process
    python bench/generation.py --trees before=/path/to/old/checkout after=. --impls lab-compiled hf-generate \
        --settings 64x32 --threads 2 --sampling sampled   # the lab's code before and after a change

Every configuration runs in its own subprocess so that "peak memory" is that run's peak resident
set size. A run times `--repeats` calls after a warm-up and keeps the fastest: other jobs on a shared
machine only ever slow a call down, and at 64 x 32 one call lasts 15-150 ms, so the best of 3 calls
(the earlier default) could miss every quiet moment where the best of 10 is less likely to. A
RuntimeWarning in a run (lab-compiled: compilation failed, the call decoded eagerly) is printed on that
run's line. The implementations take turns (A B A B ...) for `--rounds` rounds, so that a change of load
on a shared machine hits all of them alike; the table gives the median tokens/s over rounds and the
median and range of the per-round ratio to transformers, with the load average seen meanwhile and the
torch thread count. `--trees NAME=PATH ...` runs every lab implementation once per code tree (each
run imports rlhf_lab from that tree; the script itself is this one), named `impl@NAME`, so that two
versions of the lab's code take turns in the same rounds; transformers runs once, from the first tree.
Each row then also gets its ratio to the same implementation in the first tree. EOS is ignored, so
every row generates exactly batch x new_tokens tokens.
`--sampling greedy` decodes with the argmax; `--sampling sampled` draws with temperature 0.7, top-k 20
and top-p 0.9 on both sides (the same `SamplingConfig`, turned into transformers' arguments by
`hf_generate_kwargs`), so both run the same three warpers every step.
The model is the lab's standard architecture with random weights (speed does not depend on them);
transformers runs the same weights through `to_hf` (eager attention, its default dynamic cache).
`lab-compiled` is the static cache with `generate(..., compile=True)`: its warm-up call compiles the
decode step, and the "first call" column gives that call's seconds (every run is a new process, so each
compiles again; TorchInductor's on-disk cache makes all but the first compilation of a shape shorter).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from datetime import date
from pathlib import Path

SETTINGS = [(64, 32), (8, 256)]
IMPLEMENTATIONS = ["lab-static", "lab-compiled", "lab-dynamic", "lab-paged", "lab-int8", "lab-nocache",
                   "hf-generate"]
PROMPT_LEN = 8
SAMPLING = ("greedy", "sampled")


def sampling_config(sampling: str, new_tokens: int):
    """The decoding settings both sides use: greedy, or temperature 0.7 + top-k 20 + top-p 0.9."""
    from rlhf_lab.sampling import SamplingConfig

    if sampling == "greedy":
        return SamplingConfig(do_sample=False, max_new_tokens=new_tokens)
    return SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=0,
                          max_new_tokens=new_tokens)


def run_one(impl: str, batch: int, new_tokens: int, repeats: int, threads: int | None = None,
            sampling: str = "greedy") -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    generate_tokens = make_call(impl, batch, sampling)

    def call():
        generate_tokens(new_tokens)

    with warnings.catch_warnings(record=True) as caught:  # lab-compiled: a failed compilation warns
        warnings.simplefilter("always", RuntimeWarning)
        start = time.perf_counter()
        call()  # warm-up (lab-compiled: the compilation, unless torch's on-disk cache has it already)
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    best = min(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = rss if sys.platform == "darwin" else rss * 1024
    return {"impl": impl, "sampling": sampling, "batch": batch, "new_tokens": new_tokens, "seconds": best,
            "first_call_s": first,
            "tokens_per_s": batch * new_tokens / best, "ms_per_step": 1000 * best / new_tokens,
            "peak_mib": peak / 2**20, "threads": torch.get_num_threads(),
            "warnings": sorted({str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)})}


def count_ops(batch: int, new_tokens: int, sampling: str, threads: int | None) -> None:
    """Print the aten ops one decode step dispatches (lab-static and hf-generate) and the decode time
    per step, each from the difference between a run of `new_tokens` and one of 2 tokens (so the
    prefill and the setup cancel out). The arithmetic is the same on both sides; the ops are not."""
    import collections

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    if threads:
        torch.set_num_threads(threads)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    calls = {impl: make_call(impl, batch, sampling) for impl in ("lab-static", "hf-generate")}
    for impl, call in calls.items():
        call(2)  # warm-up
        counts = []
        for length in (2, new_tokens):
            with Count() as counter:
                call(length)
            counts.append(counter.ops)
        per_step = {op: (counts[1][op] - counts[0][op]) / (new_tokens - 2) for op in counts[1]}
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            call(2)
            middle = time.perf_counter()
            call(new_tokens)
            seconds.append((time.perf_counter() - middle - (middle - start)) / (new_tokens - 2))
        top = ", ".join(f"{op.removeprefix('aten.')} {n:g}" for op, n in
                        sorted(per_step.items(), key=lambda kv: -kv[1])[:12] if n)
        print(
            f"{impl} ({sampling}, {batch} rows, {torch.get_num_threads()} threads): "
            f"{sum(per_step.values()):.0f} aten ops per decode step, {1000 * statistics.median(seconds):.3f} "
            f"ms per step (median of 5); most frequent: {top}"
        )


def in_process(impls: list[str], batch: int, new_tokens: int, sampling: str, rounds: int,
               threads: int | None) -> None:
    """Print one line: the implementations take turns call by call in this process (no new process per
    run, so no import or compilation between the timed calls), `rounds` rounds after a warm-up; tokens/s
    is the median over rounds, the ratio to hf-generate the median and quartiles of each round's ratio."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    calls = {impl: make_call(impl, batch, sampling) for impl in impls}
    first = {}
    for impl, call in calls.items():  # warm-up; lab-compiled compiles here
        start = time.perf_counter()
        call(new_tokens)
        first[impl] = time.perf_counter() - start
    seconds = {impl: [] for impl in calls}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for impl, call in calls.items():
            start = time.perf_counter()
            call(new_tokens)
            seconds[impl].append(time.perf_counter() - start)
    loads.append(os.getloadavg()[0])
    parts = []
    for impl, times in seconds.items():
        part = (
            f"{impl} {batch * new_tokens / statistics.median(times):.0f} tok/s (first call "
            f"{first[impl]:.1f} s)"
        )
        if "hf-generate" in seconds and impl != "hf-generate":
            q = statistics.quantiles([h / t for h, t in zip(seconds["hf-generate"], times)], n=4)
            part += f" {q[1]:.2f}x hf (quartiles {q[0]:.2f}-{q[2]:.2f})"
        parts.append(part)
    print(
        f"{batch}x{new_tokens} {sampling}, {torch.get_num_threads()} threads, {rounds} rounds, 1-minute load "
        f"average {min(loads):.2f}-{max(loads):.2f}: " + "; ".join(parts),
        flush=True,
    )


def round_ratio(row: dict, baseline: dict | None) -> str:
    """tokens/s of `row` over `baseline`'s, round by round (the two ran in the same round), as the median
    and range over rounds; '-' without a baseline."""
    if baseline is None:
        return "-"
    ratios = [a / b for a, b in zip(row["per_round"], baseline["per_round"])]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def make_call(impl: str, batch: int, sampling: str):
    """call(new_tokens): one generation of `impl` on the benchmark's model and prompts."""
    import torch

    from rlhf_lab.model import LlamaModel, to_hf
    from rlhf_lab.sampling import generate
    from rlhf_lab.sft import lab_model_config
    from rlhf_lab.text.tokenizer import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer()
    model = LlamaModel(lab_model_config(tok, max_position_embeddings=512)).eval()
    prompts = torch.randint(3, len(tok), (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    if impl == "hf-generate":
        hf = to_hf(model)
        hf.generation_config.eos_token_id = None

        def call(new_tokens):
            torch.manual_seed(0)  # transformers samples from the global RNG
            with torch.no_grad():  # no EOS id: it runs to max_new_tokens, as the lab with stop_at_eos=False
                out = hf.generate(
                    input_ids=prompts,
                    attention_mask=torch.ones_like(prompts),
                    pad_token_id=0,
                    eos_token_id=None,
                    **sampling_config(sampling, new_tokens).hf_generate_kwargs(),
                )
            assert out.shape == (batch, PROMPT_LEN + new_tokens), out.shape
        return call
    cache = {"lab-static": "static", "lab-compiled": "static", "lab-dynamic": "dynamic", "lab-paged": "paged",
             "lab-int8": "int8", "lab-nocache": "none"}[impl]

    def call(new_tokens):
        out = generate(model, prompts, sampling_config(sampling, new_tokens), cache=cache, stop_at_eos=False,
                       compile=impl == "lab-compiled")
        assert out.completion_ids.shape == (batch, new_tokens), out.completion_ids.shape
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", nargs=3, metavar=("IMPL", "BATCH", "NEW_TOKENS"), help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)  # --one: import rlhf_lab from this checkout
    parser.add_argument(
        "--trees",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="code trees to compare, each lab implementation run from each (the first is the baseline)",
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per run (the best counts)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median over rounds)")
    parser.add_argument("--impls", nargs="*", default=IMPLEMENTATIONS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--sampling", choices=(*SAMPLING, "both"), default="greedy",
                        help="greedy, sampled (temperature 0.7, top-k 20, top-p 0.9) or both")
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="instead of the table: aten ops and ms per decode step, lab-static and hf-generate",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="instead of the table: the implementations take turns call by call in one process",
    )
    parser.add_argument("--settings", nargs="*", default=[f"{b}x{n}" for b, n in SETTINGS],
                        help="batch x new tokens, e.g. 64x32 8x256")
    args = parser.parse_args()
    if args.one:
        if args.tree:
            sys.path.insert(0, args.tree)
        impl, batch, new = args.one
        print(json.dumps(run_one(impl, int(batch), int(new), args.repeats, args.threads, args.sampling)))
        return
    import torch

    if args.count_ops:
        for sampling in SAMPLING if args.sampling == "both" else (args.sampling,):
            for item in args.settings:
                batch, new = (int(v) for v in item.split("x"))
                count_ops(batch, new, sampling, args.threads)
        return
    settings = [tuple(int(v) for v in item.split("x")) for item in args.settings]
    modes = SAMPLING if args.sampling == "both" else (args.sampling,)
    if args.in_process:
        for batch, new in settings:
            for sampling in modes:
                in_process(args.impls, batch, new, sampling, args.rounds, args.threads)
        return
    threads = ["--threads", str(args.threads)] if args.threads else []
    trees = dict(item.split("=", 1) for item in args.trees)
    contenders = [(impl, None) for impl in args.impls]  # (impl, tree name)
    if trees:  # every lab implementation from every tree, transformers once, from the first
        contenders = [(impl, name) for impl in args.impls for name in trees if impl != "hf-generate"] + \
            [("hf-generate", next(iter(trees)))] * ("hf-generate" in args.impls)
    runs: dict[tuple, list[dict]] = {}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        for sampling in modes:
            for batch, new in settings:
                for impl, tree in contenders:  # the implementations take turns within every round
                    where = ["--tree", str(Path(trees[tree]).resolve())] if tree else []
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--one",
                            impl,
                            str(batch),
                            str(new),
                            "--repeats",
                            str(args.repeats),
                            "--sampling",
                            sampling,
                        ]
                        + threads
                        + where,
                        capture_output=True,
                        text=True,
                    )
                    if out.returncode:  # the run's own error, not only its exit status
                        sys.exit(f"{impl} {batch}x{new} {sampling}{f' @{tree}' if tree else ''} "
                                 f"failed:\n{out.stderr}")
                    run = json.loads(out.stdout.strip().splitlines()[-1])
                    if tree and impl != "hf-generate":
                        run["impl"] = f"{impl}@{tree}"
                    runs.setdefault((sampling, run["impl"], batch, new), []).append(run)
                    print(
                        f"  round {round_ + 1} {sampling:7s} {run['impl']:12s} {batch}x{new}: "
                        f"{run['tokens_per_s']:.0f} tok/s"
                        + "".join(f" [warning: {w}]" for w in run["warnings"]),
                        file=sys.stderr,
                        flush=True,
                    )
        loads.append(os.getloadavg()[0])
    rows = [{**group[0], "tokens_per_s": statistics.median(r["tokens_per_s"] for r in group),
             "ms_per_step": statistics.median(r["ms_per_step"] for r in group),
             "peak_mib": max(r["peak_mib"] for r in group), "per_round": [r["tokens_per_s"] for r in group],
             "first_call_s": max(r["first_call_s"] for r in group)}
            for group in runs.values()]
    from rlhf_lab.util.device import cpu_name

    print(
        f"Generation benchmark, {date.today()}, {cpu_name()}, "
        f"{os.cpu_count()} cores, {rows[0]['threads']} torch threads, torch {torch.__version__}, python "
        f"{platform.python_version()}; {args.rounds} interleaved rounds, best of {args.repeats} calls per "
        "run; "
        f"1-minute load average {min(loads):.2f}-{max(loads):.2f} (per round: "
        f"{', '.join(f'{v:.2f}' for v in loads)})\n"
    )
    first = next(iter(trees), None)
    print(
        "| decoding | implementation | batch x new tokens | tokens/s (median) | ms/step | peak RSS (MiB) "
        "| first call (s, max) | vs hf-generate (median, range) |"
        + (f" vs @{first} (median, range) |" if trees else "")
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if trees else ""))
    for sampling in modes:
        for batch, new in settings:
            key = (sampling, batch, new)
            group = {r["impl"]: r for r in rows if (r["sampling"], r["batch"], r["new_tokens"]) == key}
            for r in group.values():
                line = (f"| {sampling} | {r['impl']} | {batch} x {new} | {r['tokens_per_s']:.0f} | "
                        f"{r['ms_per_step']:.2f} | {r['peak_mib']:.0f} | {r['first_call_s']:.2f} | "
                        f"{round_ratio(r, group.get('hf-generate'))} |")
                if trees:
                    line += f" {round_ratio(r, group.get(r['impl'].split('@')[0] + '@' + first))} |"
                print(line)
    for sampling in modes:
        for batch, new in settings:
            key = (sampling, batch, new)
            group = {r["impl"]: r for r in rows if (r["sampling"], r["batch"], r["new_tokens"]) == key}
            if "lab-static" in group and "lab-nocache" in group:
                print(f"\ncached (static) vs uncached, {sampling}, at {batch} x {new}: "
                      f"{group['lab-static']['tokens_per_s'] / group['lab-nocache']['tokens_per_s']:.1f}x")


if __name__ == "__main__":
    main()
