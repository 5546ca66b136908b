"""How many KV-cache blocks does beam search need when beams share their prefix blocks?

Runs `rlhf_lab.sampling.measure_block_sharing` on the shipped `addition_sft` model: beam search on
the paged cache (beams share their parent's blocks, copy-on-write on a shared partially filled block)
for every (num_beams, block_size), on the held-out questions alone ("bare") and behind k solved
examples ("k-shot"). Counts blocks, not seconds: the result does not depend on the machine's load.
Prints a markdown table:

    paged           distinct blocks referenced by the beams (peak, mean over steps)
    contiguous      blocks the same beams hold as contiguous per-beam caches of the same lengths
    saved           1 - paged / contiguous
    CoW             blocks copied by copy-on-write during the whole search

    python bench/beam_blocks.py [--prompts 32] [--shots 0 4] [--num-beams 2 4 8] [--block-sizes 1 4 16]
"""

from __future__ import annotations

import argparse

import torch

from rlhf_lab.checkpoints import load_checkpoint
from rlhf_lab.sampling import measure_block_sharing
from rlhf_lab.tasks import get_task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="held-out questions per workload")
    parser.add_argument("--shots", type=int, nargs="+", default=[0, 4], help="solved examples before each")
    parser.add_argument("--num-beams", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    model, tok, meta = load_checkpoint("addition_sft")
    task = get_task(meta["task"], **meta["task_params"])
    _, test = task.make_split(meta["eval"]["data_seed"], meta["eval"]["n_train"], meta["eval"]["n_test"])
    questions, solved = test[: args.prompts], test[-8:]  # the same prompts as notebook 03 in full mode
    print(f"addition_sft, {args.prompts} held-out questions, max_new_tokens {args.max_new_tokens}, "
          f"length_penalty 1.0, early_stopping False\n")
    print("| prompts | prompt tokens | num_beams | block_size | steps | paged peak | contiguous peak "
          "| saved at peak | paged mean | contiguous mean | saved (mean) | CoW copies |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in args.shots:
        prefix = "".join(f"{e.prompt}{e.completion};" for e in solved[:k])
        prompts = [prefix + e.prompt for e in questions]
        width = max(len(tok.encode(p, add_bos=True)) for p in prompts)
        rows = measure_block_sharing(model, prompts, args.num_beams, args.block_sizes, tokenizer=tok,
                                     max_new_tokens=args.max_new_tokens)
        for r in rows:
            assert r["same hypotheses"], "the block size changed the hypotheses"
            print(f"| {'bare' if k == 0 else f'{k}-shot'} | {width} | {r['num_beams']} | {r['block_size']} "
                  f"| {r['steps']} | {r['peak_paged']} | {r['peak_contiguous']} | {r['peak_saved']:.1%} "
                  f"| {r['mean_paged']:.1f} | {r['mean_contiguous']:.1f} | {r['mean_saved']:.1%} "
                  f"| {r['cow_copies']} |")


if __name__ == "__main__":
    main()
