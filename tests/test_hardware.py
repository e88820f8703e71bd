import contextlib
import platform

import pytest
import torch

from helpers import ladder
from helpers.chapters import ch08_t4_colab as t4_colab
from helpers.measure import gpus, hardware, power


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
        assert gpus.match_profile(name).key == key, name
    assert gpus.match_profile("NVIDIA GeForce GTX 1080") is None
    assert gpus.match_profile("NVIDIA A10G") is None  # no NVIDIA datasheet figures


def test_t4_has_no_bf16_or_tf32_and_mfu_uses_fp16_peak():
    t4 = gpus.PROFILES["T4"]
    assert t4.bf16_tflops is None and t4.tf32_tflops is None
    assert t4.peak_tensor_tflops == 65
    assert all(p.source for p in gpus.PROFILES.values())


def test_native_bf16_and_tf32_on_cpu(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")
    assert hardware.native_bf16(cpu) is True and hardware.no_native_bf16_reason(cpu) is None
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "slow")
    assert hardware.native_bf16(cpu) is False
    assert "uses fp32" in hardware.no_native_bf16_reason(cpu)
    assert hardware.tf32_supported(cpu) is False


def _fake_cpu(
    monkeypatch, vector_unit: str, avx512_bf16: bool, amx: bool, onednn_cap: str | None = None
):
    monkeypatch.delenv(hardware.CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: vector_unit)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    if onednn_cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_cap)


@pytest.mark.parametrize(
    "vector_unit, avx512_bf16, amx, onednn_cap, fast",
    [
        ("AVX2", False, False, None, False),  # an AVX2-only AMD EPYC: bf16 ~30x slower than fp32
        ("AVX2", True, True, None, False),  # ATEN_CPU_CAPABILITY=avx2 on a Sapphire Rapids
        ("DEFAULT", False, False, None, False),
        ("AVX512", False, False, None, False),  # Skylake/Cascade Lake: AVX-512 without BF16
        ("AVX512", True, False, None, True),  # Cooper Lake, AMD Zen 4
        ("AVX512", True, True, None, True),  # Sapphire Rapids (AMX)
        ("AVX512", True, True, "AVX2", False),  # oneDNN capped below its bf16 kernels
        ("AVX512", True, True, "AVX512_CORE_AMX", True),
    ],
)
def test_cpu_bf16_is_decided_by_the_instructions_not_by_bf16_existing(
    monkeypatch, vector_unit, avx512_bf16, amx, onednn_cap, fast
):
    _fake_cpu(monkeypatch, vector_unit, avx512_bf16, amx, onednn_cap)
    got, why = hardware.cpu_bf16()
    assert got is fast and why
    assert hardware.native_bf16(torch.device("cpu")) is fast
    assert (hardware.no_native_bf16_reason("cpu") is None) is fast


def test_cpu_bf16_override_is_checked(monkeypatch):
    _fake_cpu(monkeypatch, "AVX2", False, False)
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")
    assert hardware.cpu_bf16()[0] is True
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "quick")
    with pytest.raises(ValueError, match="'fast' or 'slow'"):
        hardware.cpu_bf16()


def _as_dict(choices):
    return {c.switch: c.value for c in choices}


def test_recipe_for_a_t4_is_fp16_with_gradscaler_and_no_tf32():
    r = t4_colab.recommend_recipe(gpus.PROFILES["T4"])
    d = _as_dict(r)
    assert d["autocast"] == "fp16" and d["matmul_precision"] == "fp32"
    assert d["compile"] == "reduce-overhead"  # the "+ CUDA graphs" rung runs on a T4
    assert d["attention"] == "sdpa" and d["vocab_multiple"] == 64 and d["batch_size"] is None
    reasons = {c.switch: c.reason for c in r}
    assert "GradScaler" in reasons["autocast"] and "memory-efficient" in reasons["attention"]


