"""Chapter 14: GPU memory in depth: the caching allocator, memory snapshots, fragmentation.

What only this chapter needs: three recorded steps of one trainer (the first, a steady one, one
with ``zero_grad(set_to_none=False)``) with per-phase allocator statistics and a snapshot of the
allocator's history; the categories a block at the peak belongs to; the switches that change the
peak; the fragmentation pattern in fresh processes; and the command that writes the committed
summary (the estimates and the emulated A100 40GB check: :mod:`helpers.chapters.ch14_estimate`):

    python -m helpers.chapters.ch14_memory record [--out results/h200-memory-DATE.json]
        [--plot results/h200-memory-DATE.png] [--force]
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import torch

import helpers
from helpers.chapters import ch14_estimate as estimate
from helpers.chapters.ch14_estimate import gib, size
from helpers.core import data, train
from helpers.core.model import GPTConfig
from helpers.measure import allocator, hardware, memory, profiler, results, snapshot
from helpers.tools import cli

RESULT_GLOB = "h200-memory-*.json"  # what `record` writes; the newest is the committed one
VIEWER_DIR = Path("traces")  # the snapshot viewer, next to the notebook (as chapter 10's trace)


def chapter_run(device: torch.device | str) -> tuple[train.RunConfig, GPTConfig]:
    """The step the chapter opens: fp32 with manual attention (the course's most memory-hungry
    step, the one ``train.default_shapes`` sizes B for) at :func:`train.default_shapes`."""
    cfg, B, T = train.default_shapes(device)
    return train.RunConfig(name="fp32", batch_size=B, seq_len=T), cfg


# --------------------------------------------------------------------------------------------
# Recording steps
# --------------------------------------------------------------------------------------------


@dataclass
class Steps:
    """Recorded steps of one trainer (:func:`record_steps`). Bytes throughout."""

    run: train.RunConfig
    model_config: GPTConfig
    device: torch.device
    capture: snapshot.Capture
    timeline: snapshot.Timeline
    phases: list[dict]  # one row per phase: step, phase, start, peak, end, reserved, trace_peak
    addresses: dict[str, set[int]]  # parameters, gradients, adamw_state: storages at the end
    trainer: train.Trainer | None  # None once released

    def release(self) -> None:
        """Drop the trainer (its parameters, gradients and AdamW state)."""
        self.trainer = None

    def step_window(self, step: int) -> tuple[int, int]:
        """The events of step ``step``: from its first phase to the next step's (or the end)."""
        return self.timeline.window(f"{step}:", (f"{step + 1}:", "after"))

    def step_peak(self, step: int) -> dict:
        """{"index", "bytes", "phase"} of the snapshot's peak in step ``step``, and
        "max_allocated": the allocator's peak of the same phases (CUDA; None on a CPU)."""
        start, stop = self.step_window(step)
        i = self.timeline.peak_in(start, stop)
        mine = [r["peak"] for r in self.phases if r["step"] == step and r["reserved"] is not None]
        return {
            "index": i,
            "bytes": self.timeline.bytes[i],
            "phase": self.timeline.phase_at(i).split(":", 1)[1],
            "max_allocated": max(mine) if mine else None,
        }


def record_steps(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    plan: tuple[tuple[int, bool], ...] = ((1, True), (2, True), (3, False)),
    warmup: int = 0,
) -> Steps:
    """Build ``run``, take ``warmup`` unrecorded steps, then record the steps of ``plan`` ((step
    number, ``set_to_none`` of its zero_grad), each through
    :func:`helpers.measure.profiler.step_with_ranges`) in one snapshot, with phase markers and,
    on CUDA, the allocator's statistics per phase (:class:`helpers.measure.allocator.PhaseStats`).
    Batches: Tiny Shakespeare, the run's B and T."""
    device = torch.device(device)
    trainer = train.build(run, model_config, device)
    loader = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, device)
    for _ in range(warmup):
        trainer.step(loader)
    markers = snapshot.Markers(device)
    stats = allocator.PhaseStats(device, markers)

    def steps() -> None:
        for step, set_to_none in plan:
            stats.prefix = f"{step}:"
            profiler.step_with_ranges(trainer, loader, stats, set_to_none=set_to_none)

    cap = snapshot.record(steps, device, markers)
    tl = snapshot.timeline(cap.snapshot, cap.device_index, cap.markers)
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    params = list(trainer.model.parameters())
    addresses = {
        "parameters": {ptr(p) for p in params},
        "gradients": {ptr(p.grad) for p in params if p.grad is not None},
        "adamw_state": {
            ptr(t)
            for state in trainer.optimizer.state.values()
            for t in state.values()
            if torch.is_tensor(t) and t.device.type == device.type
        },
    }
    return Steps(
        run, model_config, device, cap, tl, _phase_rows(tl, stats.rows), addresses, trainer
    )


