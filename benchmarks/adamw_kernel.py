"""AdamW alone over GPT-2 124M's parameters on a CUDA GPU: PyTorch's fused AdamW against
:class:`helpers.core.kernels.adamw.TritonAdamW` at each (BLOCK, warps) config, next to a copy:

    python benchmarks/adamw_kernel.py --out results/h200-adamw-kernel-DATE.json

Each optimizer steps the real model's 148 fp32 parameter tensors (vocabulary padded to 50304: 124.5M
parameters) with random gradients and a clip divisor in ``grad_scale``, as the last rung does
(``fused_clip``), from fresh copies of the same weights and gradients for each optimizer (fused
AdamW divides the gradients by ``grad_scale`` in place). AdamW moves 28 bytes per parameter (reads
weight, gradient and both moments, writes weight and moments; fused AdamW with a ``grad_scale`` also
writes the gradients back: 32); "GB/s" counts those bytes. "copy" is ``Tensor.copy_`` of one fp32
buffer of all the parameters (reads and writes 8 bytes per parameter): the bandwidth a one-pass
kernel can hope for. Before timing, each Triton config's weights after three steps are compared with
fused AdamW's from the same start (``max_abs_diff``: fp32 rounding, not a different update).

The step with it: ``python benchmarks/perf.py --variants final adamw-triton``.
"""

from __future__ import annotations

import sys
from unittest import mock

import torch

from helpers.core import train
from helpers.core.kernels import adamw
from helpers.core.model import GPT, GPTConfig
from helpers.measure import results

CONFIGS = [{"BLOCK": b, "NUM_WARPS": w} for b in (1024, 2048, 4096, 8192) for w in (4, 8, 16)]


def _optimizer(kind: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    # the trainer's optimizer: its hyperparameters and groups (train.make_optimizer)
    run = train.RunConfig()
    groups = train.param_groups(params, run.weight_decay)
    kw = dict(lr=run.lr, betas=run.betas, eps=1e-8)
    if kind == "fused":
        return torch.optim.AdamW(groups, fused=True, **kw)
    return adamw.TritonAdamW(groups, **kw)


def _params(model: GPT, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    # copies: fused AdamW with a grad_scale writes the divided gradients back into p.grad
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return params


def sweep(steps_checked: int = 3) -> dict:
    """Time fused AdamW and every Triton config on GPT-2 124M's parameters.

    Returns:
        {"parameters": int, "tensors": int, "copy": {"ms", "GB/s"}, "fused": {"ms", "GB/s"},
        "configs": [{"BLOCK", "NUM_WARPS", "ms", "GB/s", "max_abs_diff"}, ...] fastest first};
        ms is the mean per step (``triton.testing.do_bench``), GB/s counts 28 bytes per parameter
        (32 for fused AdamW, 8 for the copy).
    """
    from triton.testing import do_bench

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_multiple=64)).cuda()
    n = sum(p.numel() for p in model.parameters())
    grads = [torch.randn_like(p) * 1e-2 for p in model.parameters()]
    scale = torch.tensor(1.3, device="cuda")
    gbs = lambda ms, per_param=28: per_param * n / ms / 1e6  # noqa: E731

    flat = torch.randn(n, device="cuda")
    dst = torch.empty_like(flat)
    copy_ms = do_bench(lambda: dst.copy_(flat), warmup=25, rep=200)
    out = {"parameters": n, "tensors": len(grads), "copy": {"ms": copy_ms, "GB/s": gbs(copy_ms, 8)}}

    def timed(kind: str) -> tuple[float, list[torch.Tensor]]:
        params = _params(model, grads)
        opt = _optimizer(kind, params)
        opt.grad_scale = scale
        for _ in range(steps_checked):
            for p, g in zip(params, grads):  # fused AdamW divided the last step's in place
                p.grad = g.clone()
            opt.step()
        after = [p.detach().clone() for p in params]
        return do_bench(opt.step, warmup=10, rep=200), after

    fused_ms, want = timed("fused")
    out["fused"] = {"ms": fused_ms, "GB/s": gbs(fused_ms, 32)}
    out["configs"] = []
    for config in CONFIGS:
        with mock.patch.multiple(adamw, **config):
            ms, got = timed("triton")
        diff = max((a - b).abs().max().item() for a, b in zip(got, want))
        out["configs"].append({**config, "ms": ms, "GB/s": gbs(ms), "max_abs_diff": diff})
    out["configs"].sort(key=lambda r: r["ms"])
    return out


def main(argv=None) -> int:
    return results.gpu_benchmark_main(
        argv, __doc__, __file__, "a CUDA GPU and Triton", lambda args: sweep(),
        available=lambda: (adamw.triton is not None, "Triton is not installed"),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
