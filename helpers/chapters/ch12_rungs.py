"""Chapter 12's last eight rungs, each with a measurement of the one thing it changes.

The ladder's step times say how much each rung bought; these functions show *what* it changed,
small enough to run on a CPU in a second or two:

- "+ bf16 residual": :func:`residual_stream`, the dtype and bytes of the residual stream and its
  gradient in one training step, and the loss, fp32 stream against bf16 stream.
- "+ detached logits": :func:`zero_gradient_bytes`, the size of the (B, T, V) zero gradient the
  compiled backward no longer takes, next to the committed peak-memory drop (:func:`rung_deltas`).
- "+ Triton CE": :func:`lm_head_ce_times`, the committed H200 timings of LM head + cross-entropy.
- "+ clip in AdamW": :func:`clip_ops`, the operators of the two clipping paths and the difference
  between their updates.
- "+ fused LM-head CE": :func:`lm_head_saved_bytes`, what the LM head and its loss keep for
  backward.
- "+ fp8 LM head": :func:`fp8_errors`, the relative error of the fp8-rounded logits and gradient,
  and :func:`fp8_matmul_times`, the committed H200 matmul times.
- "+ fp8 MLP": :func:`fp8_mlp_errors`, the relative error of the MLP's output and input gradient
  with rowwise e4m3 roundings, and :func:`fp8_mlp_kernel_times`, the committed H200 times of its
  two hand-written kernels against inductor's bf16 GELU kernels.
- "+ CUDA graphs": in :mod:`helpers.chapters.ch12_cuda_graphs`.

:func:`rung_deltas` reads a committed ladder and says, rung by rung, what changed and whether the
change is larger than the steps' spread.
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import switches
from helpers.core import train
from helpers.core.kernels import fp8 as fp8_formats
from helpers.core.model import GPT, GPTConfig
from helpers.measure import results as results_io

GIB = 2**30
# The rungs chapter 12 teaches only in its own text, from the bf16 residual stream on.
LAST_RUNGS = switches.RUNG_ORDER[switches.RUNG_ORDER.index("+ bf16 residual") :]


def signed(x: float, digits: int = 2) -> str:
    """``x`` with its sign to ``digits`` decimals, and "0.00" (no sign) when it rounds to zero:
    "-0.00" reads as a change where there is none."""
    text = f"{x:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def demo_shape(device: torch.device | str) -> tuple[GPTConfig, int, int]:
    """(model config, B, T) of the demonstrations: GPT-2 124M (vocabulary padded to 50304) at
    T=1024 on a GPU, with the B the course's default shapes give its memory
    (``train.default_shapes``: 16 on 40 GB and larger GPUs, 4 on a T4), and the small CPU
    configuration at B=4, T=64 on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        _, batch_size, seq_len = train.default_shapes(device)
        return GPTConfig(vocab_multiple=64), batch_size, seq_len
    return train.small_model_config(), 4, 64


# --------------------------------------------------------------------------------------------
# Committed ladders: what each rung changed
# --------------------------------------------------------------------------------------------


def rung_deltas(results: dict, names: tuple[str, ...] = LAST_RUNGS) -> list[dict]:
    """For each rung in ``names``, its change over the measured rung just before it in a ladder
    result (``ladder.run_ladder``'s dict or a committed ``results/*-ladder-*.json``).

    Returns one dict per measured rung: ``name``, ``before`` (the previous rung's name),
    ``ms_before``, ``ms`` (ms/step), ``delta_ms``, ``delta_pct`` (% of ``ms_before``),
    ``spread_pct`` (the larger of the two rows' spreads, (max - min) / median of the timed steps,
    %; None if not recorded), ``delta_peak_gib`` (GiB, None without peaks) and ``verdict``:
    "no gain (slower)" when ``ms >= ms_before``, "faster, inside the spread" when the gain is
    smaller than the spread, else "faster". Rungs that did not run are left out.
    """
    rows, previous = [], None
    for row in results["rungs"]:
        if row.get("status") != "measured":
            continue
        if previous is not None and row["name"] in names:
            delta = row["ms_per_step"] - previous["ms_per_step"]
            spreads = [r.get("spread_pct") for r in (previous, row)]
            spread = None if None in spreads else max(spreads)
            peaks = [r.get("peak_mem_bytes") for r in (previous, row)]
            pct = 100 * delta / previous["ms_per_step"]
            if delta >= 0:
                verdict = "no gain (slower)"
            elif spread is not None and -pct < spread:
                verdict = "faster, inside the spread"
            else:
                verdict = "faster"
            rows.append(
                dict(
                    name=row["name"],
                    before=previous["name"],
                    ms_before=previous["ms_per_step"],
                    ms=row["ms_per_step"],
                    delta_ms=delta,
                    delta_pct=pct,
                    spread_pct=spread,
                    delta_peak_gib=None if None in peaks else (peaks[1] - peaks[0]) / GIB,
                    verdict=verdict,
                )
            )
        previous = row
    return rows


