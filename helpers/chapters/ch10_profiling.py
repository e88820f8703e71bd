"""Profiling the training step: which kernels run, how long, in which phase (chapter 10).

:mod:`helpers.measure.profiler` sorts kernels into families and profiles a training step (a
:class:`~helpers.measure.profiler.StepProfile`); this module turns profiles into what the chapter
reads and commits:

1. **Advice** (:func:`suggest_chapter`): the chapter whose optimisation a profile points to.
2. **Profile tables** (the JSON in ``results/``): :func:`table_from_profile` (a fresh profile),
   :func:`table_from_perf_json` (derived from ``benchmarks/perf.py --profile`` output), and
   :func:`load_table`. Command line::

       # on the GPU
       python -m helpers.chapters.ch10_profiling table \\
           --out results/h200-profile-table-new.json
       python -m helpers.chapters.ch10_profiling from-perf \\
           results/h200-perf-final-2026-11-30.json --out results/h200-profile-table.json
       # the step alone, for Nsight Systems (see chapter 10); --chapter-step: chapter 10's step
       python -m helpers.chapters.ch10_profiling run --steps 5

torch.profiler: https://pytorch.org/docs/stable/profiler.html ;
trace viewer: https://ui.perfetto.dev (or chrome://tracing).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch

from helpers.measure.profiler import (
    ATTENTION,
    COPY,
    ELEMENTWISE,
    MATMUL,
    OPTIMIZER,
    OTHER,
    REDUCTION,
    TRITON,
    StepProfile,
    family_totals,
    kernel_family,
    profile_steps,
    step_with_ranges,
)
from helpers.measure.timing import synchronize
from helpers.tools import cli

LAUNCH_BOUND_IDLE = 0.25  # GPU idle for more than this share of the step: launch / host bound
CHAPTER_FOR_FAMILY = {
    ATTENTION: "ch06",
    TRITON: "ch05",
    ELEMENTWISE: "ch05",
    REDUCTION: "ch05",
    COPY: "ch05",
    OPTIMIZER: "ch09",
    OTHER: "ch10",
}


def suggest_chapter(rows: Iterable[dict], step_ms: float, low_precision: bool) -> str:
    """The chapter whose optimisation a profile points to, "ch03" ... "ch10" (chapter 10's rules).

    ``rows``: a profile table (dicts with "family" and "ms", device ms per step); ``step_ms``: the
    measured time of one step (ms); ``low_precision``: the matmuls already run in bf16 / fp16.
    1. GPU idle (1 - sum of rows / step_ms) > :data:`LAUNCH_BOUND_IDLE`: "ch05" (CUDA graphs,
       torch.compile mode "reduce-overhead", and fusion: fewer launches).
    2. Else by the family with the largest total: matmul -> "ch04" in fp32 / TF32 (mixed
       precision), "ch03" already in low precision (a larger batch keeps the tensor cores busier);
       attention -> "ch06"; memory-bound families and Triton kernels -> "ch05"; optimizer -> "ch09";
       other -> "ch10".

    Raises:
        ValueError: if ``step_ms`` <= 0 or ``rows`` is empty.
    """
    rows = list(rows)
    if step_ms <= 0 or not rows:
        raise ValueError(
            f"need step_ms > 0 and at least one row, got step_ms={step_ms}, {len(rows)} rows"
        )
    if 1 - sum(float(r["ms"]) for r in rows) / step_ms > LAUNCH_BOUND_IDLE:
        return "ch05"
    dominant = next(iter(family_totals(rows)))
    if dominant == MATMUL:
        return "ch03" if low_precision else "ch04"
    return CHAPTER_FOR_FAMILY[dominant]


# Prefixes every eager PyTorch kernel's name starts with: dropped from the tables, so the part that
# says what the kernel does (cunn_SoftMaxBackward, GammaBetaBackward...) fits in the width.
_NAME_PREFIXES = ("void ", "at::native::(anonymous namespace)::", "at::native::")


def short_name(name: str, width: int = 70) -> str:
    """A kernel name for a table: PyTorch's common prefixes (``void at::native::(anonymous
    namespace)::``) dropped, then cut to ``width`` characters with "..."."""
    for prefix in _NAME_PREFIXES:
        name = name.removeprefix(prefix)
    return name if len(name) <= width else name[: width - 3] + "..."


def _top_cells(r: dict, width: int) -> list[str]:
    name = short_name(r["name"], width)
    calls = f"{r['calls']:.0f}" if r.get("calls") is not None else "-"
    return [f"{r['ms']:.3f}", calls, r["family"], name]


def format_top(rows: list[dict], n: int = 10, width: int = 70) -> str:
    """The first ``n`` rows as an aligned text table (names shortened by :func:`short_name`).
    :func:`top_markdown` is the same table for a rendered notebook."""
    lines = [f"{'ms/step':>8} {'calls':>6}  {'family':<13} name"]
    for r in rows[:n]:
        ms, calls, family, name = _top_cells(r, width)
        lines.append(f"{ms:>8} {calls:>6}  {family:<13} {name}")
    return "\n".join(lines)


def top_markdown(rows: list[dict], n: int = 10, width: int = 70) -> str:
    """:func:`format_top` as a Markdown table, for ``IPython.display.Markdown``: kernel names in
    code font, shortened to ``width`` characters; a family's remainder row (``"remainder":
    true``, not a kernel) in italics."""
    from helpers.measure.results import markdown_table

    cells = []
    for r in rows[:n]:
        ms, calls, family, name = _top_cells(r, width)
        cells.append([ms, calls, family, f"*{name}*" if r.get("remainder") else f"`{name}`"])
    return markdown_table(["ms/step", "calls", "family", "name"], cells, "rrll")


LAUNCHERS_RESULT = "h100-perf-launchers-b16-2026-12-07.json"  # perf.py --launchers, an H100


def launchers_markdown(rows: list[dict], n: int = 5, width: int = 40) -> str:
    """The first ``n`` rows of :func:`helpers.measure.profiler.kernel_launchers` as a Markdown
    table: kernel (shortened to ``width``), ms per step, launches per step, the first two
    operators of the chain (innermost first), the innermost operator's input shapes."""
    from helpers.measure.results import markdown_table

    cells = [
        [f"`{short_name(r['kernel'], width)}`", f"{r['ms']:.3f}", f"{r['launches']:.0f}",
         " <- ".join(f"`{op}`" for op in r["chain"][:2]), r["shapes"] or "-"]
        for r in rows[:n]
    ]  # fmt: skip
    header = ["kernel", "ms/step", "launches/step", "launched by", "input shapes"]
    return markdown_table(header, cells, "lrrll")


