"""What torch.compile does to the course's step, measured (chapter 05).

Four ideas, one function family each:

1. **Fusion, counted**: :func:`count_kernels` runs a function once under ``torch.profiler`` and
   counts the kernels it launched (rule: :data:`KERNEL_RULE`), so eager and compiled versions of the
   same chain can be compared by number, not by claim.
2. **Compile time vs step time**: :func:`measure_step` times the first training step (which
   compiles) apart from the steady steps, and says whether compilation really happened;
   :func:`break_even_steps` turns the numbers into "compiling pays off after N steps".
3. **Recompilation**: :func:`watch_compiles` runs calls one by one and reports, for each, how many
   new graphs Dynamo compiled and the guard that failed.
4. **Cold compiles**: :func:`cold_compile_cache` gives inductor an empty on-disk cache, so a compile
   time is never a cache hit from an earlier run.

PyTorch documentation: https://pytorch.org/docs/stable/torch.compiler.html (Dynamo captures a
graph from Python bytecode, guards decide when it can be reused, inductor generates Triton kernels
on a GPU and C++/OpenMP code on a CPU).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator

import torch

from helpers.core import train
from helpers.measure import hardware, timing

# ----------------------------------------------------------------------------------------------
# 1. Fusion, counted
# ----------------------------------------------------------------------------------------------

KERNEL_RULE = (
    "a kernel is one launched pass over memory: on CUDA, every kernel the profiler records "
    "on the GPU (memcpy/memset excluded); on a CPU, every outermost aten operator that "
    "computes (allocation and view ops excluded) plus every C++ kernel inductor generated "
    "(recorded with inductor's cpp.enable_kernel_profile)"
)

# aten ops that allocate or re-describe memory without a pass over the data: not kernels
_NOT_KERNELS = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::view",
    "aten::_unsafe_view",
    "aten::as_strided",
    "aten::reshape",
    "aten::resize_",
    "aten::expand",
    "aten::t",
    "aten::transpose",
    "aten::permute",
    "aten::detach",
    "aten::alias",
    "aten::lift_fresh",
    "aten::result_type",
}

GELU_C = math.sqrt(
    2.0 / math.pi
)  # the tanh approximation's constant (Hendrycks & Gimpel 2016, eq. 2)


def gelu_tanh_unfused(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), written as 8 separate tensor ops.

    Same shape and dtype as ``x``. In eager mode each op is its own kernel that reads and writes a
    full tensor; ``torch.compile`` fuses the chain into one kernel. (``nn.GELU(approximate="tanh")``
    is PyTorch's hand-written single kernel of the same function.)
    """
    inner = GELU_C * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence what C++ writes to file descriptor 2 (the profiler's start/stop lines) for a moment.
    Python exceptions are unaffected: they propagate as usual."""
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (some embedded interpreters): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _inductor_cpu_kernel_profile() -> Iterator[None]:
    """Make inductor's generated C++ kernels visible to the profiler
    (a record_function per kernel)."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "cpp") and hasattr(inductor_config.cpp, "enable_kernel_profile"):
        with inductor_config.patch({"cpp.enable_kernel_profile": True}):
            yield
    else:
        yield


def _is_generated_cpu_kernel(name: str) -> bool:
    return "cpp_fused" in name or name.startswith("cpp_kernel") or "_cpp_" in name


def count_kernels(
    fn: Callable[..., object], x: torch.Tensor | tuple, device: torch.device | str
) -> dict:
    """Count the kernels one call ``fn(x)`` (or ``fn(*x)`` for a tuple) launches,
    by :data:`KERNEL_RULE`.

    ``fn`` is called once untimed first (a compiled function compiles there; call this right after
    ``torch.compile`` so that, on a CPU, its kernels are generated with profiling records), then
    once under ``torch.profiler`` with ``ProfilerActivity.CUDA`` on a GPU, ``ProfilerActivity.CPU``
    otherwise.

    Returns
    ``{"kernels": int, "names": list[str] (launch order), "device": "cuda"/"cpu", "rule": str}``.

    Raises:
        whatever ``fn`` raises.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    args = x if isinstance(x, tuple) else (x,)
    cuda = device.type == "cuda"
    with _inductor_cpu_kernel_profile():
        with torch.no_grad():
            fn(*args)
            timing.synchronize(device)
            activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
            with _quiet_native_stderr(), warnings.catch_warnings():
                warnings.simplefilter(
                    "ignore"
                )  # the profiler's own notices, not the learner's code
                with profile(activities=activities) as prof:
                    fn(*args)
                    timing.synchronize(device)
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    if cuda:
        names = [
            e.name
            for e in events
            if e.device_type == DeviceType.CUDA
            and not e.name.lower().startswith(("memcpy", "memset"))
        ]
    else:
        names = []
        for e in events:
            if _is_generated_cpu_kernel(e.name):
                names.append(e.name)
                continue
            if not e.name.startswith("aten::") or e.name in _NOT_KERNELS:
                continue
            parent, nested = e.cpu_parent, False
            while parent is not None:
                nested = nested or parent.name.startswith("aten::")
                parent = parent.cpu_parent
            if not nested:
                names.append(e.name)
    return {"kernels": len(names), "names": names, "device": device.type, "rule": KERNEL_RULE}


# ----------------------------------------------------------------------------------------------
# 2. Compile time vs step time
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def cold_compile_cache() -> Iterator[None]:
    """Compile with an empty, temporary inductor (and Triton) cache, deleted afterwards.

    Inductor keeps compiled graphs and kernels on disk (``$TMPDIR/torchinductor_<user>``), so a
    second compile of the same model, even in a new process, can take a fraction of the first.
    Inside this context every compile is a cold one. Uses ``torch._inductor.utils.fresh_cache``
    (``fresh_inductor_cache`` before torch 2.7), the helper PyTorch's own benchmarks use for
    cold-start compile times; a no-op where neither exists.
    """
    from torch._inductor import utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or getattr(
        inductor_utils, "fresh_inductor_cache", None
    )
    if fresh is None:
        yield
        return
    with fresh():
        yield


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def chapter_run(device: torch.device | str, compile: str | None = None) -> train.RunConfig:
    """The step this chapter compiles: the ladder's rung before torch.compile (TF32 matmuls and bf16
    autocast where the device has them, fp32 otherwise; manual attention; vocab 50257), with B and T
    from :func:`helpers.core.train.default_shapes`, and ``compile`` as given (None = eager)."""
    device = torch.device(device)
    _, B, T = train.default_shapes(device)
    bf16 = device.type == "cuda" and hardware.native_bf16(device)
    return train.RunConfig(
        name=compile or "eager",
        compile=compile,
        batch_size=B,
        seq_len=T,
        matmul_precision="tf32" if hardware.tf32_supported(device) else "fp32",
        autocast="bf16" if bf16 else None,
    )


def measure_step(
    run: train.RunConfig,
    model_config,
    device: torch.device | str,
    tokens: torch.Tensor,
    iters: int = 10,
    warmup: int = 2,
    backend: Callable | None = None,
) -> dict:
    """Build ``run`` and time its training step: the first step on its own, then ``warmup`` untimed
    and ``iters`` timed steps (:func:`helpers.measure.timing.measure`, median), all in a cold
    compile cache.

    A compile that fails falls back to eager (``train.build(..., compile_fallback=True)``), and a
    compile that is unavailable here (no C++ compiler, GPU too old) is replaced by eager up front:
    either way the row says ``compiled: False`` with the one-line reason, and its label is "eager",
    so no number measured in eager is ever reported as compiled. A mode this device cannot run at
    all (``reduce-overhead`` on a CPU) is ``status: "skipped"`` with the reason, and not timed.

    ``backend`` (optional) replaces inductor with another ``torch.compile`` backend, e.g. one that
    raises, to show the fallback.

    Returns a dict: ``mode`` (the asked compile mode or "eager"), ``status`` ("measured"/"skipped"),
    ``compiled`` (bool: the timed steps ran a compiled graph), ``label`` (``mode`` if compiled, else
    "eager"), ``reason`` (one line), ``first_step_ms``, ``ms_per_step`` (median of ``iters``),
    ``spread_pct``, ``compile_s`` (first step minus a steady step, in s; None for eager), ``graphs``
    (graphs Dynamo compiled in the first step), ``graphs_after_first_step`` (should be 0).
    """
    device = torch.device(device)
    mode = run.compile or "eager"
    row = {
        "mode": mode,
        "status": "skipped",
        "compiled": False,
        "label": "eager",
        "reason": "",
        "first_step_ms": None,
        "ms_per_step": None,
        "spread_pct": None,
        "compile_s": None,
        "graphs": 0,
        "graphs_after_first_step": 0,
    }
    reason = train.unsupported_reason(run, device)
    if reason is not None and run.compile is not None:
        ok, why = hardware.compile_support(device)
        if ok:  # the mode, not compilation, is impossible here (reduce-overhead on a CPU)
            row["reason"] = reason
            return row
        row["reason"] = f"compile unavailable ({why}); measured eager"
        run = run.replace(compile=None)
    from helpers.core import data

    with cold_compile_cache():
        trainer = train.build(run, model_config, device, compile_fallback=True)
        if backend is not None and run.compile is not None:
            trainer.forward = torch.compile(trainer.model, backend=backend)
        loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, device)
        g0 = _graphs_compiled()
        timing.synchronize(device)
        t0 = time.perf_counter()
        trainer.step(loader)
        timing.synchronize(device)
        first_ms = 1e3 * (time.perf_counter() - t0)
        g1 = _graphs_compiled()
        t = timing.measure(lambda: trainer.step(loader), device, warmup=warmup, iters=iters)
        g2 = _graphs_compiled()
    compiled = run.compile is not None and trainer.forward is not trainer.model
    if run.compile is not None and not compiled:
        row["reason"] = (
            trainer.notes[-1] if trainer.notes else "torch.compile did not run; measured eager"
        )
    elif compiled:
        row["reason"] = "compiled"
    else:
        row["reason"] = row["reason"] or "eager (not compiled)"
    row.update(
        status="measured",
        compiled=compiled,
        label=mode if compiled else "eager",
        first_step_ms=first_ms,
        ms_per_step=t.median_ms,
        spread_pct=t.spread_pct,
        compile_s=(first_ms - t.median_ms) / 1e3 if compiled else None,
        graphs=g1 - g0,
        graphs_after_first_step=g2 - g1,
    )
    return row


def break_even_steps(compile_s: float, eager_ms: float, compiled_ms: float) -> float:
    """Smallest number of steps N after which compiling has paid for itself.

    Compiled: ``compile_s + N·compiled_ms/1e3`` seconds; eager: ``N·eager_ms/1e3``. The smallest
    integer N with compiled <= eager is ``ceil(compile_s / ((eager_ms - compiled_ms)/1e3))``:
    0 when there is nothing to pay back, ``math.inf`` when the compiled step is not faster (never).
    Units: ``compile_s`` in seconds, step times in ms. Returns a float (an integer value, or inf).

    Raises:
        ValueError: if a time is negative.
    """
    if compile_s < 0 or eager_ms < 0 or compiled_ms < 0:
        raise ValueError(f"times must be >= 0, got {compile_s} s, {eager_ms} ms, {compiled_ms} ms")
    saved_s = (eager_ms - compiled_ms) / 1e3  # seconds saved per step
    if saved_s <= 0:
        return math.inf
    return float(math.ceil(compile_s / saved_s))


_ROW_COLUMNS = [  # (header, fixed-width spec, Markdown alignment); "note" comes last
    ("mode", "<27", "l"),
    ("ran as", "<9", "l"),
    ("first step (s)", ">14", "r"),
    ("step (ms)", ">10", "r"),
    ("compile (s)", ">11", "r"),
    ("note", "", "l"),
]


def _row_cells(r: dict) -> list[str]:
    if r["status"] != "measured":
        return [r["mode"], "-", "-", "-", "-", f"skipped: {r['reason']}"]
    cs = f"{r['compile_s']:.1f}" if r["compile_s"] is not None else "-"
    return [
        r["mode"],
        "compiled" if r["compiled"] else "eager",
        f"{r['first_step_ms'] / 1e3:.1f}",
        f"{r['ms_per_step']:.1f}",
        cs,
        "" if r["compiled"] else r["reason"],
    ]


def format_rows(rows: list[dict]) -> str:
    """A fixed-width table of :func:`measure_step` rows, one line each, units in the header. The
    "ran as" column says what the timed steps really ran: "compiled", or "eager" with the reason.
    :func:`rows_markdown` is the same table for a rendered notebook."""
    specs = [spec for _, spec, _ in _ROW_COLUMNS[:-1]]
    lines = [" ".join(f"{h:{spec}}" for h, spec, _ in _ROW_COLUMNS[:-1]) + "  note"]
    for r in rows:
        cells = _row_cells(r)
        fixed = " ".join(f"{c:{spec}}" for c, spec in zip(cells[:-1], specs, strict=True))
        lines.append(f"{fixed}  {cells[-1]}".rstrip())
    return "\n".join(lines)


def rows_markdown(rows: list[dict]) -> str:
    """:func:`format_rows` as a Markdown table, for ``IPython.display.Markdown``."""
    from helpers.measure.results import markdown_table

    return markdown_table(
        [h for h, _, _ in _ROW_COLUMNS],
        [[f"`{c[0]}`", *c[1:]] for c in map(_row_cells, rows)],
        "".join(a for _, _, a in _ROW_COLUMNS),
    )


# ----------------------------------------------------------------------------------------------
# 3. Recompilation
# ----------------------------------------------------------------------------------------------


def recompile_limit_key() -> str:
    """The name of Dynamo's per-function graph limit in this torch: ``recompile_limit`` (2.7+) or
    ``cache_size_limit`` (earlier). Past it, Dynamo stops compiling that function and
    runs it eager."""
    cfg = torch._dynamo.config
    return "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"


def _guard_failures() -> list[str]:
    from torch._dynamo import utils as dynamo_utils

    failures = getattr(dynamo_utils, "guard_failures", {})
    return [str(r) for v in list(failures.values()) for r in v]


def _frames_not_compiled() -> int:
    """Frames Dynamo attempted but did not turn into a graph (counters "frames": total - ok)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"]) - int(counters["frames"]["ok"])


