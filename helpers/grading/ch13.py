"""Graded checks of chapter 13 (the released GPT-2, and generating fast): the attention step of a
KV cache.

Every chapter module has the same shape: ``SECTIONS`` (grade id -> the section a failed check's hint
points to), the ``check_*`` functions (run the learner's function on small CPU inputs, print one
``PASS ...`` line, or raise ``AssertionError`` with a hint), ``CHECKS`` (grade id -> check) and
``WRONG_ANSWERS`` (grade id -> plausible mistakes the check must reject; tests/test_grading.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.grading.common import passed, reread

SECTIONS = {
    "ch13_kv_attention": "chapter 13, section 4 (Generating with a KV cache)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# (B, nh, T_max, hs) of the cache, and the numbers of valid positions tried (pos >= 3: with two,
# pos - 1 = 1 key would look like is_causal=True).
KV_SHAPE = (2, 3, 12, 8)
KV_POSITIONS = (3, 5, 9, 12)


def check_kv_attention(fn: Callable[..., Any]) -> None:
    """Check ``kv_attention(q, k_cache, v_cache, pos) -> (B, nh, 1, hs)``: the new query q
    (B, nh, 1, hs) attends to the ``pos`` valid cached positions of k_cache, v_cache
    (B, nh, T_max, hs), the new one included. Compared with the last row of full causal attention
    over those ``pos`` positions, on random CPU inputs whose cache beyond ``pos`` is garbage.

    Raises:
        AssertionError: with a hint.
    """
    import torch
    from torch.nn import functional as F

    gid = "ch13_kv_attention"
    B, nh, T_max, hs = KV_SHAPE
    g = torch.Generator().manual_seed(0)
    for pos in KV_POSITIONS:
        q_all = torch.randn(B, nh, pos, hs, generator=g)  # every position's query
        k = 3.0 * torch.randn(B, nh, T_max, hs, generator=g)  # scores of order 1..10: scale matters
        v = torch.randn(B, nh, T_max, hs, generator=g)
        k[:, :, pos:] = 1e3 * torch.randn(B, nh, T_max - pos, hs, generator=g)  # unwritten slots
        v[:, :, pos:] = 1e3
        full = F.scaled_dot_product_attention(q_all, k[:, :, :pos], v[:, :, :pos], is_causal=True)
        want = full[:, :, -1:]  # the last row of full causal attention
        q = q_all[:, :, -1:].clone()
        got = fn(q, k.clone(), v.clone(), pos)
        call = f"kv_attention(q {tuple(q.shape)}, caches {tuple(k.shape)}, pos={pos})"
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (B, nh, 1, hs):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(
                f"{call} returned {shape}, expected a tensor of shape {(B, nh, 1, hs)}: one "
                f"output row per head for the one new query. {_reread(gid)}"
            )
        got = got.float()
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            why = _kv_mistake(got, want, q, k, v, pos)
            raise AssertionError(f"{call} {why}. {_reread(gid)}")
    passed(
        gid,
        f"one query against the valid cache equals full causal attention's last row "
        f"for pos in {KV_POSITIONS}, garbage beyond pos ignored",
    )


def _kv_mistake(got, want, q, k, v, pos) -> str:
    """What a wrong kv_attention output most likely did, by comparing it with each mistake."""
    import math

    import torch
    from torch.nn import functional as F

    def close(other) -> bool:
        return bool(torch.allclose(got, other, atol=1e-4, rtol=1e-3))

    hs = q.size(-1)
    if close(v[:, :, :1]):
        return (
            "returned value row 0 for every query: is_causal=True with one query aligns the "
            "mask top-left, so the query sees key 0 only; use is_causal=False on the valid "
            "prefix k_cache[:, :, :pos] (or an explicit mask)"
        )
    if got.abs().max() > 100:
        return (
            "attends to cache slots >= pos, which hold garbage (here 1e3): slice the caches "
            "to [:, :, :pos] or mask the positions that were never written"
        )
    if close(F.scaled_dot_product_attention(q, k[:, :, : pos - 1], v[:, :, : pos - 1])):
        return (
            "attends to pos - 1 positions: pos counts the valid positions *including* the "
            "new one, so the keys are k_cache[:, :, :pos]"
        )
    if close(F.scaled_dot_product_attention(q, k[:, :, :pos], v[:, :, :pos], scale=1.0)):
        return f"the scores are not scaled: multiply q kᵀ by 1/sqrt(hs) = {1 / math.sqrt(hs):g}"
    err = (got - want).abs().max().item()
    return (
        f"differs from the last row of full causal attention by up to {err:.3g}: "
        "softmax(q k_cache[:pos]ᵀ / sqrt(hs)) @ v_cache[:pos]"
    )


def _kv_is_causal(q, k_cache, v_cache, pos):
    import torch

    k, v = k_cache[:, :, :pos], v_cache[:, :, :pos]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _kv_whole_cache(q, k_cache, v_cache, pos):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache)


def _kv_off_by_one(q, k_cache, v_cache, pos):
    import torch

    k, v = k_cache[:, :, : pos - 1], v_cache[:, :, : pos - 1]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _kv_no_scale(q, k_cache, v_cache, pos):
    k, v = k_cache[:, :, :pos], v_cache[:, :, :pos]
    return (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v


CHECKS: dict[str, Callable[[Callable[..., Any]], None]] = {
    "ch13_kv_attention": check_kv_attention,
}

WRONG_ANSWERS: dict[str, list[Callable[..., Any]]] = {
    "ch13_kv_attention": [_kv_is_causal, _kv_whole_cache, _kv_off_by_one, _kv_no_scale],
}
