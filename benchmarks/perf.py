"""Time and profile the course's fastest step, and variants of it, on a CUDA GPU.

    python benchmarks/perf.py --batch-size 16 64 --variants final reduce-overhead --profile

Each variant is the ladder's last rung plus one change; every variant is built and compiled afresh
(``helpers.core.train.build`` resets dynamo). Timing is ``helpers.measure.timing.measure`` (3
warm-up steps, median of 10 CUDA-event-timed steps), the same method as the ladder and the
reference.
``--profile`` runs torch.profiler over 3 steps and sums device time per kernel family;
``--launchers REGEX`` adds which operators, with which input shapes and from which lines of the
course's code, launched the kernels whose names match (e.g. ``--variants no-cuda-graphs --profile
--launchers reduce_kernel``).
``--power`` samples the GPU's power draw and SM clock with nvidia-smi every 100 ms
(``helpers.measure.power.GPUPowerSampler``) and stores, per row, what it read during the timed
steps; the step first runs (compiled) for ``--power-settle`` seconds, so that the timed steps, and
the power reading (a ~1 s average on Ampere and newer), are those of a GPU that has been under
this load for a while rather than one just back from the idle compile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import time
from collections import defaultdict

import torch

from helpers import bench
from helpers.core import data
from helpers.core.model import GPTConfig, flops_per_token
from helpers.ladder import last_runnable
from helpers.measure import power, profiler, results

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bias_in_matmul  # noqa: E402  (this folder's experiment modules)
import fp8_linears  # noqa: E402

from helpers.core.kernels import qkv_grad  # noqa: E402

VARIANTS = {
    "final": {},
    "reduce-overhead": {"compile": "reduce-overhead"},
    "no-cuda-graphs": {"compile": "default"},  # the last rung without its "+ CUDA graphs"
    "foreach-adamw": {"optimizer": "foreach"},
    "no-clip": {"grad_clip": None},
    # the last rung minus one of its switches (each measured against "final" in one run)
    "fp32-residual": {"residual_dtype": "fp32"},
    "attached-logits": {"detach_logits": False},
    "pytorch-ce": {"loss_kernel": "pytorch"},
    "two-kernel-ce": {
        "loss_kernel": "triton"
    },  # the fused LM-head CE's gradient computed in backward instead
    # the last rung without torch.compile (chapter 10 profiles it eagerly), with each cross-entropy
    "eager": {"compile": None},
    "eager-two-kernel-ce": {"compile": None, "loss_kernel": "triton"},
    "eager-pytorch-ce": {"compile": None, "loss_kernel": "pytorch"},
    "separate-clip": {"fused_clip": False},
    "bf16-lm-head": {"lm_head_fp8": False},  # the fused LM-head CE's matmuls in bf16
    # the fp8 MLP's input-gradient matmuls with exact (fp32-promoted) accumulation
    "no-fast-accum": {"fp8_fast_accum": False},
    # the MLP in bf16 (fast accumulation is the fp8 MLP's, so it goes too)
    "bf16-mlp": {"mlp_fp8": False, "fp8_fast_accum": False},
    # the fp8 LM head's e5m2 gradient rounded by fused_ce._e5m2_bits, not the GPU's conversion
    "software-e5m2": {},
    # the ladder without its last five byte-saving rungs (the name is the committed result files')
    "session-3-final": {
        "residual_dtype": "fp32",
        "detach_logits": False,
        "loss_kernel": "pytorch",
        "fused_clip": False,
    },
    # experiments that are not RunConfig switches (yet): applied by ``experiment()`` below
    "coord-descent": {},
    # inductor's mix-order reductions (the LayerNorm backward's row reduction fused with its
    # weight and bias gradients' column sums) with fewer, larger row splits: their partial sums
    # are added by an eager aten sum per gradient (perf-log, 2026-12-04; see --launchers)
    "mix-order-split-64": {},
    "mix-order-split-128": {},
    "mix-order-autotune": {},
    "max-autotune-nocg": {"compile": "max-autotune-no-cudagraphs"},
    # inductor autotunes each matmul (cuBLAS vs Triton templates that can fuse epilogues)
    "max-autotune-gemm": {},
    # SDPA may not pick cuDNN's kernel (set before compiling, so the trace sees it)
    # deterministic kernels where PyTorch has them, inductor's deterministic mode (the loss check's
    # run-to-run spread: is it the kernels' nondeterminism?)
    "deterministic": {},
    "no-cudnn-attention": {},
    # the fused LM-head CE with other chunk sizes than fused_ce.FUSED_CHUNK_ROWS (32768)
    "fused-unchunked": {},
    "fused-chunk-8192": {},
    "fused-chunk-16384": {},
    "fused-chunk-32768": {},
    # the blocks' linears through benchmarks/fp8_linears.py (matmuls in fp8; not kept); with the
    # fp8 MLP on, only the attention's two linears still go through nn.Linear
    **{name: {} for name in fp8_linears.VARIANTS},
    # c_attn's backward: dq, dk, dv concatenated and summed for the bias in one kernel launched
    # from a traced triton_op (torch.compile copies cuDNN's gradients in front of it)
    "qkv-grad": {"qkv_grad": True},
    # the same kernel from an opaque custom op (rung "+ one-pass QKV grad"), and the last rung
    # without it
    "qkv-grad-opaque": {"qkv_grad": True},
    "no-qkv-grad": {"qkv_grad": False},
    # AdamW as one Triton launch per parameter group (helpers.core.kernels.adamw)
    "adamw-triton": {"optimizer": "triton"},
    # c_attn's bias as a column of its weight times a ones column of its input (no bias sum)
    "bias-in-matmul": {},
    # the fp8 MLP's GELU kernels autotuned without their prefetching configs
    "gelu-no-prefetch": {},
    # the fp8 LM head's transposes autotuned over only the 64 x 64-byte tile with 4 warps
    "transpose-tile-64": {},
}
FUSED_CHUNKS = {
    "fused-unchunked": None,
    "fused-chunk-8192": 8192,
    "fused-chunk-16384": 16384,
    "fused-chunk-32768": 32768,
}


def variant(name: str) -> str:
    """``name`` if it is a variant or several joined by "+" (``mix-order-autotune+reduce-overhead``:
    the last rung with all of their changes); for argparse.

    Raises:
        argparse.ArgumentTypeError: a part that is not in :data:`VARIANTS`.
    """
    unknown = [part for part in name.split("+") if part not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown}; known (join several with '+'): {', '.join(VARIANTS)}"
        )
    return name


def switches(name: str) -> dict:
    """The RunConfig switches of variant ``name`` (parts joined by "+" merged left to right)."""
    merged: dict = {}
    for part in name.split("+"):
        merged.update(VARIANTS[part])
    return merged


def experiment(name: str):
    """Context for variants that are not RunConfig switches: inductor settings (coord-descent,
    max-autotune-gemm), the SDPA backends (no-cudnn-attention),
    ``helpers.core.kernels.fused_ce.FUSED_CHUNK_ROWS`` (fused-*), and the others below; restores
    them afterwards. A name joined by "+" enters each part's context."""
    import contextlib

    import torch._inductor.config as inductor_config

    if "+" in name:
        stack = contextlib.ExitStack()
        for part in name.split("+"):
            stack.enter_context(experiment(part))
        return stack

    if name == "coord-descent":
        return inductor_config.patch(coordinate_descent_tuning=True)
    if name.startswith("mix-order-split-"):
        split = int(name.rsplit("-", 1)[1])
        return inductor_config.patch({"triton.mix_order_reduction_split_size": split})
    if name == "mix-order-autotune":
        return inductor_config.patch({"triton.mix_order_reduction_autotune_split_size": True})
    if (
        name == "max-autotune-gemm"
    ):  # GEMMs only: no coordinate descent, no pointwise autotuning, no CUDA graphs
        return inductor_config.patch(max_autotune_gemm=True)
    if name == "software-e5m2":
        from unittest import mock

        from helpers.core.kernels import fused_ce

        return mock.patch.object(fused_ce, "E5M2_HARDWARE_CAST", False)
    if name in FUSED_CHUNKS:
        from unittest import mock

        from helpers.core.kernels import fused_ce

        return mock.patch.object(fused_ce, "FUSED_CHUNK_ROWS", FUSED_CHUNKS[name])
    if name in fp8_linears.VARIANTS:
        return fp8_linears.experiment(name)
    if name == "qkv-grad":
        return qkv_grad.experiment()
    if name == "bias-in-matmul":
        return bias_in_matmul.experiment()
    if name == "gelu-no-prefetch":
        return gelu_configs(prefetch=False)
    if name == "transpose-tile-64":
        return transpose_tiles(BM=64, BN=64, num_warps=4)
    if name == "deterministic":
        # PyTorch's deterministic kernels (warn-only: an op without one warns and runs as it is)
        # and inductor's deterministic mode (no on-device benchmarking of choices that change the
        # numerics); cuBLAS also needs CUBLAS_WORKSPACE_CONFIG=:4096:8 set before it starts
        @contextlib.contextmanager
        def deterministic():
            before = (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            )
            torch.use_deterministic_algorithms(True, warn_only=True)
            inductor = (
                inductor_config.patch(deterministic=True)
                if hasattr(inductor_config, "deterministic")
                else contextlib.nullcontext()
            )
            try:
                with inductor:
                    yield
            finally:
                torch.use_deterministic_algorithms(before[0], warn_only=before[1])

        return deterministic()
    if name == "no-cudnn-attention":

        @contextlib.contextmanager
        def no_cudnn():
            before = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
            try:
                yield
            finally:
                torch.backends.cuda.enable_cudnn_sdp(before)

        return no_cudnn()
    return contextlib.nullcontext()


