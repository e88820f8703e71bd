"""Number formats and the mixed-precision facts of chapter 04, computed, not quoted.

Every number here comes from ``torch.finfo`` or from a computation on this machine, except TF32,
which is not a storage dtype in PyTorch: its layout (1 sign, 8 exponent, 10 mantissa bits) is from
NVIDIA's "A100 Tensor Core GPU Architecture" whitepaper (2020).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from helpers.measure import results
from helpers.tools import cli

if TYPE_CHECKING:
    from helpers.core import train

# (name, torch dtype or None for TF32, minimum compute capability with native tensor-core support)
FORMATS = [
    ("fp32", torch.float32, None),
    ("tf32", None, (8, 0)),
    ("bf16", torch.bfloat16, (8, 0)),
    ("fp16", torch.float16, (7, 0)),
    ("fp8 e4m3", getattr(torch, "float8_e4m3fn", None), (8, 9)),
    ("fp8 e5m2", getattr(torch, "float8_e5m2", None), (8, 9)),
]


def format_table() -> list[dict]:
    """Sign/exponent/mantissa bits, largest value, smallest normal value and machine epsilon of each
    format (fp8 rows only where this torch has the dtypes). Mantissa bits = -log2(eps)."""
    rows = []
    for name, dtype, native_from in FORMATS:
        if name == "tf32":
            m, e = 10, 8
            row = {"bits": 19, "max": (2 - 2.0**-m) * 2.0**127, "tiny": 2.0**-126, "eps": 2.0**-m}
        elif dtype is None:
            continue
        else:
            fi = torch.finfo(dtype)
            m = round(-math.log2(fi.eps))
            e = fi.bits - 1 - m
            row = dict(bits=fi.bits, max=float(fi.max), tiny=float(fi.tiny), eps=float(fi.eps))
        head = {"format": name, "sign": 1, "exponent": e, "mantissa": m}
        rows.append({**head, **row, "native_tensor_cores_from": native_from})
    return rows


def native_on(capability: tuple[int, int] | None) -> list[str]:
    """Formats whose matmuls run natively on tensor cores of this compute capability (None = CPU:
    fp32 only). fp16 from 7.0 (Volta), TF32 and bf16 from 8.0 (Ampere), fp8 from 8.9 (Ada,
    Hopper)."""
    if capability is None:
        return ["fp32"]
    return ["fp32"] + [
        name for name, _, since in FORMATS if since is not None and capability >= since
    ]


def demonstrations() -> dict[str, object]:
    """Three facts measured on this machine's arithmetic:

    - ``bf16_1_plus_2^-8``: (1 + 2⁻⁸) rounded to bf16 equals 1 (8 mantissa bits: eps is 2⁻⁷);
    - ``fp16_underflow``: a gradient of 1e-8 becomes 0 in fp16, and survives when scaled by 2¹⁶
      first (what GradScaler does);
    - ``overflow``: 70000 is inf in fp16 (max 65504) and finite in bf16 (fp32's exponent range).
    """
    one = torch.tensor(1.0)
    tiny_grad = torch.tensor(1e-8)
    scale = 2.0**16
    big = torch.tensor(70000.0)
    return {
        "bf16_1_plus_2^-8_equals_1": bool((one + 2.0**-8).to(torch.bfloat16) == 1),
        "bf16_1_plus_2^-7_equals_1": bool((one + 2.0**-7).to(torch.bfloat16) == 1),
        "fp16_1e-8": float(tiny_grad.to(torch.float16)),
        "fp16_1e-8_scaled_by_2^16_then_unscaled": float(
            (tiny_grad * scale).to(torch.float16).float() / scale
        ),
        "fp16_70000": float(big.to(torch.float16)),
        "bf16_70000": float(big.to(torch.bfloat16)),
    }


def autocast_dtype_for(capability: tuple[int, int] | None) -> torch.dtype | None:
    """The course's choice of autocast dtype: bf16 with native support (compute capability
    >= 8.0), fp16 (with GradScaler) on older GPUs, none (fp32) on a CPU, where the course only
    checks results."""
    if capability is None:
        return None
    return torch.bfloat16 if capability >= (8, 0) else torch.float16


# --------------------------------------------------------------------------------------------
# Loss scaling, TF32 and autocast, measured on this device
# --------------------------------------------------------------------------------------------


def gradscaler_rescue(device: torch.device | str, grad: float = 1e-8) -> dict[str, float]:
    """The gradient of one weight that should be ``grad`` (default 1e-8), computed three ways on
    ``device``.

    The weight matrix W (4, 4) is fp32 (master weights); the activation x is 1e-4 and the gradient
    arriving at the matmul output is ``grad`` / 1e-4, so dL/dW = x · that = ``grad``. Returns
    {"fp32": grad without autocast, "fp16": grad under fp16 autocast (the matmul's backward runs in
    fp16 and its result rounds to 0 below fp16's smallest subnormal, 2⁻²⁴ ≈ 6e-8),
    "fp16_gradscaler": the same with a real ``torch.amp.GradScaler`` (scaled loss, ``unscale_``),
    "scale": the scaler's scale}. All gradients are read from ``W.grad`` (fp32) as Python floats.

    Source: PyTorch AMP docs, "Gradient Scaling" (https://pytorch.org/docs/stable/amp.html#gradient-scaling).
    """
    device = torch.device(device)
    w = torch.nn.Parameter(torch.ones(4, 4, device=device))
    x = torch.full((1, 4), 1e-4, device=device)
    opt = torch.optim.SGD([w], lr=0.0)  # never steps: only unscale_ needs an optimizer

    def weight_grad(fp16: bool, scaler: torch.amp.GradScaler | None = None) -> float:
        w.grad = None
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=fp16):
            out = x @ w  # (1, 4): fp16 under autocast, fp32 otherwise
        loss = out.float().sum() * (grad / 1e-4)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # divides W.grad by the scale, in fp32
        return float(w.grad[0, 0])

    scaler = torch.amp.GradScaler(device.type)
    return {
        "fp32": weight_grad(False),
        "fp16": weight_grad(True),
        "fp16_gradscaler": weight_grad(True, scaler),
        "scale": float(scaler.get_scale()),
    }


def tf32_matmul_error(device: torch.device | str, n: int = 1024) -> dict[str, float]:
    """Relative error (Frobenius norm) of an fp32 (n, n) @ (n, n) matmul against a float64 reference
    on ``device``, with ``torch.set_float32_matmul_precision("highest")`` (true fp32) and ``"high"``
    (TF32 allowed: inputs rounded to 10 mantissa bits on GPUs of compute capability >= 8.0; nothing
    changes on older GPUs or a CPU). Restores the global setting it changes.

    Returns {"highest": error, "high": error} (dimensionless). Source:
    https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen) for _ in range(2))
    ref = a.double() @ b.double()
    a, b = a.to(device), b.to(device)
    old = torch.get_float32_matmul_precision()
    out = {}
    try:
        for setting in ("highest", "high"):
            torch.set_float32_matmul_precision(setting)
            c = (a @ b).double().cpu()
            out[setting] = float((c - ref).norm() / ref.norm())
    finally:
        torch.set_float32_matmul_precision(old)
    return out


def autocast_op_dtypes(device: torch.device | str, dtype: torch.dtype) -> list[dict[str, str]]:
    """Output dtype of the ops of a GPT-2 step, run on fp32 inputs under
    ``torch.autocast(device.type, dtype)`` on ``device``: measured, not looked up.

    Returns rows {"op", "input", "output"} (dtype names). Ops: linear (matmul), GELU, softmax,
    log_softmax, layer_norm, exp, sum and cross_entropy; each gets the linear's output as input (the
    case inside the model), so a listed fp32 op shows fp32 out of a 16-bit input. Which op goes to
    which dtype is PyTorch's per-device op list, "Autocast Op Reference":
    https://pytorch.org/docs/stable/amp.html#autocast-op-reference
    """
    device = torch.device(device)
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=gen).to(device)
    w = torch.randn(64, 64, generator=gen).to(device)
    target = torch.zeros(8, dtype=torch.long, device=device)
    rows = []
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=dtype):
        h = F.linear(x, w)  # (8, 64)
        ops = {
            "linear (matmul)": lambda: h,
            "gelu": lambda: F.gelu(h, approximate="tanh"),
            "softmax": lambda: F.softmax(h, dim=-1),
            "log_softmax": lambda: F.log_softmax(h, dim=-1),
            "layer_norm": lambda: F.layer_norm(h, (64,)),
            "exp": lambda: torch.exp(h),
            "sum": lambda: h.sum(),
            "cross_entropy": lambda: F.cross_entropy(h, target),
        }
        for name, op in ops.items():
            given = "float32" if name.startswith("linear") else _name(h.dtype)
            rows.append({"op": name, "input": given, "output": _name(op().dtype)})
    return rows


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def state_dtypes(trainer) -> dict[str, list[str]]:
    """The dtypes a :class:`helpers.core.train.Trainer` keeps between steps: its parameters, their
    gradients (after a step; zero_grad sets them to None only at the start of the next step) and
    AdamW's exp_avg / exp_avg_sq. Returns {"parameters", "gradients", "optimizer state"} -> sorted
    dtype names. Correct mixed precision keeps all three in float32."""
    params = list(trainer.model.parameters())
    state = [
        t
        for s in trainer.optimizer.state.values()
        for k, t in s.items()
        if k in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "parameters": sorted({_name(p.dtype) for p in params}),
        "gradients": sorted({_name(p.grad.dtype) for p in params if p.grad is not None}),
        "optimizer state": sorted({_name(t.dtype) for t in state}),
    }


