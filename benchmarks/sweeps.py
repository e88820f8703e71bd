"""Attention (chapter 06) and LM-head vocab (chapter 07) sweeps, written as JSON with provenance.

python benchmarks/sweeps.py --out-dir results --prefix h200
"""

from __future__ import annotations

import argparse
from pathlib import Path

from helpers.chapters import ch06_attention as attention
from helpers.chapters import ch07_vocab as vocab
from helpers.measure import hardware, results
from helpers.tools import cli


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out-dir", type=Path, default=Path("results"))
    p.add_argument("--prefix", default="local")
    cli.add_force(p, "sweep JSON")
    args = p.parse_args(argv)
    # both files checked before anything is measured (a committed results/ file needs --force)
    paths = {
        k: results.checked_out(
            p, args.out_dir / f"{args.prefix}-{k}-sweep.json", args.force, flag="--out-dir"
        )
        for k in ("attention", "vocab")
    }
    device = hardware.default_device()
    cuda = device.type == "cuda"
    meta = results.provenance(device)
    seq_lens = [128, 256, 512, 1024, 2048, 4096] if cuda else [64, 128, 256]
    att = attention.attention_sweep(device, seq_lens, B=8 if cuda else 2)
    lm = vocab.lm_head_sweep(device)  # chapter 07's sizes, 50257 and 50304 included
    what = (
        "one attention layer, forward + backward, 12 heads x 64, median of 10; peak = memory added"
    )
    results.save({**meta, "what": what, "dtype": att[0]["dtype"], "rows": att}, paths["attention"])
    what = (
        "LM head x @ W.T forward + backward, 16x1024 tokens, n_embd 768, bf16, median of 10"
        if cuda
        else "LM head, 128 tokens, n_embd 128, fp32"
    )
    results.save({**meta, "what": what, "rows": lm}, paths["vocab"])
    for r in att:
        print(
            f"attention {r['impl']:<7} T={r['T']:<5} {r['status']:<14} "
            f"{r['ms'] or float('nan'):9.3f} ms"
        )
    for r in lm:
        print(f"lm head V={r['V']:<6} {r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
