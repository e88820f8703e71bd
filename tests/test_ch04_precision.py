import pytest
import torch

from helpers.chapters import ch04_precision as precision


def test_format_table_matches_the_ieee_and_bf16_layouts():
    rows = {r["format"]: r for r in precision.format_table()}
    assert (rows["fp32"]["exponent"], rows["fp32"]["mantissa"]) == (8, 23)
    assert (rows["bf16"]["exponent"], rows["bf16"]["mantissa"]) == (8, 7)
    assert (rows["fp16"]["exponent"], rows["fp16"]["mantissa"]) == (5, 10)
    assert (rows["tf32"]["exponent"], rows["tf32"]["mantissa"], rows["tf32"]["bits"]) == (8, 10, 19)
    assert rows["fp16"]["max"] == 65504.0 and rows["bf16"]["eps"] == 2.0**-7
    if hasattr(torch, "float8_e4m3fn"):
        assert rows["fp8 e4m3"]["max"] == 448.0 and rows["fp8 e5m2"]["max"] == 57344.0


def test_native_formats_by_compute_capability():
    assert precision.native_on((7, 5)) == ["fp32", "fp16"]
    assert set(precision.native_on((8, 0))) == {"fp32", "tf32", "bf16", "fp16"}
    assert "fp8 e4m3" in precision.native_on((9, 0)) and precision.native_on(None) == ["fp32"]


def test_demonstrations_show_underflow_rounding_and_overflow():
    d = precision.demonstrations()
    assert d["bf16_1_plus_2^-8_equals_1"] and not d["bf16_1_plus_2^-7_equals_1"]
    assert d["fp16_1e-8"] == 0.0 and abs(d["fp16_1e-8_scaled_by_2^16_then_unscaled"] - 1e-8) < 1e-10
    assert d["fp16_70000"] == float("inf") and d["bf16_70000"] < float("inf")


def test_autocast_dtype_choice():
    assert precision.autocast_dtype_for((7, 5)) is torch.float16
    assert precision.autocast_dtype_for((8, 0)) is torch.bfloat16
    assert precision.autocast_dtype_for(None) is None


# ---- measured on this device ----------------------------------------------------------------


def test_gradscaler_rescues_a_gradient_that_fp16_flushes_to_zero():
    g = precision.gradscaler_rescue("cpu")
    assert abs(g["fp32"] - 1e-8) < 1e-12
    assert g["fp16"] == 0.0  # 1e-8 is below fp16's smallest subnormal (2^-24)
    assert abs(g["fp16_gradscaler"] - 1e-8) / 1e-8 < 0.01 and g["scale"] == 2.0**16


def test_tf32_setting_changes_nothing_on_a_cpu_and_is_restored():
    before = torch.get_float32_matmul_precision()
    err = precision.tf32_matmul_error("cpu", n=128)
    assert err["highest"] == err["high"] and 0 < err["highest"] < 1e-5
    assert torch.get_float32_matmul_precision() == before


def test_autocast_runs_matmul_in_bf16_and_cross_entropy_in_fp32():
    rows = {r["op"]: r for r in precision.autocast_op_dtypes("cpu", torch.bfloat16)}
    assert rows["linear (matmul)"]["output"] == "bfloat16" and rows["gelu"]["input"] == "bfloat16"
    assert rows["cross_entropy"]["output"] == "float32"


def test_state_dtypes_sees_fp32_master_weights_and_a_wrong_cast(tiny_config):
    from helpers.core import data, train

    run = train.RunConfig(autocast="bf16", batch_size=2, seq_len=16)
    trainer = train.build(run, tiny_config, "cpu")
    trainer.step(data.BatchLoader(data.load_tokens()[:1000], 2, 16))
    assert precision.state_dtypes(trainer) == {
        "parameters": ["float32"],
        "gradients": ["float32"],
        "optimizer state": ["float32"],
    }
    trainer.model.to(torch.bfloat16)
    assert precision.state_dtypes(trainer)["parameters"] == ["bfloat16"]


