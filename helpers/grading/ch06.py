"""Graded checks of chapter 06 (Flash Attention): the attention block's forward with SDPA and
the online softmax of two tiles.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import passed, reread, run_learner

SECTIONS = {
    "ch06_sdpa_attention": "chapter 06, section 2 (Exercise: SDPA in the attention block)",
    "ch06_online_softmax": "chapter 06, section 3 (The idea behind FlashAttention: online softmax)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


def _attention_block():
    """A manual-attention block of the course's model (T = 96, C = 48, 3 heads of size 16, so no
    weight or activation is (T, T)), an input x (B, T, C) and an upstream gradient for backward."""
    import torch

    from helpers.core.model import CausalSelfAttention, GPTConfig

    torch.manual_seed(0)
    attn = CausalSelfAttention(GPTConfig(block_size=96, n_embd=48, n_head=3), attention="manual")
    x, grad_out = torch.randn(2, 96, 48), torch.randn(2, 96, 48)
    return attn, x, grad_out


def _harness_forward_backward(forward, attn, x, grad_out):
    """``forward(attn, x)`` and its backward with ``grad_out``, with the shape of every tensor the
    ops return recorded; the harness of ``ch06_sdpa_attention`` (and, called here, the reference).

    Returns a dict:
        ``"out"``: the output, detached (a (B, T, C) fp32 tensor for a right answer), or what
        ``forward`` returned when that is None or not of x's shape (then no backward is run and
        every gradient is None);
        ``"dx"``, ``"dw_attn"``, ``"dw_proj"``: the gradients of x (B, T, C), of
        ``attn.c_attn.weight`` (3C, C) and of ``attn.c_proj.weight`` (C, C), fp32, or None;
        ``"shapes"``: the (op name, shape tuple) of every tensor an ATen op returned in forward and
        backward, in order (the check looks for (..., T, T) ones).
    """
    from helpers.chapters import ch06_attention as attention
    from helpers.measure import hardware

    attn.zero_grad(set_to_none=True)
    xx = x.detach().clone().requires_grad_(True)
    rec = attention.TensorShapeRecorder()
    # CPU tensors: the CPU's fused kernel, also while a T4 is emulated
    with rec, hardware.cpu_sdpa_kernels():
        out = forward(attn, xx)
        ran = out is not None and tuple(out.shape) == tuple(x.shape)
        if ran and out.requires_grad:
            out.backward(grad_out)
    if not ran:
        return {
            "out": out if out is None else out.detach(),
            "dx": None,
            "dw_attn": None,
            "dw_proj": None,
            "shapes": list(rec.shapes),
        }
    return {
        "out": out.detach(),
        "dx": xx.grad,
        "dw_attn": attn.c_attn.weight.grad,
        "dw_proj": attn.c_proj.weight.grad,
        "shapes": list(rec.shapes),
    }


def _square(shapes, T: int) -> list:
    """The (op, shape) among ``shapes`` whose last two dims are both T."""
    return [(op, tuple(s)) for op, s in shapes if len(s) >= 2 and s[-1] == s[-2] == T]


def check_sdpa_attention(fn: Callable[..., Any]) -> None:
    """Check ``sdpa_block_forward(attn, x)``, the forward of the model's attention block
    (``helpers.core.model.CausalSelfAttention``) written with SDPA, on a small block on the CPU:
    the same output and gradients (of x and of both projections) as the block's own forward with
    manual attention (fp32, relative error < 1e-4), and no (T, T) tensor allocated in forward or
    backward (the shape of every tensor the ops return is recorded). A wrong output is compared
    with the usual mistakes (no causal mask, the scale applied twice, softmax over the queries,
    heads split without the transpose, no output projection) to name the one made.

    Raises:
        AssertionError: with a hint.
    """
    from helpers.chapters import ch06_attention as attention

    gid = "ch06_sdpa_attention"
    attn, x, grad_out = _attention_block()
    # forward and backward run beside the learner's function (in the submission's kernel when
    # grading); the output and gradients are judged here against the reference computed here
    ran = run_learner(fn, _harness_forward_backward, attn, x, grad_out)
    out, dx, dw_attn, dw_proj = (ran[k] for k in ("out", "dx", "dw_attn", "dw_proj"))
    B, T, C = x.shape
    if out is None:
        raise AssertionError(
            f"sdpa_block_forward returned None: return the block's output. {_reread(gid)}"
        )
    if tuple(out.shape) != (B, T, C):
        raise AssertionError(
            f"sdpa_block_forward returned shape {tuple(out.shape)}, expected {(B, T, C)} = "
            f"(B, T, C): merge the heads back with y.transpose(1, 2).contiguous().view(B, T, C). "
            f"{_reread(gid)}"
        )
    manual = _harness_forward_backward(lambda a, t: a(t), attn, x, grad_out)
    ref, ref_grads = manual["out"], [manual[k] for k in ("dx", "dw_attn", "dw_proj")]
    err = attention.relative_error(out, ref)
    if not err < 1e-4:
        for mistake, hint in _BLOCK_MISTAKES:
            wrong = _harness_forward_backward(mistake, attn, x, grad_out)["out"]
            if attention.relative_error(out, wrong) < 1e-4:
                raise AssertionError(f"the output matches {hint} {_reread(gid)}")
        raise AssertionError(
            f"relative error {err:.2e} against the block's manual attention: project with "
            "attn.c_attn, split q, k, v into (B, nh, T, hs), "
            "F.scaled_dot_product_attention(q, k, v, is_causal=True), merge the heads, project "
            f"with attn.c_proj. {_reread(gid)}"
        )
    for name, got, want in zip(
        ("x", "attn.c_attn.weight", "attn.c_proj.weight"), (dx, dw_attn, dw_proj), ref_grads
    ):
        grad_err = 1.0 if got is None else attention.relative_error(got, want)
        if not grad_err < 1e-4:
            raise AssertionError(
                f"the gradient of {name} is {'missing' if got is None else 'wrong'} "
                f"(relative error {grad_err:.2e}): build the output from attn's layers with "
                f"differentiable ops only (no torch.no_grad, .detach() or .data). {_reread(gid)}"
            )
    square = _square(ran["shapes"], T)
    if square:
        ops = sorted({op for op, _ in square})
        raise AssertionError(
            f"{len(square)} tensors of shape (..., T, T) were allocated (by {', '.join(ops[:4])}): "
            "build no score matrix or mask tensor; "
            f"call F.scaled_dot_product_attention(q, k, v, is_causal=True). {_reread(gid)}"
        )
    passed(
        gid,
        "same output and gradients as the manual attention block "
        "(rel. error < 1e-4) and no (T, T) tensor in forward or backward",
    )


def _heads(attn, x):
    """q, k, v of the block, each (B, nh, T, hs), as the model's forward makes them."""
    B, T, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    return [t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v)]