@contextlib.contextmanager
def autotune_only(kernels, keep, recompile: bool):
    """Triton autotuned ``kernels`` restricted to their configs for which ``keep(config)`` is true
    (a ``triton.Config``); their picks are cleared before and restored afterwards. ``recompile``:
    torch.compile reads an autotuned kernel's configs when it traces it (``triton_op`` kernels),
    so such a step must be built inside this context, with inductor's caches off so it does not
    reuse a step compiled with the other configs; an opaque custom op's kernel needs no recompile.

    Raises:
        ValueError: if ``keep`` leaves a kernel no config.
    """
    import torch._inductor.config as inductor_config

    before = [k.configs for k in kernels]
    caches = (
        inductor_config.patch(force_disable_caches=True) if recompile else contextlib.nullcontext()
    )
    try:
        for k in kernels:
            k.configs = [c for c in k.configs if keep(c)]
            if not k.configs:
                raise ValueError("keep() left an autotuned kernel without a config")
            k.cache.clear()
        with caches:
            yield
    finally:
        for k, configs in zip(kernels, before):
            k.configs = configs
            k.cache.clear()


def gelu_configs(prefetch: bool):
    """The fp8 MLP's two GELU kernels autotuned only over their configs with ``PREFETCH ==
    prefetch`` (a context; the step must be compiled inside it)."""
    from helpers.core.kernels import fp8_mlp

    kernels = (fp8_mlp._fwd_kernel, fp8_mlp._bwd_kernel)
    return autotune_only(kernels, lambda c: c.kwargs["PREFETCH"] == prefetch, recompile=True)


