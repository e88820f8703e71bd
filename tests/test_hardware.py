import pytest
import torch

from helpers import hardware


def test_cpu_summary_is_complete_and_honest():
    s = hardware.summary("cpu")
    assert s.device == "cpu" and s.capability is None and s.tf32 is False
    assert s.sdpa["math"] == "ok"
    assert "CPU" in s.one_line()
    assert set(s.as_dict()) >= {"name", "native_bf16", "tf32", "compile_ok", "sdpa"}


def test_known_gpu_names_map_to_datasheet_profiles():
    cases = {
        "Tesla T4": "T4",
        "NVIDIA A100-SXM4-80GB": "A100-80GB",
        "NVIDIA A100-PCIE-40GB": "A100-40GB",
        "NVIDIA H100 80GB HBM3": "H100-SXM",
        "NVIDIA H100 PCIe": "H100-PCIe",
        "NVIDIA H200": "H200",
        "NVIDIA L4": "L4",
        "Tesla V100-SXM2-16GB": "V100",
    }
    for name, key in cases.items():
        assert hardware.match_profile(name).key == key, name
    assert hardware.match_profile("NVIDIA GeForce GTX 1080") is None
    assert hardware.match_profile("NVIDIA A10G") is None  # no NVIDIA datasheet figures


def test_t4_has_no_bf16_or_tf32_and_mfu_uses_fp16_peak():
    t4 = hardware.PROFILES["T4"]
    assert t4.bf16_tflops is None and t4.tf32_tflops is None
    assert t4.peak_tensor_tflops == 65
    assert all(p.source for p in hardware.PROFILES.values())


def test_native_bf16_and_tf32_on_cpu():
    cpu = torch.device("cpu")
    assert hardware.native_bf16(cpu) is True
    assert hardware.tf32_supported(cpu) is False


def _as_dict(choices):
    return {c.switch: c.value for c in choices}


def test_recipe_for_a_t4_is_fp16_with_gradscaler_and_no_tf32():
    r = hardware.recommend_recipe(hardware.PROFILES["T4"])
    d = _as_dict(r)
    assert d["autocast"] == "fp16" and d["matmul_precision"] == "fp32" and d["compile"] == "default"
    assert d["attention"] == "sdpa" and d["vocab_multiple"] == 64 and d["batch_size"] is None
    reasons = {c.switch: c.reason for c in r}
    assert "GradScaler" in reasons["autocast"] and "memory-efficient" in reasons["attention"]


def test_recipe_for_ampere_and_hopper_uses_bf16_and_tf32():
    for key in ("A100-80GB", "H100-SXM", "H200", "L4"):
        d = _as_dict(hardware.recommend_recipe(hardware.PROFILES[key]))
        assert (d["autocast"], d["matmul_precision"], d["optimizer"]) == ("bf16", "tf32", "fused"), key


def test_recipe_on_this_cpu_builds_a_runconfig_that_runs_here():
    from helpers import train

    choices = hardware.recommend_recipe("cpu")
    assert _as_dict(choices)["autocast"] is None
    run = train.recipe_run_config(choices, batch_size=2, seq_len=16)
    assert train.unsupported_reason(run, torch.device("cpu")) is None
    assert "switch" in hardware.format_recipe(choices).splitlines()[0]


class _FakeProps:
    name, total_memory, major, minor = "NVIDIA H200", 150 * 10**9, 9, 0


def test_t4_emulation_on_a_big_gpu_answers_like_a_t4(monkeypatch):
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: _FakeProps())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.setdefault("fraction", []).append(f))
    for name in ("enable_flash_sdp", "enable_cudnn_sdp"):
        monkeypatch.setattr(torch.backends.cuda, name, lambda on, name=name: calls.setdefault(name, []).append(on))
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    cuda = torch.device("cuda")
    try:
        assert hardware.native_bf16(cuda) and hardware.tf32_supported(cuda)  # the real (fake) H200
        info = hardware.emulate("T4", cuda)
        assert info["memory_cap_bytes"] == 15 * 10**9 and calls["fraction"] == [0.1]
        assert set(info["sdpa_disabled"]) == {"flash", "cudnn"}
        assert not hardware.native_bf16(cuda) and not hardware.tf32_supported(cuda)
        d = {c.switch: c.value for c in hardware.recommend_recipe(cuda)}
        assert (d["autocast"], d["matmul_precision"]) == ("fp16", "fp32")
        from helpers import timing, train

        peak, why = timing.peak_flops(cuda)
        assert peak is None and "emulating" in why  # never claims T4 speed
        with pytest.raises(ValueError, match="bf16 is not native"):
            train.build(train.RunConfig(autocast="bf16", batch_size=1, seq_len=8), train.small_model_config(), cuda)
    finally:
        hardware.stop_emulation(cuda)
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    assert hardware.emulated_profile() is None and calls["fraction"][-1] == 1.0
    assert calls["enable_flash_sdp"][-1] is True


def test_emulation_needs_a_gpu_and_a_known_profile(monkeypatch):
    with pytest.raises(ValueError, match="needs one"):
        hardware.emulate("T4", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="unknown profile"):
        hardware.emulate("TPU", "cuda")
