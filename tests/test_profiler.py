"""Tests for helpers/measure/profiler.py: kernel families, the step with ranges, profiling a
step and summarising its events."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.core import data, train
from helpers.core.model import GPTConfig
from helpers.measure import profiler

TINY = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)


@pytest.mark.parametrize(
    "name,family",
    [
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "matmul"),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
            "matmul",
        ),
        ("triton_tem_fused_mm_0", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::mm", "matmul"),
        (
            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
            "attention",
        ),
        (
            "void pytorch_flash::flash_fwd_kernel<"
            "Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>",
            "attention",
        ),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        (
            "triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_add_arange_eq_expand_nll_loss_backward",
            "triton fused",
        ),
        ("triton_poi_fused_gelu_view_9", "triton fused"),
        (
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)>",
            "elementwise",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::CUDAFunctor_add<c10::BFloat16>>",
            "elementwise",
        ),
        ("aten::add_", "elementwise"),
        ("aten::gelu_backward", "elementwise"),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
            "reduction",
        ),
        (
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>",
            "reduction",
        ),
        (
            "void at::native::reduce_kernel<512, 1, "
            "at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>",
            "reduction",
        ),
        ("aten::native_layer_norm", "reduction"),
        ("aten::nll_loss_forward", "reduction"),
        (
            "void at::native::elementwise_kernel<128, 4, "
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
            "copy / cast",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)>",
            "copy / cast",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "copy / cast"),
        ("Memset (Device)", "copy / cast"),
        ("aten::copy_", "copy / cast"),
        ("aten::embedding_dense_backward", "copy / cast"),
        (
            "void at::native::(anonymous namespace)::"
            "multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
            "optimizer",
        ),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::_foreach_norm", "optimizer"),
        (
            "void at::native::amp_update_scale_cuda_kernel("
            "float*, int*, float const*, double, double, int)",
            "optimizer",
        ),
        ("aten::view", "other"),
    ],
)
def test_kernel_family_of_real_kernel_and_operator_names(name, family):
    assert profiler.kernel_family(name) == family


# The first name is as results/h200-perf-eager-2026-11-30.json recorded it on the H200; the
# others are LayerNorm's backward kernels in other PyTorch versions and in apex.
LAYER_NORM_BACKWARD = [
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, "
    "32u, 32u, 256u, false, true, false>(long, long, float const*, float const*, float const*, "
    "float const*, float*, float*)",
    "void at::native::(anonymous namespace)::GammaBetaBackwardSimpleCUDAKernel<float, float>",
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<float, float>",
    "aten::native_layer_norm_backward",
    "LayerNormBackward0",
    "void cuComputeGradGammaBeta<float, float, float>(float const*, int, int)",
    "void cuComputePartGradGammaBeta<float, float, float>(float const*, int, int)",
    "void cuComputeGradInput<float, float, float>(float const*, float const*, int, int)",
]


@pytest.mark.parametrize("name", LAYER_NORM_BACKWARD)
def test_layer_norm_backward_kernels_are_reductions(name):
    """LayerNorm's weight and bias gradients are sums over the rows: a reduction, not "other"."""
    assert profiler.kernel_family(name) == "reduction"


@pytest.mark.parametrize(
    "name,family",
    [
        (
            "void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>"
            "(float const*, at::native::TensorListAddresses, int)",
            "optimizer",
        ),
        (
            "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, float>"
            "(long const*, c10::BFloat16 const*, long const*, long, long, long, float*)",
            "copy / cast",
        ),
        (
            "void at::native::(anonymous namespace)::sum_and_scatter<c10::BFloat16, float>"
            "(long const*, c10::BFloat16*, long, long const*, float const*, long const*)",
            "copy / cast",
        ),
        ("void at::native::(anonymous namespace)::krn_partials_per_segment<long>", "copy / cast"),
    ],
)
def test_clip_norm_and_embedding_backward_kernels_have_their_family(name, family):
    assert profiler.kernel_family(name) == family


def test_kernel_family_rejects_non_strings():
    with pytest.raises(TypeError):
        profiler.kernel_family(None)


def test_family_totals_sum_per_family_largest_first():
    rows = [
        {"family": "matmul", "ms": 3.0},
        {"family": "elementwise", "ms": 2.0},
        {"family": "elementwise", "ms": 2.5},
    ]
    assert list(profiler.family_totals(rows).items()) == [("elementwise", 4.5), ("matmul", 3.0)]