def rung_deltas_markdown(by_label: dict[str, dict], names: tuple[str, ...] = LAST_RUNGS) -> str:
    """One Markdown table of :func:`rung_deltas` for several ladders (``{"H200 B=16": result}``):
    per rung and ladder the ms/step change (two decimals, so the printed change is the difference
    of the printed times), its spread, the peak-memory change and the verdict."""
    body = []
    for label, res in by_label.items():
        for d in rung_deltas(res, names):
            spread = "-" if d["spread_pct"] is None else f"{d['spread_pct']:.0f}%"
            peak = "-" if d["delta_peak_gib"] is None else signed(d["delta_peak_gib"])
            body.append(
                [
                    f"`{d['name']}`",
                    label,
                    f"{d['ms_before']:.2f} -> {d['ms']:.2f}",
                    f"{d['delta_ms']:+.2f} ({d['delta_pct']:+.1f}%)",
                    spread,
                    peak,
                    d["verdict"],
                ]
            )
    header = ["rung", "run", "ms/step", "change", "spread", "\u0394 peak mem (GiB)", "verdict"]
    return results_io.markdown_table(header, body, align="llrrrrl")


def no_gain_lines(by_label: dict[str, dict], names: tuple[str, ...] = LAST_RUNGS) -> list[str]:
    """One sentence per rung that measured no gain (slower than the rung before) in a ladder,
    with the change and the two rows' spread; empty when every rung was faster."""
    return [
        f"{d['name']}: {d['delta_ms']:+.1f} ms/step at {label} ({d['ms_before']:.1f} -> "
        f"{d['ms']:.1f} ms, slower than {d['before']}; steps spread up to {d['spread_pct']:.0f}%)"
        for label, res in by_label.items()
        for d in rung_deltas(res, names)
        if d["verdict"] == "no gain (slower)"
    ]


def zero_gradient_bytes(batch_size: int, seq_len: int, vocab: int, dtype_bytes: int = 2) -> int:
    """Bytes of the (B, T, V) gradient a compiled step fills with zeros for returned logits that
    require grad (bf16: 2 bytes per value); "+ detached logits" removes it."""
    return batch_size * seq_len * vocab * dtype_bytes


