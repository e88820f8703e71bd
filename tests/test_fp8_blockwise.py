"""benchmarks/fp8_blockwise.py (results/perf-log.md, 2026-12-06): its block-scaled e4m3 casts give
the values back within e4m3's rounding, in the scale layouts cuBLAS's blockwise modes read. The
matmuls themselves need a Hopper GPU (the benchmark was run on the H200)."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fb():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "fp8_blockwise", ROOT / "benchmarks/fp8_blockwise.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_1x128_blocks_undo_the_cast_block_by_block(fb):
    torch.manual_seed(0)
    # blocks of one row five decades apart: one scale per 128 elements keeps each one's precision
    x = torch.randn(8, 512) * torch.logspace(-3, 2, 4).repeat_interleave(128)[None, :]
    x8, s = fb.quant_1x128(x)
    assert s.shape == (8, 4) and s.stride() == (1, 8), "outer-dim-major (R, K/128) scales"
    back = fb.dequant_1x128(x8, s)
    # e4m3 rounds a normal value by at most 1/16 of itself, a subnormal by half its 2**-9 step
    step = s.repeat_interleave(128, dim=1) * 2.0**-10
    assert ((back - x).abs() <= x.abs() / 16 + step + 1e-12).all(), "worse than e4m3's rounding"
    assert (x8.float().abs().view(8, 4, 128).amax(-1) == 448).all(), "each block's amax -> 448"


def test_128x128_scales_in_the_layout_cublas_reads(fb):
    torch.manual_seed(0)
    w = torch.randn(256, 384)
    w[:128, 128:256] *= 100  # one block 100x larger: only its own scale grows
    w8, s = fb.quant_128x128(w)
    # (L4, N / 128) with stride (1, L4), L4 = K / 128 = 3 rounded up to 4; the padding unused
    assert s.shape == (4, 2) and s.stride() == (1, 4)
    scales = s.t()[:, :3]  # (N / 128, K / 128)
    assert torch.allclose(scales[0, 1] / scales[0, 0], torch.tensor(100.0), rtol=0.2)
    per_elem = scales.repeat_interleave(128, 0).repeat_interleave(128, 1)  # (N, K)
    back = w8.float() * per_elem
    assert ((back - w).abs() <= w.abs() / 16 + per_elem * 2.0**-10 + 1e-12).all(), "rounding"
    assert (w8.float().abs().view(2, 128, 3, 128).amax(dim=(1, 3)) == 448).all()
