import pytest

from helpers.chapters import ch07_vocab as V
from helpers.core.model import GPTConfig
from helpers.measure import profiler


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sweep_sizes_contain_gpt2_vocab_and_its_padding_exactly(device):
    sizes = V.sweep_sizes(device)
    assert {50257, 50304} <= set(sizes)
    assert sizes == sorted(set(sizes))
    assert sizes[0] == 50240 and 50257 - 1 in sizes  # the grid around it stays
    step = 8 if device == "cuda" else 16
    assert all(s % step == 0 for s in sizes if s != 50257)


def test_lm_head_sweep_passes_the_sizes_and_cpu_shapes(monkeypatch):
    seen = {}

    def fake_sweep(device, sizes, **kwargs):
        seen.update(sizes=list(sizes), **kwargs)
        return []

    monkeypatch.setattr(V.ch06_attention, "lm_head_sweep", fake_sweep)
    V.lm_head_sweep("cpu")
    assert seen == {"sizes": V.sweep_sizes("cpu"), "n_tokens": 128, "n_embd": 128}


@pytest.mark.parametrize("vocab", [50257, 50304, 50264, 128, 1])
@pytest.mark.parametrize("dtype_bytes", [2, 4])
def test_row_alignment_matches_counting_row_starts(vocab, dtype_bytes):
    a = V.row_alignment(vocab, dtype_bytes)
    starts = [i * vocab * dtype_bytes for i in range(1024)]
    assert a["row_bytes"] == vocab * dtype_bytes
    assert a["share_aligned"] == sum(s % 128 == 0 for s in starts) / len(starts)
    assert all(s % a["aligned_to"] == 0 for s in starts)
    assert a["aligned_to"] == 128 or any(s % (2 * a["aligned_to"]) for s in starts)


def test_row_alignment_of_the_chapters_sizes():
    assert V.row_alignment(50257, 2) == {
        "row_bytes": 100514,
        "aligned_to": 2,
        "share_aligned": 1 / 64,
    }
    assert V.row_alignment(50304, 2)["share_aligned"] == 1.0
    with pytest.raises(ValueError):
        V.row_alignment(50257, 2, boundary=100)


def _row(name, ms):
    return {"name": name, "family": profiler.kernel_family(name), "ms": ms}


BEFORE = [
    _row("sm80_xmma_gemm_odd", 10.0),
    _row("cunn_SoftMaxForward", 6.0),
    _row("triton_poi_fused_add_0", 1.0),
]
AFTER = [
    _row("nvjet_sm90_tst_aligned", 4.0),
    _row("cunn_SoftMaxForward", 5.5),
    _row("triton_poi_fused_add_0", 1.0),
    _row("memset", 0.5),
]


def test_compare_kernels_pairs_families_and_shows_a_changed_kernel_choice():
    families, kernels = V.compare_kernels(BEFORE, AFTER, top=3)
    fam = {f["family"]: f for f in families}
    assert [f["family"] for f in families] == ["matmul", "reduction", "triton fused", "copy / cast"]
    assert fam["matmul"] == {
        "family": "matmul",
        "before_ms": 10.0,
        "after_ms": 4.0,
        "diff_ms": -6.0,
    }
    assert fam["copy / cast"]["before_ms"] == 0.0 and fam["copy / cast"]["diff_ms"] == 0.5
    # the gemm chosen at 50257 is gone at 50304 and another one took its place: two rows
    assert [(k["name"], k["before_ms"], k["after_ms"]) for k in kernels] == [
        ("sm80_xmma_gemm_odd", 10.0, 0.0),
        ("nvjet_sm90_tst_aligned", 0.0, 4.0),
        ("cunn_SoftMaxForward", 6.0, 5.5),
    ]


def _padding_profile(before, after):
    families, kernels = V.compare_kernels(before, after)
    fake = profiler.StepProfile("cuda", "GPU", 1, [], {}, 0.0, 0.0, 0.0)
    return V.PaddingProfile("eager", (50257, 50304), {50257: fake, 50304: fake}, families, kernels)


def test_conclusion_names_the_family_that_saved_most():
    p = _padding_profile(BEFORE, AFTER)
    assert p.conclusion() == (
        "eager, 50257 -> 50304 rows: the family that saved most is matmul,\n  10.00 -> 4.00 ms "
        "per step (-6.00 ms) of -6.00 ms in all kernels"
    )
    table = p.family_markdown().splitlines()
    assert table[0] == "| family | ms at 50257 | ms at 50304 | difference (ms) |"
    assert table[-1] == "| **all kernels** | 17.00 | 11.00 | -6.00 |"


def test_conclusion_says_so_when_no_family_got_faster():
    slower = [{**r, "ms": r["ms"] + 1.0} for r in BEFORE]
    p = _padding_profile(BEFORE, slower)
    assert "no family got faster; the largest change is matmul" in p.conclusion()


def test_short_name_drops_namespaces_and_cuts():
    name = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float>(...)"
    assert V.short_name(name, 200) == "cunn_SoftMaxForward<4, float, float>(...)"
    assert V.short_name(name, 20) == "cunn_SoftMaxForwa..."


def test_profile_padding_on_cpu_compares_50257_with_50304_rows():
    tiny = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)
    p = V.profile_padding("cpu", tiny, 2, 16, None, active=1)
    assert p.sizes == (50257, 50304) and p.mode == "eager"
    for rows in p.sizes:
        assert p.profiles[rows].device_type == "cpu"
    fam = {f["family"]: f for f in p.families}
    assert fam["matmul"]["before_ms"] > 0 and fam["matmul"]["after_ms"] > 0
    assert sum(f["before_ms"] for f in p.families) == pytest.approx(p.profiles[50257].kernel_ms)
    assert "all operators" in p.conclusion()
    assert V.compiled_skip_reason("cpu").startswith("compiled profile skipped on a CPU")


def test_profile_padding_refuses_two_multiples_that_give_the_same_rows():
    with pytest.raises(ValueError, match="need two sizes"):
        V.profile_padding("cpu", GPTConfig(), 1, 8, None, multiples=(1, 1))