# --------------------------------------------------------------------------------------------
# fp32, TF32, bf16 and fp16 on the full training step
# --------------------------------------------------------------------------------------------

# Each precision turns one switch from fp32 (so bf16 and fp16 also run on a CPU).
PRECISIONS = {
    "fp32": dict(matmul_precision="fp32", autocast=None),
    "tf32": dict(matmul_precision="tf32", autocast=None),
    "bf16": dict(matmul_precision="fp32", autocast="bf16"),
    # + GradScaler (helpers.core.train.build)
    "fp16": dict(matmul_precision="fp32", autocast="fp16"),
}

CPU_FP16_REASON = (
    "fp16 autocast and GradScaler run on a CPU, but CPUs lack fast fp16 matmuls "
    "(torch falls back to slow kernels) and loss scaling matters on GPUs: "
    "fp16 is timed on GPUs only (cpu_fp16=True runs it anyway)"
)


def precision_run(name: str, batch_size: int, seq_len: int) -> "train.RunConfig":
    """The :class:`helpers.core.train.RunConfig` of precision ``name`` (a key of
    :data:`PRECISIONS`), eager, manual attention, vocab 50257, foreach AdamW, grad clipping at 1.0,
    seed 1337.

    Raises:
        ValueError: for an unknown name.
    """
    from helpers.core import train

    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {name!r}")
    return train.RunConfig(name=name, batch_size=batch_size, seq_len=seq_len, **PRECISIONS[name])


