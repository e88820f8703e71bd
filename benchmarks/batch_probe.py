"""Find the largest batch size that fits at T=1024 for the FP32 and the bf16 + SDPA configurations.

    python benchmarks/batch_probe.py --out results/h200-batch-probe.json

GPU: the real GPT-2 124M and ``helpers.measure.memory.find_max_batch_size`` (full training steps,
OOM caught, retried outside ``except``). CPU: the small configuration against a simulated 1 GiB
budget.
"""

from __future__ import annotations

import argparse

import torch

from helpers.core import train
from helpers.measure import hardware, memory, results

CONFIGS = {
    "fp32, manual attention": dict(),
    "bf16 autocast + sdpa": dict(autocast="bf16", attention="sdpa"),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--margin", type=float, default=0.1)
    results.add_out(p)
    args = p.parse_args(argv)
    args.out = results.checked_out(p, args.out, args.force)
    device = hardware.default_device()
    model_config, _, T = train.default_shapes(device)
    T = args.seq_len or T
    limit = None if device.type == "cuda" else memory.SimulatedMemoryLimit(2**30)
    rows = []
    for name, switches in CONFIGS.items():
        trainer = train.build(
            train.RunConfig(name=name, batch_size=1, seq_len=T, **switches), model_config, device
        )
        res = memory.find_max_batch_size(
            memory.make_step_probe(trainer, T, limit), device, margin=args.margin
        )
        trainer = None
        memory.reset_peak(device)
        rows.append({"config": name, "switches": switches, **res})
        print(
            f"{name:<26} largest B = {res['max_batch_size']:>4}  "
            f"peak {memory.format_bytes(res['peak_mem_bytes']):>10}  "
            f"safe B = {res['safe_batch_size']}  tries: {[(b, ok) for b, ok, _ in res['tried']]}",
            flush=True,
        )
    out = {
        **results.provenance(device),
        "seq_len": T,
        "model": model_config.__dict__,
        "total_memory_bytes": torch.cuda.get_device_properties(device).total_memory
        if device.type == "cuda"
        else None,
        "simulated_limit_bytes": None if limit is None else limit.limit_bytes,
        "rows": rows,
    }
    results.save(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