# ---- fp32 / tf32 / bf16 / fp16 on the training step ------------------------------------------


def test_precision_run_and_skip_reasons():
    assert precision.precision_run("bf16", 2, 16).autocast == "bf16"
    assert precision.precision_run("tf32", 2, 16).matmul_precision == "tf32"
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.precision_run("fp8", 2, 16)
    fp16 = precision.precision_run("fp16", 2, 16)
    assert precision.skip_reason(fp16, "cpu") == precision.CPU_FP16_REASON
    assert precision.skip_reason(fp16, "cpu", cpu_fp16=True) is None
    assert "compute capability >= 8.0" in precision.skip_reason(
        precision.precision_run("tf32", 2, 16), "cpu"
    )


def test_bf16_is_skipped_on_a_cpu_without_fast_bf16_unless_asked(monkeypatch, tiny_config):
    from helpers.measure import hardware

    monkeypatch.setenv(hardware.CPU_BF16_ENV, "slow")
    bf16 = precision.precision_run("bf16", 2, 16)
    assert "uses fp32" in precision.skip_reason(bf16, "cpu")
    assert precision.skip_reason(bf16, "cpu", cpu_bf16=True) is None
    rows = precision.compare_precisions(
        "cpu", 1, tiny_config, 2, 16, warmup=0, iters=1, names=("fp32", "bf16"), progress=False
    )
    assert [r["status"] for r in rows] == ["measured", "skipped"]


def test_compare_precisions_on_cpu_measures_fp32_bf16_and_skips_tf32_fp16(tiny_config):
    before = torch.get_float32_matmul_precision()
    rows = precision.compare_precisions(
        "cpu", 4, tiny_config, 2, 16, warmup=0, iters=1, progress=False, cpu_bf16=True
    )  # a tiny model: cheap even where bf16 is slow
    by = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == ["fp32", "tf32", "bf16", "fp16"]
    assert by["fp32"]["status"] == by["bf16"]["status"] == "measured"
    assert by["tf32"]["status"] == "skipped" and "compute capability" in by["tf32"]["reason"]
    assert by["fp16"]["status"] == "skipped" and by["fp16"]["reason"] == precision.CPU_FP16_REASON
    for name in ("fp32", "bf16"):
        r = by[name]
        assert len(r["losses"]) == 4 and r["ms_per_step"] > 0 and r["peak_mem_bytes"] is None
        assert r["tokens_per_s"] == pytest.approx(2 * 16 / (r["ms_per_step"] / 1e3))
        assert r["grad_scale"] == [] and r["skipped_steps"] == []
    assert by["fp32"]["losses"][-1] < by["fp32"]["losses"][0]  # it really trains
    assert by["fp32"]["max_loss_gap_vs_fp32"] == 0.0
    assert (
        0 < by["bf16"]["max_loss_gap_vs_fp32"] < 0.01 * by["fp32"]["losses"][0]
    )  # same seed and data: close
    assert torch.get_float32_matmul_precision() == before
    text = precision.format_comparison(rows)
    assert "skipped" in text and "fp32" in text
    table = precision.comparison_markdown(rows).splitlines()
    assert table[0].startswith("| precision | ms/step | spread (%) | tokens/s | peak memory |")
    assert len(table) == 2 + len(rows)
    fp32 = next(line for line in table if line.startswith("| fp32 |"))
    assert f"| {by['fp32']['ms_per_step']:.1f} |" in fp32 and "| 0.0000 |" in fp32
    assert any("| skipped |" in line for line in table)


def test_compare_precisions_fp16_on_cpu_records_the_grad_scale(tiny_config):
    rows = precision.compare_precisions(
        "cpu",
        3,
        tiny_config,
        2,
        16,
        warmup=0,
        iters=1,
        names=("fp32", "fp16"),
        cpu_fp16=True,
        progress=False,
    )
    fp16 = rows[1]
    assert (
        fp16["status"] == "measured"
        and len(fp16["grad_scale"]) == 4
        and fp16["grad_scale"][0] == 2.0**16
    )
    assert abs(fp16["losses"][0] - rows[0]["losses"][0]) < 0.01 * rows[0]["losses"][0]
    assert "GradScaler: scale 65536" in precision.format_comparison(rows)


