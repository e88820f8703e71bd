import pytest
import torch

from helpers.chapters import ch06_attention as A
from helpers.measure import gpus, hardware


@pytest.fixture
def qkv():
    torch.manual_seed(0)
    return tuple(torch.randn(2, 3, 100, 16) for _ in range(3))


def test_tiled_online_softmax_is_exact(qkv):
    ref = A.manual_attention(*qkv)
    for tile in (7, 32, 100, 128):
        assert A.relative_error(A.tiled_attention(*qkv, tile=tile), ref) < 1e-6


def test_tiled_attention_survives_huge_scores():
    q = torch.randn(1, 1, 20, 8) * 300  # scores of ~1e5: a naive exp overflows
    out = A.tiled_attention(q, q, q, tile=8)
    assert torch.isfinite(out).all()
    assert A.relative_error(out, A.manual_attention(q, q, q)) < 1e-5


def test_manual_and_sdpa_agree_on_outputs_and_grads(qkv):
    res = A.compare_outputs_and_grads(*qkv)
    assert all(r["ok"] for r in res.values()), res


def test_only_manual_attention_allocates_t_by_t_tensors(qkv):
    assert A.square_score_tensors(A.manual_attention, *qkv)
    assert A.square_score_tensors(A.sdpa_attention, *qkv) == []


def test_forcing_a_backend_that_cannot_run_returns_the_reason(qkv):
    results = {b: A.run_forced_backend(*qkv, b) for b in A.sdpa_backend_names()}
    assert results["MATH"][1] == "ok"
    failed = [(b, why) for b, (out, why) in results.items() if out is None]
    assert failed and all(why for _, why in failed)  # on a CPU the CUDA-only kernels cannot run


def test_pitfalls_are_shown_by_measurement(monkeypatch):
    res = A.pitfall_mask_and_is_causal("cpu")
    assert (
        res["raised"] or res["rel_error_vs_causal"] is not None
    )  # torch-version dependent, both reported

    def strict(*args, **kwargs):
        raise RuntimeError("Explicit attn_mask should not be set when is_causal=True")

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", strict)
    res = A.pitfall_mask_and_is_causal("cpu")
    assert res["raised"] and "is_causal" in res["message"] and res["rel_error_vs_causal"] is None
    monkeypatch.undo()
    errs = A.pitfall_single_query_is_causal("cpu")
    assert errs["is_causal=True"] > 0.1 and errs["is_causal=False"] < 1e-5


def test_attention_and_lm_head_sweeps_on_cpu():
    rows = A.attention_sweep("cpu", [32, 64], B=1, n_head=2, head_size=8)
    assert [(r["impl"], r["T"]) for r in rows] == [
        ("manual", 32),
        ("sdpa", 32),
        ("manual", 64),
        ("sdpa", 64),
    ]
    assert all(r["ms"] > 0 and r["peak_mem_bytes"] is None for r in rows)
    lm = A.lm_head_sweep("cpu", [100, 128], n_tokens=64, n_embd=32)
    assert [r["multiple_of_64"] for r in lm] == [False, True] and all(r["ms"] > 0 for r in lm)


def test_tensor_core_multiples():
    assert hardware.tensor_core_multiple(torch.bfloat16) == 8
    assert hardware.tensor_core_multiple(torch.float16) == 8
    assert hardware.tensor_core_multiple(torch.float32) == 4


def test_forced_backend_reason_includes_pytorchs_explanation(monkeypatch, qkv):
    import warnings

    def fake_sdpa(*args, **kwargs):
        warnings.warn(
            "Memory efficient kernel not used because: (Triggered internally at x.cpp)",
            stacklevel=1,
        )
        warnings.warn(
            "Flash attention kernel not used because: (Triggered internally at y.cpp)", stacklevel=1
        )
        warnings.warn(
            "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Float.",
            stacklevel=1,
        )
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", fake_sdpa)
    out, why = A.run_forced_backend(*qkv, "FLASH_ATTENTION")
    assert out is None
    assert (
        why.startswith("Flash attention kernel not used because:")
        and "Expected query, key and value" in why
    )
    assert "Triggered internally" not in why