def ladder_shape(results: dict, rung: str) -> tuple[int, int, int]:
    """(B, T, V) of rung ``rung`` in a ladder result: V is the vocabulary padded to the rung's
    ``vocab_multiple`` (50257 -> 50304 from "+ vocab 50304" on)."""
    cfg = results["config"]
    row = next(r for r in results["rungs"] if r["name"] == rung)
    multiple = row["switches"].get("vocab_multiple", 1)
    vocab = -(-cfg["model"]["vocab_size"] // multiple) * multiple
    return cfg["batch_size"], cfg["seq_len"], vocab


# --------------------------------------------------------------------------------------------
# + bf16 residual: the stream's bytes
# --------------------------------------------------------------------------------------------


def _record_stream(model: GPT) -> tuple[dict, dict, list]:
    """Forward hooks on every block: bytes and dtype of its output and of that output's gradient."""
    seen, dtypes = collections.defaultdict(int), {}

    def record(module, inputs, output):
        seen["stream"] += output.numel() * output.element_size()
        dtypes["stream"] = output.dtype

        def grad_hook(g):
            seen["grad"] += g.numel() * g.element_size()
            dtypes["grad"] = g.dtype

        output.register_hook(grad_hook)

    return seen, dtypes, [b.register_forward_hook(record) for b in model.transformer.h]


def residual_stream(
    model_config: GPTConfig, batch_size: int, seq_len: int, device: torch.device | str, seed=0
) -> list[dict]:
    """One forward and backward under bf16 autocast with the fp32 and with the bf16 residual
    stream, same weights and tokens (both drawn from ``seed``).

    Hooks on every block record its output (the residual stream) and that output's gradient.
    Returns two dicts: ``residual_dtype``, ``stream_dtype`` and ``grad_dtype`` (as str),
    ``stream_bytes`` (all blocks' outputs, forward) and ``grad_bytes`` (their gradients,
    backward), bytes, and ``loss`` (nats, fp32).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model_config.vocab_size, (batch_size, seq_len + 1), generator=gen)
    x, y = idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)
    out = []
    for residual in ("fp32", "bf16"):
        # GPT draws its init seed from the global CPU generator: seed it here, for both models
        # alike, without changing the caller's random state
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT(model_config, attention="sdpa", residual_dtype=residual)
        model = model.to(device)
        seen, dtypes, handles = _record_stream(model)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        for h in handles:
            h.remove()
        out.append(
            dict(
                residual_dtype=residual,
                stream_dtype=str(dtypes["stream"]).replace("torch.", ""),
                grad_dtype=str(dtypes["grad"]).replace("torch.", ""),
                stream_bytes=seen["stream"],
                grad_bytes=seen["grad"],
                loss=loss.item(),
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# + clip in AdamW: the pass that is gone
# --------------------------------------------------------------------------------------------


class _OpLog(TorchDispatchMode):
    """Counts the ATen operators that run inside it (what a GPU would launch as kernels)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def clip_ops(sizes=(3000, 1000, 500), max_norm: float = 1.0, seed: int = 0) -> dict:
    """Clip then fused AdamW, the two ways, on the same parameters and gradients (CPU, fp32).

    "separate": ``clip_grad_norm_`` rescales every gradient, then ``optimizer.step()``.
    "in AdamW": ``optimizer.grad_scale = train.clip_divisor(...)``, then ``optimizer.step()``,
    which divides each gradient by it as it reads it. The gradients are drawn large enough
    that clipping is active (norm > ``max_norm``).

    Returns ``ops`` ({path: Counter of ATen operator names}), ``only_separate`` (the operators
    the separate path runs and the fused path does not, with their counts), ``max_abs_diff``
    (largest difference between the two paths' updated parameters) and ``grad_norm``.
    """
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(n, generator=gen) for n in sizes]
    grads = [10 * torch.randn(n, generator=gen) for n in sizes]
    ops, params = {}, {}
    for path in ("separate", "in AdamW"):
        ps = [torch.nn.Parameter(s.clone()) for s in start]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt = torch.optim.AdamW(ps, lr=1e-3, fused=True)
        with _OpLog() as log:
            if path == "separate":
                torch.nn.utils.clip_grad_norm_(ps, max_norm)
            else:
                opt.grad_scale = train.clip_divisor(ps, max_norm)
            opt.step()
        ops[path], params[path] = log.ops, ps
    diff = max((a - b).abs().max().item() for a, b in zip(params["separate"], params["in AdamW"]))
    norm = torch.linalg.vector_norm(torch.cat(grads)).item()
    return dict(
        ops=ops,
        only_separate=ops["separate"] - ops["in AdamW"],
        max_abs_diff=diff,
        grad_norm=norm,
    )


def parameter_bytes(model_config: GPTConfig | None = None) -> int:
    """Bytes of the model's fp32 parameters (= of their gradients), counted on the meta device:
    what one pass over all gradients reads, and writes again. Default: GPT-2 124M with the
    vocabulary padded to 50304, as on the ladder's last rungs."""
    model_config = model_config or GPTConfig(vocab_multiple=64)
    with torch.device("meta"):
        model = GPT(model_config)
    return sum(p.numel() * p.element_size() for p in model.parameters())


# --------------------------------------------------------------------------------------------
# + fused LM-head CE: what waits for backward
# --------------------------------------------------------------------------------------------


def saved_bytes(fn, *args) -> int:
    """Bytes of the distinct tensors autograd saves for backward while ``fn(*args)`` runs
    (``torch.autograd.graph.saved_tensors_hooks``; a tensor saved twice, or a view of a saved
    storage, is counted once, by storage)."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def lm_head_saved_bytes(
    n_rows: int, n_embd: int, vocab: int, device: torch.device | str, seed: int = 0
) -> dict:
    """What LM head + cross-entropy keep for backward, bf16 inputs (N, C) and weight (V, C).

    Returns ``logits_bytes`` (one bf16 (N, V) logits tensor), ``fused_by_code``
    (:func:`fused_saved_bytes`), ``pytorch`` (bytes saved by
    ``x @ W.T`` and ``F.cross_entropy(logits.float())``, measured) and ``fused`` (bytes saved by
    ``kernels.linear_cross_entropy``, measured where its Triton kernel runs on ``device``, else
    None) and ``fused_reason`` (why not, or "").
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n_embd, generator=gen).to(device, torch.bfloat16).requires_grad_()
    w = (0.02 * torch.randn(vocab, n_embd, generator=gen)).to(device, torch.bfloat16)
    w.requires_grad_()
    y = torch.randint(0, vocab, (n_rows,), generator=gen).to(device)
    out = dict(
        logits_bytes=n_rows * vocab * 2,
        fused_by_code=fused_saved_bytes(n_rows, n_embd, vocab),
        pytorch=saved_bytes(lambda: F.cross_entropy((x @ w.t()).float(), y)),
        fused=None,
        fused_reason="",
    )
    from helpers.core import kernels

    ok, why = kernels.available(device)
    if ok:
        out["fused"] = saved_bytes(lambda: kernels.linear_cross_entropy(x, w, y))
    else:
        out["fused_reason"] = why
    return out


