"""How stable is the step time of activation checkpointing? Chapter 09's sweep (off, every block,
every block with the selective policy) four times in one process: fresh, after the chapter's
accumulation check, after its accumulation sweep, and once more, with the global flags that could
slow a step printed after each. Prints ms per step (median of 5 after 2 warm-up steps) per setting.
On a GPU: ``PYTHONPATH=$PWD python benchmarks/checkpointing_spread.py`` (about 60 s on an H200).
"""

import time

import torch

from helpers.chapters import ch09_tradeoffs as tradeoffs
from helpers.core import train
from helpers.measure import hardware

SETTINGS = [0, 1, (1, "selective")]


def flags() -> tuple:
    """The process-wide settings that change a step's kernels: deterministic algorithms, fp32
    matmul precision, cudnn.benchmark, TF32 matmuls, grad mode, anomaly detection."""
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.is_grad_enabled(),
        torch.is_anomaly_enabled(),
    )


def main() -> None:
    device = hardware.default_device()
    run, cfg = tradeoffs.benchmark_run(device)
    B, T = run.batch_size, run.seq_len

    def sweep(tag: str) -> None:
        start = time.time()
        rows = tradeoffs.checkpointing_sweep(run, cfg, device, SETTINGS, warmup=2, iters=5)
        ms = [round(r["ms"], 1) for r in rows]
        print(tag, ms, flags(), f"{time.time() - start:.0f} s", flush=True)

    print(f"{run.name}, B={B}, T={T}, settings {SETTINGS}, on {device}")
    sweep("fresh")
    switches = train.model_switches(run)
    tradeoffs.accumulation_report(cfg, B, T, micro_steps=4, device=device, model_switches=switches)
    sweep("after accumulation_report")
    steps = [1, 4, 32] if device.type == "cuda" else [1, 4]
    tradeoffs.accumulation_sweep(run, cfg, device, steps, warmup=1, iters=3)
    sweep("after accumulation_sweep")
    sweep("again")


if __name__ == "__main__":
    main()
