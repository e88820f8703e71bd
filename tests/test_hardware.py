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