def _short_reason(reason: str) -> str:
    """First line of a guard failure, without its source comment:
    "s == 2.0", "tensor 'x' size ..."."""
    line = reason.splitlines()[0].split("#")[0].strip()
    head, sep, tail = line.partition(": ")
    if sep and "/" in head and head.replace("/", "").isdigit():  # "0/1: ..." -> "..."
        line = tail
    return line.split(". Guard failed")[0].strip()


def watch_compiles(calls: list[tuple[str, Callable[[], object]]]) -> list[dict]:
    """Run each ``(label, call)`` in turn and report what Dynamo did.

    Returns one dict per call: ``label``, ``new_graphs`` (graphs compiled during the call, from
    ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``), ``reason`` (the guard that failed
    on the newest cached graph and forced the recompile, "" if none) and ``ran`` ("compiled new
    graph", "reused a graph", or "eager: guards failed but no graph was compiled (recompile
    limit)"). Dynamo's own warning for the limit is silenced during the call; the row reports it
    instead.
    """
    rows = []
    dynamo_log = logging.getLogger("torch._dynamo")
    for label, call in calls:
        g0, f0, frames0 = _graphs_compiled(), len(_guard_failures()), _frames_not_compiled()
        level = dynamo_log.level
        dynamo_log.setLevel(logging.ERROR)
        try:
            call()
        finally:
            dynamo_log.setLevel(level)
        new, failed = _graphs_compiled() - g0, _guard_failures()[f0:]
        gave_up = _frames_not_compiled() > frames0  # Dynamo tried this frame and did not compile it
        reason = _short_reason(failed[0]) if failed else ""
        if new:
            ran = "compiled new graph"
        elif failed or gave_up:
            ran = "eager: guards failed but no graph was compiled (recompile limit)"
        else:
            ran = "reused a graph"
        rows.append({"label": label, "new_graphs": new, "reason": reason, "ran": ran})
    return rows


def watch_markdown(rows: list[dict], reasons: bool = True) -> str:
    """A Markdown table of :func:`watch_compiles` rows, for ``IPython.display.Markdown``: the call,
    the new graphs it compiled, what ran, and (``reasons``) the guard that failed ("" if none)."""
    from helpers.measure.results import markdown_table

    heads = ["call", "new graphs", "ran"] + (["guard that failed"] if reasons else [])
    cells = [
        [r["label"], r["new_graphs"], r["ran"]]
        + ([f"`{r['reason']}`" if r["reason"] else ""] if reasons else [])
        for r in rows
    ]
    return markdown_table(heads, cells, "lrl" + ("l" if reasons else ""))