def fused_saved_bytes(n_rows: int, n_embd: int, vocab: int, dtype_bytes: int = 2) -> int:
    """Bytes ``linear_cross_entropy`` saves for backward by its code (``_LinearCrossEntropy.
    _finish``): dx (N, C) and dweight (V, C) in the weight's dtype, and one int64 count."""
    return (n_rows * n_embd + vocab * n_embd) * dtype_bytes + 8


# --------------------------------------------------------------------------------------------
# + Triton CE and + fp8 LM head: committed H200 timings, and the fp8 numerics
# --------------------------------------------------------------------------------------------


def lm_head_ce_times(name: str = "h200-lm-head-ce-2026-11-30.json", n_rows: int = 16384) -> dict:
    """The committed LM head + CE forward+backward times at ``n_rows`` rows: ``device``, ``torch``,
    ``date`` and ``rows`` [(what, ms)] for eager PyTorch, the Triton CE (4 warps) and the fused
    LM-head CE (``benchmarks/lm_head_ce.py``: x (N, 768), W (50304, 768), bf16).

    Raises:
        FileNotFoundError: the result is not in results/ (``results.missing`` says why).
    """
    res = results_io.load(name)
    if res is None:
        raise FileNotFoundError(results_io.missing(name))
    labels = {
        "pytorch": "PyTorch, eager: F.cross_entropy(logits.float())",
        "triton, 4 warps": "Triton CE, two kernels (4 warps)",
        f"fused, chunks of {n_rows} rows": "fused LM-head CE, one chunk",
    }
    prefix = "LM head + CE forward+backward, "
    rows = [
        (labels[r["what"].removeprefix(prefix)], r["ms"])
        for r in res["rows"]
        if r["N"] == n_rows and r["what"].removeprefix(prefix) in labels
    ]
    return dict(device=res["device"], torch=res["torch"], date=res["date"], rows=rows)


def fp8_matmul_times(name: str = "h200-fp8-matmul-2026-11-30.json") -> dict:
    """The committed bf16 and fp8 times of the LM head's three matmuls: ``gpu``, ``torch``,
    ``date`` (from the file name) and ``rows`` [(name, M, N, K, bf16 ms, fp8 ms)], where the
    matmul multiplies an (M, K) by a (K, N) operand; the 32768 rows are one chunk of the fused
    LM-head CE (half the rows of B=64 at T=1024; all of B=32).

    Raises:
        FileNotFoundError: the result is not in results/.
    """
    res = results_io.load(name)
    if res is None:
        raise FileNotFoundError(results_io.missing(name))
    rows = [
        (r["name"], r["M"], r["N"], r["K"], r["bf16_ms"], r["fp8_ms"])
        for r in res["rows"]
        if r["name"].startswith("lm_head")
    ]
    date = "-".join(name.removesuffix(".json").split("-")[-3:])
    return dict(gpu=res["gpu"], torch=res["torch"], date=date, rows=rows)


def _rel_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(a.float() - ref) / torch.linalg.vector_norm(ref)).item()