def test_forced_backend_reason_is_never_empty_when_pytorch_gives_none(monkeypatch, qkv):
    """Chapter 06 once printed "Flash attention kernel not used because:" and nothing more (fp32
    on an H200, torch 2.11): PyTorch's heading came with no reason after it. The reason now says
    so, and what the course found by running the same shapes in the other dtypes."""
    import warnings

    def fake_sdpa(q, k, v, **kwargs):
        if q.dtype != torch.float32:
            return q  # this backend runs fp16 and bf16
        for text in (
            "Memory efficient kernel not used because: (Triggered internally at x.cpp)",
            "Memory Efficient attention has been runtime disabled. (Triggered internally at y.h)",
            "Flash attention kernel not used because: (Triggered internally at x.cpp)",
            "cuDNN attention kernel not used because: (Triggered internally at x.cpp)",
            "cuDNN attention has been runtime disabled. (Triggered internally at y.h)",
        ):
            warnings.warn(text, stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(A.F, "scaled_dot_product_attention", fake_sdpa)
    out, why = A.run_forced_backend(*qkv, "FLASH_ATTENTION")
    assert out is None
    assert why.startswith("Flash attention kernel not used because:")
    assert why.removeprefix("Flash attention kernel not used because:").strip()  # not empty
    assert "PyTorch gave no reason" in why
    assert "float16 and bfloat16" in why and "float32 is what it refuses" in why
    assert "cuDNN" not in why and "runtime disabled" not in why  # other backends' lines


def test_cpu_sdpa_keeps_its_fused_kernel_while_a_t4_is_emulated(monkeypatch):
    """emulate() turns the global FlashAttention switch off, which torch also reads for CPU tensors:
    without hardware.cpu_sdpa_kernels the CPU demonstrations of chapter 06 built (T, T) scores."""
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    monkeypatch.setattr(hardware, "_emulated", gpus.PROFILES["T4"])
    was = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert A.square_score_tensors(A.sdpa_attention, q, k, v) == []
        assert not torch.backends.cuda.flash_sdp_enabled()  # switched back off afterwards
        with hardware.cpu_sdpa_kernels():
            assert torch.backends.cuda.flash_sdp_enabled()
        # the trap itself: without the context, the switch takes the CPU's fused kernel away
        rec = A.TensorShapeRecorder()
        with rec:
            A.sdpa_attention(q, k, v)
        assert any(len(s) >= 2 and s[-1] == s[-2] == 96 for _, s in rec.shapes)
    finally:
        torch.backends.cuda.enable_flash_sdp(was)


def test_sdpa_grader_passes_a_right_answer_with_the_same_error_while_a_t4_is_emulated(
    monkeypatch, capsys
):
    """The grader's printed line must not depend on emulation (nbval compares it): with the global
    flash switch off, the CPU fell back to the math kernel, which builds the (T, T) scores
    (and once printed rel. error 1.4e-07 instead of 0.0e+00)."""
    from helpers import grading

    def right(attn, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2)
            for t in attn.c_attn(x).split(C, dim=2)
        )
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))

    grading.check_sdpa_attention(right)
    normal = capsys.readouterr().out
    monkeypatch.setattr(hardware, "_emulated", gpus.PROFILES["T4"])
    was = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        grading.check_sdpa_attention(right)
    finally:
        torch.backends.cuda.enable_flash_sdp(was)
    assert capsys.readouterr().out == normal and "PASS" in normal


def test_gpu_sweeps_use_fp16_below_sm80(monkeypatch):
    """A T4's memory-efficient SDPA kernel has no bf16 version:
    the sweeps' default dtype follows the GPU."""
    monkeypatch.setattr(hardware, "capability", lambda device: (7, 5))
    assert A._gpu_half_dtype(torch.device("cuda")) is torch.float16
    monkeypatch.setattr(hardware, "capability", lambda device: (9, 0))
    assert A._gpu_half_dtype(torch.device("cuda")) is torch.bfloat16