def test_recipe_for_ampere_and_hopper_uses_bf16_and_tf32():
    for key in ("A100-80GB", "H100-SXM", "H200", "L4"):
        d = _as_dict(t4_colab.recommend_recipe(gpus.PROFILES[key]))
        assert (d["autocast"], d["matmul_precision"], d["optimizer"]) == (
            "bf16",
            "tf32",
            "triton",
        ), key


def test_recipe_on_this_cpu_builds_a_runconfig_that_runs_here():
    from helpers.core import train

    choices = t4_colab.recommend_recipe("cpu")
    cpu = torch.device("cpu")
    assert _as_dict(choices)["autocast"] == ("bf16" if hardware.native_bf16(cpu) else None)
    run = t4_colab.recipe_run_config(choices, batch_size=2, seq_len=16)
    assert train.unsupported_reason(run, torch.device("cpu")) is None
    assert "switch" in t4_colab.format_recipe(choices).splitlines()[0]


def _fake_fraction(calls, fraction, device):
    # like torch: an unindexed torch.device("cuda") is refused (found on the H200, 2026-11-29)
    if isinstance(device, torch.device) and device.index is None:
        raise ValueError(
            f"Expected a torch.device with a specified index or an integer, but got:{device}"
        )
    calls.setdefault("fraction", []).append(fraction)


class _FakeProps:
    name, total_memory, major, minor = "NVIDIA H200", 150 * 10**9, 9, 0


def test_t4_emulation_on_a_big_gpu_answers_like_a_t4(monkeypatch):
    calls = {}
    state = _fake_h200(monkeypatch, calls)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    cuda = torch.device("cuda")
    try:
        assert hardware.native_bf16(cuda) and hardware.tf32_supported(cuda)  # the real (fake) H200
        info = hardware.emulate("T4", cuda)
        assert info["memory_cap_bytes"] == 15 * 10**9 and calls["fraction"] == [0.1]
        assert set(info["sdpa_disabled"]) == {"flash", "cudnn"}
        assert not hardware.native_bf16(cuda) and not hardware.tf32_supported(cuda)
        d = {c.switch: c.value for c in t4_colab.recommend_recipe(cuda)}
        assert (d["autocast"], d["matmul_precision"]) == ("fp16", "fp32")
        from helpers.core import train
        from helpers.measure import timing

        peak, why = timing.peak_flops(cuda)
        assert peak is None and "emulating" in why  # never claims T4 speed
        with pytest.raises(ValueError, match="bf16 is not native"):
            train.build(
                train.RunConfig(autocast="bf16", batch_size=1, seq_len=8),
                train.small_model_config(),
                cuda,
            )
    finally:
        hardware.stop_emulation(cuda)
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    assert hardware.emulated_profile() is None and calls["fraction"][-1] == 1.0
    assert state["flash"] is True  # FlashAttention switched back on


def test_emulation_needs_a_gpu_and_a_known_profile(monkeypatch):
    with pytest.raises(ValueError, match="needs one"):
        hardware.emulate("T4", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="unknown profile"):
        hardware.emulate("TPU", "cuda")


# ---- chapter 08 ----------------------------------------------------------------------------------
# every profile, the recipe for each, emulation on a real GPU's API, old torch versions

EXPECTED_AUTOCAST = {
    "T4": "fp16",
    "V100": "fp16",
    "A10": "bf16",
    "A10G": "bf16",
    "L4": "bf16",
    "A100-40GB": "bf16",
    "A100-80GB": "bf16",
    "H100-PCIe": "bf16",
    "H100-SXM": "bf16",
    "H200": "bf16",
    "CPU": "bf16" if hardware.native_bf16(torch.device("cpu")) else None,  # this CPU's ladder
}


def test_the_course_has_a_profile_for_every_gpu_it_names_and_a_cpu():
    assert set(gpus.PROFILES) == set(EXPECTED_AUTOCAST)
    for p in gpus.PROFILES.values():
        assert p.source, p.key
        if p.capability is not None:
            assert p.memory_gb and p.bandwidth_gbs, p.key
        if p.peak_tensor_tflops is None or p.fp32_tflops is None:
            assert p.note, f"{p.key}: a missing figure needs a note saying why"
    assert (
        gpus.PROFILES["CPU"].capability is None and gpus.PROFILES["CPU"].peak_tensor_tflops is None
    )
    assert gpus.PROFILES["A10G"].capability == (8, 6) and gpus.PROFILES["A10G"].memory_gb == 24


