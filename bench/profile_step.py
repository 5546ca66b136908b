"""Where the time of one default GRPO step goes, and how far each phase is from its arithmetic floor.

    python bench/profile_step.py                   # 32 prompts x 8 completions, shipped checkpoint, defaults
    python bench/profile_step.py --algo gspo --steps 10 --threads 1
    python bench/profile_step.py --steps 10 --ops    # and the top aten ops of the update and the decode loop

The step is taken apart with the trainer's public pieces and each piece is timed on its own, `--steps`
times after two warm-up steps (median reported):

    rollout    prefill (the prompts through the model once), decode loop (one token for all rows per
               iteration; of it, the logits processors + sampling, timed apart on the same shapes),
               decode + scoring of the texts
    reference  log pi_ref: the full-batch forward (what the step did before it was skipped at beta = 0)
               and the `kl_metric_samples`-row sample the step now runs for its KL metrics
    update     forward (with entropy), loss, backward, optimiser (clip + AdamW)
    bookkeeping  train_step's own time minus its phases: metrics, the snapshot that makes a step
               atomic, the finite-weight check

Floor: FLOPs counted from the shapes (2 per multiply-add of every matmul: projections, attention
scores and values, lm_head; backward = 2 x forward), divided by this CPU's fp32 matmul throughput
measured at the same shapes (`torch.nn.functional.linear`, the op the model uses). Overhead share:
the phase run on 1 row instead of N (same lengths, almost no arithmetic) over the phase on N rows,
i.e. the part of the time that is Python and op dispatch rather than arithmetic. All times are
CPU seconds of this process (steady on a shared machine; with 1 thread, equal to wall time when idle).

--ops: `torch.profiler` (with input shapes) over `--steps` updates (forward with entropy, loss,
backward, on one rollout) and `--steps` rollouts' `generate` calls, each after a warm-up call; the top
aten ops by self CPU time per call, with their shapes and count per call, and for the matmuls (mm, bmm,
addmm) their FLOPs and the GFLOP/s they reached against the F.linear throughput measured here. Self
times under the profiler include its own overhead (a few us per op), so the op table's total exceeds
the phase times above. The profiler's records also split the heap's free blocks, and without a
reserve (`--reserve-mb`, Linux with glibc) the step's large tensors land on fresh pages: ~3,000 page
faults per update, which the step itself does not take, charged to whichever ops write large outputs.
Each table gives the page faults per call with and without the profiler: they should be close.
"""

# The timed lambdas below are called at once, inside the loop iteration that defines them, so binding
# the loop variables late (ruff B023) cannot pick up another iteration's values.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import date

import torch
import torch.nn.functional as F

from rlhf_lab.rl import Trainer, make_config
from rlhf_lab.rl.rollout import score_completions
from rlhf_lab.sampling import generate
from rlhf_lab.sampling.generate import token_chooser
from rlhf_lab.util.device import cpu_name


def clock(fn, repeat: int = 1):
    """(median CPU seconds of fn(), its last result). CPU time of this process, not wall time: with one
    thread it is the time spent computing, which other jobs on a shared machine do not stretch."""
    times, result = [], None
    for _ in range(repeat):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def linear_gflops(rows: int, fan_in: int, fan_out: int, repeat: int = 30) -> float:
    """Measured fp32 throughput of F.linear at (rows, fan_in) x (fan_in, fan_out), GFLOP/s: the best
    of `repeat` calls (the floor is what the CPU can do, not what a busy moment let it do)."""
    x, w = torch.randn(rows, fan_in), torch.randn(fan_out, fan_in)
    F.linear(x, w)
    best = min(clock(lambda: F.linear(x, w))[0] for _ in range(repeat))
    return 2 * rows * fan_in * fan_out / max(best, 1e-9) / 1e9


def forward_flops(config, rows: int, positions: int, keys: float, logits: int) -> float:
    """FLOPs of one forward: `rows` x `positions` tokens through every projection, attention over
    `keys` keys on average, the lm_head on `logits` positions per row."""
    C, I, H, K, D, L = (config.hidden_size, config.intermediate_size, config.num_attention_heads,
                        config.num_key_value_heads, config.head_dim, config.num_hidden_layers)
    projections = C * H * D + 2 * C * K * D + H * D * C + 3 * C * I  # q, k, v, o, gate, up, down
    attention = 2 * H * D * keys  # q.k over the keys, then probs @ v
    return 2 * rows * (positions * L * (projections + attention) + logits * C * config.vocab_size)


MATMULS = ("aten::mm", "aten::bmm", "aten::addmm")


