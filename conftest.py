"""pytest set-up shared by the unit tests and the nbval notebook run.

nbval compares every stored output of a notebook cell (strict mode). stderr (progress bars,
library warnings) and widget/HTML outputs depend on the machine, so they are not compared;
the hook is guarded to notebook files (nbval docs, "Skipping certain output types").
"""

import os
from pathlib import Path

_data = Path(__file__).resolve().parent.parent / "shared" / "data"
if not os.environ.get("COURSE_DATA_DIR") and _data.is_dir():
    os.environ["COURSE_DATA_DIR"] = str(_data)
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collectstart(collector):
    path = getattr(collector, "path", None)
    if path is not None and str(path).endswith(".ipynb") and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "text/html", "application/javascript",
                                   "application/vnd.jupyter.widget-view+json")
