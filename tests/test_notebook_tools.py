"""helpers.tools.notebooks: the authoring tools that re-record notebook outputs."""

import nbformat

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
    nbval table measured them (so the two never disagree)."""
    import re

    from helpers import REPO_ROOT

    table = REPO_ROOT / "results" / "h200-nbval-2026-12-01-evening.md"
    rows = {}
    for line in table.read_text().splitlines():
        m = re.match(r"\| (\d\d)_\w+ \| [^|]+ \| (\d+) \| [^|]+ \| (\d+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    chapters = sorted((REPO_ROOT / "notebooks").glob("[01][0-9]_*.ipynb"))
    assert len(chapters) == 13 and set(rows) == {p.name[:2] for p in chapters}
    for path in chapters:
        opening = " ".join(nbformat.read(path, as_version=4).cells[0].source.split())
        h200, t4 = rows[path.name[:2]]
        assert f"{h200} s on an NVIDIA H200; {t4} s as an emulated T4" in opening, path.name
