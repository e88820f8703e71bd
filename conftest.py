"""pytest set-up shared by the unit tests and the nbval notebook run.

nbval compares every stored output of a notebook cell (strict mode). stderr (progress bars,
library warnings) and widget/HTML outputs depend on the machine, so they are not compared;
the hook is guarded to notebook files (nbval docs, "Skipping certain output types").

The test command runs on two pytest-xdist workers with ``--dist loadscope``: a test module, or a
notebook (its cells share one kernel and run in order), is one unit of work on one worker. Each
worker's share of the CPU threads (its own torch and the notebook kernels it starts, through
``OMP_NUM_THREADS``) is the machine's cores divided by the workers: two workers that each use
every core slow each other down.
"""

import os
from pathlib import Path

_data = Path(__file__).resolve().parent.parent / "shared" / "data"
if not os.environ.get("COURSE_DATA_DIR") and _data.is_dir():
    os.environ["COURSE_DATA_DIR"] = str(_data)
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # an xdist worker, before torch is imported
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))


def pytest_collectstart(collector):
    path = getattr(collector, "path", None)
    if path is not None and str(path).endswith(".ipynb") and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")


# wall time of the test items, per group (see pytest_terminal_summary)
_seconds: dict[str, float] = {}


def _group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        return f"nbval {Path(path).name}"
    if "test_student_version_of_real_notebook" in nodeid:
        return "student versions of the exercise notebooks"
    return "unit tests"


def pytest_runtest_logreport(report):
    _seconds[_group(report.nodeid)] = _seconds.get(_group(report.nodeid), 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Where the run's time went: unit tests, the student-version executions, each notebook."""
    if not _seconds:
        return
    terminalreporter.section("time per group (s)")
    order = sorted(_seconds.items(), key=lambda kv: (kv[0].startswith("nbval"), kv[0]))
    for group, seconds in order:
        terminalreporter.write_line(f"{seconds:8.1f}  {group}")
    nbval = sum(s for g, s in _seconds.items() if g.startswith("nbval"))
    if nbval:
        terminalreporter.write_line(f"{nbval:8.1f}  nbval, all notebooks")
