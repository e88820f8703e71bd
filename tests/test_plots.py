import matplotlib.pyplot as plt
import pytest

from helpers.measure import plots

GIB = 2**30


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_memory_vs_batch_names_a_far_limit_instead_of_flattening_the_data():
    sizes, measured, estimated = [1, 2, 4], [2.4 * GIB, 3.7 * GIB, 5.7 * GIB], [2.8, 3.8, 5.7]
    fig = plots.memory_vs_batch(sizes, measured, [e * GIB for e in estimated], 140 * GIB, "H200")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    assert ax.get_ylim()[1] < 2 * 5.7  # fitted to the data, not stretched to 140 GiB
    assert not any(list(line.get_ydata()) == [140, 140] for line in ax.lines)
    assert "device memory 140 GiB (far above, not drawn)" in _legend(ax)
    # each measured point carries its difference to the estimate
    assert [t.get_text() for t in ax.texts] == ["-14%", "-3%", "+0%"]


def test_memory_vs_batch_draws_a_limit_within_the_data_range():
    fig = plots.memory_vs_batch([8, 16], [9 * GIB, None], [9.5 * GIB, 17 * GIB], 15 * GIB, "T4")
    ax = fig.axes[0]
    assert any(list(line.get_ydata()) == [15, 15] for line in ax.lines)
    assert "device memory" in _legend(ax) and ax.get_ylim()[1] > 17


def test_memory_vs_batch_on_a_cpu_draws_the_estimate_only():
    fig = plots.memory_vs_batch([1, 2], [None, None], [0.1 * GIB, 0.2 * GIB], None, "CPU")
    assert _legend(fig.axes[0]) == ["estimate"] and len(fig.axes[0].texts) == 0


def test_loss_differences_plots_each_run_minus_the_reference():
    curves = {"fp32": [3.0, 2.5, 2.0], "tf32": None, "bf16": [3.01, 2.48, 2.03]}
    fig = plots.loss_differences(curves, "fp32", "Same batches on Test GPU")
    top, bottom = fig.axes
    assert "Test GPU" in top.get_title() and "nats" in bottom.get_ylabel()
    assert _legend(top) == ["fp32", "tf32: skipped", "bf16"]
    (gap,) = [line for line in bottom.lines if line.get_label() == "bf16 - fp32"]
    assert list(gap.get_ydata()) == pytest.approx([0.01, -0.02, 0.03])
    assert any(list(line.get_ydata()) == [0.0, 0.0] for line in bottom.lines)  # the zero line


def test_loss_differences_says_when_there_is_no_reference():
    fig = plots.loss_differences({"fp32": None, "bf16": [3.0, 2.9]}, "fp32", "t")
    assert "nothing to subtract" in fig.axes[1].texts[0].get_text()


def test_grad_scale_marks_skipped_steps_at_the_scale_that_overflowed():
    histories = {
        "defaults": {"grad_scale": [2.0**16] * 4, "skipped_steps": []},
        "too high": {"grad_scale": [2.0**30, 2.0**29, 2.0**28, 2.0**28], "skipped_steps": [1, 2]},
        "fp32 (no scaler)": {"grad_scale": [], "skipped_steps": []},
    }
    fig = plots.grad_scale(histories, "GradScaler on Test GPU")
    ax = fig.axes[0]
    assert "Test GPU" in ax.get_title()
    assert _legend(ax) == ["defaults", "too high", "skipped step (inf/NaN gradient)"]
    assert [list(line.get_ydata()) for line in ax.lines] == [[16] * 4, [30, 29, 28, 28]]
    (marks,) = ax.collections
    assert marks.get_offsets().tolist() == [[1, 30], [2, 29]]
    lo, hi = ax.get_ylim()
    assert lo < 16 and hi > 30


def test_a_tools_own_png_is_replaced_without_force_and_any_other_file_is_not(tmp_path):
    """Re-running README's main command (--plot ladder.png) replaces the figure it wrote before;
    another tool's figure (a leaderboard), a PNG from elsewhere, or any other file needs --force."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.measure import plots
    from helpers.tools import cli

    ours, other, theirs = tmp_path / "ours.png", tmp_path / "board.png", tmp_path / "theirs.png"
    fig = plt.figure()
    plots.save_png(fig, ours, "ladder")
    plots.save_png(fig, other, "leaderboard")
    fig.savefig(theirs)  # a PNG, but not one a course tool wrote
    plt.close(fig)
    assert plots.is_course_png(ours, "ladder") and not plots.is_course_png(theirs)
    assert not plots.is_course_png(other, "ladder") and plots.is_course_png(other)
    assert not plots.is_course_png(tmp_path / "missing.png")
    assert cli.out_path(ours, "--plot", suffix=".png", png_kind="ladder") == ours
    for path in (other, theirs):
        with pytest.raises(ValueError, match="is not a figure this tool wrote: pass --force"):
            cli.out_path(path, "--plot", suffix=".png", png_kind="ladder")
        assert cli.out_path(path, "--plot", suffix=".png", force=True) == path


def test_memory_timeline_marks_the_peak_and_names_the_phases():
    gib = 2**30
    points = [[0, 1 * gib], [10, 3 * gib], [20, 5 * gib], [30, 2 * gib], [40, 1 * gib]]
    phases = [(0, "forward"), (15, "backward"), (35, "optimizer")]
    fig = plots.memory_timeline(points, phases, "t", marks={"max_memory_allocated": 5 * gib})
    ax = fig.axes[0]
    assert {t.get_text() for t in ax.texts} == {"forward", "backward", "optimizer"}
    labels = ax.get_legend_handles_labels()[1]
    assert "peak 5.00 GiB" in labels and "max_memory_allocated 5.00 GiB" in labels
    assert ax.get_xlabel().startswith("allocator events") and "GiB" in ax.get_ylabel()


def test_ladder_panels_log_ms_axis_labels_median_and_spread_and_draws_no_bar_for_a_skip():
    from helpers.measure import plots, results

    res = results.load("h200-ladder-b16.json")
    res["rungs"][1] = {**res["rungs"][1], "status": "skipped", "ms_per_step": None, "speedup": None}
    fig = plots.ladder_panels(res)
    ms_ax = fig.axes[0]
    assert ms_ax.get_yscale() == "log" and "speed-up" in fig.axes[1].get_ylabel()
    heights = [b.get_height() for b in ms_ax.patches]
    assert heights[1] != heights[1]  # NaN: no bar for the skipped rung
    texts = [t.get_text() for t in ms_ax.texts]
    last = res["rungs"][-1]
    assert f"{last['ms_per_step']:.1f}\n{last['spread_pct']:.0f}%" in texts and "skipped" in texts


def test_ladder_bars_skipped_labels_of_neighbouring_rungs_do_not_overlap():
    """The CPU ladder skips up to eight rungs in a row: their "skipped" labels must stay apart
    (drawn upright, each was wider than its bar and they ran into one word)."""
    from helpers.measure import plots, results

    res = results.load("h200-ladder-b16.json")
    skipped = {**res["rungs"][-1], "status": "skipped", "ms_per_step": None, "speedup": None}
    res["rungs"] = res["rungs"][:10] + [{**skipped, "name": f"+ rung {i}"} for i in range(8)]
    fig = plots.ladder_bars(res)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts if t.get_text() == "skipped"]
    assert len(boxes) == 8
    assert all(b.x0 - a.x1 >= 2 for a, b in zip(boxes, boxes[1:], strict=False))  # pixels apart
