"""Every benchmark's output file goes through one rule (``results.checked_out`` before it measures,
``results.save`` after): it never replaces a file that is not a course result, nor a committed
result in ``results/``, unless told to with ``--force``."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.measure import results

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((REPO / "benchmarks").glob("*.py"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench")
    results.add_out(p)
    return p


def test_an_existing_file_that_is_not_a_result_is_refused_before_the_run(tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}\n')
    args = parser().parse_args(["--out", str(notes)])
    with pytest.raises(SystemExit) as e:
        results.checked_out(parser(), args.out, args.force)
    assert e.value.code == 2
    assert "exists and is not a course result JSON" in capsys.readouterr().err
    assert notes.read_text() == '{"my": "notes"}\n'


def test_a_course_result_is_replaced_and_force_replaces_anything_but_a_notebook(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"device": "x", "torch": "2", "date": "2026-01-01", "rows": []}))
    assert results.checked_out(parser(), old) == old
    notes = tmp_path / "notes.json"
    notes.write_text("{}")
    assert results.checked_out(parser(), notes, force=True) == notes
    with pytest.raises(SystemExit):
        results.checked_out(parser(), tmp_path / "chapter.ipynb", force=True)
    results.save({"device": "y", "rows": [1]}, notes)
    assert json.loads(notes.read_text()) == {"device": "y", "rows": [1]}
    assert results.checked_out(parser(), None) is None


def test_a_committed_result_needs_force():
    committed = next((REPO / "results").glob("h200-ladder-b16.json"))
    with pytest.raises(SystemExit):
        results.checked_out(parser(), committed)


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_no_benchmark_writes_a_file_around_the_rule(path):
    src = path.read_text()
    direct = re.findall(r"\.write_text\(|open\([^)]*['\"][wa]b?['\"]|json\.dump\(", src)
    assert not direct, f"{path.name} writes {direct}: use results.checked_out and results.save"
    if re.search(r"add_argument\(\s*\"--out\"", src):
        pytest.fail(f"{path.name} declares --out itself: use results.add_out")
    if "results.add_out(" in src:
        assert "results.checked_out(" in src, path.name


def test_a_benchmark_refuses_to_replace_a_file_before_measuring(tmp_path):
    """sweeps.py writes two files: the second one being a learner's file stops the run before
    either sweep runs, and the first file is not created."""
    mine = tmp_path / "local-vocab-sweep.json"
    mine.write_text("my notes, not a result\n")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "sweeps.py"), "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "local-vocab-sweep.json exists" in done.stderr and "--force" in done.stderr
    assert mine.read_text() == "my notes, not a result\n"
    assert not (tmp_path / "local-attention-sweep.json").exists()


def test_a_path_the_system_cannot_follow_is_a_clear_error(tmp_path, capsys):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    for path in (loop, deep, tmp_path / ("b" * 300 + ".json")):
        with pytest.raises(SystemExit) as e:
            results.checked_out(parser(), path)
        assert e.value.code == 2, path.name[:20]
        assert "error: --out" in capsys.readouterr().err
    assert deep.read_text() == "[" * 200_000


def test_a_tool_with_its_own_keys_does_not_replace_another_tools_result(tmp_path, capsys):
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps({"device": "x", "torch": "2", "date": "2026-01-01", "rows": []}))
    with pytest.raises(SystemExit):
        results.checked_out(parser(), perf, kind=("what", "config", "rows"))
    assert "not a course result JSON holding ['what', 'config', 'rows']" in capsys.readouterr().err
    assert results.checked_out(parser(), perf, kind=("rows",)) == perf


def test_gpu_benchmark_main_checks_the_path_then_the_gpu_then_writes(tmp_path, monkeypatch, capsys):
    """results.gpu_benchmark_main: a bad --out is refused before anything else, a missing GPU or
    need exits 2 saying why, and a run writes provenance plus the measurement."""
    monkeypatch.setattr(results, "provenance", lambda device: {"device": "fake", "date": "d"})
    ran = []

    def measure(args):
        ran.append(args.sweep)
        return {"rows": [1]}

    def add(p):
        p.add_argument("--sweep", action="store_true")

    def main(argv, available=None):
        return results.gpu_benchmark_main(
            argv, "Doc.", "b/x.py", "a GPU", measure, available=available, add_args=add
        )

    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path)])
    assert e.value.code == 2 and not ran
    monkeypatch.setattr(results.torch.cuda, "is_available", lambda: False)
    assert main([]) == 2
    assert "benchmarks/x.py needs a GPU: no CUDA GPU" in capsys.readouterr().err and not ran
    monkeypatch.setattr(results.torch.cuda, "is_available", lambda: True)
    assert main([], available=lambda: (False, "it is a T4")) == 2
    assert "needs a GPU: it is a T4" in capsys.readouterr().err and not ran
    out = tmp_path / "r.json"
    assert main(["--out", str(out), "--sweep"], available=lambda: (True, "")) == 0
    assert ran == [True]
    assert json.loads(out.read_text()) == {"device": "fake", "date": "d", "rows": [1]}