def skip_reason(
    run: "train.RunConfig",
    device: torch.device | str,
    cpu_fp16: bool = False,
    cpu_bf16: bool = False,
) -> str | None:
    """Why ``run`` is not measured on ``device`` (None if it is):
    :func:`helpers.core.train.unsupported_reason`, plus fp16 on a CPU unless ``cpu_fp16`` (see
    :data:`CPU_FP16_REASON`), plus bf16 on a CPU without fast bf16 unless ``cpu_bf16``
    (:func:`helpers.core.train.slow_reason`)."""
    from helpers.core import train

    reason = train.unsupported_reason(run, device)
    if (
        reason is None
        and run.autocast == "fp16"
        and torch.device(device).type == "cpu"
        and not cpu_fp16
    ):
        reason = CPU_FP16_REASON
    if reason is None and not cpu_bf16:
        reason = train.slow_reason(run, device)
    return reason


def train_recording(trainer, loader, steps: int, progress: bool = False) -> dict[str, list]:
    """Train ``steps`` steps and record, after each one, the loss (nats, read with ``.item()``) and,
    when the trainer has a GradScaler, ``scaler.get_scale()``.

    A step whose scale went *down* was skipped: GradScaler found an inf/NaN gradient, did not call
    ``optimizer.step()`` and multiplied the scale by its backoff factor (0.5). Returns
    {"losses": [float] * steps, "grad_scale": [scale before step 1, after step 1, ...] ([] without a
    scaler), "skipped_steps": [1-based step numbers]}. Source: ``torch.amp.GradScaler`` docs
    (https://pytorch.org/docs/stable/amp.html#torch.amp.GradScaler).
    """
    from tqdm.auto import tqdm

    scaler = trainer.scaler
    losses, scales = [], ([scaler.get_scale()] if scaler is not None else [])
    for _ in tqdm(range(steps), desc=trainer.run.name, disable=not progress):
        losses.append(trainer.step(loader).item())
        if scaler is not None:
            scales.append(scaler.get_scale())
    skipped = [i for i in range(1, len(scales)) if scales[i] < scales[i - 1]]
    return {"losses": losses, "grad_scale": scales, "skipped_steps": skipped}


