"""Peak-memory measurement for one device.

``torch.cuda.max_memory_allocated`` counts the bytes the caching allocator handed to tensors since
the last reset: the figure that decides whether a step fits. CPUs have no such counter in torch,
so on a CPU these functions return None rather than a made-up number.
"""

from __future__ import annotations

import gc

import torch


def reset_peak(device: torch.device | str) -> None:
    """Free cached blocks and start a new peak-memory window on ``device`` (no-op on CPU)."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device | str) -> int | None:
    """Peak bytes allocated to tensors on ``device`` since :func:`reset_peak`; None on CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def format_bytes(n: int | None) -> str:
    """'11.52 GiB' style text (binary units); '-' for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