# --------------------------------------------------------------------------------------------
# 3. Profile tables (results/*.json)
# --------------------------------------------------------------------------------------------

TABLE_FORMAT = "fast-gpt2-course profile table, v1"
SHIPPED_TABLE = "h200-profile-table.json"

# benchmarks/perf.py's family names -> helpers.measure.profiler's (its rules are a coarser version
# of FAMILY_RULES)
PERF_FAMILIES = {
    "matmul": MATMUL,
    "matmul (inductor Triton template)": MATMUL,  # max-autotune variants only
    "attention": ATTENTION,
    "triton fused (elementwise, norms, softmax, CE)": TRITON,
    "cross-entropy (hand-written Triton)": REDUCTION,
    "copies / casts": COPY,
    "optimizer": OPTIMIZER,
    "other": OTHER,
}


def table_from_perf_json(perf: dict, source: str, date: str, cuda: str | None = None) -> dict:
    """A profile table derived from the JSON of ``benchmarks/perf.py --profile``.

    perf.py kept, per profiled row, the device ms per step of each kernel family and of its largest
    kernels (``top_kernels_ms``: 15). The table lists those kernels as measured, plus one row per
    family for the rest of that family ("(rest of the matmul family ...)", ms = family total minus
    the listed kernels), so that family totals equal the measured ones. No per-kernel number is
    made up; the remainder rows say they are remainders (``"remainder": true``, ``"calls": null``).

    Only the rows of variant "final" (the ladder's last rung) are used, the first one per batch
    size.

    Raises:
        ValueError: if the file has no profiled "final" row, a family name is unknown, a listed
            kernel falls in another family under :func:`kernel_family` than under perf.py, or a
            remainder would be negative.
    """
    tables, seen, n_listed = [], set(), {}
    for row in perf["rows"]:
        prof = row.get("profile")
        if not prof or row["variant"] != "final" or row["batch_size"] in seen:
            continue  # the table is of the ladder's last rung, one per batch size
        seen.add(row["batch_size"])
        fam_ms = {}
        for perf_fam, ms in prof["families_ms"].items():
            if perf_fam not in PERF_FAMILIES:
                raise ValueError(f"unknown perf.py family {perf_fam!r}; add it to PERF_FAMILIES")
            fam_ms[PERF_FAMILIES[perf_fam]] = fam_ms.get(PERF_FAMILIES[perf_fam], 0.0) + ms
        n_listed[row["batch_size"]] = len(prof["top_kernels_ms"])
        kernels, listed = [], defaultdict(float)
        for ms, name in prof["top_kernels_ms"]:
            fam = kernel_family(name)
            if fam not in fam_ms:
                raise ValueError(
                    f"kernel {name[:60]!r} is {fam!r} here but no such family in perf.py's totals"
                )
            kernels.append(
                {"name": name, "family": fam, "ms": ms, "calls": None, "remainder": False}
            )
            listed[fam] += ms
        for fam, total in fam_ms.items():
            rest = total - listed[fam]
            if rest < -1e-6:
                raise ValueError(
                    f"family {fam!r}: listed kernels sum to {listed[fam]:.3f} ms > family total "
                    f"{total:.3f} ms"
                )
            if rest > 1e-6:
                kernels.append(
                    {
                        "name": f"(rest of the {fam} family: kernels not listed one by one)",
                        "family": fam,
                        "ms": rest,
                        "calls": None,
                        "remainder": True,
                    }
                )
        kernels.sort(key=lambda r: -r["ms"])
        tables.append(
            {
                "config": "the ladder's last rung (every switch of python -m helpers.ladder on, "
                "as of the perf.py run), GPT-2 124M",
                "batch_size": row["batch_size"],
                "seq_len": 1024,
                "steps_profiled": 3,
                "step_ms": row["ms_per_step"],
                "step_ms_how": (
                    "median of 10 CUDA-event-timed steps after 3 warm-up steps (not profiled)"
                ),
                "kernels": kernels,
                "families_ms": family_totals(kernels),
            }
        )
    if not tables:
        raise ValueError(
            "no 'final' row with a 'profile' in this perf.py file: "
            "run it with --variants final --profile"
        )
    tables.sort(key=lambda t: t["batch_size"])
    counts = sorted(set(n_listed.values()))
    how_many = (
        f"{counts[0]} largest"
        if len(counts) == 1
        else "largest (" + ", ".join(f"{n} at B={b}" for b, n in sorted(n_listed.items())) + ")"
    )
    return {
        "format": TABLE_FORMAT,
        "what": (
            "device time (ms per training step) of each CUDA kernel, torch.profiler over 3 steps"
        ),
        "device": perf["device"],
        "torch": perf["torch"],
        "cuda": cuda,
        "date": date,
        "source": source,
        "derived": f"listed kernels are perf.py's {how_many}, as measured; "
        "each '(rest of the ... family)' row is that family's measured total minus its listed "
        "kernels",
        "tables": tables,
    }


