"""Generation speed of GPT-2 124M on the GPU: full recomputation, a KV cache, a compiled KV cache.

    python benchmarks/generation_speed.py --out results/h200-generation-2026-12-01.json

Greedy generation of ``--new-tokens`` after a random ``--prompt-len``-token prompt, at each
``--batch`` size, for the four ways of chapter 13 (``helpers.chapters.ch13_real_gpt2.SPEED_RUNS``:
recompute, cache under no_grad, cache under inference_mode, compiled cache), timed by
``helpers.core.generation.generation_speed`` (one warm-up run that holds the compile, then the
median of ``--iters`` runs). The model: GPT-2 124M with random weights (speed does not depend on
their values), fp32, SDPA attention, vocabulary padded to 50304. Before timing, the cached greedy
tokens are checked against full recomputation at every batch size (``tokens_equal`` in the
output). Writes provenance (GPU, torch, date, commit), the settings and one row per measurement.
"""

from __future__ import annotations

import argparse
import sys

import torch

from helpers.chapters import ch13_real_gpt2 as ch13
from helpers.core.model import GPT, GPTConfig
from helpers.measure import hardware, results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    device = hardware.default_device()
    torch.set_float32_matmul_precision("highest")  # fp32 as the notebook measures it
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_multiple=64), attention="sdpa").to(device).eval()
    equal = {}
    for b in args.batch:
        prompt = torch.randint(0, model.config.vocab_size, (b, args.prompt_len), device=device)
        slow = model.generate(prompt, args.new_tokens, top_k=1)
        equal[str(b)] = bool(torch.equal(slow, model.generate(prompt, args.new_tokens, top_k=1,
                                                               use_cache=True)))  # fmt: skip
    print(f"greedy tokens, cache == recomputation: {equal}", flush=True)
    rows = ch13.speed_rows(
        model, device, tuple(args.batch), args.prompt_len, args.new_tokens, iters=args.iters
    )
    print(ch13.speed_markdown(rows), flush=True)
    out = {
        **results.provenance(device),
        "model": "GPT-2 124M, random weights, fp32, sdpa, vocab 50304",
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "iters": args.iters,
        "tokens_equal": equal,
        "rows": rows,
    }
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