def test_recipe_for_every_profile_gives_a_reason_for_every_switch():

    for key, p in gpus.PROFILES.items():
        choices = t4_colab.recommend_recipe(p)
        d = _as_dict(choices)
        assert d["autocast"] == EXPECTED_AUTOCAST[key], key
        ampere = p.capability is not None and p.capability >= (8, 0)
        assert d["matmul_precision"] == ("tf32" if ampere else "fp32"), key
        assert d["attention"] == "sdpa" and d["vocab_multiple"] == 64 and d["batch_size"] is None, (
            key
        )
        assert all(c.reason for c in choices), key
        reasons = {c.switch: c.reason for c in choices}
        if d["autocast"] == "fp16":
            assert (
                "GradScaler" in reasons["autocast"] and "memory-efficient" in reasons["attention"]
            ), key
        if ampere:
            assert "FlashAttention-2" in reasons["attention"], key
        # every recipe is a valid RunConfig
        t4_colab.recipe_run_config(choices, batch_size=4, seq_len=64)
    table = gpus.format_profiles()
    assert all(k in table for k in gpus.PROFILES) and "fp16 + GradScaler" in table


def test_the_recipe_is_the_ladders_last_runnable_rung(monkeypatch):
    """Chapter 08's recipe and ladder.last_runnable answer "the fastest configuration here" alike,
    for a real (faked) device and for the same GPU asked from its datasheet."""
    from helpers import switches

    for cap, key in (((7, 5), "T4"), ((8, 0), "A100-80GB"), ((9, 0), "H200")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=cap: c)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None, k=key: f"NVIDIA {k}")
        last = ladder.last_runnable(1, 1, "cuda")  # Triton comes with the test extra
        d = _as_dict(t4_colab.recommend_recipe("cuda"))
        assert all(d[f] == getattr(last, f) for f in switches.rung_fields()), key
        monkeypatch.undo()
        with hardware.datasheet(gpus.PROFILES[key]) as cuda:
            last = ladder.last_runnable(1, 1, cuda)
        d = _as_dict(t4_colab.recommend_recipe(gpus.PROFILES[key]))
        assert all(d[f] == getattr(last, f) for f in switches.rung_fields()), key
        assert d["lm_head_fp8"] is d["mlp_fp8"] is (cap >= (8, 9)), key
        assert d["fused_clip"] is (cap >= (8, 0)), key


def test_a_datasheet_answers_for_its_gpu_and_leaves_nothing_behind():
    with hardware.datasheet(gpus.PROFILES["T4"]) as cuda:
        assert hardware.capability(cuda) == (7, 5) and not hardware.native_bf16(cuda)
        assert hardware.compile_support(cuda)[0] and hardware.from_datasheet()
    assert hardware.emulated_profile() is None and not hardware.from_datasheet()
    with pytest.raises(ValueError, match="not a GPU"):
        with hardware.datasheet(gpus.PROFILES["CPU"]):
            pass


def test_a_skipped_rung_gives_its_reason_in_the_recipe():
    reasons = {c.switch: c.reason for c in t4_colab.recommend_recipe(gpus.PROFILES["T4"])}
    assert "'+ tf32' skipped" in reasons["matmul_precision"]
    assert "'+ fp8 LM head' skipped" in reasons["lm_head_fp8"] and "8.9" in reasons["lm_head_fp8"]
    assert "'+ fp8 MLP' skipped" in reasons["mlp_fp8"] and "8.9" in reasons["mlp_fp8"]
    assert "'+ fused LM-head CE' skipped" in reasons["loss_kernel"]
    table = t4_colab.format_recipe(t4_colab.recommend_recipe(gpus.PROFILES["T4"]))
    assert max(len(line) for line in table.splitlines()) <= 100
    md = t4_colab.recipe_markdown(t4_colab.recommend_recipe(gpus.PROFILES["T4"]))
    assert md.splitlines()[0] == "| switch | value | taught in | reason |"
    assert "| `lm_head_fp8` | `False` | 12 |" in md


