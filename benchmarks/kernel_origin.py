"""Which operation launched a kernel: the last rung's step under torch.profiler with shapes and
Python stacks, for the kernels whose names match a pattern.

    python benchmarks/kernel_origin.py --batch-size 16 --kernel reduce_kernel --out x.json

A per-kernel profile (``benchmarks/perf.py --profile``) names kernels, not who called them; an
eager aten kernel inside a compiled step (for example ``at::native::reduce_kernel`` in the B=64
profiles of 2026-12-04) can come from a custom op, the optimizer or a graph break. torch.profiler
links each CPU operator to the kernels it launched (``FunctionEvent.kernels``); this prints, per
matching kernel, the operator, its input shapes and the innermost Python frames of the course's
code, with the kernel's device time per step.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

import torch

from helpers.core import data
from helpers.core.model import GPTConfig
from helpers.core.train import build
from helpers.ladder import last_runnable
from helpers.measure import results


def origins(batch_size: int, pattern: str, steps: int = 2) -> list[dict]:
    """[{kernel, op, shapes, stack, ms_per_step, calls_per_step}] for kernels matching
    ``pattern`` (a regex) in ``steps`` profiled steps of the last rung at ``batch_size``."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device("cuda")
    run = last_runnable(batch_size, 1024, device)
    trainer = build(run, GPTConfig(), device)
    loader = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, device)
    for _ in range(4):  # compile, then warm
        trainer.step(loader)
    torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts, record_shapes=True, with_stack=True) as prof:
        for _ in range(steps):
            trainer.step(loader)
        torch.cuda.synchronize()
    found: dict[tuple, dict] = defaultdict(lambda: {"us": 0.0, "calls": 0})
    for evt in prof.events():
        for k in getattr(evt, "kernels", []) or []:
            if not re.search(pattern, k.name):
                continue
            stack = [f for f in (evt.stack or []) if "helpers/" in f or "benchmarks/" in f]
            key = (k.name[:120], evt.name, str(evt.input_shapes)[:300], tuple(stack[:6]))
            found[key]["us"] += k.duration
            found[key]["calls"] += 1
    rows = [
        {"kernel": kn, "op": op, "shapes": sh, "stack": list(st),
         "ms_per_step": v["us"] / 1e3 / steps, "calls_per_step": v["calls"] / steps}
        for (kn, op, sh, st), v in found.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--kernel", default="reduce_kernel", help="regex on kernel names")
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print("benchmarks/kernel_origin.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = origins(args.batch_size, args.kernel)
    for r in rows:
        print(f"{r['ms_per_step']:7.3f} ms/step {r['calls_per_step']:5.1f} calls  {r['op']}  "
              f"{r['shapes']}\n    {r['kernel']}\n    " + "\n    ".join(r["stack"]))  # fmt: skip
    prov = results.provenance(torch.device("cuda"))
    out = {**prov, "batch_size": args.batch_size, "pattern": args.kernel, "rows": rows}
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