@pytest.mark.parametrize(
    "switches",
    [
        dict(),
        dict(grad_accum_steps=2, attention="sdpa", optimizer="fused"),
        dict(autocast="bf16", grad_clip=None),
        dict(autocast="fp16"),
    ],
    ids=["fp32", "accum2-sdpa-fused", "bf16-noclip", "fp16-scaler"],
)
def test_step_with_ranges_matches_trainer_step(switches):
    tokens = data.load_tokens()[:20_000]
    run = train.RunConfig(batch_size=2, seq_len=16, **switches)
    a, b = train.build(run, TINY, "cpu"), train.build(run, TINY, "cpu")
    la, lb = data.BatchLoader(tokens, 2, 16), data.BatchLoader(tokens, 2, 16)
    for _ in range(3):
        loss_a = a.step(la)
        loss_b = profiler.step_with_ranges(b, lb)
        assert torch.equal(loss_a, loss_b)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    if a.scaler is not None:
        assert a.scaler.get_scale() == b.scaler.get_scale()


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    run = train.RunConfig(batch_size=2, seq_len=16, attention="sdpa")
    trainer = train.build(run, TINY, "cpu")
    loader = data.BatchLoader(data.load_tokens()[:20_000], 2, 16)
    trace = tmp_path_factory.mktemp("traces") / "step.json"
    return profiler.profile_steps(trainer, loader, active=2, trace_path=trace)