def fp8_errors(n_rows: int = 64, n_embd: int = 768, vocab: int = 8192, seed: int = 0) -> dict:
    """Relative errors (||a - ref|| / ||ref||, Frobenius) of the fp8 LM head's roundings against
    fp32 (whose own rounding, ~1e-7, is far below either), next to bf16's, computed on the CPU
    for x ~ N(0, 1) (a LayerNorm output) and W ~ N(0, 0.02) (GPT-2's init); ``vocab`` rows of W
    (default 8192, fewer than the LM head's 50304, so it takes well under a second).

    The fp8 matmuls multiply the rounded values exactly and accumulate at higher precision, so
    rounding x and W to e4m3 (one scale each, :func:`helpers.core.kernels.fp8.to_fp8_e4m3`) and
    multiplying in fp32 gives their logits up to the rounding of the sums.

    Returns ``logits_bf16``, ``logits_fp8`` (inputs rounded to bf16 resp. e4m3, output to bf16)
    and ``loss_bf16``, ``loss_fp8`` (relative differences of the mean cross-entropy computed from
    those logits, against fp32's).
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n_embd, generator=gen)
    w = 0.02 * torch.randn(vocab, n_embd, generator=gen)
    y = torch.randint(0, vocab, (n_rows,), generator=gen)
    ref = x @ w.t()
    bf16 = (x.bfloat16().float() @ w.bfloat16().float().t()).bfloat16()
    (x8, xs), (w8, ws) = fp8_formats.to_fp8_e4m3(x), fp8_formats.to_fp8_e4m3(w)
    fp8 = ((x8.float() * xs) @ (w8.float() * ws).t()).bfloat16()
    loss_ref = F.cross_entropy(ref, y)
    return dict(
        logits_bf16=_rel_error(bf16, ref),
        logits_fp8=_rel_error(fp8, ref),
        loss_bf16=(F.cross_entropy(bf16.float(), y) / loss_ref - 1).item(),
        loss_fp8=(F.cross_entropy(fp8.float(), y) / loss_ref - 1).item(),
    )


def fp8_mlp_errors(n_rows: int = 256, n_embd: int = 768, n_layer: int = 12, seed: int = 0) -> dict:
    """Relative errors (||a - ref|| / ||ref||, Frobenius) of the MLP's output y and input gradient
    dx when each matmul's two operands are rounded to bf16 or to e4m3 with one scale per row (the
    fp8 MLP's roundings, :func:`helpers.core.kernels.fp8.rowwise_e4m3`), against fp32; computed
    on the CPU in PyTorch, the rounded operands multiplied in fp32 (as fp8 tensor cores multiply
    them exactly and accumulate at higher precision).

    x ~ N(0, 1) (a LayerNorm output, (n_rows, C)), the upstream gradient dy ~ N(0, 1), c_fc's
    weight (4C, C) ~ N(0, 0.02) and c_proj's (C, 4C) ~ N(0, 0.02 / sqrt(2 * n_layer)) (GPT-2's
    init), biases zero. The four roundings per matmul pair are the kernel's: x and c_fc's weight,
    GELU(h) and c_proj's weight (forward); dy and c_proj's weight transposed, dh and c_fc's
    weight transposed (backward: one scale per input feature of the weight).

    Returns ``y_bf16``, ``y_fp8``, ``dx_bf16``, ``dx_fp8``.
    """
    gen = torch.Generator().manual_seed(seed)
    C = n_embd
    x = torch.randn(n_rows, C, generator=gen)
    dy = torch.randn(n_rows, C, generator=gen)
    w_fc = 0.02 * torch.randn(4 * C, C, generator=gen)
    w_proj = 0.02 / (2 * n_layer) ** 0.5 * torch.randn(C, 4 * C, generator=gen)

    def rowwise(t: torch.Tensor) -> torch.Tensor:
        t8, inv = fp8_formats.rowwise_e4m3(t)
        return t8.float() * inv

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.bfloat16().float()

    def mlp(q):  # y and dx with every matmul operand rounded by q (rows of the (R, K) operands)
        h = q(x) @ q(w_fc).t()  # (N, 4C)
        h.requires_grad_(True)
        a = F.gelu(h, approximate="tanh")
        y = q(a.detach()) @ q(w_proj).t()  # (N, C)
        da = q(dy) @ q(w_proj.t().contiguous()).t()  # (N, 4C)
        (dh,) = torch.autograd.grad(a, h, da)  # GELU's derivative, in fp32
        dx = q(dh) @ q(w_fc.t().contiguous()).t()  # (N, C)
        return y, dx

    y_ref, dx_ref = mlp(lambda t: t)
    (y_b, dx_b), (y_8, dx_8) = mlp(bf16), mlp(rowwise)
    return dict(
        y_bf16=_rel_error(y_b, y_ref),
        y_fp8=_rel_error(y_8, y_ref),
        dx_bf16=_rel_error(dx_b, dx_ref),
        dx_fp8=_rel_error(dx_8, dx_ref),
    )


def fp8_mlp_kernel_times(name: str = "h200-fp8-mlp-kernels-2026-12-04.json") -> dict:
    """The committed times of the fp8 MLP's two Triton kernels and of inductor's bf16 GELU kernels
    they replace, at one B=64 layer's size (65536 rows of 3072): ``device``, ``torch``, ``date``
    and ``rows`` [(kernel, ms per call, GB/s)] (``python benchmarks/fp8_mlp.py --out``).

    Raises:
        FileNotFoundError: the result is not in results/.
    """
    res = results_io.load(name)
    if res is None:
        raise FileNotFoundError(results_io.missing(name))
    rows = [(k, v["ms"], v["GB/s"]) for k, v in res["kernels"].items()]
    return dict(device=res["device"], torch=res["torch"], date=res["date"], rows=rows)
