"""Causal attention three ways, and the measurements of chapter 06.

- :func:`manual_attention` (the model's own, from :mod:`helpers.core.model`): softmax(q kᵀ / √d
  + causal mask) v, materialising the (T, T) scores.
- :func:`sdpa_attention` (the model's own too): ``F.scaled_dot_product_attention(q, k, v,
  is_causal=True)``: PyTorch picks a fused kernel (FlashAttention, memory-efficient, cuDNN) that
  never stores the scores.
- :func:`tiled_attention`: FlashAttention's idea in plain PyTorch: walk over key/value tiles keeping
  a running max, a running softmax denominator and a running output (the "online softmax" of Milakov
  & Gimelshein 2018, https://arxiv.org/abs/1805.02867), so the result is exact, never approximate.
  FlashAttention: Dao et al. 2022 (https://arxiv.org/abs/2205.14135); FlashAttention-2: Dao 2023
  (https://arxiv.org/abs/2307.08691).

All take q, k, v of shape (B, nh, T, hs) and return (B, nh, T, hs).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.core.model import manual_attention, sdpa_attention  # noqa: F401 (chapter 06 API)
from helpers.measure import hardware, memory, timing


def tiled_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int = 64
) -> torch.Tensor:
    """Exact causal attention computed tile by tile with the online softmax (forward only).

    For each tile of ``tile`` keys: scores s = q kᵀ/√d (B, nh, T, tile); new running max
    m' = max(m, rowmax(s)); rescale the old denominator and output by exp(m - m'); add
    exp(s - m') to the denominator and exp(s - m') v to the output. At the end divide by the
    denominator. Only (T, tile) scores exist at a time. Computed in fp32, returned in q's dtype.
    """
    B, nh, T, hs = q.shape
    qf, kf, vf = q.float(), k.float(), v.float()
    m = torch.full((B, nh, T, 1), float("-inf"), device=q.device)  # running max
    denom = torch.zeros(B, nh, T, 1, device=q.device)  # running softmax denominator
    acc = torch.zeros(B, nh, T, hs, device=q.device)  # running (unnormalised) output
    rows = torch.arange(T, device=q.device).view(T, 1)
    for start in range(0, T, tile):
        kt, vt = kf[:, :, start : start + tile], vf[:, :, start : start + tile]
        s = (qf @ kt.transpose(-2, -1)) / math.sqrt(hs)  # (B, nh, T, tile)
        cols = torch.arange(start, start + kt.size(2), device=q.device).view(1, -1)
        s = s.masked_fill(cols > rows, float("-inf"))  # causal: key index <= query index
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(
            torch.isinf(m_new), torch.zeros_like(m_new), m_new
        )  # rows with no key yet
        scale = torch.exp(m - safe)  # how much the old sums shrink
        p = torch.exp(s - safe)
        denom = denom * scale + p.sum(dim=-1, keepdim=True)
        acc = acc * scale + p @ vt
        m = m_new
    return (acc / denom).to(q.dtype)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64."""
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


# Relative-error tolerances per dtype for comparing two attention implementations.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def compare_outputs_and_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """Manual vs SDPA attention on the same inputs: relative error of outputs and of dq, dk, dv,
    each against the dtype's tolerance in :data:`TOLERANCE`."""
    res = {}
    grads = []
    for fn in (manual_attention, sdpa_attention):
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out = fn(qq, kk, vv)
        out.float().pow(2).sum().backward()
        grads.append((out.detach(), qq.grad, kk.grad, vv.grad))
    tol = TOLERANCE[q.dtype]
    for name, a, b in zip(("output", "dq", "dk", "dv"), grads[0], grads[1]):
        err = relative_error(b, a)
        res[name] = {"rel_error": err, "tolerance": tol, "ok": err < tol}
    return res


class TensorShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor an ATen op returns while the mode is active: a direct
    way to see whether any (…, T, T) tensor was allocated (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func.overloadpacket.__name__), tuple(t.shape)))
        return out


def square_score_tensors(
    fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool = True
) -> list:
    """The (op, shape) of every tensor of shape (…, T, T) that ``fn(q, k, v)`` (and its backward)
    allocates, T = q.size(-2) > head size.
    Empty for a fused SDPA kernel; not for manual attention."""
    T = q.size(-2)
    qq, kk, vv = (t.detach().clone().requires_grad_(backward) for t in (q, k, v))
    rec = TensorShapeRecorder()
    kernels = hardware.cpu_sdpa_kernels() if q.device.type == "cpu" else contextlib.nullcontext()
    with rec, kernels:
        out = fn(qq, kk, vv)
        if backward:
            out.sum().backward()
    return [(op, s) for op, s in rec.shapes if len(s) >= 2 and s[-1] == T and s[-2] == T]