def _phase_rows(tl: snapshot.Timeline, measured: list[dict]) -> list[dict]:
    """One row per recorded phase: the allocator's numbers where it counted them (CUDA), else
    the trace's; "trace_peak" is the snapshot's own peak of the phase and "requested_peak" the
    allocator's peak of requested bytes in it (CUDA; the two count the same bytes)."""
    by_name = {r["phase"]: r for r in measured}
    rows = []
    for name, p in tl.phase_peaks().items():
        if ":" not in name:
            continue  # the "after" marker
        step, phase = name.split(":", 1)
        m = by_name.get(name)
        rows.append(
            {
                "step": int(step),
                "phase": phase,
                "start": m["allocated_start"] if m else p["start"],
                "peak": m["peak"] if m else p["peak"],
                "end": m["allocated_end"] if m else p["end"],
                "reserved": m["reserved_end"] if m else None,
                "requested_peak": m["requested_peak"] if m else None,
                "trace_peak": p["peak"],
            }
        )
    return rows


def phase_table(rows: list[dict], unit: str = "GiB") -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the phases' memory in ``unit``, for ``results.markdown_table``."""
    what = ("allocated at start", "peak in phase", "allocated at end", "reserved at end")
    header = ["step", "phase", *(f"{w} ({unit})" for w in what)]
    keys = ("start", "peak", "end", "reserved")
    cells = [[r["step"], r["phase"], *(size(r[k], unit) for k in keys)] for r in rows]
    return header, cells


