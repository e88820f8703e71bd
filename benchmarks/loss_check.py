"""Loss check of the issue "beat the reference trainer": the fastest configuration must train like
the plain bf16 one.

    python benchmarks/loss_check.py --steps 200 --batch-size 16 --variants recompute-ce \\
        --out results/x.json

Trains GPT-2 124M (T=1024) on Tiny Shakespeare for ``--steps`` steps from the same seed and the same
batches with (a) the ladder's "+ bf16 autocast" rung (TF32 + bf16 autocast, eager, manual attention,
vocab 50257, foreach AdamW) and (b) the ladder's last rung plus each ``benchmarks/perf.py`` variant,
then compares the mean loss of the last 10 steps. Passing means within ``--tolerance`` (1%).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from helpers.core import data
from helpers.core.model import GPTConfig
from helpers.core.train import build
from helpers.ladder import ladder_configs, last_runnable
from helpers.measure import results

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from perf import VARIANTS, experiment  # noqa: E402


def run_losses(
    run, steps: int, tokens: torch.Tensor, device: torch.device, variant: str = "final"
) -> list[float]:
    trainer = build(run, GPTConfig(), device)
    loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, device)
    with experiment(variant):
        losses = [trainer.step(loader) for _ in range(steps)]
    return [float(x) for x in torch.stack(losses).cpu()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--variants", nargs="+", default=["final"], choices=list(VARIANTS))
    p.add_argument("--tolerance", type=float, default=0.01)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/loss_check.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    tokens = data.load_tokens()
    rungs = {run.name: run for run, _ in ladder_configs(args.batch_size, 1024, device=device)}
    plain = rungs["+ bf16 autocast"]
    final = last_runnable(args.batch_size, 1024, device)
    base = run_losses(plain, args.steps, tokens, device)
    base_end = sum(base[-10:]) / 10
    rows = [
        {
            "config": "plain bf16 (ladder rung '+ bf16 autocast')",
            "switches": dataclasses.asdict(plain),
            "last10_mean_loss": base_end,
            "losses": base,
        }
    ]
    print(f"plain bf16: loss(last 10 of {args.steps}) = {base_end:.4f}", flush=True)
    ok = True
    for v in args.variants:
        run = final.replace(name=v, **VARIANTS[v])
        losses = run_losses(run, args.steps, tokens, device, v)
        end = sum(losses[-10:]) / 10
        rel = (end - base_end) / base_end
        ok &= abs(rel) <= args.tolerance
        rows.append(
            {
                "config": f"last rung ({final.name}) + {v}",
                "switches": dataclasses.asdict(run),
                "last10_mean_loss": end,
                "rel_diff": rel,
                "losses": losses,
            }
        )
        print(f"{v}: loss(last 10) = {end:.4f}  ({100 * rel:+.2f}% vs plain bf16)", flush=True)
    out = {
        **results.provenance(device),
        "batch_size": args.batch_size,
        "seq_len": 1024,
        "steps": args.steps,
        "tolerance": args.tolerance,
        "passed": ok,
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