def table_from_profile(
    prof: StepProfile, config: str, batch_size: int, seq_len: int, step_ms: float, command: str
) -> dict:
    """One entry of a profile table (see :func:`save_table`) from a fresh :class:`StepProfile`."""
    return {
        "config": config,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "steps_profiled": prof.steps,
        "step_ms": step_ms,
        "step_ms_how": (
            "median of 10 timed steps after 3 warm-up steps "
            "(helpers.measure.timing.measure, not profiled)"
        ),
        "kernels": [{**r, "remainder": False} for r in prof.kernels],
        "families_ms": prof.families_ms(),
        "phases_ms": prof.phases_ms,
        "busy_ms": prof.busy_ms,
        "span_ms": prof.span_ms,
        "host_ms": prof.host_ms,
        "command": command,
    }


def load_table(name: str = SHIPPED_TABLE, batch_size: int = 16) -> tuple[dict, dict] | None:
    """(provenance, table) of the committed profile table ``name`` for ``batch_size``, or None when
    the file is not found (see :func:`helpers.measure.results.load`).

    Raises:
        KeyError: if the file has no table for ``batch_size``.
    """
    from helpers.measure import results

    data = results.load(name)
    if data is None:
        return None
    for t in data["tables"]:
        if t["batch_size"] == batch_size:
            provenance = {k: v for k, v in data.items() if k != "tables"}
            return provenance, t
    raise KeyError(
        f"{name} has no table for B={batch_size}: "
        f"it has B={[t['batch_size'] for t in data['tables']]}"
    )