def test_recipe_reports_a_measured_batch_size_with_its_reason():
    d = {
        c.switch: c
        for c in t4_colab.recommend_recipe(
            gpus.PROFILES["T4"], batch_size=12, batch_reason="probed"
        )
    }
    assert d["batch_size"].value == 12 and d["batch_size"].reason == "probed"


def test_profile_native_bf16_ignores_what_torch_says():
    assert not gpus.PROFILES["T4"].native_bf16 and not gpus.PROFILES["V100"].native_bf16
    assert gpus.PROFILES["A100-40GB"].native_bf16 and gpus.PROFILES["CPU"].native_bf16


def _fake_h200(monkeypatch, calls):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: _FakeProps())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: _fake_fraction(calls, f, d)
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    state = {"flash": True, "cudnn": True}
    for name in ("flash", "cudnn"):
        monkeypatch.setattr(
            torch.backends.cuda,
            f"enable_{name}_sdp",
            lambda on, name=name: state.__setitem__(name, on),
        )
        monkeypatch.setattr(
            torch.backends.cuda, f"{name}_sdp_enabled", lambda name=name: state[name]
        )
    return state


def test_stop_emulation_restores_the_switches_as_they_were(monkeypatch):
    calls = {}
    state = _fake_h200(monkeypatch, calls)
    state["cudnn"] = False  # the user had switched cuDNN attention off before emulating
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        hardware.emulate("T4", "cuda")
        assert (
            state == {"flash": False, "cudnn": False}
            and torch.get_float32_matmul_precision() == "highest"
        )
        hardware.emulate("T4", "cuda")  # a second call keeps the first saved state
        hardware.stop_emulation("cuda")
        assert (
            state == {"flash": True, "cudnn": False}
            and torch.get_float32_matmul_precision() == "high"
        )
        assert calls["fraction"] == [0.1, 0.1, 1.0]
    finally:
        hardware.stop_emulation("cuda")
        torch.set_float32_matmul_precision(old)


def test_emulation_refuses_the_cpu_profile(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="unknown profile .CPU. .a GPU"):
        hardware.emulate("CPU", "cuda")


def test_sdpa_probe_while_emulating_answers_as_the_t4(monkeypatch):
    # sdpa_kernel(FLASH) would switch flash back on for the probe:
    # the probe must not ask the real GPU.
    calls = {}
    _fake_h200(monkeypatch, calls)
    real_randn = torch.randn
    monkeypatch.setattr(
        torch,
        "randn",
        lambda *shape, device=None, dtype=None: real_randn(*shape, dtype=torch.float32),
    )
    try:
        hardware.emulate("T4", "cuda")
        probe = hardware.sdpa_backends(torch.device("cuda"))
    finally:
        hardware.stop_emulation("cuda")
    assert "emulating a T4" in probe["flash_attention"] and "sm75" in probe["flash_attention"]
    assert probe["math"] == "ok"


def test_old_torch_without_cudnn_attention_still_emulates(monkeypatch):
    # torch versions without cuDNN attention have neither the switch nor the SDPBackend member
    calls = {}
    _fake_h200(monkeypatch, calls)
    monkeypatch.delattr(torch.backends.cuda, "enable_cudnn_sdp")
    monkeypatch.delattr(torch.backends.cuda, "cudnn_sdp_enabled")
    try:
        info = hardware.emulate("T4", "cuda")
        assert info["sdpa_disabled"] == ["flash"]
    finally:
        hardware.stop_emulation("cuda")