def cache_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of :func:`helpers.measure.allocator.empty_cache_effect` in GiB."""
    header = ["moment", "allocated (GiB)", "reserved (GiB)", "segments"]
    return header, [
        [r["when"], gib(r["allocated"]), gib(r["reserved"]), r["segments"]] for r in rows
    ]


def parts_table(
    parts: dict[str, int], total: int, unit: str = "GiB"
) -> tuple[list[str], list[list[str]]]:
    """(header, rows): category | bytes in ``unit`` | share of the peak."""
    rows = [[name, size(b, unit), f"{100 * b / total:.1f}%"] for name, b in parts.items()]
    return ["alive at the peak", unit, "share"], rows


def first_step_findings(steps: Steps, unit: str = "GiB") -> list[str]:
    """Sentences computed from the three recorded steps: each step's peak and its phase, what
    step 2 starts its forward with that step 1 did not (AdamW's state, made in step 1's
    ``optimizer.step()``), and what ``zero_grad(set_to_none=False)`` keeps (step 3)."""
    n = sum(p.numel() for p in steps.trainer.model.parameters()) if steps.trainer else None
    at = {(r["step"], r["phase"]): r for r in steps.phases}
    out = []
    for step in sorted({r["step"] for r in steps.phases}):
        peak = max((r for r in steps.phases if r["step"] == step), key=lambda r: r["peak"])
        out.append(f"step {step}: peak {size(peak['peak'], unit)} {unit}, in {peak['phase']}")
    for (a, b), what, per_param in (((1, 2), "AdamW state", 8), ((2, 3), "gradients", 4)):
        if (a, "forward") in at and (b, "forward") in at:
            extra = at[(b, "forward")]["start"] - at[(a, "forward")]["start"]
            expect = (
                f", of which the {what} {'are' if what.endswith('s') else 'is'} "
                f"{size(per_param * n, unit)} {unit} ({per_param} bytes"
                f" x {n:,} parameters)"
                if n
                else f": the {what}"
            )
            out.append(
                f"forward of step {b} starts with {size(extra, unit)} {unit} more than step {a}"
                f"{expect}"
            )
    return out


# --------------------------------------------------------------------------------------------
# What holds the peak
# --------------------------------------------------------------------------------------------


def category_rules(steps: Steps) -> list:
    """The rules of :func:`helpers.measure.snapshot.attribute` for this trainer's blocks: the
    storages of its parameters, gradients and AdamW state (alive when the snapshot was taken),
    then tensors recognised by their size: (B, T, V) logits-sized ones, (B, nh, T, T) attention
    scores (made in ``manual_attention`` when made in the forward: the small CPU model's MLP
    output has the same size), and under autocast the 16-bit copies of the matmul weights made in
    the forward."""
    run, cfg = steps.run, steps.model_config
    B, T, V = run.batch_size, run.seq_len, cfg.padded_vocab_size
    addr = steps.addresses
    widths = (2, 4) if run.autocast is not None else (4,)  # bytes per number they come in
    logits = {B * T * V * k for k in widths}
    scores = {B * cfg.n_head * T * T * k for k in widths}
    C = cfg.n_embd
    weights = {2 * n for n in (3 * C * C, C * C, 4 * C * C, V * C)}
    rules = [
        (name, lambda b, s=addr[key]: b["address"] in s and b["freed"] is None)
        for name, key in (
            ("parameters", "parameters"),
            ("gradients", "gradients"),
            ("AdamW state", "adamw_state"),
        )
    ]

    def made_by(b: dict, name: str) -> bool:  # a forward block's frames name its maker
        return not b["phase"].endswith("forward") or any(
            name in f"{f.get('filename', '')} {f.get('name', '')}" for f in b["frames"]
        )

    rules += [
        ("logits-sized (B, T, V)", lambda b: b["size"] in logits),
        (
            "(T, T) attention scores",
            lambda b: b["size"] in scores and made_by(b, "manual_attention"),
        ),
    ]
    if run.autocast is not None:
        rules.append(
            (
                "16-bit weight copies",
                lambda b: b["size"] in weights and b["phase"].endswith("forward"),
            )
        )
    return rules


def default_category(block: dict) -> str:
    """A block no rule names: by the phase that allocated it."""
    phase = block["phase"].split(":")[-1]
    if phase == "forward":
        return "activations (saved for backward)"
    if phase == "backward":
        return "made in backward (activation gradients)"
    return "other, from before the step" if phase == "before" else f"other ({phase})"


def peak_blocks(steps: Steps, step: int = 2) -> tuple[dict[str, int], list[dict]]:
    """({category: bytes}, the blocks alive at the snapshot's peak of ``step``, largest first,
    each with its "category" and "where" (the course's line that allocated it))."""
    blocks = snapshot.live_at(steps.timeline, steps.step_peak(step)["index"])
    rules = category_rules(steps)
    for b in blocks:
        b["category"] = next((n for n, test in rules if test(b)), None) or default_category(b)
        b["where"] = snapshot.where(b["frames"]) or (
            "autograd engine" if b["phase"].endswith("backward") else ""
        )
    parts = snapshot.attribute(blocks, [], default=lambda b: b["category"])
    return parts, sorted(blocks, key=lambda b: -b["size"])


def largest_table(blocks: list[dict], n: int = 8) -> tuple[list[str], list[list[str]]]:
    """(header, rows): the ``n`` largest blocks at the peak (MiB, category, phase, where)."""
    header = ["MiB", "category", "allocated in", "by"]
    cells = [
        [f"{b['size'] / 2**20:,.1f}", b["category"], b["phase"].split(":")[-1], b["where"] or "-"]
        for b in blocks[:n]
    ]
    return header, cells


# --------------------------------------------------------------------------------------------
# What changes the peak
# --------------------------------------------------------------------------------------------


def variants(device: torch.device | str) -> list[tuple[str, dict]]:
    """The switches the chapter adds one after the other, as (name, RunConfig changes): 16-bit
    autocast (bf16; fp16 + GradScaler without native bf16, :func:`train.recipe_autocast`), SDPA,
    the fused LM-head cross-entropy, activation checkpointing of every block."""
    ac = train.recipe_autocast(device) or "bf16"  # a CPU without fast bf16: skipped, with why
    return [
        (f"+ {ac} autocast", {"autocast": ac}),
        ("+ SDPA", {"attention": "sdpa"}),
        ("+ fused LM-head CE", {"loss_kernel": "fused"}),
        ("+ checkpoint every block", {"checkpoint_every": 1}),
    ]


VARIANT_SWITCHES = ("autocast", "attention", "loss_kernel", "checkpoint_every")


def measure_variants(
    run: train.RunConfig,
    cfg: GPTConfig,
    device: torch.device | str,
    n_blocks: int = 3,
    first: Steps | None = None,
) -> list[dict]:
    """``run``, then each of :func:`variants` added to the last one that ran: one step after a
    warm-up step, recorded. Rows {"name", "status" ("measured" or "skipped"), "reason",
    "switches", "peak" (the snapshot's, bytes), "max_allocated" (CUDA), "phase", "estimate"
    (``memory.peak_estimate``; None where not modelled), "categories", "largest" (the
    ``n_blocks`` largest blocks at the peak)}. A switch the device cannot run (or runs far too
    slowly: ``train.slow_reason``) is skipped with the reason and left out of the later rows.
    ``first``: :func:`record_steps` of ``run`` already taken (its step 2 is the first row)."""
    device = torch.device(device)
    rows, base = [], None
    for name, change in [(f"{run.name}, manual attention", {}), *variants(device)]:
        candidate = (base or run).replace(name=name, **change)
        why = train.unsupported_reason(candidate, device) or train.slow_reason(candidate, device)
        row = {"name": name, "switches": {k: getattr(candidate, k) for k in VARIANT_SWITCHES}}
        if why is not None:
            rows.append({**row, "status": "skipped", "reason": why})
            continue
        base = candidate
        if first is not None and not change:
            steps = first
        else:
            steps = record_steps(candidate, cfg, device, plan=((2, True),), warmup=1)
        peak = steps.step_peak(2)
        parts, blocks = peak_blocks(steps, 2)
        est = estimate.run_estimate(candidate, steps.model_config)
        keep = ("size", "category", "where")
        rows.append(
            {
                **row,
                "status": "measured",
                "reason": "ok",
                "peak": peak["bytes"],
                "max_allocated": peak["max_allocated"],
                "phase": peak["phase"],
                "estimate": est["total"] if est else None,
                "categories": parts,
                "largest": [{k: b[k] for k in keep} for b in blocks[:n_blocks]],
            }
        )
        if steps is not first:
            steps.release()
        memory.reset_peak(device)
    return rows


def variant_table(rows: list[dict], unit: str = "GiB") -> tuple[list[str], list[list[str]]]:
    """(header, rows): variant | peak | chapter 14's estimate (``unit``) | in phase | largest
    blocks (MiB)."""
    header = [
        "switches",
        f"peak ({unit})",
        f"estimate ({unit})",
        "peak in",
        "largest blocks at the peak (MiB)",
    ]
    cells = []
    for r in rows:
        if r["status"] != "measured":
            cells.append([r["name"], "-", "-", "-", f"skipped: {r['reason']}"])
            continue
        big = "; ".join(f"{b['size'] / 2**20:,.0f} {b['category']}" for b in r["largest"])
        cells.append([r["name"], size(r["peak"], unit), size(r["estimate"], unit), r["phase"], big])
    return header, cells


# --------------------------------------------------------------------------------------------
# Fragmentation, and the emulated A100 40GB
# --------------------------------------------------------------------------------------------


def fragmentation_runs(cap_bytes: int | None = None) -> list[dict]:
    """The fragmentation pattern without, then with expandable segments, each in a fresh process
    (:func:`helpers.measure.allocator.run_fragmentation`), under ``cap_bytes`` (default: the
    emulated GPU's memory while emulating, else the whole GPU)."""
    if cap_bytes is None and hardware.emulated_profile() is not None:
        cap_bytes = hardware.usable_memory_bytes("cuda")
    return [allocator.run_fragmentation(e, cap_bytes) for e in (False, True)]


def fragmentation(free: int, largest_free: int) -> float:
    """1 - largest free block / free bytes: 0 when the free memory is one block, near 1 when it is
    many small ones (0.0 when nothing is free)."""
    return 1 - largest_free / free if free else 0.0


def fragmentation_table(runs: list[dict]) -> tuple[list[str], list[list[str]]] | None:
    """(header, rows) of :func:`fragmentation_runs` in GiB, with the fragmentation before the
    request (:func:`fragmentation`); None if nothing was measured."""
    if not any(r.get("status") == "measured" for r in runs):
        return None
    header = [
        "expandable segments",
        "reserved (GiB)",
        "allocated (GiB)",
        "reserved - allocated (GiB)",
        "largest free block (GiB)",
        "fragmentation",
        "request (GiB)",
        "outcome",
        "reserved after (GiB)",
        "peak reserved (GiB)",
    ]
    cells = []
    for r in runs:
        if r.get("status") != "measured":
            cells.append(["?", *["-"] * 6, r.get("status"), "-", "-"])
            continue
        b, a = r["before"], r["after"]
        cells.append(
            [
                str(r["expandable_segments"]),
                gib(b["reserved"]),
                gib(b["allocated"]),
                gib(b["free_in_segments"]),
                gib(b["largest_free"]),
                f"{fragmentation(b['free_in_segments'], b['largest_free']):.2f}",
                gib(r["request_bytes"]),
                r["outcome"],
                gib(a["reserved"]),
                gib(a["peak_reserved"]),
            ]
        )
    return header, cells


# --------------------------------------------------------------------------------------------
# The committed summary
# --------------------------------------------------------------------------------------------


def committed() -> tuple[dict | None, str]:
    """(the newest committed ``results/h200-memory-*.json``, its name); (None, the pattern) when
    none is there."""
    folder = results.results_dir()
    found = sorted(folder.glob(RESULT_GLOB)) if folder else []
    if not found:
        return None, RESULT_GLOB.replace("*", "<date>")
    return json.loads(found[-1].read_text()), found[-1].name


def step_plot(points, phases, title: str, marks: dict | None = None):
    """The memory timeline of one recorded step (``plots.memory_timeline``), the step's number
    taken off the phase names."""
    from helpers.measure import plots

    return plots.memory_timeline(
        points, [(i, n.split(":", 1)[-1]) for i, n in phases], title, marks
    )


def snapshot_summary(steps: Steps, step: int = 2) -> dict:
    """The JSON-sized summary of step ``step``'s snapshot: its peak (bytes, phase), the
    allocator's peak (``max_allocated``, block sizes) and requested-bytes peak of the same phases,
    the snapshot's difference to the first (``agreement_pct``), the
    categories and the ten largest blocks at the peak, at most ~400 timeline points, the phases,
    and the two estimates."""
    peak = steps.step_peak(step)
    parts, blocks = peak_blocks(steps, step)
    start, stop = steps.step_window(step)
    mine = [r for r in steps.phases if r["step"] == step]
    requested = [r["requested_peak"] for r in mine if r["requested_peak"] is not None]
    m = peak["max_allocated"]
    run, cfg = steps.run, steps.model_config
    return {
        "step": step,
        "peak_bytes": peak["bytes"],
        "peak_phase": peak["phase"],
        "max_allocated": m,
        "agreement_pct": None if not m else 100 * (peak["bytes"] / m - 1),
        "requested_peak": max(requested) if requested else None,
        "consistent": steps.timeline.consistent,
        "categories": parts,
        "largest": [{k: b[k] for k in ("size", "category", "phase", "where")} for b in blocks[:10]],
        "points": steps.timeline.points(400, start, stop),
        "phases": [p for p in steps.timeline.phases if start <= p[0] < stop],
        "estimate": estimate.run_estimate(run, cfg),
        "ch03_estimate": memory.training_step_estimate(
            cfg, run.batch_size, run.seq_len, run.autocast is not None, run.attention == "manual"
        ),
        "estimate_rows": estimate.estimate_rows(run, cfg, parts, peak["bytes"]),
    }


def run_all(device: torch.device | str) -> dict:
    """Everything the committed summary holds, measured on ``device`` (a GPU: the CPU has no
    allocator statistics, fragmentation or emulation)."""
    device = torch.device(device)
    run, cfg = chapter_run(device)
    steps = record_steps(run, cfg, device)
    out = {
        **results.provenance(device),
        "what": "chapter 14: the caching allocator, a memory "
        "snapshot of one training step, the switches that change the peak, fragmentation",
        "config": {"run": dataclasses.asdict(run), "model": dataclasses.asdict(cfg)},
        "phases": steps.phases,
        "snapshot": snapshot_summary(steps),
    }
    out["empty_cache"] = allocator.empty_cache_effect(device, steps.release)
    memory.reset_peak(device)
    out["variants"] = measure_variants(run, cfg, device, first=steps)
    del steps
    memory.reset_peak(device)
    out["fragmentation"] = {
        "this GPU": fragmentation_runs(),
        "15 GB cap (a T4)": fragmentation_runs(hardware.T4_USABLE_BYTES),
    }
    out["a100_40gb"] = estimate.a100_check()
    return out


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.chapters.ch14_memory record [--out FILE.json] [--plot FILE.png]
    [--force]`` (defaults: ``results/h200-memory-<today>.json`` and ``.png``, on an H200 only)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m helpers.chapters.ch14_memory",
        description="Chapter 14's measurements (JSON and a PNG).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="measure everything and write the summary")
    r.add_argument("--out", default=None, help="JSON (default results/h200-memory-<date>.json)")
    r.add_argument("--plot", default=None, help="PNG of the step's timeline (default: beside)")
    r.add_argument("--device", default=None, help="default: cuda")
    cli.add_force(r, "--out/--plot")
    args = p.parse_args(argv)

    def outputs(out) -> tuple[Path, Path]:  # refused before anything runs
        json_path = cli.out_path(out, "--out", ".json", force=args.force, same_kind=lambda _: 0)
        png = args.plot or json_path.with_suffix(".png")
        return json_path, cli.out_path(
            png, "--plot", ".png", force=args.force, same_kind=lambda _: 0
        )

    if args.out is not None:
        out, plot = outputs(args.out)
    device = cli.device(args.device or "cuda")
    if args.out is None:
        if "H200" not in torch.cuda.get_device_name(device):
            raise ValueError("the default file name is the course's H200's: give --out FILE.json")
        out, plot = outputs(
            helpers.REPO_ROOT / "results" / f"h200-memory-{datetime.date.today()}.json"
        )
    summary = run_all(device)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    from helpers.measure import plots

    s = summary["snapshot"]
    fig = step_plot(
        s["points"],
        s["phases"],
        f"{run_title(summary)}, step {s['step']}",
        {"max_memory_allocated": s["max_allocated"]},
    )
    plots.save_png(fig, plot, "ch14-memory")
    print(f"wrote {out} ({out.stat().st_size / 1e3:.0f} kB) and {plot}")
    return 0


def run_title(summary: dict) -> str:
    """ "fp32, B=16, T=1024, on NVIDIA H200" from a summary's config and provenance."""
    run = summary["config"]["run"]
    return f"{run['name']}, B={run['batch_size']}, T={run['seq_len']}, on {summary['device']}"


if __name__ == "__main__":
    raise SystemExit(main())