# what a precision's row copies from its bench.measure row
_MEASURED = ("losses", "grad_scale", "skipped_steps", "ms_per_step", "spread_pct", "tokens_per_s")
_MEASURED += ("peak_mem_bytes",)


def compare_precisions(
    device: torch.device | str,
    steps: int,
    model_config=None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    warmup: int = 2,
    iters: int = 10,
    names: tuple[str, ...] = tuple(PRECISIONS),
    cpu_fp16: bool = False,
    progress: bool = True,
    cpu_bf16: bool = False,
) -> list[dict]:
    """Train the same model (same seed, same Tiny Shakespeare batches) in each precision of
    ``names`` on ``device``, and measure it.

    Per precision: build with :func:`helpers.core.train.build`; train ``steps`` steps recording the
    loss and the GradScaler's scale (:func:`train_recording`); then time ``iters`` more steps after
    ``warmup`` untimed ones, both through :func:`helpers.bench.measure` (CUDA events on a GPU).
    Peak memory covers build, training and timing (CUDA only). ``model_config``, ``batch_size`` and
    ``seq_len`` default to :func:`helpers.core.train.default_shapes`. A precision this device cannot
    run is returned as ``"skipped"`` with the reason (:func:`skip_reason`), never run in another
    mode; so are fp16 on a CPU (unless ``cpu_fp16``) and bf16 on a CPU without fast bf16 (unless
    ``cpu_bf16``). The progress bar (``progress``) closes and disappears when the last precision is
    done (``leave=False``), so only the table stays in the cell.

    Returns one dict per name: {"name", "status" ("measured"/"skipped"), "reason",
    "matmul_precision", "autocast", "losses" (nats per step), "final_loss", "max_loss_gap_vs_fp32"
    (max over steps of |loss - fp32 loss|, nats; None without a measured fp32 row), "ms_per_step"
    (median), "spread_pct", "tokens_per_s", "peak_mem_bytes" (None on CPU), "grad_scale",
    "skipped_steps"}. Restores the global matmul precision.

    Raises:
        ValueError: steps < 1, iters < 1, warmup < 0, an unknown name, or seq_len > block_size.
    """
    from tqdm.auto import tqdm

    from helpers import bench
    from helpers.core import data, train
    from helpers.measure import memory

    if steps < 1 or iters < 1 or warmup < 0:
        raise ValueError(
            f"need steps >= 1, iters >= 1, warmup >= 0; got {steps}, {iters}, {warmup}"
        )
    device = torch.device(device)
    cfg, B, T = train.default_shapes(device)
    cfg = model_config if model_config is not None else cfg
    B, T = batch_size or B, seq_len or T
    runs = [precision_run(n, B, T) for n in names]
    tokens = data.load_tokens()
    old = torch.get_float32_matmul_precision()
    rows = []
    try:
        for run in tqdm(runs, desc="precisions", disable=not progress, leave=False):
            row = {
                **dict.fromkeys(_MEASURED),
                **dict.fromkeys(("final_loss", "max_loss_gap_vs_fp32")),
                **dict(name=run.name, status="skipped", losses=[], grad_scale=[]),
                **dict(skipped_steps=[], reason=skip_reason(run, device, cpu_fp16, cpu_bf16)),
                **dict(matmul_precision=run.matmul_precision, autocast=run.autocast),
            }
            rows.append(row)
            if row["reason"] is not None:
                continue
            # skip_reason above already decided what is too slow here (cpu_fp16, cpu_bf16)
            measured = bench.measure(
                run,
                cfg,
                device,
                tokens,
                warmup,
                iters,
                run_slow=True,
                before=lambda trainer, loader: train_recording(trainer, loader, steps),
            )
            row.update(status=measured["status"], reason=measured["reason"])
            if measured["status"] == "measured":  # the MFU note is the ladder's, not this table's
                row.update({k: measured[k] for k in _MEASURED}, final_loss=measured["losses"][-1])
                row["reason"] = "ok"
            memory.reset_peak(device)
    finally:
        torch.set_float32_matmul_precision(old)
    ref = next(
        (r["losses"] for r in rows if r["name"] == "fp32" and r["status"] == "measured"), None
    )
    for r in rows:
        if ref is not None and r["status"] == "measured":
            r["max_loss_gap_vs_fp32"] = max(
                abs(a - b) for a, b in zip(r["losses"], ref, strict=True)
            )
    return rows


