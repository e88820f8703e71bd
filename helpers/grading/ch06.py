"""Graded checks of chapter 06 (Flash Attention): SDPA in the attention block and
the online softmax of two tiles.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import reread

SECTIONS = {
    "ch06_sdpa_attention": "chapter 06, section 2 (Exercise: SDPA in the attention block)",
    "ch06_online_softmax": "chapter 06, section 3 (The idea behind FlashAttention: online softmax)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


def check_sdpa_attention(fn: Callable[..., Any]) -> None:
    """Check ``causal_attention(q, k, v)`` written with SDPA: same output and gradients as the
    manual reference (fp32, relative error < 1e-4), and no (T, T) tensor allocated in forward or
    backward, measured by recording the shape of every tensor the ops return.

    Raises:
        AssertionError: with a hint, for a wrong result or a materialised (T, T) tensor.
    """
    import torch

    from helpers.chapters import ch06_attention as attention
    from helpers.measure import hardware

    gid = "ch06_sdpa_attention"
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 96, 16) for _ in range(3))
    with (
        hardware.cpu_sdpa_kernels()
    ):  # CPU tensors: the CPU's fused kernel, also while a T4 is emulated
        out = fn(q, k, v)
    if out is None:
        raise AssertionError(
            f"causal_attention returned None: return the attention output. {_reread(gid)}"
        )
    ref = attention.manual_attention(q, k, v)
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(
            f"causal_attention returned shape {tuple(out.shape)}, "
            f"expected {tuple(ref.shape)} = (B, nh, T, hs). {_reread(gid)}"
        )
    err = attention.relative_error(out, ref)
    if not err < 1e-4:
        with hardware.cpu_sdpa_kernels():
            noncausal = attention.relative_error(
                torch.nn.functional.scaled_dot_product_attention(q, k, v), out
            )
        why = (
            "the output matches attention *without* the causal mask: pass is_causal=True."
            if noncausal < 1e-4
            else f"relative error {err:.2e} against the manual causal attention."
        )
        raise AssertionError(f"{why} {_reread(gid)}")
    square = attention.square_score_tensors(fn, q, k, v)
    if square:
        ops = sorted({op for op, _ in square})
        raise AssertionError(
            f"{len(square)} tensors of shape (..., T, T) were allocated (by {', '.join(ops[:4])}): "
            "build no score matrix or mask tensor; "
            f"call F.scaled_dot_product_attention(q, k, v, is_causal=True). {_reread(gid)}"
        )
    print(
        f"PASS {gid}: same output as manual attention (rel. error {err:.1e}) and no (T, T) tensor "
        "in forward or backward"
    )


def check_online_softmax(fn: Callable[..., Any]) -> None:
    """Check ``combine_two_tiles(s1, v1, s2, v2)`` = softmax([s1, s2]) @ [v1; v2], computed with the
    online-softmax recurrence: exact on random and on huge scores (1e4, where exp overflows), and
    without building the concatenated (N, t1 + t2) scores.

    Raises:
        AssertionError: with a hint.
    """
    import torch

    from helpers.chapters import ch06_attention as attention

    gid = "ch06_online_softmax"
    g = torch.Generator().manual_seed(0)
    N, t1, t2, d = 5, 7, 11, 3
    for scale in (1.0, 1e4):
        s1, s2 = torch.randn(N, t1, generator=g) * scale, torch.randn(N, t2, generator=g) * scale
        v1, v2 = torch.randn(t1, d, generator=g), torch.randn(t2, d, generator=g)
        ref = torch.cat([s1, s2], dim=1).double().softmax(dim=1) @ torch.cat([v1, v2]).double()
        rec = attention.TensorShapeRecorder()
        with rec:
            out = fn(s1, v1, s2, v2)
        if out is None:
            raise AssertionError(f"combine_two_tiles returned None. {_reread(gid)}")
        if any(len(shape) >= 1 and shape[-1] == t1 + t2 for _, shape in rec.shapes):
            raise AssertionError(
                f"a tensor with {t1 + t2} = t1 + t2 columns was built: that is the full score row. "
                "Keep one tile at a time: a running max, a running denominator and a running "
                f"output. {_reread(gid)}"
            )
        if not torch.isfinite(out).all():
            raise AssertionError(
                f"with scores of size ~{scale:g} the result has inf/nan: "
                f"subtract the running max before exp(). {_reread(gid)}"
            )
        err = attention.relative_error(out, ref)
        if not err < 1e-5:
            raise AssertionError(
                f"relative error {err:.2e} (scores ~{scale:g}): when the max grows from m1 to m, "
                "rescale the first tile's denominator and output by exp(m1 - m) before adding "
                f"the second tile. {_reread(gid)}"
            )
    print(
        f"PASS {gid}: two tiles combined exactly (also with scores of 1e4), "
        "never building the full score row"
    )


def _attention_manual(q, k, v):
    from helpers.chapters import ch06_attention as attention

    return attention.manual_attention(q, k, v)


def _attention_not_causal(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _attention_mask_tensor(q, k, v):
    import torch

    T = q.size(-2)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _tiles_concatenate(s1, v1, s2, v2):
    import torch

    return torch.cat([s1, s2], dim=1).softmax(dim=1) @ torch.cat([v1, v2])


def _tiles_no_rescale(s1, v1, s2, v2):
    import torch

    m1 = s1.amax(dim=1, keepdim=True)
    p1 = torch.exp(s1 - m1)
    m = torch.maximum(m1, s2.amax(dim=1, keepdim=True))
    p2 = torch.exp(s2 - m)
    return (p1 @ v1 + p2 @ v2) / (
        p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True)
    )  # p1 not rescaled


def _tiles_no_max(s1, v1, s2, v2):
    import torch

    p1, p2 = torch.exp(s1), torch.exp(s2)
    return (p1 @ v1 + p2 @ v2) / (p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True))


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch06_sdpa_attention": check_sdpa_attention,
    "ch06_online_softmax": check_online_softmax,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch06_sdpa_attention": [_attention_manual, _attention_not_causal, _attention_mask_tensor],
    "ch06_online_softmax": [_tiles_concatenate, _tiles_no_rescale, _tiles_no_max],
}