def test_profile_steps_hides_torchs_one_cycle_warning():
    """torch 2.11 warned "Warning: Profiler clears events at the end of each cycle" in chapter 10's
    profile (one cycle: nothing to warn about). The filter must match that exact text, which starts
    with "Warning: "."""
    import warnings

    msg = (
        "Warning: Profiler clears events at the end of each cycle. Only events from the current "
        "cycle will be reported. To keep events across cycles, set acc_events=True."
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with profiler.quiet_one_cycle_warning():
            warnings.warn(msg, UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)  # other warnings still show
    assert [str(w.message) for w in seen] == ["another warning"]


def test_cpu_profile_has_operators_phases_and_a_trace(cpu_profile):
    prof = cpu_profile
    assert prof.device_type == "cpu" and prof.steps == 2
    names = {r["name"] for r in prof.kernels}
    assert {"aten::addmm", "aten::mm"} & names
    assert all(r["name"].startswith("aten::") and r["ms"] > 0 for r in prof.kernels)
    assert [r["ms"] for r in prof.kernels] == sorted((r["ms"] for r in prof.kernels), reverse=True)
    for phase in ("forward", "backward", "optimizer", "clip"):
        assert prof.phases_ms[phase] > 0, phase
    assert prof.phases_ms["backward"] > prof.phases_ms["optimizer"] * 0.1
    assert prof.phases_ms.get(profiler.UNATTRIBUTED, 0.0) < 0.05 * sum(prof.phases_ms.values())
    assert 0 < prof.busy_ms <= prof.span_ms
    assert prof.busy_ms == pytest.approx(prof.kernel_ms)
    for phase, fams in prof.phase_families_ms.items():  # the phases, split by family
        assert sum(fams.values()) == pytest.approx(prof.phases_ms[phase]), phase
    assert prof.phase_families_ms["backward"]["matmul"] > 0
    trace = json.loads(Path(prof.trace_path).read_text())
    names_in_trace = {e.get("name") for e in trace["traceEvents"]}
    assert {"forward", "backward", "optimizer"} <= names_in_trace


def _evt(name, device, start, end, id=0, linked=0, annotation=False):
    return SimpleNamespace(
        name=name,
        device_type=f"DeviceType.{device}",
        time_range=SimpleNamespace(start=start, end=end),
        id=id,
        linked_correlation_id=linked,
        is_user_annotation=annotation,
        self_cpu_time_total=0,
    )


def test_summarize_events_puts_gpu_kernels_in_the_phase_of_their_launch():
    # host: forward 0-10 us, backward 10-20 us, optimizer 20-25 us; kernels run later on the GPU
    events = [
        _evt("ProfilerStep#3", "CPU", 0, 25, annotation=True),
        _evt("forward", "CPU", 0, 10, annotation=True),
        _evt("backward", "CPU", 10, 20, annotation=True),
        _evt("optimizer", "CPU", 20, 25, annotation=True),
        _evt("forward", "CUDA", 5, 40, annotation=True),  # the range's copy on the GPU timeline
        _evt("aten::mm", "CPU", 1, 3, id=7),
        _evt("cudaLaunchKernel", "CPU", 2, 3, id=101, linked=7),
        _evt("nvjet_sm90_gemm", "CUDA", 5, 15, id=101, linked=7),  # launched in forward
        _evt("cudaLaunchKernel", "CPU", 12, 13, id=102),
        _evt("triton_poi_fused_gelu_backward", "CUDA", 15, 20, id=102),  # launched in backward
        _evt("cudaLaunchKernel", "CPU", 21, 22, id=103),
        _evt(
            "multi_tensor_apply_kernel<FusedAdam>", "CUDA", 30, 40, id=103
        ),  # optimizer, after a gap
        _evt(
            "Memcpy HtoD (Pinned -> Device)", "CUDA", 0, 1, id=999
        ),  # no launch event: unattributed
    ]
    prof = profiler.summarize_events(events, steps=1, device_type="cuda", device_name="fake")
    assert prof.phases_ms["forward"] == pytest.approx(0.010)
    assert prof.phases_ms["backward"] == pytest.approx(0.005)
    assert prof.phases_ms["optimizer"] == pytest.approx(0.010)
    assert prof.phases_ms[profiler.UNATTRIBUTED] == pytest.approx(0.001)
    assert not prof.notes  # 1 us of 26 unattributed: under the 5% that earns a note
    assert {r["name"] for r in prof.kernels} == {
        "nvjet_sm90_gemm",
        "triton_poi_fused_gelu_backward",
        "multi_tensor_apply_kernel<FusedAdam>",
        "Memcpy HtoD (Pinned -> Device)",
    }
    assert prof.busy_ms == pytest.approx(0.026)  # 0-1, 5-20, 30-40
    assert prof.span_ms == pytest.approx(0.040)
    assert prof.idle_ms == pytest.approx(0.014)
    assert prof.host_ms == pytest.approx(0.025)
    assert prof.phase_families_ms["forward"] == pytest.approx({"matmul": 0.010})
    assert prof.phase_families_ms["backward"] == pytest.approx({"triton fused": 0.005})
    assert prof.phase_ratio() == pytest.approx(0.5)  # backward / forward, all kernels
    assert prof.phase_ratio(family="triton fused") is None  # no triton kernel in the forward
    assert prof.phase_ratio("optimizer", "backward") == pytest.approx(2.0)


def test_summarize_events_refuses_an_empty_profile():
    with pytest.raises(ValueError, match="no CUDA kernel events"):
        profiler.summarize_events([_evt("forward", "CPU", 0, 1, annotation=True)], 1, "cuda")
    with pytest.raises(ValueError, match="steps"):
        profiler.summarize_events([], 0, "cpu")


@pytest.mark.parametrize("wait,warmup", [(1, 1), (0, 2), (2, 0)])
def test_profile_steps_synchronizes_before_the_recording_starts(monkeypatch, wait, warmup):
    """The GPU runs behind the host: a kernel of the last unrecorded step still running when
    ``prof.step()`` starts the recording lands in the first recorded step (chapter 10's H200
    profile counted 14 attention backwards per step for 12 blocks). So the device must be
    synchronized after that step and before the ``prof.step()`` whose new action records, and not
    again until the last recorded step is done (the recorded steps keep their host/GPU overlap)."""
    from torch.profiler import ProfilerAction, profile

    log = []
    monkeypatch.setattr(profiler, "synchronize", lambda device: log.append("sync"))
    real_step = profile.step

    def logged_step(self):
        real_step(self)
        log.append(f"prof.step -> {self.current_action.name}")

    monkeypatch.setattr(profile, "step", logged_step)
    run = train.RunConfig(batch_size=2, seq_len=16)
    trainer = train.build(run, TINY, "cpu")
    loader = data.BatchLoader(data.load_tokens()[:20_000], 2, 16)
    profiler.profile_steps(trainer, loader, wait=wait, warmup=warmup, active=2, pre_steps=0)
    record = (ProfilerAction.RECORD.name, ProfilerAction.RECORD_AND_SAVE.name)
    first = next(i for i, e in enumerate(log) if e.split(" -> ")[-1] in record)
    assert log[first - 1] == "sync", log
    # between the start of the recording and the end of the last recorded step: no sync
    last_recorded = max(i for i, e in enumerate(log) if e.split(" -> ")[-1] in record)
    assert "sync" not in log[first : last_recorded + 1], log


def _fe(name, id, shapes=(), parent=None, stack=()):
    """A real torch FunctionEvent (the class prof.events() returns), on the CPU."""
    from torch.autograd.profiler_util import FunctionEvent

    e = FunctionEvent(
        id=id,
        name=name,
        thread=0,
        start_us=id,
        end_us=id + 1,
        input_shapes=list(shapes),
        stack=list(stack),
    )
    if parent is not None:
        e.set_cpu_parent(parent)
    return e


def test_kernel_launchers_names_the_operators_and_shapes_behind_a_kernel():
    # two steps: an opaque custom op calls aten::sum, whose launch runs reduce_kernel; a matmul's
    # kernel does not match the pattern
    events = []
    for step in range(2):
        op = _fe("fastgpt2::qkv_grad_cat_opaque", 10 * step + 1)
        frames = [
            "/repo/helpers/core/kernels/qkv_grad.py(92): _qkv_grad_run",
            "/usr/lib/python3/site-packages/torch/_ops.py(841): __call__",
        ]
        s = _fe("aten::sum", 10 * step + 2, shapes=[[256, 2304], []], parent=op, stack=frames)
        launch = _fe("cudaLaunchKernel", 10 * step + 3, parent=s)
        launch.append_kernel("void at::native::reduce_kernel<128, 4>", 0, 40.0)  # us
        mm = _fe("aten::mm", 10 * step + 4)
        mm_launch = _fe("cudaLaunchKernel", 10 * step + 5, parent=mm)
        mm_launch.append_kernel("nvjet_sm90_gemm", 0, 100.0)
        events += [op, s, launch, mm, mm_launch]
    rows = profiler.kernel_launchers(events, r"reduce_kernel", steps=2)
    assert len(rows) == 1
    (r,) = rows
    assert r["kernel"] == "void at::native::reduce_kernel<128, 4>"
    assert r["chain"] == ["aten::sum", "fastgpt2::qkv_grad_cat_opaque"]
    assert r["shapes"] == "[[256, 2304], []]"
    assert r["stack"] == ["/repo/helpers/core/kernels/qkv_grad.py(92): _qkv_grad_run"]
    assert r["ms"] == pytest.approx(0.040)  # 40 us per step
    assert r["launches"] == 1
    assert profiler.kernel_launchers(events, "nvjet", steps=2)[0]["chain"] == ["aten::mm"]
    assert profiler.kernel_launchers(events, "no such kernel", steps=2) == []


def test_kernel_launchers_refuses_a_bad_pattern_and_zero_steps():
    with pytest.raises(ValueError, match="regular expression"):
        profiler.kernel_launchers([], "reduce_kernel(", steps=1)
    with pytest.raises(ValueError, match="steps"):
        profiler.kernel_launchers([], "x", steps=0)


def test_kernel_launchers_survives_a_parent_cycle_and_refuses_a_bad_top():
    a, b = _fe("aten::sum", 1), _fe("aten::add", 2)
    a.set_cpu_parent(b)
    b.cpu_parent = a  # not a real tree: the walk must still end
    a.append_kernel("reduce_kernel", 0, 5.0)
    assert profiler.kernel_launchers([a, b], "reduce", steps=1)[0]["chain"] == [
        "aten::sum",
        "aten::add",
    ]
    for top in (0, -1, 1.5):
        with pytest.raises(ValueError, match="top"):
            profiler.kernel_launchers([a], "x", steps=1, top=top)
    with pytest.raises(ValueError, match="regular expression"):
        profiler.kernel_launchers([a], None, steps=1)


@pytest.mark.parametrize(
    "name, annotation",
    [
        ("ProfilerStep#3", True),
        ("Optimizer.step#TritonAdamW.step", True),
        ("## Call CompiledFxGraph fm6f ##", True),
        ("forward", True),
        # a kernel whose C++ name holds a lambda is a kernel
        ("void at::native::reduce_kernel<128, 4, {lambda(float, float)#1}>", False),
        ("void at::native::vectorized_elementwise_kernel<4, {lambda(float)#1}>", False),
        ("nvjet_sm90_tst_256x128", False),
    ],
)
def test_is_annotation_tells_ranges_from_kernels(name, annotation):
    evt = SimpleNamespace(name=name, activity_type="kernel")
    assert profiler.is_annotation(evt) is annotation