def test_sdpa_probe_on_a_torch_without_cudnn_attention(monkeypatch):
    import torch.nn.attention as attn

    class OldBackend:  # the members of SDPBackend in torch 2.3
        FLASH_ATTENTION, EFFICIENT_ATTENTION, MATH = (
            attn.SDPBackend.FLASH_ATTENTION,
            attn.SDPBackend.EFFICIENT_ATTENTION,
            attn.SDPBackend.MATH,
        )

    monkeypatch.setattr(attn, "SDPBackend", OldBackend)
    monkeypatch.setattr(
        attn, "sdpa_kernel", lambda backend: contextlib.nullcontext()
    )  # the real one checks the enum
    probe = hardware.sdpa_backends(torch.device("cpu"))
    assert probe["cudnn_attention"] == "not in this torch version" and probe["math"] == "ok"


def test_what_torch_says_about_bf16_on_old_and_new_versions(monkeypatch):
    assert hardware.torch_says_bf16("cpu") == {"default": False, "without_emulation": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # a T4 on a recent torch: True by default (emulated), False without emulation
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    assert hardware.torch_says_bf16("cuda") == {"default": True, "without_emulation": False}
    # a torch without the including_emulation argument
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert hardware.torch_says_bf16("cuda") == {"default": True, "without_emulation": None}


def test_chapter_08_budget_parts_are_chapter_03s_estimate():
    from helpers.core import model
    from helpers.grading import ch08 as checks_ch08
    from helpers.measure import memory

    cfg = model.GPTConfig(vocab_multiple=64)
    parts = checks_ch08.step_parts(cfg, 1024, True, False)
    for B in (1, 12, 13):
        want = memory.training_step_estimate(cfg, B, 1024, True, False)
        assert (
            parts(B) == {k: v for k, v in want.items() if k != "total"}
            and sum(parts(B).values()) == want["total"]
        )


def test_course_emulate_gpu_makes_default_device_emulate_once(monkeypatch):
    """COURSE_EMULATE_GPU=T4 runs every notebook as a T4: they all start with default_device()."""
    calls = {}
    _fake_h200(monkeypatch, calls)
    monkeypatch.setattr(hardware, "_env_emulation_done", False)
    monkeypatch.setenv(hardware.EMULATE_ENV, "T4")
    precision = torch.get_float32_matmul_precision()
    try:
        assert hardware.default_device() == torch.device("cuda")
        assert hardware.emulated_profile().key == "T4" and calls["fraction"] == [0.1]
        hardware.stop_emulation("cuda")
        hardware.default_device()  # applied once: a stop_emulation holds
        assert hardware.emulated_profile() is None and calls["fraction"] == [0.1, 1.0]
    finally:
        hardware.stop_emulation("cuda")
        torch.set_float32_matmul_precision(precision)


def test_default_device_without_the_variable_or_on_a_cpu_does_not_emulate(monkeypatch):
    calls = {}
    monkeypatch.setattr(hardware, "_env_emulation_done", False)
    monkeypatch.setenv(hardware.EMULATE_ENV, "T4")
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: False
    )  # no GPU (also when the tests run on one)
    assert hardware.default_device() == torch.device("cpu") and hardware.emulated_profile() is None
    _fake_h200(monkeypatch, calls)
    monkeypatch.setattr(hardware, "_env_emulation_done", False)
    monkeypatch.delenv(hardware.EMULATE_ENV)
    assert hardware.default_device() == torch.device("cuda") and hardware.emulated_profile() is None
    assert "fraction" not in calls
    monkeypatch.setattr(hardware, "_env_emulation_done", False)
    monkeypatch.setenv(hardware.EMULATE_ENV, "TPU")
    with pytest.raises(ValueError, match="unknown profile"):
        hardware.default_device()


def test_a_failed_env_emulation_raises_again_instead_of_running_unemulated(monkeypatch):
    """A typo in COURSE_EMULATE_GPU must not turn into a silent un-emulated run
    on the second call."""
    calls = {}
    _fake_h200(monkeypatch, calls)
    monkeypatch.setattr(hardware, "_env_emulation_done", False)
    monkeypatch.setenv(hardware.EMULATE_ENV, "T4x")
    for _ in range(2):
        with pytest.raises(ValueError, match="unknown profile"):
            hardware.default_device()


