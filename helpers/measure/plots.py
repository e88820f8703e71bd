"""The course's matplotlib figures."""

from __future__ import annotations

from pathlib import Path

# Every PNG the course's tools write carries this in its "Software" text chunk, so a tool can
# recognise (and replace without --force) a figure it wrote before.
PNG_SOFTWARE = "fast-gpt2-course"


def save_png(fig, path: str | Path, kind: str, dpi: int = 120) -> None:
    """Save ``fig`` as a PNG at ``path``, marked as the course's (:data:`PNG_SOFTWARE`) and as
    ``kind``'s (its "Title" text chunk: the tool that wrote it, e.g. ``"ladder"``)."""
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": PNG_SOFTWARE, "Title": kind})


def is_course_png(path: str | Path, kind: str | None = None) -> bool:
    """Whether ``path`` is a PNG that :func:`save_png` wrote (its "Software" text chunk), as
    ``kind``'s when ``kind`` is given; False for any other file, including one that cannot be
    read."""
    try:
        from PIL import Image  # matplotlib depends on Pillow

        with Image.open(path) as im:
            ours = im.format == "PNG" and im.info.get("Software") == PNG_SOFTWARE
            return ours and (kind is None or im.info.get("Title") == kind)
    except (OSError, ValueError):
        return False