def provenance_line(provenance: dict, table: dict) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130, CUDA 13.0, measured 2026-11-29, B=16, T=1024' and, on a
    second line indented two spaces, 'source: ...' (two lines, so neither passes 100 columns)."""
    cuda = f", CUDA {provenance['cuda']}" if provenance.get("cuda") else ""
    return (
        f"{provenance['device']}, torch {provenance['torch']}{cuda}, "
        f"measured {provenance['date']}, B={table['batch_size']}, T={table['seq_len']}\n"
        f"  source: {provenance['source']}"
    )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def final_rung(
    batch_size: int,
    seq_len: int,
    device: torch.device | str,
    eager: bool = False,
    taught_by: str | None = None,
):
    """The ladder's last rung that runs on this device (every switch it can run, see
    :func:`helpers.ladder.last_runnable`) as a RunConfig named "final rung"; with ``taught_by``
    (a chapter number) the last one whose switches are all taught by that chapter, named for its
    rung ("the ladder up to '+ vocab 50304'"). ``eager=True`` drops torch.compile (seconds instead
    of minutes to build).

    Raises:
        ValueError: if no such rung can run on ``device``.
    """
    from helpers.ladder import last_runnable

    run = last_runnable(batch_size, seq_len, torch.device(device), taught_by=taught_by)
    name = "final rung" if taught_by is None else f"the ladder up to '{run.name}'"
    return run.replace(
        name=name + (", eager" if eager else ""), compile=None if eager else run.compile
    )


TAUGHT_BY = "09"  # chapter 10 profiles what chapters 01-09 taught


def chapter_rung(batch_size: int, seq_len: int, device: torch.device | str, eager: bool = False):
    """The step chapter 10 profiles: :func:`final_rung` with ``taught_by=TAUGHT_BY``, the ladder's
    last rung that runs here and whose switches chapters 01-09 teach (the switch registry names
    each switch's chapter)."""
    return final_rung(batch_size, seq_len, device, eager, taught_by=TAUGHT_BY)


def ratio_rows(prof: StepProfile, num: str = "backward", den: str = "forward") -> list[list[str]]:
    """Rows [family, den ms, num ms, num / den] of a profile, one per family with kernel time in
    either phase (largest ``num`` first), then "all kernels"; ms per step, the ratio "-" where
    the ``den`` time is 0. For :func:`helpers.measure.results.markdown_table`."""
    fwd = prof.phase_families_ms.get(den, {})
    bwd = prof.phase_families_ms.get(num, {})
    fams = sorted(set(fwd) | set(bwd), key=lambda f: -bwd.get(f, 0.0))

    def row(label: str, a: float, b: float, ratio: float | None) -> list[str]:
        return [label, f"{a:.2f}", f"{b:.2f}", "-" if ratio is None else f"{ratio:.2f}"]

    rows = [row(f, fwd.get(f, 0.0), bwd.get(f, 0.0), prof.phase_ratio(num, den, f)) for f in fams]
    total = row(
        "all kernels",
        prof.phases_ms.get(den, 0.0),
        prof.phases_ms.get(num, 0.0),
        prof.phase_ratio(num, den),
    )
    return rows + [total]


def describe(run) -> str:
    """'name: matmul_precision=..., autocast=..., ...': the switches of a RunConfig on one line."""
    from helpers import switches

    keys = (*switches.rung_fields(), "grad_clip")
    return f"{run.name}: " + ", ".join(f"{k}={getattr(run, k)}" for k in keys)


# A trace torch.profiler's export_chrome_trace wrote: a JSON object with "traceEvents".
TRACE_KIND = cli.json_with_keys("traceEvents")


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    from helpers import bench
    from helpers.core import data
    from helpers.core.train import build, default_shapes
    from helpers.measure import hardware

    p = argparse.ArgumentParser(
        prog="python -m helpers.chapters.ch10_profiling", description=__doc__.splitlines()[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "table", help="profile the ladder's last rung and write a profile table (JSON)"
    )
    t.add_argument("--out", required=True, type=Path)
    cli.add_force(t)
    t.add_argument(
        "--batch-size", type=int, nargs="+", default=None, help="default: 16 64 on CUDA, 4 on a CPU"
    )
    t.add_argument("--steps", type=int, default=3, help="active profiled steps (default 3)")
    t.add_argument("--eager", action="store_true", help="without torch.compile")
    t.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="also write the Chrome trace of the last batch size",
    )
    t.add_argument(
        "--warmup", type=int, default=3, help="untimed steps before the timed ones (default 3)"
    )
    t.add_argument(
        "--iters", type=int, default=10, help="timed steps for step_ms, median (default 10)"
    )
    r = sub.add_parser(
        "run", help="run the step alone (NVTX ranges, cudaProfilerStart/Stop) for Nsight Systems"
    )
    r.add_argument("--batch-size", type=int, default=None, help="default: train.default_shapes")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=5)
    r.add_argument("--eager", action="store_true", help="without torch.compile")
    r.add_argument(
        "--chapter-step",
        action="store_true",
        help="chapter 10's step (chapter_rung: switches taught by chapter 09) instead of the "
        "ladder's last rung",
    )
    f = sub.add_parser(
        "from-perf", help="derive a profile table from benchmarks/perf.py --profile output"
    )
    f.add_argument("perf_json", type=Path)
    f.add_argument("--out", required=True, type=Path)
    cli.add_force(f)
    f.add_argument(
        "--date", required=True, help="the date the perf.py run was measured, YYYY-MM-DD"
    )
    f.add_argument(
        "--cuda", default=None, help="CUDA version of that run (perf.py did not record it)"
    )
    args = p.parse_args(argv)

    for name in ("steps", "iters"):
        cli.at_least(name, getattr(args, name, None))
    cli.at_least("warmup", getattr(args, "warmup", None), 0)
    sizes_asked = getattr(args, "batch_size", None)
    for b in sizes_asked if isinstance(sizes_asked, list) else [sizes_asked]:
        cli.at_least("batch_size", b)
    cli.result_out(getattr(args, "out", None), ("tables",), force=getattr(args, "force", False))
    # the trace is written at the end of the run: its path is checked by the same rule now
    cli.out_path(
        getattr(args, "trace", None),
        "--trace",
        ".json",
        force=getattr(args, "force", False),
        same_kind=TRACE_KIND,
        what=" and is not a profiler trace",
    )
    if args.command == "from-perf":
        try:
            datetime.date.fromisoformat(args.date)
        except ValueError:
            raise ValueError(
                f"--date {args.date!r}: write the date of the perf.py run as YYYY-MM-DD"
            ) from None
        perf = json.loads(args.perf_json.read_text())
        if not isinstance(perf, dict) or not isinstance(perf.get("rows"), list):
            raise ValueError(
                f"{args.perf_json} is not the output of benchmarks/perf.py --profile "
                "(no 'rows' list)"
            )
        table = table_from_perf_json(
            perf,
            source=f"{args.perf_json.as_posix()} (benchmarks/perf.py --profile)",
            date=args.date,
            cuda=args.cuda,
        )
        args.out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {args.out} ({len(table['tables'])} tables)")
        return 0

    device = hardware.default_device()
    cfg, B0, T = default_shapes(device)
    tokens = data.load_tokens()
    if args.command == "run":
        B = B0 if args.batch_size is None else args.batch_size
        rung = chapter_rung if args.chapter_step else final_rung
        trainer = build(rung(B, T, device, args.eager), cfg, device)
        loader = data.BatchLoader(tokens, B, T, device)
        for _ in range(args.warmup):
            step_with_ranges(trainer, loader)
        synchronize(device)
        ranges = torch.cuda.nvtx.range if device.type == "cuda" else torch.profiler.record_function
        capture = (
            torch.cuda.profiler.profile() if device.type == "cuda" else contextlib.nullcontext()
        )
        # cudaProfilerStart / Stop: nsys --capture-range=cudaProfilerApi records only this
        with capture:
            t0 = time.perf_counter()
            for i in range(args.steps):
                with ranges(f"step {i}"):
                    step_with_ranges(trainer, loader, ranges)
            synchronize(device)
            ms = 1e3 * (time.perf_counter() - t0) / args.steps
        print(
            f"{describe(trainer.run)}; B={B}, T={T} on "
            f"{hardware.summary(device, probe_sdpa=False).name}: "
            f"{ms:.1f} ms/step over {args.steps} steps (host clock, synchronised at the end)"
        )
        return 0

    sizes = (
        args.batch_size
        if args.batch_size is not None
        else ([16, 64] if device.type == "cuda" else [B0])
    )
    tables = []
    command = "python -m helpers.chapters.ch10_profiling " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    for i, B in enumerate(sizes):
        run = final_rung(B, T, device, args.eager)
        trace = args.trace if (args.trace is not None and i == len(sizes) - 1) else None
        row = bench.measure(
            run,
            cfg,
            device,
            tokens,
            args.warmup,
            args.iters,
            after=lambda trainer, loader, trace=trace: {
                "profile": profile_steps(trainer, loader, active=args.steps, trace_path=trace)
            },
        )
        if row["status"] != "measured":
            raise RuntimeError(f"B={B}: {row['status']}: {row['reason']}")
        step_ms, prof = row["ms_per_step"], row["profile"]
        entry = table_from_profile(prof, describe(run), B, T, step_ms, command)
        entry["step_ms_how"] = (
            f"median of {args.iters} timed steps after {args.warmup} warm-up steps "
            "(helpers.bench.measure, not profiled)"
        )
        tables.append(entry)
        fams = ", ".join(f"{k} {v:.2f}" for k, v in prof.families_ms().items())
        print(f"B={B}: {step_ms:.1f} ms/step; device time by family (ms/step): {fams}", flush=True)
        for note in prof.notes:
            print(f"B={B}: note: {note}")
    out = {
        "format": TABLE_FORMAT,
        "what": (
            "device time (ms per training step) of each CUDA kernel"
            if device.type == "cuda"
            else "self CPU time (ms per training step) of each aten operator"
        )
        + f", torch.profiler over {args.steps} steps",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "date": datetime.date.today().isoformat(),
        "source": command,
        "derived": None,
        "tables": tables,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