def sdpa_backend_names() -> list[str]:
    """The SDPA backends this torch version can force: FLASH_ATTENTION, EFFICIENT_ATTENTION, ..."""
    from torch.nn.attention import SDPBackend

    return [
        n
        for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
        if hasattr(SDPBackend, n)
    ]


_BACKEND_WORDS = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "CUDNN_ATTENTION": "cudnn",
    "MATH": "math",
}


def _forced_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str
) -> tuple[torch.Tensor | None, list[str], str]:
    """Causal SDPA with only ``backend`` allowed: (output or None, the text of every warning it
    raised, in order and without PyTorch's "(Triggered internally at ...)" suffix, the first line
    of its RuntimeError or "")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out, error = None, ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        except (RuntimeError, NotImplementedError) as e:
            error = str(e).strip().split("\n")[0]
    texts = [str(w.message).split("(Triggered internally")[0].strip() for w in caught]
    return out, texts, error


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _no_reason_check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> str:
    """What the course checks when PyTorch refuses ``backend`` without saying why: the same shapes
    in the other dtypes among fp16, bf16 and fp32, on the same device."""
    others = [d for d in (torch.float16, torch.bfloat16, torch.float32) if d != q.dtype]
    runs = [d for d in others if _forced_sdpa(q.to(d), k.to(d), v.to(d), backend)[0] is not None]
    if runs:
        return (
            f"PyTorch gave no reason after it; the course ran {backend} on the same shapes in "
            f"other dtypes: it runs {' and '.join(map(_dtype_name, runs))}, so the dtype "
            f"{_dtype_name(q.dtype)} is what it refuses here"
        )
    return (
        f"PyTorch gave no reason after it; the course ran {backend} on the same shapes in "
        f"{' and '.join(map(_dtype_name, others))} too: it runs none of them here, so the dtype "
        "alone is not the cause"
    )


def run_forced_backend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str
) -> tuple[torch.Tensor | None, str]:
    """Causal SDPA forced to one backend (``torch.nn.attention.sdpa_kernel``).

    Returns (output, "ok"), or (None, reason) when the backend cannot run these inputs; never
    raises for that. The reason is never empty: PyTorch's own warning about that backend with the
    explanation it gave after it; where it gave none (its "<Backend> kernel not used because:" with
    nothing after it, as chapter 06 recorded for fp32 inputs with torch 2.11 on an H200), that
    heading, the words "PyTorch gave no reason" and what the course found instead by running the
    same shapes in the other dtypes; where PyTorch did not warn about the backend at all, its error
    message."""
    out, texts, error = _forced_sdpa(q, k, v, backend)
    if out is not None:
        return out, "ok"
    word = _BACKEND_WORDS.get(backend, backend.lower())
    # With one backend forced, PyTorch's error path warns "<Backend> kernel not used because:"
    # for every backend in turn, each followed by the reason(s) that backend failed; the other
    # backends' reason is that sdpa_kernel runtime-disabled them.
    headings = [i for i, t in enumerate(texts) if "not used because" in t.lower()]
    mine = next((i for i in headings if word in texts[i].lower()), None)
    if mine is None:
        return None, error or f"{backend} did not run these inputs and PyTorch gave no message"
    end = next((i for i in headings if i > mine), len(texts))
    reasons = [
        t
        for t in texts[mine + 1 : end]
        if t and not ("runtime disabled" in t.lower() and word not in t.lower())
    ]
    if reasons:
        return None, " ".join([texts[mine], *reasons])
    return None, f"{texts[mine]} ({_no_reason_check(q, k, v, backend)})"


def _gpu_half_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the GPU has it natively (compute capability >= 8.0), else fp16 (a T4, a V100)."""
    return torch.bfloat16 if hardware.native_bf16(device) else torch.float16