def _merge(attn, y):
    """(B, nh, T, hs) -> c_proj of (B, T, C)."""
    B, nh, T, hs = y.shape
    return attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, nh * hs))


def _block_manual(attn, x):
    import math

    import torch

    q, k, v = _heads(attn, x)
    T = x.size(1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, T)
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return _merge(attn, att.softmax(dim=-1) @ v)


def _block_not_causal(attn, x):
    import torch.nn.functional as F

    return _merge(attn, F.scaled_dot_product_attention(*_heads(attn, x)))


def _block_mask_tensor(attn, x):
    import torch
    import torch.nn.functional as F

    T = x.size(1)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return _merge(attn, F.scaled_dot_product_attention(*_heads(attn, x), attn_mask=mask))


def _block_scaled_twice(attn, x):
    import math

    import torch.nn.functional as F

    q, k, v = _heads(attn, x)
    q = q / math.sqrt(q.size(-1))  # SDPA divides by sqrt(hs) again
    return _merge(attn, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def _block_softmax_over_queries(attn, x):
    import math

    import torch

    q, k, v = _heads(attn, x)
    T = x.size(1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return _merge(attn, att.softmax(dim=-2) @ v)  # normalised over the queries


def _block_heads_not_transposed(attn, x):
    import torch.nn.functional as F

    B, T, C = x.shape
    q, k, v = (
        t.reshape(B, attn.n_head, T, C // attn.n_head)  # a view of (B, T, C), not (B, nh, T, hs)
        for t in attn.c_attn(x).split(C, dim=2)
    )
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.c_proj(y.reshape(B, T, C))


def _block_no_output_projection(attn, x):
    import torch.nn.functional as F

    B, T, C = x.shape
    y = F.scaled_dot_product_attention(*_heads(attn, x), is_causal=True)
    return y.transpose(1, 2).contiguous().view(B, T, C)


# (a mistake, what the hint says when the learner's output matches it)
_BLOCK_MISTAKES = [
    (_block_not_causal, "attention *without* the causal mask: pass is_causal=True."),
    (
        _block_scaled_twice,
        "q scaled by 1/sqrt(hs) twice: SDPA already scales the scores, so leave q as it is "
        "(or pass scale=, not both).",
    ),
    (
        _block_softmax_over_queries,
        "a softmax over the queries (dim=-2): each query's weights over the keys must sum to 1, "
        "a softmax over the last dim. SDPA does it right.",
    ),
    (
        _block_heads_not_transposed,
        "heads split with reshape(B, nh, T, hs) straight from (B, T, C): that mixes positions "
        "and channels. Use view(B, T, nh, hs).transpose(1, 2), and transpose(1, 2) back before "
        "view(B, T, C).",
    ),
    (
        _block_no_output_projection,
        "the heads merged but not projected: finish with attn.c_proj(y).",
    ),
]


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
        out, shapes = run_learner(fn, _harness_recorded, s1, v1, s2, v2)
        if out is None:
            raise AssertionError(f"combine_two_tiles returned None. {_reread(gid)}")
        if any(len(shape) >= 1 and shape[-1] == t1 + t2 for _, shape in shapes):
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
    passed(
        gid,
        "two tiles combined exactly (also with scores of 1e4), never building the full score row",
    )


def _harness_recorded(fn, *args):
    """``fn(*args)`` with the shape of every tensor an ATen op returned meanwhile; the harness of
    ``ch06_online_softmax``.

    Returns:
        (what ``fn`` returned (an (N, d) tensor for a right answer), the list of (op name, shape
        tuple) of every tensor the ops returned, in order).
    """
    from helpers.chapters import ch06_attention as attention

    rec = attention.TensorShapeRecorder()
    with rec:
        out = fn(*args)
    return out, list(rec.shapes)


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
    "ch06_sdpa_attention": [
        _block_manual,
        _block_not_causal,
        _block_mask_tensor,
        _block_scaled_twice,
        _block_softmax_over_queries,
        _block_heads_not_transposed,
        _block_no_output_projection,
    ],
    "ch06_online_softmax": [_tiles_concatenate, _tiles_no_rescale, _tiles_no_max],
}