def transpose_tiles(BM: int, BN: int, num_warps: int):
    """``transpose_fp8`` autotuned only over the tile config (BM, BN, num_warps), one of
    ``fp8.TRANSPOSE_CONFIGS`` (a context). The transpose is an opaque custom op: a step compiled
    before calls the kernel with this config too."""
    from helpers.core.kernels import fp8

    tile = (BM, BN, num_warps)
    keep = lambda c: (c.kwargs["BM"], c.kwargs["BN"], c.num_warps) == tile  # noqa: E731
    return autotune_only((fp8._transpose_tuned,), keep, recompile=False)


FAMILIES = [  # (family, regex on the kernel name), first match wins
    ("fp8 MLP GELU + casts (hand-written Triton)", r"_gelu_(backward_)?cast_kernel"),
    ("fp8 gradient cast (hand-written Triton)", r"_cast_colsum_kernel"),
    ("cross-entropy (hand-written Triton)", r"_ce_(forward|backward|fused|fused_e5m2)_kernel"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("matmul (inductor Triton template)", r"^triton_tem_"),
    ("matmul", r"gemm|nvjet|xmma|cutlass|sm90_|sm80_|wgmma|cublas"),
    ("optimizer", r"adam|multi_tensor|foreach|norm_kernel|_amp_"),
    ("triton fused (elementwise, norms, softmax, CE)", r"^triton_"),
    ("copies / casts", r"copy|cast|fill|memset|memcpy|_transpose_kernel"),
]


def launcher_pattern(text: str) -> str:
    """--launchers' argument: a regular expression of kernel names, checked before any run."""
    if not text:
        raise argparse.ArgumentTypeError("an empty pattern matches every kernel: name some")
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression ({e}): {text!r}") from None
    return text


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if re.search(pattern, name, re.I):
            return fam
    return "other"


def profile(trainer, loader, steps: int = 3, launchers: str | None = None) -> dict:
    """Device ms per step by kernel family, from torch.profiler over ``steps`` steps, with the 15
    (and 40) largest kernels: ``top_kernels_ms`` and ``kernels_ms``, lists of
    [ms per step, kernel name]. With ``launchers`` (a regular expression of kernel names) the
    profiler also records CPU operators, their input shapes and Python stacks, and ``launchers``
    lists the operators that launched the matching kernels (``profiler.kernel_launchers``)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    for _ in range(3):
        trainer.step(loader)
    torch.cuda.synchronize()
    traced = launchers is not None
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if traced else [])
    with tprofile(activities=activities, record_shapes=traced, with_stack=traced) as prof:
        for _ in range(steps):
            trainer.step(loader)
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    top = []
    for evt in prof.key_averages():
        if traced and (
            not str(evt.device_type).upper().endswith("CUDA") or profiler.is_annotation(evt)
        ):
            continue  # a CPU operator, or a range's copy on the GPU timeline: not a kernel
        dev_us = getattr(evt, "self_device_time_total", None) or getattr(
            evt, "self_cuda_time_total", 0
        )
        if dev_us <= 0:
            continue
        totals[family(evt.key)] += dev_us / 1e3 / steps
        top.append((dev_us / 1e3 / steps, evt.key))
    top.sort(reverse=True)
    # top_kernels_ms feeds helpers.chapters.ch10_profiling.table_from_perf_json;
    # kernels_ms: to read
    out = {
        "families_ms": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
        "top_kernels_ms": top[:15],
        "kernels_ms": top[:40],
    }
    if traced:
        out["launchers"] = profiler.kernel_launchers(prof.events(), launchers, steps)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[16], help="B, one or more")
    p.add_argument(
        "--variants",
        nargs="+",
        default=["final"],
        type=variant,
        help="the last rung ('final') or changes to it, joined with '+' to combine them: "
        + ", ".join(VARIANTS),
    )
    p.add_argument(
        "--profile", action="store_true", help="torch.profiler: device ms per kernel family"
    )
    p.add_argument(
        "--launchers",
        metavar="REGEX",
        type=launcher_pattern,
        help="with --profile: which operators (and input shapes) launched the kernels whose "
        "names match REGEX; kernels replayed from a CUDA graph have none, so profile a variant "
        "without CUDA graphs (no-cuda-graphs) to see those",
    )
    p.add_argument(
        "--power", action="store_true", help="sample power and SM clock with nvidia-smi (100 ms)"
    )
    p.add_argument(
        "--power-settle",
        type=float,
        default=3.0,
        help="with --power: seconds of steps before timing",
    )
    results.add_out(p)
    args = p.parse_args(argv)
    if args.launchers is not None and not args.profile:
        p.error("--launchers goes with --profile")
    args.out = results.checked_out(p, args.out, args.force)
    if not torch.cuda.is_available():
        print(
            "benchmarks/perf.py needs a CUDA GPU (on a CPU, python -m helpers.ladder "
            "runs the small model)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda")
    cfg = GPTConfig()
    tokens = data.load_tokens()
    rows = []
    smi = power.GPUPowerSampler(device) if args.power else contextlib.nullcontext()
    args.max_clock_mhz = (
        power.max_sm_clock_mhz(device) if args.power else None
    )  # read once, printed per row
    provenance = results.provenance(device)

    def save() -> None:
        """Write every row measured so far, so a run stopped by a time limit keeps them."""
        results.save({**provenance, "rows": rows}, args.out, say=False)

    with smi:
        for B in args.batch_size:
            run_batch_size(B, args, device, cfg, tokens, rows, smi if args.power else None, save)
    save()
    return 0


def run_batch_size(
    B: int, args, device: torch.device, cfg: GPTConfig, tokens, rows: list, smi, save
) -> None:
    """Every variant at batch size B through bench.measure (build, compile in the warm-up, time);
    profile and power if asked; `save()` after each measured row."""
    final = last_runnable(B, 1024, device)
    for v in args.variants:
        run = final.replace(name=v, **switches(v))
        settled = {}

        def settle(trainer, loader):
            """Compile, then keep the GPU under this load before the timed steps."""
            t_compile = time.time()
            trainer.step(loader)
            torch.cuda.synchronize(device)
            t_settle = time.time()
            settled["compile_s"] = t_settle - t_compile  # noqa: B023 (runs in this iteration)
            while time.time() - t_settle < args.power_settle:
                trainer.step(loader)
                torch.cuda.synchronize(device)
            return {}

        def profiled(trainer, loader):
            if not args.profile:
                return {}
            return {"profile": profile(trainer, loader, launchers=args.launchers)}

        try:
            with experiment(v):  # compilation happens in the warm-up steps, inside the context
                m = bench.measure(
                    run,
                    cfg,
                    device,
                    tokens,
                    warmup=3,
                    iters=10,
                    before=settle if smi is not None else None,
                    after=profiled,
                )
        except Exception as e:  # e.g. an inductor setting this torch lacks: the next variant runs
            print(f"B={B:<3} {v:<16} failed: {e!r}", flush=True)
            rows.append({"variant": v, "batch_size": B, "error": repr(e)})
            save()
            continue
        if m["status"] != "measured":
            print(f"B={B:<3} {v:<16} {m['status']}: {m['reason']}", flush=True)
            continue
        tok_s = m["tokens_per_s"]
        row = {
            "variant": v,
            "batch_size": B,
            "ms_per_step": m["ms_per_step"],
            "spread_pct": m["spread_pct"],
            "tokens_per_s": tok_s,
            "tflops": flops_per_token(cfg) * tok_s / 1e12,
            "peak_mem_bytes": m["peak_mem_bytes"],
            "first_step_s": settled.get("compile_s", m["first_step_ms"] / 1e3),
        }
        if smi is not None:
            t0, t1 = m["timed_window_s"]
            row["power_timed_steps"] = power.power_summary(smi.samples, t0, t1)
            row["power_samples"] = [
                dataclasses.asdict(s) for s in power.samples_in_window(smi.samples, t0, t1)
            ]
            row["power_settle_s"] = args.power_settle
            row["power_is_average"] = power.power_reading_is_average(device)
        if "profile" in m:
            row["profile"] = m["profile"]
        rows.append(row)
        save()
        print(
            f"B={B:<3} {v:<16} {m['ms_per_step']:8.1f} ms  {tok_s:10,.0f} tok/s  "
            f"{row['tflops']:6.1f} TFLOP/s  spread {m['spread_pct']:4.1f}%  "
            f"compile+first step {row['first_step_s']:.1f} s",
            flush=True,
        )
        if smi is not None:
            summary = row["power_timed_steps"]
            text = (
                power.format_power_summary(summary, args.max_clock_mhz, row["power_is_average"])
                if summary["samples"]
                else f"no sample in the {summary['window_s']:.2f} s of timed steps; "
                f"{smi.problem() or 'the window is shorter than the 100 ms interval'}"
            )
            print("\n".join("      " + line for line in text.splitlines()))
        if "profile" in row:
            for fam, ms in row["profile"]["families_ms"].items():
                print(f"      {fam:<48} {ms:7.2f} ms/step")
            for r in row["profile"].get("launchers", []):
                print(
                    f"      {r['ms']:7.3f} ms/step  {r['launches']:5.1f} launches  "
                    f"{r['kernel'][:60]}\n        <- {' <- '.join(r['chain'][:4])}  {r['shapes']}"
                )
                for frame in r["stack"]:
                    print(f"           {frame}")


if __name__ == "__main__":
    raise SystemExit(main())
