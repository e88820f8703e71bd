"""Rung "+ Triton AdamW" (``RunConfig(optimizer="triton")``): AdamW in one Triton kernel over all of
a parameter group's tensors at once (``benchmarks/adamw_kernel.py`` measures it against PyTorch's
fused AdamW).

AdamW moves 28 bytes per fp32 parameter each step: it reads the weight, its gradient and the two
moments (16 B) and writes the weight and the moments back (12 B); 3.49 GB for GPT-2 124M's 124.5M
parameters (vocabulary padded to 50304). PyTorch's fused AdamW given a clip divisor (``grad_scale``)
also writes the divided gradients back (32 B per parameter). Here one launch covers a whole
parameter group: each program looks up which tensor and which block of it it owns in tables of the
tensors' addresses (read through ``tl.pointer_type``; made again only when an address changes), so
every program streams ``BLOCK`` contiguous elements of one tensor, whatever the tensors' sizes.

Measured alone on an H100 (``benchmarks/adamw_kernel.py``, torch 2.11,
results/h100-adamw-kernel-2026-12-07.json): 1.17 ms per step at ``BLOCK=1024`` with 16 warps (3.0
TB/s, a copy's speed there) against fused AdamW's 1.53 ms; larger blocks were slower (4096 with 8
warps: 2.10 ms). In the step, on the same H100 (``benchmarks/perf.py --variants final
final+adamw-triton``, results/h100-perf-adamw-triton-2026-12-07.json), the optimizer's kernels took
1.40 instead of 1.77 ms per B=64 step and 1.38 instead of 1.74 at B=16; the step 30.0 -> 29.6 ms
at B=16, at B=64 inside the run-to-run change of the matmuls.

The update is PyTorch's (``torch.optim.AdamW``, decoupled weight decay, Loshchilov & Hutter 2019,
https://arxiv.org/abs/1711.05101, algorithm 2), in fp32 for each element::

    g = grad / grad_scale                   (grad_scale: the fused clip's divisor, if set)
    w = w * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w = w - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

with ``t`` the step count (kept on the host, so the launch needs no device read).
"""

from __future__ import annotations

import math

import torch

from helpers.core.kernels._triton import _INTERPRETED_AT_IMPORT, TRITON_OP_MISSING, tl, triton

BLOCK = 1024  # elements per program (fp32: 4 KiB of each of the four streams)
NUM_WARPS = 16  # the fastest of benchmarks/adamw_kernel.py's 12 configs on an H100

if triton is not None and TRITON_OP_MISSING is None:

    @triton.jit
    def _adamw_kernel(w_tab, g_tab, m_tab, v_tab, numel_tab, block_tensor, block_start,
                      scale_ptr, decay, beta1, beta2, eps, step_size, bc2_sqrt,
                      HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        pid = tl.program_id(0)
        t = tl.load(block_tensor + pid)  # the tensor this program updates
        offs = tl.load(block_start + pid) + tl.arange(0, BLOCK)
        mask = offs < tl.load(numel_tab + t)
        w_ptr = tl.load(w_tab + t).to(tl.pointer_type(tl.float32))
        g_ptr = tl.load(g_tab + t).to(tl.pointer_type(tl.float32))
        m_ptr = tl.load(m_tab + t).to(tl.pointer_type(tl.float32))
        v_ptr = tl.load(v_tab + t).to(tl.pointer_type(tl.float32))
        w = tl.load(w_ptr + offs, mask=mask)
        g = tl.load(g_ptr + offs, mask=mask)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
        if HAS_SCALE:
            g = g / tl.load(scale_ptr)
        w = w * decay
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        w = w - step_size * m / (tl.sqrt(v) / bc2_sqrt + eps)
        tl.store(w_ptr + offs, w, mask=mask)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)


def _to_device(host: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    if device.type != "cuda":
        return host
    # through pinned memory: a copy from pageable memory would wait for the GPU to finish
    return [t.pin_memory().to(device, non_blocking=True) for t in host]


def _block_tables(numels: tuple[int, ...], block: int, device) -> list[torch.Tensor]:
    """Per tensor its element count (int64); per program the index of its tensor (int32) and its
    first element (int64): tensor i gets ceil(numels[i] / block) programs."""
    n = torch.tensor(numels, dtype=torch.int64)
    per_tensor = (n + block - 1) // block
    block_tensor = torch.repeat_interleave(torch.arange(len(numels)), per_tensor)
    first = torch.cumsum(per_tensor, 0) - per_tensor  # each tensor's first program
    block_start = (torch.arange(int(per_tensor.sum())) - first[block_tensor]) * block
    return _to_device([n, block_tensor.to(torch.int32), block_start], device)


def _address_tables(streams: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The four address tables (weights, gradients, exp_avg, exp_avg_sq): int64, one entry per
    tensor, on the tensors' device."""
    host = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64) for ts in streams]
    return _to_device(host, streams[0][0].device)


class TritonAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose step is one Triton launch per parameter group
    (:func:`_adamw_kernel`): same hyperparameters, same state (``step``, ``exp_avg``,
    ``exp_avg_sq``, so ``state_dict`` round-trips with PyTorch's AdamW), same update.

    Like fused AdamW it reads ``self.grad_scale`` (a 0-d fp32 tensor on the device, if set) and
    divides every gradient by it as it reads it (the trainer's fused clip, ``fused_clip``).
    Parameters must be fp32, contiguous, dense and on one CUDA device (or on the CPU under
    ``TRITON_INTERPRET=1``); ``amsgrad``, ``maximize`` and tensor learning rates are not supported.

    Raises:
        RuntimeError: without Triton (or with a torch older than 2.6).
        ValueError: an unsupported option or parameter (the message says which and why).
    """

    def __init__(self, params, **kwargs):
        for key in ("amsgrad", "maximize", "foreach", "fused", "capturable", "differentiable"):
            if kwargs.get(key):
                raise ValueError(f"TritonAdamW does not support {key}=True; use torch.optim.AdamW")
        if triton is None or TRITON_OP_MISSING is not None:
            raise RuntimeError(
                TRITON_OP_MISSING
                or "TritonAdamW needs the triton package (a CUDA install of torch)"
            )
        super().__init__(params, foreach=False, **kwargs)
        for group in self.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                raise ValueError("TritonAdamW takes a float learning rate, not a tensor")
            for p in group["params"]:
                if p.dtype != torch.float32 or not p.is_contiguous() or p.is_sparse:
                    raise ValueError(
                        f"TritonAdamW updates dense, contiguous fp32 parameters; got {p.dtype}, "
                        f"shape {tuple(p.shape)}: keep the weights in fp32 (autocast casts them)"
                    )
                if p.device.type != "cuda" and not _INTERPRETED_AT_IMPORT:
                    raise ValueError(
                        f"TritonAdamW runs on a CUDA GPU; this parameter is on {p.device} "
                        "(set TRITON_INTERPRET=1 before importing helpers for the CPU interpreter)"
                    )
        # per launch (group index, which of its step counts): the tables and the keys they were
        # made for
        self._tables: dict = {}

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step over every parameter with a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = getattr(self, "grad_scale", None)
        if scale is not None and not (
            isinstance(scale, torch.Tensor) and scale.numel() == 1 and scale.dtype == torch.float32
        ):
            raise ValueError(
                "optimizer.grad_scale must be a one-element fp32 tensor on the parameters' device "
                f"(the divisor every gradient is divided by), got {scale!r}"
            )
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                g = p.grad
                if g.is_sparse or not g.is_contiguous() or g.dtype != torch.float32:
                    raise ValueError(
                        "TritonAdamW needs dense, contiguous fp32 gradients (the kernel reads "
                        f"them as fp32); got {g.dtype}, contiguous={g.is_contiguous()}"
                    )
                if g.device != p.device or p.device != params[0].device:
                    raise ValueError("TritonAdamW needs the parameters and gradients on one device")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
            # one launch per step count (the same for all unless a tensor missed a step)
            by_step: dict[float, list[torch.Tensor]] = {}
            for p in params:
                by_step.setdefault(float(self.state[p]["step"]), []).append(p)
            for k, (t, ps) in enumerate(by_step.items()):
                self._launch((gi, k), group, ps, t, scale)
        return loss

    def _launch(
        self, launch: tuple, group: dict, params: list[torch.Tensor], t: float, scale
    ) -> None:
        beta1, beta2 = group["betas"]
        streams = [
            params,
            [p.grad for p in params],
            [self.state[p]["exp_avg"] for p in params],
            [self.state[p]["exp_avg_sq"] for p in params],
        ]
        # the tables are made again only when a tensor moves (new gradients' addresses) or the
        # set of tensors changes
        cache = self._tables.setdefault(launch, {})
        numels = tuple(p.numel() for p in params)
        if cache.get("numels") != (numels, BLOCK):
            cache["numels"] = (numels, BLOCK)
            cache["blocks"] = _block_tables(numels, BLOCK, params[0].device)
        addresses = tuple(x.data_ptr() for ts in streams for x in ts)
        if cache.get("addresses") != addresses:
            cache["addresses"] = addresses
            cache["address_tables"] = _address_tables(streams)
        blocks = cache["blocks"]
        _adamw_kernel[(blocks[1].numel(),)](
            *cache["address_tables"],
            *blocks,
            scale if scale is not None else blocks[0],
            1.0 - group["lr"] * group["weight_decay"],
            beta1,
            beta2,
            group["eps"],
            group["lr"] / (1.0 - beta1**t),
            math.sqrt(1.0 - beta2**t),
            HAS_SCALE=scale is not None,
            BLOCK=BLOCK,
            num_warps=NUM_WARPS,
        )
