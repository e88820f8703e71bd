"""The course's matplotlib figures."""

from __future__ import annotations

from pathlib import Path


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
        label = f"{r['ms_per_step']:.1f}" if r["status"] == "measured" else r["status"]
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(range(len(rows)), names, rotation=25, ha="right")
    ax.set_ylabel("ms per training step (median)")
    cfg = results["config"]
    ax.set_title(
        f"Speed-up ladder on {results['device']}, B={cfg['batch_size']}, T={cfg['seq_len']} "
        f"(torch {results['torch']}, {results['date']})",
        fontsize=9,
    )
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
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


def memory_vs_batch(batch_sizes, measured_bytes, estimated_bytes, limit_bytes, title: str):
    """Peak memory (GiB) against batch size: measured points, the estimate as a line, the device
    limit dashed. ``measured_bytes`` entries may be None (not measurable here).
    Returns the Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(batch_sizes, [e / 2**30 for e in estimated_bytes], label="estimate", color="tab:orange")
    pts = [(b, m / 2**30) for b, m in zip(batch_sizes, measured_bytes) if m is not None]
    if pts:
        ax.scatter(*zip(*pts), label="measured (max_memory_allocated)", zorder=3)
    if limit_bytes:
        ax.axhline(limit_bytes / 2**30, ls="--", color="grey", label="device memory")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B")
    ax.set_ylabel("peak memory (GiB)")
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