def matmul_flops(name: str, shapes: list) -> float:
    """2 x multiply-adds of a matmul op from its input shapes ((a, b) @ (b, c); batched (n, a, b) @ (n, b, c);
    addmm's bias first); 0 for any other op."""
    if name not in MATMULS:
        return 0.0
    left, right = shapes[-2:]
    batch = left[0] if name == "aten::bmm" else 1
    return 2.0 * batch * left[-2] * left[-1] * right[-1]


def minor_faults() -> int:
    """Page faults of this process so far that found no page (a fresh zeroed page mapped in); 0 where
    the OS does not say (no `resource` module)."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def reserve_heap(megabytes: int) -> bool:
    """Touch `megabytes` of heap and free them, with glibc told to keep them (trim threshold raised):
    the memory the profiler's records take in the middle of the step's free blocks then comes from
    pages already mapped. Without it, the profiler's many small records split the blocks the step's
    tensors would reuse, the heap grows by ~12 MB per profiled update, and each op that writes a large
    output pays for fresh pages: ~3,000 page faults per update, which then took ~3x as long as without
    the profiler, where it takes none (measured 2026-12-03). Linux with glibc only: False elsewhere."""
    from rlhf_lab.util.allocator import MMAP_THRESHOLD_BYTES, keep_freed_memory

    if not keep_freed_memory(trim_threshold_bytes=2 * megabytes * 2**20):  # False off glibc or under the environment's own
        return False
    block = MMAP_THRESHOLD_BYTES // 4  # under the mmap threshold: from the heap, back to the heap when freed
    blocks = [torch.ones(block // 4) for _ in range(megabytes * 2**20 // block)]  # float32: touched
    del blocks
    return True


def op_table(title: str, fn, calls: int, gflops: float, top: int = 25) -> None:
    """Profile `calls` calls of fn (after one warm-up call) and print the top aten ops by self CPU time
    per call, and the page faults per call with and without the profiler (see reserve_heap)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    faults = minor_faults()
    for _ in range(calls):
        fn()
    faults_alone = (minor_faults() - faults) / calls
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        faults = minor_faults()
        for _ in range(calls):
            fn()
        faults_profiled = (minor_faults() - faults) / calls
    ops = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in ops) / calls / 1e3  # ms per call
    matmul = sum(e.self_cpu_time_total for e in ops if e.key in MATMULS) / calls / 1e3
    flops = sum(matmul_flops(e.key, e.input_shapes) * e.count for e in ops) / calls
    count = sum(e.count for e in ops) / calls
    print(f"\n{title}: {count:.0f} aten calls per call (nested ones included), self CPU {total:.1f} ms per call under the "
          f"profiler, of which matmuls {matmul:.1f} ms for {flops / 1e6:.0f} MFLOP ({flops / max(matmul, 1e-9) / 1e6:.0f} "
          f"GFLOP/s; F.linear alone: {gflops:.0f} GFLOP/s, so {flops / gflops / 1e6:.1f} ms at that rate); page faults "
          f"per call {faults_profiled:.0f} under the profiler, {faults_alone:.0f} without it\n")
    print("| op | input shapes | calls | self CPU ms | share | MFLOP | GFLOP/s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]:
        ms = e.self_cpu_time_total / calls / 1e3
        mflop = matmul_flops(e.key, e.input_shapes) * e.count / calls / 1e6
        cells = [f"{mflop:.1f}", f"{mflop / ms:.0f}"] if mflop else ["-", "-"]
        shapes = ", ".join(str(list(shape)) for shape in e.input_shapes if shape)
        print(f"| {e.key.removeprefix('aten::')} | {shapes} | {e.count / calls:.0f} | {ms:.2f} | {ms / total:.0%} | "
              f"{' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="grpo")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ops", action="store_true", help="also the top aten ops of the update and the decode loop")
    parser.add_argument("--reserve-mb", type=int, default=512,
                        help="--ops: heap touched and kept before profiling, so the profiler's own records do not "
                             "put the step's tensors on fresh pages (0: none)")
    args = parser.parse_args()
    if args.reserve_mb < 0:
        parser.error(f"--reserve-mb must be 0 (no reserve) or a positive number of MB, got {args.reserve_mb}")
    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    trainer = Trainer(make_config(args.algo, eval_every=0, eval_examples=1, seed=0))
    trainer.train(steps=2)  # warm-up
    c, sampler, policy, mc = trainer.config, trainer.sampler, trainer.policy, trainer.policy.config
    G, V = c.num_generations, mc.vocab_size
    times: dict[str, list[float]] = {}
    small: dict[str, list[float]] = {}
    flops: dict[str, float] = {}

    def note(name, seconds, store=times):
        store.setdefault(name, []).append(seconds)

    kl_rows = f"reference: KL-metric sample ({min(c.kl_metric_samples or 0, c.prompts_per_step * G)} rows)"
    for _ in range(args.steps):
        # --- rollout, piece by piece (what sample_and_score does)
        examples = sampler.draw_prompts(c.prompts_per_step)
        prompts = [trainer.tokenizer.encode(e.prompt, add_bos=True) for e in examples]
        policy.eval()
        seconds, out = clock(lambda: generate(policy, prompts, sampler.sampling, num_return_sequences=G,
                                              generator=sampler.sample_generator))
        steps = out.timings["steps"]
        N, P = out.completion_ids.shape[0], out.prompt_ids.shape[1]
        prefill_share = out.timings["prefill_s"] / (out.timings["prefill_s"] + out.timings["decode_s"])
        note("rollout: prefill", seconds * prefill_share)  # generate's own wall-clock split, applied to CPU time
        decode = seconds * (1 - prefill_share)
        logits = torch.randn(N, V)
        context = out.sequences[:, : P + 1]

        config = sampler.sampling
        choose = token_chooser(config, config.no_repeat_ngram_size > 0, config.return_logprobs)  # generate's
        context_mask = torch.ones_like(context)

        def processors_and_sampling():
            for _ in range(steps):
                choose(logits, context, context_mask, context.shape[1], sampler.sample_generator)

        seconds, _ = clock(processors_and_sampling)
        note("rollout: decode loop (model)", decode - seconds)
        note("rollout: processors + sampling", seconds)
        one = generate(policy, prompts[:1], sampler.sampling, num_return_sequences=1, stop_at_eos=False,
                       generator=sampler.sample_generator)
        note("rollout: prefill", one.timings["prefill_s"], small)
        note("rollout: decode loop (model)", one.timings["decode_s"], small)

        def decode_and_score():
            texts, finished = zip(*(trainer.tokenizer.decode_until_eos(r) for r in out.completion_ids.tolist()))
            rows = [examples[i // G] for i in range(N)]
            rewards = score_completions(trainer.reward_fn, [e.prompt for e in rows], texts, [e.answer for e in rows],
                                        finished)
            if sampler.accuracy_fn is trainer.reward_fn:  # the reward is the exact match: scored once
                return rewards
            return score_completions(sampler.accuracy_fn, [e.prompt for e in rows], texts, [e.answer for e in rows],
                                     finished)

        note("rollout: decode text + scoring", clock(decode_and_score)[0])
        flops["rollout: prefill"] = forward_flops(mc, c.prompts_per_step, P, (P + 1) / 2, 1)
        flops["rollout: decode loop (model)"] = sum(forward_flops(mc, N, 1, P + t + 1, 1) for t in range(steps - 1))

        # --- the no-grad forwards, and the update, on the real rollout of this step
        with torch.no_grad():
            rollout = trainer.collect_rollout(with_reference=False)
            T = rollout.completion_ids.shape[1]
            note("reference: full batch (skipped at beta = 0)", clock(lambda: trainer.reference_logprobs(rollout))[0])
            note(kl_rows, clock(lambda: trainer.sampled_kl_metrics(rollout))[0])
            note("reference: full batch (skipped at beta = 0)",
                 clock(lambda: trainer.reference_logprobs(rollout.select(torch.arange(1))))[0], small)
        policy.train()
        trainer.algorithm.compute_advantages(rollout)
        # teacher-forced forward as completion_logits runs it: each distinct prompt once (U x P tokens),
        # then every row's first T-1 completion tokens over P + t keys
        U = len(torch.unique(rollout.input_ids[:, :P], dim=0))
        fwd = forward_flops(mc, U, P, (P + 1) / 2, 1) + forward_flops(mc, N, T - 1, P + T / 2, T - 1)
        sample = min(c.kl_metric_samples or N, N)
        flops["reference: full batch (skipped at beta = 0)"] = fwd
        flops[kl_rows] = (forward_flops(mc, min(U, sample), P, (P + 1) / 2, 1)
                                                          + forward_flops(mc, sample, T - 1, P + T / 2, T - 1))
        flops["update: forward"], flops["update: backward"] = fwd, 2 * fwd
        for batch, store in ((rollout, times), (rollout.select(torch.arange(1)), small)):
            seconds, policy_out = clock(lambda b=batch: trainer.policy_outputs(b, with_entropy=True))
            note("update: forward", seconds, store)
            batch.old_logprobs = policy_out.logprobs.detach()
            seconds, (loss, _) = clock(lambda b=batch, p=policy_out: trainer.algorithm.loss(b, p))
            note("update: loss", seconds, store)
            trainer.optimizer.zero_grad(set_to_none=True)
            note("update: backward", clock(loss.backward)[0], store)

            def optimise():
                torch.nn.utils.clip_grad_norm_(trainer.trainable_parameters(), c.max_grad_norm)
                trainer.optimizer.step()

            note("update: clip + AdamW", clock(optimise)[0], store)
        # --- a whole step, to find what is not in the phases above (wall-clock parts scaled to CPU time)
        wall, cpu = time.perf_counter(), time.process_time()
        row = trainer.train_step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        note("whole train_step", cpu)
        note("bookkeeping (train_step - rollout - update)", cpu * (1 - row["step_time"] / wall))
        load.append(os.getloadavg()[0])

    # --- the matmul throughput the floors are computed with
    tokens = N * (T - 1)  # the completion tokens of the update's forward, its largest matmuls
    gflops_update = linear_gflops(tokens, mc.hidden_size, mc.intermediate_size)
    gflops_decode = linear_gflops(N, mc.hidden_size, mc.intermediate_size)
    median = {name: statistics.median(v) for name, v in times.items()}
    step = median["whole train_step"]
    print(f"\nProfile of one {args.algo} step, {date.today()}, {cpu_name()}, "
          f"torch {torch.__version__}, {args.threads} thread(s), 1-minute load average {min(load):.2f}-{max(load):.2f}; "
          f"{c.prompts_per_step} prompts x {G} completions (last step: prompt width {P}, {steps} decode steps, "
          f"forward: {U} distinct prompts x {P} + {N} rows x {T - 1} tokens); median of {args.steps} steps\n")
    print(f"fp32 F.linear throughput: {gflops_update:.1f} GFLOP/s at ({tokens}, {mc.hidden_size}) x "
          f"({mc.hidden_size}, {mc.intermediate_size}) (update, reference), {gflops_decode:.1f} GFLOP/s at "
          f"({N}, {mc.hidden_size}) x ({mc.hidden_size}, {mc.intermediate_size}) (prefill, decode)\n")
    print("| phase | CPU ms | share of step | MFLOP | floor ms | x floor | overhead share (1 row / N rows) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, seconds in median.items():
        share = "-" if name.startswith("reference: full") or name == "whole train_step" else f"{seconds / step:.0%}"
        cells = ["-", "-", "-"]
        if name in flops:
            rate = gflops_decode if name.startswith("rollout") else gflops_update
            floor = flops[name] / rate / 1e9
            cells = [f"{flops[name] / 1e6:.0f}", f"{floor * 1e3:.2f}", f"{seconds / floor:.0f}x"]
        overhead = f"{min(statistics.median(small[name]) / seconds, 1):.0%}" if name in small else "-"
        print(f"| {name} | {seconds * 1e3:.1f} | {share} | {' | '.join(cells)} | {overhead} |")
    total_flops = sum(v for k, v in flops.items() if not k.startswith("reference: full"))
    print(f"\nFLOPs of a step (without the skipped full reference forward): {total_flops / 1e9:.2f} GFLOP; "
          f"floor {total_flops / gflops_update / 1e6:.1f} ms at the update's throughput; the step takes "
          f"{step * 1e3:.1f} ms ({step / (total_flops / gflops_update / 1e9):.0f}x the floor).")
    if args.ops:
        reserved = args.reserve_mb and reserve_heap(args.reserve_mb)
        print(f"\nHeap reserved before profiling: {f'{args.reserve_mb} MB' if reserved else 'none'}")
        with torch.no_grad():
            rollout = trainer.collect_rollout(with_reference=False)
        trainer.algorithm.compute_advantages(rollout)

        def update():
            policy_out = trainer.policy_outputs(rollout, with_entropy=True)
            rollout.old_logprobs = policy_out.logprobs.detach()
            loss, _ = trainer.algorithm.loss(rollout, policy_out)
            trainer.optimizer.zero_grad(set_to_none=True)
            loss.backward()

        def rollout_generate():
            policy.eval()
            with torch.no_grad():
                generate(policy, prompts, sampler.sampling, num_return_sequences=G, generator=sampler.sample_generator)
            policy.train()

        P, T = rollout.prompt_width, rollout.completion_ids.shape[1]
        op_table(f"Update, forward (with entropy) + loss + backward, {len(rollout)} rows, prompt width {P}, "
                 f"{T} completion tokens", update, args.steps, gflops_update)
        op_table(f"Rollout, generate ({c.prompts_per_step} prompts x {G}: prefill, decode loop, sampling)",
                 rollout_generate, args.steps, gflops_decode)


if __name__ == "__main__":
    main()