def test_compare_precisions_rejects_bad_arguments():
    with pytest.raises(ValueError, match="steps >= 1"):
        precision.compare_precisions("cpu", 0)
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.compare_precisions("cpu", 1, names=("fp64",))


def test_train_recording_counts_a_step_skipped_for_an_inf_gradient(tiny_config):
    from helpers.core import data, train

    trainer = train.build(
        train.RunConfig(autocast="fp16", batch_size=2, seq_len=16), tiny_config, "cpu"
    )
    loader = data.BatchLoader(data.load_tokens()[:2000], 2, 16)
    first = precision.train_recording(trainer, loader, 1)
    assert first["skipped_steps"] == [] and first["grad_scale"] == [2.0**16, 2.0**16]
    weight = trainer.model.transformer.h[0].mlp.c_fc.weight
    hook = weight.register_hook(lambda g: torch.full_like(g, float("inf")))  # force an overflow
    before = weight.detach().clone()
    second = precision.train_recording(trainer, loader, 1)
    hook.remove()
    assert second["skipped_steps"] == [1] and second["grad_scale"] == [2.0**16, 2.0**15]
    assert torch.equal(before, weight.detach())  # the optimizer step was skipped
    third = precision.train_recording(trainer, loader, 2)
    assert third["skipped_steps"] == [] and not torch.equal(before, weight.detach())


def test_train_recording_without_scaler_has_no_scale(tiny_config):
    from helpers.core import data, train

    trainer = train.build(train.RunConfig(batch_size=2, seq_len=16), tiny_config, "cpu")
    rec = precision.train_recording(trainer, data.BatchLoader(data.load_tokens()[:2000], 2, 16), 2)
    assert len(rec["losses"]) == 2 and rec["grad_scale"] == [] and rec["skipped_steps"] == []


def test_plots_show_measured_precisions_and_the_device():
    rows = [
        {
            "name": "fp32",
            "status": "measured",
            "losses": [3.0, 2.5],
            "grad_scale": [],
            "skipped_steps": [],
        },
        {"name": "tf32", "status": "skipped", "losses": [], "grad_scale": [], "skipped_steps": []},
        {
            "name": "fp16",
            "status": "measured",
            "losses": [3.0, 2.6],
            "grad_scale": [4.0, 2.0, 2.0],
            "skipped_steps": [1],
        },
    ]
    from helpers.measure import plots

    losses = {r["name"]: r["losses"] if r["status"] == "measured" else None for r in rows}
    fig = plots.loss_differences(losses, "fp32", "on Test GPU")
    top = fig.axes[0]
    assert "Test GPU" in top.get_title()
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert "fp32" in labels and any("tf32" in t and "skipped" in t for t in labels)
    scale = plots.grad_scale({"fp16": rows[2]}, "fp16 on Test GPU")
    assert "Test GPU" in scale.axes[0].get_title() and scale.axes[0].lines


def test_cli_writes_json_with_provenance(tiny_config, tmp_path, monkeypatch):
    import json

    from helpers.core import train

    monkeypatch.setattr(train, "default_shapes", lambda device: (tiny_config, 2, 16))
    out = tmp_path / "res" / "cpu-precision.json"
    rc = precision.main(
        [
            "compare",
            "--steps",
            "2",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--device",
            "cpu",
            "--precisions",
            "fp32",
            "tf32",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    rec = json.loads(out.read_text())
    assert (
        rec["device"].startswith("cpu")
        and rec["torch"] == torch.__version__
        and len(rec["date"]) == 10
    )
    assert rec["config"]["batch_size"] == 2 and rec["config"]["recorded_steps"] == 2
    assert [(r["name"], r["status"]) for r in rec["precisions"]] == [
        ("fp32", "measured"),
        ("tf32", "skipped"),
    ]
    assert len(rec["precisions"][0]["losses"]) == 2
