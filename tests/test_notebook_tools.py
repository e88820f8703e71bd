"""helpers.tools.notebooks: the authoring tools that re-record notebook outputs."""

import nbformat
import pytest

from helpers.tools import notebooks


def test_refresh_replaces_compared_outputs_and_keeps_ignored_ones(tmp_path):
    nb = nbformat.v4.new_notebook()
    compared = nbformat.v4.new_code_cell("print(6 * 7)")
    compared.outputs = [nbformat.v4.new_output("stream", name="stdout", text="41\n")]  # stale
    hardware = nbformat.v4.new_code_cell(
        "print('this machine')", metadata={"tags": [notebooks.IGNORE_TAG]}
    )
    hardware.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="NVIDIA H200\n")
    ]  # the committed GPU's
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), compared, hardware]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)

    assert notebooks.refresh(path, timeout_s=120) == [1]
    out = nbformat.read(path, as_version=4)
    assert out.cells[1].outputs[0]["text"] == "42\n"
    assert out.cells[2].outputs[0]["text"] == "NVIDIA H200\n"
    assert notebooks.refresh(path, timeout_s=120) == []  # nothing left to change


def test_record_keeps_figures_even_when_mplbackend_is_agg(tmp_path, monkeypatch):
    """MPLBACKEND=Agg (how tests and CI run) must not strip the figures from a recording."""
    from helpers.tools import notebooks

    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])"
        )
    ]
    path = tmp_path / "fig.ipynb"
    nbformat.write(nb, path)
    notebooks.record(path, timeout_s=120)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs), outputs
    import os

    assert os.environ["MPLBACKEND"] == "Agg"  # this process's setting is given back


def test_every_chapter_states_its_measured_run_time_from_the_committed_table():
    """The opening of each chapter gives its H200 and emulated-T4 run times, as the committed
    table measured them (so the two never disagree)."""
    from helpers import REPO_ROOT
    from helpers.tools import run_times

    rows = run_times.read_table()
    chapters = sorted((REPO_ROOT / "notebooks").glob("[01][0-9]_*.ipynb"))
    assert len(chapters) == 15 and set(rows) == {p.name[:2] for p in chapters}
    for path in chapters:
        opening = nbformat.read(path, as_version=4).cells[0].source
        assert run_times.sentence(*rows[path.name[:2]]) in opening, path.name


def test_run_time_rewrite_follows_the_table_and_refuses_a_chapter_without_a_row(tmp_path):
    from helpers.tools import run_times

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# T\n\n**Run time**: old.\n\nNext.")]
    good, bad = tmp_path / "07_x.ipynb", tmp_path / "99_x.ipynb"
    nbformat.write(nb, good)
    nbformat.write(nb, bad)
    assert run_times.rewrite([good]) == [good]
    text = nbformat.read(good, as_version=4).cells[0].source
    assert run_times.sentence(*run_times.read_table()["07"]) in text and "old" not in text
    assert text.endswith("\n\nNext.")
    assert run_times.rewrite([good]) == []  # already current: not written again
    with pytest.raises(ValueError, match="no row"):
        run_times.rewrite([bad])
    assert "not yet timed" in run_times.sentence(10, None, "2026-12-02")
    both = run_times.sentence(30, 21, "2026-12-01", "2026-12-02")
    assert both.startswith("**Run time** (measured 2026-12-01, as a T4 2026-12-02, torch 2.11")
    assert "(measured 2026-12-02, torch" in run_times.sentence(30, 21, "2026-12-02", "2026-12-02")


def _progress_notebook(value: float, total: float):
    """A notebook with one tqdm-style widget output whose saved state is ``value``/``total``."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    out = nbformat.v4.new_output(
        "display_data",
        data={
            notebooks.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
            "text/plain": "fp32:   0%|          | 0/40 [00:00<?, ?it/s]",
        },
    )
    nb.cells.append(nbformat.v4.new_code_cell("train()", outputs=[out]))

    def m(name, **state):
        return {"model_name": name, "state": {"_model_name": name, **state}}

    nb.metadata["widgets"] = {
        notebooks.WIDGET_STATE: {
            "state": {
                "box": m("HBoxModel", children=["IPY_MODEL_l", "IPY_MODEL_b", "IPY_MODEL_r"]),
                "l": m("HTMLModel", value="fp32:\u2007100%"),
                "b": m("FloatProgressModel", value=value, max=total),
                "r": m("HTMLModel", value="\u200740/40\u2007[00:14&lt;00:00]"),
            }
        }
    }
    return nb


def test_final_progress_text_replaces_the_first_bar_text_with_the_saved_final_state():
    nb = _progress_notebook(40.0, 40.0)
    assert notebooks.final_progress_text(nb) == 1
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == (
        "fp32: 100%|" + "\u2588" * 10 + "| 40/40 [00:14<00:00]"
    )
    assert notebooks.final_progress_text(nb) == 0  # already final: nothing to change
    half = _progress_notebook(20.0, 40.0)
    notebooks.final_progress_text(half)
    assert "|" + "\u2588" * 5 + " " * 5 + "|" in half.cells[0].outputs[0]["data"]["text/plain"]


def test_final_progress_text_leaves_outputs_without_saved_state_alone():
    nb = _progress_notebook(40.0, 40.0)
    nb.metadata["widgets"] = {}
    assert notebooks.final_progress_text(nb) == 0
    assert "0/40" in nb.cells[0].outputs[0]["data"]["text/plain"]


def test_final_progress_text_takes_the_count_from_the_saved_value():
    # the bar's last redraw said 37/40, its saved value is 40 of 40
    nb = _progress_notebook(40.0, 40.0)
    state = nb.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    state["r"]["state"]["value"] = "\u200737/40\u2007[00:14&lt;00:00]"
    notebooks.final_progress_text(nb)
    assert nb.cells[0].outputs[0]["data"]["text/plain"].endswith("| 40/40 [00:14<00:00]")


def test_every_cell_that_shows_a_figure_is_ignored_by_nbval():
    """A recording shows figures (the inline backend); nbval runs under MPLBACKEND=Agg, where a
    figure is not shown, so a compared cell with a figure fails there ("Missing output fields").
    Figures go in their own cell tagged nbval-ignore-output (or nbval-skip)."""
    from helpers import REPO_ROOT

    shown = []
    for path in sorted((REPO_ROOT / "notebooks").glob("[01][0-9]_*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            tags = cell.metadata.get("tags", [])
            if cell.cell_type != "code" or {notebooks.IGNORE_TAG, "nbval-skip"} & set(tags):
                continue
            if any("image/png" in o.get("data", {}) for o in cell.outputs):
                shown.append(f"{path.name} cell {i}")
    assert shown == []
