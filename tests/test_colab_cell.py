"""The Colab set-up cell of every notebook, run with a faked Colab (no network, nothing installed).

What can be checked here: every chapter carries the same cell; outside Colab it does nothing; in
Colab it clones the course (once), installs it without re-installing Colab's own packages, fetches
the data and, on a runtime without a GPU, says how to get one. A real Colab runtime is not reachable
from CI or the course's machines.
"""

import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import torch

NOTEBOOKS = sorted(
    (Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")
)


def _colab_cell(path: Path) -> str:
    cells = [
        c.source
        for c in nbformat.read(path, 4).cells
        if c.cell_type == "code" and "google.colab" in c.source
    ]
    assert len(cells) == 1, f"{path.name}: expected one Colab set-up cell, found {len(cells)}"
    return cells[0]


def test_every_chapter_has_the_same_colab_cell_first():
    assert len(NOTEBOOKS) >= 13
    sources = {_colab_cell(p) for p in NOTEBOOKS}
    assert len(sources) == 1
    for p in NOTEBOOKS:
        first_code = next(c for c in nbformat.read(p, 4).cells if c.cell_type == "code")
        assert "google.colab" in first_code.source, (
            f"{p.name}: the Colab cell must be the first code cell"
        )


def _run_cell(monkeypatch, tmp_path, in_colab, gpu, clone_exists=False, git_status=0, calls=None):
    calls = [] if calls is None else calls
    monkeypatch.chdir(tmp_path)
    if clone_exists:
        (tmp_path / "fast-gpt2-course").mkdir()

    def run(cmd, check=False, **kw):
        calls.append(cmd)
        status = git_status if cmd[0] == "git" else 0
        if check and status:
            raise subprocess.CalledProcessError(status, cmd)
        return subprocess.CompletedProcess(cmd, status)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if in_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(_colab_cell(NOTEBOOKS[0]), {"__name__": "__main__"})
    return calls


def test_outside_colab_the_cell_does_nothing(monkeypatch, tmp_path, capsys):
    assert _run_cell(monkeypatch, tmp_path, in_colab=False, gpu=False) == []
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("gpu", [True, False])
def test_in_colab_the_cell_clones_installs_fetches_and_checks_the_gpu(
    monkeypatch, tmp_path, capsys, gpu
):
    calls = _run_cell(monkeypatch, tmp_path, in_colab=True, gpu=gpu)
    course = str(tmp_path / "fast-gpt2-course")
    assert calls[0][:4] == ["git", "clone", "--depth", "1"] and calls[0][-1] == course
    assert calls[0][4].startswith("https://github.com/")
    install = calls[1]
    assert (
        install[1:4] == ["-m", "pip", "install"]
        and "--no-deps" in install
        and install[-2:] == ["-e", course]
    )
    assert calls[2][1:4] == ["-m", "pip", "install"] and any(
        a.startswith("tiktoken") for a in calls[2]
    )
    assert calls[3][1:] == ["-m", "helpers.core.data", "fetch"]
    assert course in sys.path
    out = capsys.readouterr().out
    assert ("Runtime > Change runtime type > T4 GPU" in out) is (not gpu)


def test_in_colab_a_second_run_does_not_clone_again(monkeypatch, tmp_path):
    calls = _run_cell(monkeypatch, tmp_path, in_colab=True, gpu=True, clone_exists=True)
    assert not any(c[0] == "git" for c in calls) and len(calls) == 3


def test_in_colab_a_failed_clone_says_which_line_to_change_and_stops(monkeypatch, tmp_path):
    """git prints its own reason (not found, no network); the cell adds one line naming REPO_URL
    and the address it tried, instead of a CalledProcessError traceback, and installs nothing."""
    calls = []
    with pytest.raises(SystemExit) as stop:
        _run_cell(monkeypatch, tmp_path, in_colab=True, gpu=True, git_status=128, calls=calls)
    message = str(stop.value)
    assert "REPO_URL" in message and "https://github.com/" in message and "\n" not in message
    assert [c[0] for c in calls] == ["git"]  # nothing installed or fetched after the failure