def test_explicit_emulate_supersedes_the_variable_and_cli_device_applies_it(monkeypatch):
    from helpers.tools import cli

    calls = {}
    _fake_h200(monkeypatch, calls)
    precision = torch.get_float32_matmul_precision()
    try:
        # --emulate A100-40GB with COURSE_EMULATE_GPU=T4 set: the explicit profile holds
        monkeypatch.setattr(hardware, "_env_emulation_done", False)
        monkeypatch.setenv(hardware.EMULATE_ENV, "T4")
        hardware.emulate("A100-40GB", "cuda")
        assert cli.device(None).type == "cuda" and cli.device("cuda").type == "cuda"
        assert hardware.emulated_profile().key == "A100-40GB"
        hardware.stop_emulation("cuda")
        # --device cuda (explicit) with the variable: emulated too
        monkeypatch.setattr(hardware, "_env_emulation_done", False)
        cli.device("cuda")
        assert hardware.emulated_profile().key == "T4"
    finally:
        hardware.stop_emulation("cuda")
        torch.set_float32_matmul_precision(precision)


def test_emulating_on_a_cpu_with_the_variable_set_says_to_unset_it(monkeypatch):
    monkeypatch.setenv(hardware.EMULATE_ENV, "T4")
    with pytest.raises(ValueError, match="unset \\$COURSE_EMULATE_GPU"):
        hardware.emulate("T4", "cpu")


# --- GPUPowerSampler: nvidia-smi lines in, samples and a summary out (a fake nvidia-smi on the CPU)

SMI_LINES = [
    "2026/11/30 03:39:09.345, 1740, 697.75, 700.00, 0x0000000000000004, 52",
    "2026/11/30 03:39:09.445, 1980, 124.80, 700.00, 0x0000000000000000, 47",
    "2026/11/30 03:39:09.545, 1650, 693.88, 700.00, 0x0000000000000004, 55",
]


def test_parse_smi_line_reads_clock_power_limit_and_reasons():
    s = power.parse_smi_line(SMI_LINES[0], t=5.0)
    assert (s.t, s.sm_clock_mhz, s.power_w, s.power_limit_w, s.reasons) == (
        5.0,
        1740,
        697.75,
        700.0,
        4,
    )
    assert s.reasons & power.SW_POWER_CAP and s.temperature_c == 52
    old = power.parse_smi_line(SMI_LINES[0].rsplit(",", 1)[0], t=5.0)  # a query without it
    assert old.reasons == 4 and old.temperature_c is None
    for bad in [
        "timestamp, clocks.current.sm [MHz], power.draw [W], power.limit [W], reasons",
        'Field "power.draw.instant" is not a valid field to query.',
        "No devices were found",
        "",
        "2026/11/30 03:39:09.345, [N/A], [N/A], [N/A], [N/A]",
    ]:
        assert power.parse_smi_line(bad, t=0.0) is None
    na = power.parse_smi_line("2026/11/30 03:39:09.345, 1740, [N/A], [Not Supported], 0x4", t=1.0)
    assert (na.sm_clock_mhz, na.power_w, na.power_limit_w, na.reasons) == (
        1740,
        None,
        None,
        4,
    )  # the clock is kept