def _comparison_cells(r: dict) -> list[str | None]:
    """One row of :func:`compare_precisions` as the tables' cells: name, ms/step, spread (%),
    tokens/s, peak memory, final loss and largest gap vs fp32 (nats), note; a skipped row has
    None in the measured cells and its reason as the note."""
    from helpers.measure import memory

    if r["status"] != "measured":
        return [r["name"], "skipped", None, None, None, None, None, r["reason"]]
    gap = None if r["max_loss_gap_vs_fp32"] is None else f"{r['max_loss_gap_vs_fp32']:.4f}"
    note = (
        f"GradScaler: scale {r['grad_scale'][0]:g} -> {r['grad_scale'][-1]:g}, "
        f"{len(r['skipped_steps'])} skipped step(s)"
        if r["grad_scale"]
        else ""
    )
    return [
        r["name"],
        f"{r['ms_per_step']:.1f}",
        f"{r['spread_pct']:.0f}",
        f"{r['tokens_per_s']:,.0f}",
        memory.format_bytes(r["peak_mem_bytes"]),
        f"{r['final_loss']:.4f}",
        gap,
        note,
    ]


def format_comparison(rows: list[dict]) -> str:
    """The rows of :func:`compare_precisions` as a fixed-width text table (the command line's)."""
    head = (
        f"{'precision':<10} {'ms/step':>9} {'spread':>7} {'tokens/s':>10} {'peak mem':>10} "
        f"{'final loss':>10} {'max |gap| vs fp32':>17}  note"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        c = _comparison_cells(r)
        if r["status"] != "measured":
            lines.append(f"{c[0]:<10} {c[1]:>9}  {c[7]}")
            continue
        gap = "-" if c[6] is None else f"{c[6]} nats"
        lines.append(
            f"{c[0]:<10} {c[1]:>9} {c[2]:>6}% {c[3]:>10} {c[4]:>10} {c[5]:>10} {gap:>17}  {c[7]}"
        )
    return "\n".join(lines)


def comparison_markdown(rows: list[dict]) -> str:
    """:func:`format_comparison` as a Markdown table (``results.markdown_table``) for
    ``IPython.display.Markdown``: the same rows and numbers, units in the headers."""
    from helpers.measure import results

    header = [
        "precision",
        "ms/step",
        "spread (%)",
        "tokens/s",
        "peak memory",
        "final loss (nats)",
        "max abs gap vs fp32 (nats)",
        "note",
    ]
    return results.markdown_table(header, [_comparison_cells(r) for r in rows], "lrrrrrrl")


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.chapters.ch04_precision compare --steps N --out results/<file>.json``"""
    import argparse
    import json
    import sys
    from pathlib import Path

    from helpers.core import train
    from helpers.measure import hardware

    p = argparse.ArgumentParser(
        prog="python -m helpers.chapters.ch04_precision",
        description="fp32 / TF32 / bf16 / fp16 + GradScaler on the same training run",
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "compare", help="train and time each precision; print a table, optionally write JSON"
    )
    for flag, default, what in (
        ("--steps", 30, "recorded training steps per precision"),
        ("--warmup", 2, "untimed steps before the timed ones"),
        ("--iters", 10, "timed steps; the median is reported"),
    ):
        c.add_argument(flag, type=int, default=default, help=f"{what} (default {default})")
    c.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="B (default: train.default_shapes: 16 on a 40 GB or larger GPU, 4 on a T4 or a CPU)",
    )
    c.add_argument(
        "--seq-len", type=int, default=None, help="T (default: 1024 on a GPU, 128 on a CPU)"
    )
    c.add_argument("--device", default=None, help="'cuda' or 'cpu' (default: cuda if available)")
    c.add_argument("--precisions", nargs="*", default=list(PRECISIONS), choices=list(PRECISIONS))
    c.add_argument("--out", type=Path, default=None, help="write the results as JSON to this file")
    c.add_argument("--plot", type=Path, default=None, help="save the loss curves to this PNG file")
    c.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    cli.add_force(c, "--out/--plot")
    args = p.parse_args(argv)
    device = cli.device(args.device)
    for name in ("steps", "iters", "batch_size", "seq_len"):
        cli.at_least(name, getattr(args, name))
    cli.at_least("warmup", args.warmup, 0)
    if args.precisions is not None and len(args.precisions) == 0:
        raise ValueError("--precisions needs at least one of fp32, tf32, bf16, fp16")
    cli.result_out(args.out, ("precisions",), force=args.force)
    cli.out_path(args.plot, "--plot", suffix=".png", force=args.force, png_kind="ch04-precision")
    cfg, B, T = train.default_shapes(device)
    B = B if args.batch_size is None else args.batch_size
    T = T if args.seq_len is None else args.seq_len
    try:
        rows = compare_precisions(
            device,
            args.steps,
            cfg,
            B,
            T,
            args.warmup,
            args.iters,
            tuple(args.precisions),
            progress=not args.no_progress,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summ = hardware.summary(device, probe_sdpa=False)
    name = summ.name if device.type == "cuda" else f"cpu ({summ.name})"
    print(
        f"{name} | torch {torch.__version__} | B={B} T={T} | {args.steps} recorded steps, "
        f"median of {args.iters} timed"
    )
    print(format_comparison(rows))
    if args.out:
        record = {
            **results.provenance(device),
            "capability": summ.capability,
            "config": {
                "model": {k: v for k, v in cfg.__dict__.items()},
                "batch_size": B,
                "seq_len": T,
                "recorded_steps": args.steps,
                "warmup_steps": args.warmup,
                "timed_steps": args.iters,
                "data": "Tiny Shakespeare, GPT-2 BPE, sequential batches, same for every precision",
                "step": "zero_grad, forward+loss (autocast), backward (GradScaler for fp16), "
                "unscale_, clip_grad_norm_(1.0), AdamW (foreach) step; eager, manual attention, "
                "vocab 50257",
                "timing": "median of timed steps after the recorded ones; "
                "CUDA events on GPU, perf_counter on CPU",
            },
            "precisions": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        from helpers.measure import plots

        losses = {r["name"]: r["losses"] if r["status"] == "measured" else None for r in rows}
        title = f"Same model, seed and batches in each precision, on {name}"
        fig = plots.loss_differences(losses, "fp32", title)
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plots.save_png(fig, args.plot, "ch04-precision")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
