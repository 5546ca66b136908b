"""GPU benchmark of the scale-up path: generation tokens/s (the lab vs transformers' generate), GRPO step
time, and memory (measured vs the formula in rlhf_lab.runs.scale_up).

    python bench/gpu.py                                  # Qwen3-0.6B shapes, random weights, on CUDA
    python bench/gpu.py --model /path/to/Qwen3-0.6B      # a real local checkpoint folder
    python bench/gpu.py --shape Qwen2.5-0.5B --batch 32 --new-tokens 512
    python bench/gpu.py --smoke                          # a tiny model on the CPU: checks the script runs

Speed does not depend on the weights, so without --model the model has the shapes of a known
checkpoint (`rlhf_lab.runs.scale_up.KNOWN_CONFIGS`) and random weights: nothing is downloaded. Both
generators decode greedily with EOS ignored, so each produces exactly batch x new_tokens tokens;
transformers runs the very same weights (`to_hf`, SDPA attention, bf16) with its default cache. The
GRPO step is countdown with the task's BPE tokenizer, bf16 autocast, SDPA, fp32 master weights.
Results are printed as markdown and written to bench/results/gpu_<date>.txt. Without a GPU it says so
and measures nothing (unless --smoke).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def once(fn, device) -> float:
    """Seconds of one call, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def peak_of(fn, device) -> float:
    """GiB allocated at the peak of one call of `fn` alone (it also warms up kernels and the allocator)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return peak_gib(device)


def peak_gib(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a local Hugging Face folder (Llama / Qwen2 / Qwen3)")
    parser.add_argument("--shape", default="Qwen3-0.6B", help="KNOWN_CONFIGS entry used without --model")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (lab, transformers)")
    parser.add_argument("--rl-steps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model on the CPU (checks the script, measures nothing)")
    args = parser.parse_args(argv)

    from rlhf_lab.model import LlamaModel, to_hf
    from rlhf_lab.rl import make_config
    from rlhf_lab.rl.trainer import Trainer
    from rlhf_lab.runs.scale_up import (
        describe_parameters,
        estimate_training_memory,
        known_config,
        load_model,
        task_tokenizer,
        tiny_qwen3_config,
    )
    from rlhf_lab.sampling import SamplingConfig, generate
    from rlhf_lab.tasks import get_task
    from rlhf_lab.util.device import describe

    if args.smoke:
        device = torch.device("cpu")
        args.batch, args.prompt_len, args.new_tokens, args.repeats, args.rl_steps = 4, 16, 8, 1, 1
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("No CUDA GPU here: nothing measured. Run on a GPU machine, or --smoke to check the script.")
        return 0

    task = get_task("countdown")
    tokenizer = task_tokenizer(task)
    torch.manual_seed(0)
    if args.model:
        model, tokenizer, source = load_model(task, args.model, device=device)
    elif args.smoke:
        model, source = LlamaModel(tiny_qwen3_config(tokenizer)), "tiny random Qwen3 (smoke test)"
    else:
        config = known_config(args.shape)
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        config.attn_implementation = "sdpa"
        model, source = LlamaModel(config), f"{args.shape} shapes, random weights"
    model = model.to(device).eval()
    lines = [f"# GPU benchmark, {date.today()}", "", f"- device: {describe(device)}", f"- model: {source}, "
             f"{describe_parameters(model.config)}", ""]

    # ---- generation: the lab (static cache, SDPA, bf16 autocast) vs transformers' generate (bf16 weights)
    prompts = torch.randint(10, tokenizer.vocab_size, (args.batch, args.prompt_len), device=device,
                            generator=torch.Generator(device).manual_seed(1))
    sampling = SamplingConfig(do_sample=False, max_new_tokens=args.new_tokens)
    tokens = args.batch * args.new_tokens

    def lab_generate():
        generate(model, prompts, sampling, cache="static", stop_at_eos=False)

    lab_peak = peak_of(lab_generate, device)  # alone on the device, before transformers' copy exists
    hf = to_hf(model).to(device)
    hf.set_attn_implementation("sdpa")
    hf = hf.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    hf.generation_config.eos_token_id = None

    def hf_generate():
        with torch.no_grad():
            hf.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=False,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=None,
                top_k=None,
                top_p=None,
                temperature=None,
            )

    hf_peak = peak_of(hf_generate, device)  # includes the lab model's weights, still on the device
    # Interleaved rounds (A B A B ...): drift in clocks or load hits both sides of each round's ratio.
    lab_times, hf_times = [], []
    for _ in range(args.repeats):
        lab_times.append(once(lab_generate, device))
        hf_times.append(once(hf_generate, device))
    ratios = sorted(h / l for l, h in zip(lab_times, hf_times))
    hf.to("cpu")  # free the GPU for the RL step
    rows = [("lab generate (static cache, SDPA, bf16 autocast)", statistics.median(lab_times), lab_peak),
            ("transformers generate (SDPA, bf16 weights)", statistics.median(hf_times), hf_peak)]
    lines += [
        f"## Generation: batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens, greedy",
        f"{args.repeats} interleaved rounds",
        "",
        "| implementation | median s | tokens/s | peak GiB |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {t:.3f} | {tokens / t:,.0f} | {peak:.2f} |" for name, t, peak in rows]
    lines += ["", f"lab / transformers tokens/s, per round: median {statistics.median(ratios):.2f}x "
              f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}x)", ""]

    # ---- GRPO step on countdown
    config = make_config("grpo", task="countdown", task_params={}, steps=args.rl_steps, eval_every=0,
                         prompts_per_step=max(1, args.batch // 8), num_generations=8 if not args.smoke else 2,
                         max_completion_length=args.new_tokens, n_train=1000, n_test=10, eval_examples=2,
                         device=str(device), bf16=device.type == "cuda" or None, attn_implementation="sdpa",
                         num_minibatches=4 if not args.smoke else 1)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    trainer = Trainer(config, model=model.train(), tokenizer=tokenizer)
    trainer.train()
    history = trainer.history[trainer.history["step"] > 0]
    memory = trainer.memory_bytes()
    estimate = estimate_training_memory(
        model.config,
        len(history) and int(history["num_rollout_rows"].iloc[-1]),
        args.prompt_len,
        args.new_tokens,
        minibatch_rows=config.prompts_per_step * config.num_generations // config.num_minibatches,
    )
    lines += [
        f"## GRPO step: {config.prompts_per_step} prompts x {config.num_generations} completions, "
        f"up to {args.new_tokens} tokens, {config.num_minibatches} minibatches",
        "",
        "| measure | value |",
        "|---|---|",
        f"| step time, median s | {history['step_time'].median():.2f} |",
        f"| rollout time, median s | {history['rollout_time'].median():.2f} |",
        f"| update time, median s | {history['update_time'].median():.2f} |",
        f"| tokens/s (generated, whole step) | {history['tokens_per_s'].median():,.0f} |",
        f"| peak allocated GiB (measured) | {peak_gib(device):.2f} |",
        f"| update's peak above what was held, GiB | {history['mem_update_peak_bytes'].max() / 2**30:.2f} |",
        *[f"| held: {k} GiB | {v / 2**30:.2f} |" for k, v in memory.items()],
        "| formula total GiB (policy, reference, grads, AdamW, activations, logits, KV) | "
        f"{estimate.total / 2**30:.2f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.smoke:
        out = Path(__file__).resolve().parent / "results" / f"gpu_{date.today()}.txt"
        out.write_text(text + "\n")
        print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
