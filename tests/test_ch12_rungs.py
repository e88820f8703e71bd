"""Chapter 12's demonstrations of the last eight rungs (helpers/chapters/ch12_rungs.py), on CPU."""

import os
import subprocess
import sys

import pytest
import torch

from helpers.chapters import ch12_cuda_graphs as graphs
from helpers.chapters import ch12_rungs as rungs
from helpers.core import train
from helpers.measure import results


def _ladder(*rows):
    return {
        "rungs": [
            dict(name=n, status=s, ms_per_step=ms, spread_pct=sp, peak_mem_bytes=pk)
            for n, s, ms, sp, pk in rows
        ]
    }


def test_rung_deltas_calls_a_slower_rung_no_gain_and_a_small_gain_inside_the_spread():
    res = _ladder(
        ("+ fused AdamW", "measured", 100.0, 2.0, 10 * rungs.GIB),
        ("+ bf16 residual", "measured", 90.0, 2.0, 9 * rungs.GIB),
        ("+ detached logits", "measured", 91.0, 5.0, 7 * rungs.GIB),
        ("+ Triton CE", "skipped", None, None, None),
        ("+ clip in AdamW", "measured", 89.0, 1.0, 7 * rungs.GIB),
    )
    by_name = {d["name"]: d for d in rungs.rung_deltas(res)}
    assert by_name["+ bf16 residual"]["verdict"] == "faster"
    assert by_name["+ detached logits"]["verdict"] == "no gain (slower)"
    assert by_name["+ detached logits"]["delta_peak_gib"] == -2.0
    assert "+ Triton CE" not in by_name  # skipped rungs are left out
    clip = by_name["+ clip in AdamW"]
    assert clip["before"] == "+ detached logits"  # compared with the last measured rung
    assert clip["verdict"] == "faster, inside the spread"  # -2.2% against a 5% spread
    lines = rungs.no_gain_lines({"X": res})
    assert lines == [
        "+ detached logits: +1.0 ms/step at X (90.0 -> 91.0 ms, slower than + bf16 residual; "
        "steps spread up to 5%)"
    ]


def test_committed_b64_ladder_names_detached_logits_and_clip_as_no_gain():
    lines = rungs.no_gain_lines({"B=64": results.load("h200-ladder-b64.json")})
    assert [line.split(":")[0] for line in lines] == ["+ detached logits", "+ clip in AdamW"]


def test_detached_logits_peak_drop_is_one_bf16_logits_gradient():
    for b in (16, 64):
        res = results.load(f"h200-ladder-b{b}.json")
        drop = next(d for d in rungs.rung_deltas(res) if d["name"] == "+ detached logits")
        B, T, V = rungs.ladder_shape(res, "+ detached logits")
        assert V == 50304
        zeros = rungs.zero_gradient_bytes(B, T, V) / rungs.GIB
        assert abs(drop["delta_peak_gib"] + zeros) < 0.01 * zeros


def test_bf16_residual_halves_the_stream_bytes_and_keeps_the_loss_close():
    cfg = train.small_model_config()
    fp32, bf16 = rungs.residual_stream(cfg, 2, 16, "cpu")
    assert (fp32["stream_dtype"], fp32["grad_dtype"]) == ("float32", "float32")
    assert (bf16["stream_dtype"], bf16["grad_dtype"]) == ("bfloat16", "bfloat16")
    assert bf16["stream_bytes"] * 2 == fp32["stream_bytes"] == 2 * 16 * 128 * 4 * cfg.n_layer
    assert bf16["grad_bytes"] * 2 == fp32["grad_bytes"]
    # same weights and tokens: only the stream's rounding differs (different weights would
    # differ by about 1%)
    assert abs(bf16["loss"] / fp32["loss"] - 1) < 1e-3
    again = rungs.residual_stream(cfg, 2, 16, "cpu")
    assert [r["loss"] for r in again] == [fp32["loss"], bf16["loss"]]


def test_clip_in_adamw_drops_the_rescaling_pass_and_gives_the_same_update():
    out = rungs.clip_ops()
    assert out["grad_norm"] > 1.0  # clipping is active
    assert out["only_separate"]["_foreach_mul_"] == 1  # the pass over every gradient
    assert "_foreach_mul_" not in out["ops"]["in AdamW"]
    assert out["ops"]["in AdamW"]["_fused_adamw_"] == 1
    assert out["max_abs_diff"] < 1e-6