def test_power_summary_keeps_only_the_window():
    samples = [power.parse_smi_line(line, t=float(i)) for i, line in enumerate(SMI_LINES)]
    all3 = power.power_summary(samples)
    assert all3["samples"] == 3 and all3["power_w"] == {
        "min": 124.8,
        "median": 693.88,
        "max": 697.75,
    }
    assert all3["sm_clock_mhz"]["min"] == 1650 and all3["sw_power_cap_fraction"] == pytest.approx(
        2 / 3
    )
    assert power.power_summary(samples, 0.5, 1.5)["sm_clock_mhz"] == {
        "min": 1980,
        "median": 1980,
        "max": 1980,
    }
    assert power.power_summary(samples, 10.0, 11.0) == {"samples": 0, "window_s": 1.0}
    two = power.power_summary(samples[:2])
    assert two["sm_clock_mhz"]["median"] == 1860  # the mean of the middle two, not the upper one
    samples.append(
        power.PowerSample(t=3.0, sm_clock_mhz=1500, power_w=None, power_limit_w=None, reasons=None)
    )
    with_na = power.power_summary(samples)
    assert (
        with_na["samples"] == 4
        and with_na["power_w"]["max"] == 697.75
        and with_na["sm_clock_mhz"]["min"] == 1500
    )
    assert with_na["sw_power_cap_fraction"] == pytest.approx(
        2 / 3
    )  # over the samples that had reasons
    assert with_na["thermal_fraction"] == 0.0
    samples.append(
        power.PowerSample(t=3.5, sm_clock_mhz=1400, power_w=650, power_limit_w=700, reasons=0x24)
    )  # power cap and SW thermal slowdown at once
    assert power.power_summary(samples)["thermal_fraction"] == pytest.approx(1 / 4)


def test_format_power_summary_says_what_was_measured():
    samples = [power.parse_smi_line(line, t=float(i)) for i, line in enumerate(SMI_LINES)]
    text = power.format_power_summary(power.power_summary(samples), max_clock_mhz=1980)
    assert "1650 / 1740 / 1980 MHz" in text and "the median is 88% of it" in text
    assert (
        "up to 698 W of a 700 W limit (a ~1 s average" in text and "in 67% of the samples" in text
    )
    assert "a thermal slowdown (the GPU too hot) in 0% of the samples" in text
    assert "power draw median 694 W" in text
    assert "GPU temperature min / median / max: 47 / 52 / 55 °C" in text
    assert "average" not in power.format_power_summary(
        power.power_summary(samples), power_is_average=False
    )
    assert "no nvidia-smi sample" in power.format_power_summary({"samples": 0, "window_s": 0.05})


def test_gpu_power_sampler_collects_the_lines_a_command_prints():
    import sys

    script = (
        "import sys, time\n"
        + "".join(f"print({line!r}, flush=True)\n" for line in SMI_LINES)
        + "time.sleep(30)\n"
    )
    with power.GPUPowerSampler("cuda", command=[sys.executable, "-c", script]) as smi:
        import time

        deadline = time.time() + 20
        while len(smi.samples) < 3 and time.time() < deadline:
            time.sleep(0.05)
    assert [s.sm_clock_mhz for s in smi.samples] == [
        1740,
        1980,
        1650,
    ]  # the sleeping 'nvidia-smi' was stopped
    assert smi._proc.poll() is not None and smi.returncode is None and smi.problem() is None


def test_gpu_power_sampler_reports_why_nvidia_smi_gave_nothing():
    import sys
    import time

    script = (
        "import sys; print('Field \"power.draw.instant\" is not a valid field to query.'); "
        "sys.exit(2)"
    )
    with power.GPUPowerSampler("cuda", command=[sys.executable, "-c", script]) as smi:
        time.sleep(1.0)
    assert smi.samples == [] and smi.returncode == 2
    assert "exit status 2" in smi.problem() and "not a valid field" in smi.problem()


def test_gpu_power_sampler_says_what_is_missing(monkeypatch):
    with pytest.raises(RuntimeError, match="not a CUDA device"):
        power.GPUPowerSampler("cpu").__enter__()
    monkeypatch.setattr(hardware.shutil, "which", lambda name: None)
    monkeypatch.setattr(hardware.torch.cuda, "is_available", lambda: False)  # on a GPU host too
    with pytest.raises(
        RuntimeError, match="cannot see a CUDA GPU"
    ):  # a CPU-only torch: the first thing to say
        power.GPUPowerSampler("cuda").__enter__()
    monkeypatch.setattr(hardware.torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="nvidia-smi is not on PATH"):
        power.GPUPowerSampler("cuda").__enter__()
    assert power.max_sm_clock_mhz("cuda") is None and power.max_sm_clock_mhz("cpu") is None
    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        hardware.torch.cuda, "is_available", lambda: False
    )  # a CPU-only torch, nvidia-smi present
    with pytest.raises(RuntimeError, match="cannot see a CUDA GPU"):
        power.GPUPowerSampler("cuda").__enter__()
    assert power.max_sm_clock_mhz("cuda") is None


