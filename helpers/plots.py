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