def test_lm_head_saved_bytes_counts_the_fp32_log_softmax():
    n, c, v = 32, 16, 256
    out = rungs.lm_head_saved_bytes(n, c, v, "cpu")
    # x and W (bf16) for the matmul, the (N, V) fp32 log-softmax for the loss
    assert out["pytorch"] >= 2 * out["logits_bytes"] + (n * c + v * c) * 2
    assert out["fused_by_code"] == (n * c + v * c) * 2 + 8
    if out["fused"] is None:
        assert out["fused_reason"]


def test_parameter_bytes_of_gpt2_124m_padded():
    # 124,475,904 parameters with the vocabulary padded to 50304 (the tied matrix counted once)
    assert rungs.parameter_bytes() == 4 * 124_475_904


def test_saved_bytes_counts_a_storage_once():
    x = torch.randn(100, requires_grad=True)
    assert rungs.saved_bytes(lambda: (x * x).sum()) == 400


def test_fp8_logits_err_more_than_bf16_but_stay_within_a_few_percent():
    err = rungs.fp8_errors(n_rows=16, n_embd=64, vocab=512)
    assert err["logits_bf16"] < err["logits_fp8"] < 0.1
    assert abs(err["loss_fp8"]) < 0.01


def test_fp8_mlp_errors_are_e4m3s_rowwise_rounding_of_every_operand(monkeypatch):
    err = rungs.fp8_mlp_errors(n_rows=32, n_embd=64)
    # bf16 keeps 8 mantissa bits, e4m3 3: about 2^-5 more error, in the output and the gradient
    assert err["y_bf16"] < 0.01 and err["dx_bf16"] < 0.01
    assert 0.02 < err["y_fp8"] < 0.1 and 0.02 < err["dx_fp8"] < 0.1
    # the mistake the bounds must reject: the "fp8" operands not rounded at all
    monkeypatch.setattr(
        rungs.fp8_formats, "rowwise_e4m3", lambda t: (t.float(), torch.ones(t.shape[0], 1))
    )
    unrounded = rungs.fp8_mlp_errors(n_rows=32, n_embd=64)
    assert unrounded["y_fp8"] < 0.02 and unrounded["dx_fp8"] < 0.02


def test_committed_timings_are_read_with_their_provenance():
    ce = rungs.lm_head_ce_times()
    assert ce["device"] == "NVIDIA H200" and ce["rows"][0][0].startswith("PyTorch")
    assert len(ce["rows"]) == 3
    mm = rungs.fp8_matmul_times()
    assert mm["date"] == "2026-11-30" and len(mm["rows"]) == 3
    kt = dict((k, ms) for k, ms, _ in rungs.fp8_mlp_kernel_times()["rows"])
    assert set(kt) == {
        "gelu_rowwise_e4m3",
        "inductor GELU (bf16)",
        "gelu_backward_rowwise_e4m3",
        "inductor GELU backward + bias sum (bf16)",
    }
    assert all(ms > 0 for ms in kt.values())
    assert all(fp8 < bf16 for *_, bf16, fp8 in mm["rows"])
    # the shapes: logits (rows x vocab), dx (rows x n_embd), dW (vocab x n_embd)
    assert [r[1:4] for r in mm["rows"]] == [
        (32768, 50304, 768),
        (32768, 768, 50304),
        (50304, 768, 32768),
    ]