def test_power_window_and_reading_kind(monkeypatch):
    samples = [power.parse_smi_line(line, t=float(i)) for i, line in enumerate(SMI_LINES)]
    assert [s.t for s in power.samples_in_window(samples, 0.5, 2.0)] == [1.0, 2.0]
    assert power.samples_in_window(samples) == samples
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda d=None: (7, 5)
    )  # a T4: instantaneous
    assert power.power_reading_is_average("cuda") is False
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda d=None: (9, 0)
    )  # an H200: ~1 s average
    assert power.power_reading_is_average("cuda") is True


def test_the_emulation_variable_is_checked_even_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(hardware.EMULATE_ENV, "X9")
    with pytest.raises(ValueError, match="unknown profile 'X9'"):
        hardware.apply_env_emulation("cpu")
    monkeypatch.setenv(hardware.EMULATE_ENV, "T4")
    with pytest.warns(UserWarning, match="no CUDA GPU to emulate it with"):
        assert hardware.apply_env_emulation("cpu") is None


def test_a_recipe_is_asked_by_profile_name_and_a_wrong_name_says_what_exists():
    assert _as_dict(t4_colab.recommend_recipe("T4"))["autocast"] == "fp16"
    with pytest.raises(ValueError, match="neither a device"):
        t4_colab.recommend_recipe("T5")
    reasons = {c.switch: c.reason for c in t4_colab.recommend_recipe("T4")}
    assert "compute capability 7.5" in reasons["matmul_precision"]


def test_profiles_markdown_is_the_profile_table_as_a_real_table():
    text = gpus.format_profiles().splitlines()
    md = gpus.profiles_markdown().splitlines()
    assert md[0].startswith("| profile | sm | GB | GB/s | fp32 TFLOP/s |")
    n = len(gpus.PROFILES)
    for text_row, md_row in zip(text[2 : 2 + n], md[2 : 2 + n], strict=True):
        assert text_row.split() == " ".join(md_row.strip("| ").split(" | ")).split()
    assert "- T4: NVIDIA T4 Tensor Core GPU datasheet (2019)" in md


def test_compare_markdown_keeps_the_rungs_only_one_ladder_ran():
    from helpers.chapters import ch08_t4_colab as t4_colab

    def row(name, ms):
        return {"name": name, "status": "measured", "ms_per_step": ms, "peak_mem_bytes": 2**30}

    left = [row("fp32", 100.0), row("+ fp8 LM head", 30.0)]
    right = [row("fp32", 120.0)]
    table = t4_colab.compare_markdown(left, right, ("H200", "emulated T4")).splitlines()
    assert len(table) == 4  # header, rule, two rungs
    assert table[3] == "| + fp8 LM head | 30.0 ms, peak 1.00 GiB | - | not in this run |"
    swapped = t4_colab.compare_markdown(right, left, ("emulated T4", "H200")).splitlines()
    assert swapped[3] == "| - | not in this run | + fp8 LM head | 30.0 ms, peak 1.00 GiB |"


def test_cpu_model_reads_cpuinfo_and_falls_back(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n")
    assert hardware.cpu_model(str(info)) == "AMD EPYC 9R14"
    assert hardware.cpu_model(str(tmp_path / "absent")) == (
        platform.processor() or platform.machine()
    )
    info.write_text("processor\t: 0\n")  # no model line (some ARM kernels)
    assert hardware.cpu_model(str(info)) == (platform.processor() or platform.machine())
