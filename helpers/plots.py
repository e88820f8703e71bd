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
    bars = ax.bar(range(len(rows)), ms, color=["tab:blue" if r["status"] == "measured" else "lightgrey" for r in rows])
    for bar, r in zip(bars, rows, strict=False):
        label = f"{r['ms_per_step']:.1f}" if r["status"] == "measured" else r["status"]
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), names, rotation=25, ha="right")
    ax.set_ylabel("ms per training step (median)")
    cfg = results["config"]
    ax.set_title(f"Speed-up ladder on {results['device']}, B={cfg['batch_size']}, T={cfg['seq_len']} "
                 f"(torch {results['torch']}, {results['date']})", fontsize=9)
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
    ax.bar(x, [r["tflops"] or 0 for r in rows], color=["tab:blue" if r["status"] == "measured" else "lightgrey" for r in rows],
           label="measured")
    peaks = [(i, r["peak_tflops"]) for i, r in enumerate(rows) if r.get("peak_tflops")]
    if peaks:
        ax.scatter([i for i, _ in peaks], [p for _, p in peaks], marker="_", s=600, color="tab:red", label="datasheet peak")
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
    """Training loss (nats) against step; ``reference`` draws a dashed line (e.g. ln(vocab)). Returns the Figure."""
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