def test_fused_lm_head_saves_what_its_code_says_in_the_triton_interpreter():
    pytest.importorskip("triton")
    script = (
        "from helpers.chapters import ch12_rungs as r\n"
        "out = r.lm_head_saved_bytes(32, 16, 256, 'cpu')\n"
        "assert out['fused'] == out['fused_by_code'], out\n"
        "assert out['fused'] < out['pytorch'], out\n"
        "print('saved OK')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # read when helpers.core.kernels is imported
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "saved OK" in out.stdout


def test_demo_shape_fits_the_gpu_memory(monkeypatch):
    """The demonstrations run GPT-2 124M at T=1024 with the B the memory takes: 16 on an H200,
    4 on a T4 (15 GB; B=16 ran out of memory there), the small config on a CPU."""
    from helpers.measure import hardware

    for usable, batch_size in ((140 * 2**30, 16), (hardware.T4_USABLE_BYTES, 4)):
        monkeypatch.setattr(hardware, "_emulated_memory", usable)
        cfg, B, T = rungs.demo_shape("cuda")
        assert (cfg.padded_vocab_size, B, T) == (50304, batch_size, 1024)
    assert rungs.demo_shape("cpu")[1:] == (4, 64)


def test_signed_drops_the_sign_of_a_change_that_rounds_to_zero():
    assert [rungs.signed(x) for x in (-0.004, 0.0, 0.004, -1.5, 0.25)] == [
        "0.00",
        "0.00",
        "0.00",
        "-1.50",
        "+0.25",
    ]


def test_variant_changes_pairs_each_variant_row_with_the_base_of_its_own_batch_size(monkeypatch):
    def row(v, b, ms, spread):
        return dict(variant=v, batch_size=b, ms_per_step=ms, spread_pct=spread)

    fake = {
        "device": "GPU",
        "date": "d",
        "rows": [
            row("final", 16, 30.0, 5.0),
            row("reduce-overhead", 16, 29.0, 4.0),
            row("final", 64, 100.0, 9.0),
            row("reduce-overhead", 64, 101.0, 12.0),
            row("reduce-overhead", 8, 10.0, 1.0),  # no base at B=8: left out
            row("other", 16, 1.0, 1.0),
        ],
    }
    monkeypatch.setattr(graphs.results_io, "load", lambda name: fake)
    got = graphs.variant_changes(("x.json",))
    assert [(g["B"], g["ms_base"], g["ms"]) for g in got] == [(16, 30.0, 29.0), (64, 100.0, 101.0)]
    assert got[0]["delta_ms"] == -1.0 and abs(got[0]["delta_pct"] + 100 / 30) < 1e-9
    assert [g["spread_pct"] for g in got] == [5.0, 12.0]
    monkeypatch.setattr(graphs.results_io, "load", lambda name: None)
    with pytest.raises(FileNotFoundError, match="x.json"):
        graphs.variant_changes(("x.json",))


def test_the_committed_cuda_graphs_runs_are_read():
    got = graphs.variant_changes()
    assert [(g["device"], g["B"]) for g in got] == [("NVIDIA H200", 16), ("NVIDIA H200", 16)]
    assert all(g["delta_ms"] < 0 for g in got)  # both committed runs: CUDA graphs faster


class _Event:
    def __init__(self, name, device_type):
        self.name, self.device_type = name, device_type


def test_count_launches_tells_kernel_launches_graph_replays_and_gpu_kernels_apart():
    from torch.autograd import DeviceType

    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [
        _Event("cudaLaunchKernel", cpu),
        _Event("cuLaunchKernelEx", cpu),  # Triton's launches go through the driver API
        _Event("cudaGraphLaunch", cpu),
        _Event("cudaMemcpyAsync", cpu),  # a copy, not a launch
        _Event("aten::add", cpu),
        _Event("triton_poi_fused_add_0", cuda),
        _Event("Memset (Device)", cuda),
        _Event("Memcpy HtoD (Pinned -> Device)", cuda),
    ]
    assert graphs.count_launches(events) == dict(kernel_launches=2, graph_launches=1, gpu_kernels=1)


def test_launch_counts_says_why_it_cannot_run_on_a_cpu():
    assert "CUDA GPU" in graphs.launch_counts("cpu")["skipped"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_launch_counts_gpu_cuda_graphs_replace_most_kernel_launches():
    got = graphs.launch_counts("cuda", train.small_model_config(), batch_size=4, seq_len=64)
    without, with_graphs = got["without CUDA graphs"], got["with CUDA graphs"]
    assert without["compile"] == "default" and with_graphs["compile"] == "reduce-overhead"
    assert without["graph_launches"] == 0 and with_graphs["graph_launches"] >= 2  # fwd and bwd
    assert with_graphs["kernel_launches"] < without["kernel_launches"] / 2, got
    print(got)