def attention_sweep(
    device, seq_lens, B: int = 8, n_head: int = 12, head_size: int = 64, dtype=None
) -> list[dict]:
    """Forward + backward time (ms, median of 10) and peak memory (bytes, CUDA only) of manual and
    SDPA attention for each T in ``seq_lens``. A size that runs out of memory is reported, not
    raised. ``dtype`` defaults to bf16 on a GPU with native bf16, fp16 on older GPUs (a T4: its
    memory-efficient SDPA kernel has no bf16 version), fp32 on a CPU."""
    device = torch.device(device)
    if dtype is None:
        dtype = _gpu_half_dtype(device) if device.type == "cuda" else torch.float32
    rows = []
    for T in seq_lens:
        for name, fn in (("manual", manual_attention), ("sdpa", sdpa_attention)):
            row = {
                "impl": name,
                "T": T,
                "B": B,
                "dtype": str(dtype).replace("torch.", ""),
                "ms": None,
                "peak_mem_bytes": None,
                "status": "ok",
            }
            qkv = [
                torch.randn(B, n_head, T, head_size, device=device, dtype=dtype, requires_grad=True)
                for _ in range(3)
            ]

            def step(fn=fn, qkv=qkv):
                for t in qkv:
                    t.grad = None
                fn(*qkv).sum().backward()

            try:
                memory.reset_peak(device)
                base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
                row["ms"] = timing.measure(step, device, warmup=2, iters=10).median_ms
                peak = memory.peak_bytes(device)
                row["peak_mem_bytes"] = None if peak is None else peak - base
            except Exception as e:  # noqa: BLE001 - OOM at large T is a result, not a crash
                if not memory.is_oom(e):
                    raise
                row["status"] = "out of memory"
            rows.append(row)
            qkv = step = None  # free this size's tensors before the next
            memory.reset_peak(device)
    return rows


def pitfall_mask_and_is_causal(device) -> dict:
    """Pass an explicit causal mask *and* ``is_causal=True``, which PyTorch's documentation calls an
    error. Returns {"raised": bool, "message": str, "rel_error_vs_causal": float | None}: whether
    this device's kernel raised, and if not, how far its output is from plain causal attention."""
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, 2, 8, 16, device=device, generator=g)
    mask = torch.ones(8, 8, dtype=torch.bool, device=device).tril()
    try:
        out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=True)
    except RuntimeError as e:
        return {
            "raised": True,
            "message": str(e).strip().splitlines()[0],
            "rel_error_vs_causal": None,
        }
    err = relative_error(out, F.scaled_dot_product_attention(q, q, q, is_causal=True))
    return {
        "raised": False,
        "message": "no error raised: the mistake goes unnoticed here",
        "rel_error_vs_causal": err,
    }


def pitfall_single_query_is_causal(device, n_keys: int = 16) -> dict:
    """One new query against a cache of ``n_keys`` keys (decoding). The last query may see every
    key, but ``is_causal=True`` aligns the mask to the top-left, so it sees only key 0. Returns the
    relative error of ``is_causal=True`` and of ``is_causal=False`` against the correct answer."""
    g = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(1, 2, n_keys, 16, device=device, generator=g)
    v = torch.randn(1, 2, n_keys, 16, device=device, generator=g)
    q = torch.randn(1, 2, 1, 16, device=device, generator=g)
    correct = ((q @ k.transpose(-2, -1)) / 4.0).softmax(
        -1
    ) @ v  # the last position attends to all keys
    wrong = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    right = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    return {
        "is_causal=True": relative_error(wrong, correct),
        "is_causal=False": relative_error(right, correct),
    }


def lm_head_sweep(
    device, vocab_sizes, n_tokens: int | None = None, n_embd: int = 768, dtype=None
) -> list[dict]:
    """Forward + backward time (ms, median of 10) of the LM-head matmul logits = x Wᵀ with x of
    shape (n_tokens, n_embd) and W of shape (V, n_embd), for each V in ``vocab_sizes``.
    Defaults: 16·1024 tokens in bf16 on a GPU (fp16 below sm80), 512 tokens in fp32 on a CPU."""
    device = torch.device(device)
    if dtype is None:
        dtype = _gpu_half_dtype(device) if device.type == "cuda" else torch.float32
    if n_tokens is None:
        n_tokens = 16 * 1024 if device.type == "cuda" else 512
    x = torch.randn(n_tokens, n_embd, device=device, dtype=dtype, requires_grad=True)
    rows = []
    for V in vocab_sizes:
        w = (0.02 * torch.randn(V, n_embd, device=device, dtype=dtype)).requires_grad_(True)

        def step(w=w):
            x.grad = w.grad = None
            (x @ w.t()).sum().backward()

        ms = timing.measure(step, device, warmup=3, iters=10).median_ms
        rows.append(
            {
                "V": V,
                "ms": ms,
                "tflops": 6 * n_tokens * n_embd * V / (ms / 1e3) / 1e12,
                "multiple_of_64": V % 64 == 0,
                "multiple_of_128": V % 128 == 0,
            }
        )
    return rows