def ladder_bars(results: dict, path: str | Path | None = None):
    """Bar chart of ms/step per ladder rung (skipped/failed rungs drawn as empty, labelled).

    Returns the matplotlib Figure; saves it as PNG when ``path`` is given.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = results["rungs"]
    names = [r["name"] for r in rows]
    ms = [r["ms_per_step"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(
        range(len(rows)),
        ms,
        color=["tab:blue" if r["status"] == "measured" else "lightgrey" for r in rows],
    )
    for bar, r in zip(bars, rows, strict=False):
        measured = r["status"] == "measured"
        ax.annotate(
            f"{r['ms_per_step']:.1f}" if measured else r["status"],
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            # upright, neighbouring "skipped" labels wider than their bars run into one another
            rotation=0 if measured else 90,
        )
    ax.set_xticks(range(len(rows)), names, rotation=25, ha="right")
    ax.set_ylabel("ms per training step (median)")
    ax.set_title(_ladder_title(results), fontsize=9)
    fig.tight_layout()
    if path is not None:
        save_png(fig, path, "ladder")
        plt.close(fig)
    return fig


def matmul_bars(rows: list[dict], device_name: str):
    """Bar chart of achieved TFLOP/s per matmul mode (rows from ``timing.benchmark_matmul``),
    with the datasheet peak drawn as a marker where known. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(rows))
    ax.bar(
        x,
        [r["tflops"] or 0 for r in rows],
        color=["tab:blue" if r["status"] == "measured" else "lightgrey" for r in rows],
        label="measured",
    )
    peaks = [(i, r["peak_tflops"]) for i, r in enumerate(rows) if r.get("peak_tflops")]
    if peaks:
        ax.scatter(
            [i for i, _ in peaks],
            [p for _, p in peaks],
            marker="_",
            s=600,
            color="tab:red",
            label="datasheet peak",
        )
    for i, r in enumerate(rows):
        if r["status"] != "measured":
            ax.annotate("skipped", (i, 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [r["mode"] for r in rows])
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{rows[0]['n']}x{rows[0]['n']} matmul on {device_name}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def loss_curve(losses: list[float], title: str, reference: float | None = None):
    """Training loss (nats) against step; ``reference`` draws a dashed line (e.g. ln(vocab)).
    Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, label="training loss")
    if reference is not None:
        ax.axhline(reference, ls="--", color="grey", label=f"ln(vocab) = {reference:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_times(times_ms: list[float], title: str, first_timed: int = 0):
    """Time of each step in order (ms, log scale): the first steps' one-off costs stand out.
    Steps before ``first_timed`` are drawn as warm-up. Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = range(1, len(times_ms) + 1)
    ax.plot(steps, times_ms, marker="o")
    if first_timed:
        ax.axvspan(
            0.5, first_timed + 0.5, color="orange", alpha=0.2, label="warm-up (not reported)"
        )
        ax.legend(fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms, log scale)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def roofline(points: list[dict], peak_flops_per_s: float, bandwidth_bytes_per_s: float, title: str):
    """Roofline: attainable FLOP/s = min(peak, intensity × bandwidth) against arithmetic intensity
    (FLOP/byte, log-log), with measured ops as points (from ``timing.roofline_points``). Williams,
    Waterman & Patterson 2009, "Roofline" (https://doi.org/10.1145/1498765.1498785).
    Returns the Figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    lo = min(p["intensity"] for p in points) / 4
    hi = max(p["intensity"] for p in points) * 4
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(
        xs,
        np.minimum(peak_flops_per_s, xs * bandwidth_bytes_per_s) / 1e12,
        color="black",
        label="roof",
    )
    for p in points:
        ax.scatter(p["intensity"], p["flops_per_s"] / 1e12, s=40, zorder=3)
        ax.annotate(
            p["op"],
            (p["intensity"], p["flops_per_s"] / 1e12),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _plain_log_ticks(axis) -> None:
    """Label a log axis with plain numbers (0.5, 1, 2, 4 ...) instead of powers of the base."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))


def memory_vs_batch(batch_sizes, measured_bytes, estimated_bytes, limit_bytes, title: str):
    """Peak memory (GiB) against batch size, both on log2 axes (memory roughly doubles with B):
    measured points, each labelled with its difference to the estimate (percent), and the estimate
    as a line. ``measured_bytes`` entries may be None (not measurable here).

    ``limit_bytes`` (the device's memory, None on a CPU) is drawn dashed only when it is at most
    twice the largest value plotted; further above, a line would squeeze the data into the bottom
    of the plot, so the limit is named in the legend instead. Returns the Figure.
    """
    import math

    import matplotlib.pyplot as plt

    gib = 2**30
    est = [e / gib for e in estimated_bytes]
    pts = [(b, m / gib, e) for b, m, e in zip(batch_sizes, measured_bytes, est) if m is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(batch_sizes, est, label="estimate", color="tab:orange")
    if pts:
        ax.scatter(
            [b for b, _, _ in pts],
            [m for _, m, _ in pts],
            zorder=3,
            label="measured (max_memory_allocated)",
        )
        for b, m, e in pts:
            ax.annotate(
                f"{100 * (m / e - 1):+.0f}%",
                (b, m),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=7,
            )
    if limit_bytes:
        if limit_bytes / gib <= 2 * max(est + [m for _, m, _ in pts]):
            ax.axhline(limit_bytes / gib, ls="--", color="grey", label="device memory")
        else:
            ax.plot(
                [],
                [],
                ls="none",
                label=f"device memory {limit_bytes / gib:.0f} GiB (far above, not drawn)",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    # from the power of two below the data (so it carries a label) to room for the percentages
    shown = est + [m for _, m, _ in pts]
    ax.set_ylim(2 ** math.floor(math.log2(min(shown))), 1.3 * ax.get_ylim()[1])
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("batch size B (log2 axis)")
    ax.set_ylabel("peak memory (GiB, log2 axis)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput_vs_batch(batch_sizes, tokens_per_s, title: str):
    """tokens/s against batch size (log2 x axis). Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(batch_sizes, tokens_per_s, marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("tokens/s")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def loss_differences(curves: dict, reference: str, title: str):
    """Loss curves that lie on top of each other, and what differs between them.

    ``curves`` maps a run's name to its loss per step (nats; None or [] for a run that was
    skipped, named in the legend); every run saw the same batches, so the loss of run r at step
    i minus the ``reference`` run's loss at step i is what r's switch changed. Top panel: the
    losses; bottom panel: each run's loss minus the reference's (nats), with the zero line (the
    reference itself). Without a measured reference the bottom panel says so.
    Returns the Figure.
    """
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.3]}
    )
    ref = curves.get(reference) or None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, losses) in enumerate(curves.items()):
        color = colors[i % len(colors)]
        if not losses:
            top.plot([], [], ls="none", label=f"{name}: skipped")
            continue
        steps = range(1, len(losses) + 1)
        top.plot(steps, losses, color=color, label=name, alpha=0.8)
        if ref is not None and name != reference:
            gap = [a - b for a, b in zip(losses, ref, strict=True)]
            bottom.plot(steps, gap, color=color, marker=".", label=f"{name} - {reference}")
    if ref is not None:
        bottom.axhline(0.0, color="black", lw=0.8, label=f"{reference} (zero line)")
        bottom.legend(fontsize=8)
    else:
        bottom.text(
            0.5,
            0.5,
            f"no {reference} run measured here: nothing to subtract",
            transform=bottom.transAxes,
            ha="center",
            va="center",
            fontsize=9,
        )
    top.set_ylabel("training loss (nats)")
    top.set_title(title, fontsize=9)
    top.legend(fontsize=8)
    bottom.set_xlabel("step (same batch for every run)")
    bottom.set_ylabel(f"loss - {reference} loss (nats)")
    fig.tight_layout()
    return fig


def grad_scale(histories: dict, title: str):
    """GradScaler's loss scale S (log2 axis) against step, one line per run.

    ``histories`` maps a label to a dict with "grad_scale" (S before step 1, then after each
    step) and "skipped_steps" (1-based steps whose gradients held inf/NaN, so the optimizer step
    was skipped and S halved), as :func:`helpers.chapters.ch04_precision.train_recording` returns.
    A skipped step is marked with a red x at the scale that overflowed. Runs without a history
    (empty "grad_scale") are left out. Returns the Figure.
    """
    import math

    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 3.5))
    marked = False
    for label, h in histories.items():
        scales = h["grad_scale"]
        if not scales:
            continue
        ax.step(range(len(scales)), [math.log2(s) for s in scales], where="post", label=label)
        skipped = h["skipped_steps"]
        if skipped:
            ax.scatter(
                skipped,
                [math.log2(scales[i - 1]) for i in skipped],
                marker="x",
                color="tab:red",
                zorder=3,
                label=None if marked else "skipped step (inf/NaN gradient)",
            )
            marked = True
    # log2 of S on a linear axis, labelled 2^k: integer ticks at every few powers of two
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"$2^{{{v:.0f}}}$"))
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, math.floor(lo) - 1), max(hi, math.ceil(hi) + 1))
    ax.set_xlabel("step (0 = before the first step)")
    ax.set_ylabel("loss scale S (log2 axis)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def ladder_panels(results: dict):
    """Four bar charts of one ladder (the results dict of ``helpers.ladder.run_ladder``): ms/step
    on a log scale (so the last rungs' few-percent differences stay visible next to fp32's
    hundreds of ms), each bar labelled with its median and its steps' spread; the speed-up over
    the first measured rung; MFU (%); and peak memory (GiB). Rungs that did not run are drawn
    empty and labelled. Returns the matplotlib Figure (chapter 12's ``capstone.ladder_figure``)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = results["rungs"]
    panels = [
        ("ms_per_step", "ms per step (median, log scale)", 1.0),
        ("speedup", "speed-up over the first rung (x)", 1.0),
        ("mfu", "MFU (%)", 100.0),
        ("peak_mem_bytes", "peak memory (GiB)", 1 / 2**30),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    x = range(len(rows))
    for ax, (key, label, scale) in zip(axes.flat, panels, strict=True):
        vals = [(r.get(key) or 0.0) * scale for r in rows]
        colors = ["tab:blue" if r["status"] == "measured" else "lightgrey" for r in rows]
        if key == "ms_per_step":
            ax.set_yscale("log")
            # a rung that did not run has no bar on a log axis (nothing at 0), only its label
            low = min((v for v in vals if v > 0), default=1.0)
            vals = [v if v > 0 else float("nan") for v in vals]
        ax.bar(x, vals, color=colors)
        for i, r in enumerate(rows):
            if r["status"] != "measured":
                ax.annotate(
                    r["status"],
                    (i, 0),
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    rotation=90,
                )
            elif r.get(key) is None:
                ax.annotate(
                    "n/a",
                    (i, 0),
                    xycoords=("data", "axes fraction"),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            elif key == "ms_per_step":
                spread = r.get("spread_pct")
                text = f"{vals[i]:.1f}" + (f"\n{spread:.0f}%" if spread is not None else "")
                ax.annotate(text, (i, vals[i]), ha="center", va="bottom", fontsize=6.5)
            elif key == "speedup":
                ax.annotate(f"{vals[i]:.1f}", (i, vals[i]), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), [r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
        if not any(r.get(key) is not None for r in rows if r["status"] == "measured"):
            ax.set_yticks([])
            ax.text(
                0.5,
                0.5,
                "not reported on this device",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=9,
                color="0.4",
            )
        ax.set_ylabel(label, fontsize=9)
        if key == "ms_per_step":
            ax.margins(y=0.25)
            # plain numbers at 1-2-5 steps instead of the log axis' powers of ten
            top = max((v for v in vals if v == v), default=low) * 2  # NaN: did not run
            ticks = [
                m * 10**e for e in range(-2, 7) for m in (1, 2, 5) if low / 2 <= m * 10**e <= top
            ]
            ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.text(
                0.99,
                0.97,
                "labels: median ms, spread (max - min) / median",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=7,
            )
        elif key == "speedup":
            ax.margins(y=0.12)
    fig.suptitle(_ladder_title(results), fontsize=10)
    fig.tight_layout()
    return fig


def _ladder_title(results: dict) -> str:
    """A ladder figure's title: device, B, T, torch and date of the results dict."""
    cfg = results["config"]
    return (
        f"Speed-up ladder on {results['device']}, B={cfg['batch_size']}, T={cfg['seq_len']} "
        f"(torch {results['torch']}, {results['date']})"
    )


def memory_timeline(points, phases, title: str, marks=None):
    """Allocated memory (GiB) through a recorded step, against the allocator's events in order:
    ``points`` [[event index, bytes], ...] (e.g. ``snapshot.Timeline.points``), ``phases``
    [(first event index, name), ...] shaded in turn and named at the top, ``marks`` {label:
    bytes} drawn as dashed lines (the measured ``max_memory_allocated``, an estimate). The peak
    point is marked. Returns the Figure."""
    import matplotlib.pyplot as plt

    gib = 2**30
    xs, ys = [p[0] for p in points], [p[1] / gib for p in points]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(xs, ys, color="tab:blue", lw=1.2, label="allocated (snapshot trace)")
    top = max(ys + [v / gib for v in (marks or {}).values()])
    ends = [start for start, _ in phases[1:]] + [xs[-1] if xs else 0]
    for k, ((start, name), end) in enumerate(zip(phases, ends)):
        if k % 2 == 0:
            ax.axvspan(start, end, color="0.93", lw=0)
        if end - start > 0.04 * (xs[-1] - xs[0] if xs else 1):  # room for the name
            ax.text((start + end) / 2, top * 1.08, name, ha="center", va="bottom", fontsize=7)
    peak = max(range(len(ys)), key=ys.__getitem__) if ys else None
    if peak is not None:
        ax.scatter(
            [xs[peak]], [ys[peak]], color="tab:red", zorder=3, label=f"peak {ys[peak]:.2f} GiB"
        )
    for (label, value), style in zip((marks or {}).items(), ("--", ":", "-.")):
        ax.axhline(
            value / gib, ls=style, color="grey", lw=1, label=f"{label} {value / gib:.2f} GiB"
        )
    ax.set_ylim(0, top * 1.2)
    ax.set_xlabel("allocator events (allocations and frees, in order)")
    ax.set_ylabel("allocated (GiB)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center right")  # a step's tail (clip, optimizer) runs low and right
    fig.tight_layout()
    return fig
