"""Each chapter's measured run time: one table, ``results/h200-run-times.md``, and the sentence the
chapter's opening prints from it.

The table holds, per notebook, the seconds of its newest whole run on the H200 (strict nbval or a
recording) and as an emulated T4 (strict nbval), or ``-`` where the chapter changed since its last
emulated-T4 run. ``python -m helpers.tools.run_times`` rewrites the **Run time** paragraph in every
chapter's first cell from the table; a test checks that they agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import helpers

TABLE = "h200-run-times.md"
_ROW = re.compile(r"\| (\d\d)_\w+ \| (\d+) \| ([^|]+) \| (\d+|-) \| ([^|]+) \|")
_DATE = re.compile(r"\d{4}-\d\d-\d\d")
_PARAGRAPH = re.compile(r"\*\*Run time\*\*.*?(?=\n\n|\Z)", re.S)


def table_path() -> Path:
    """``results/h200-run-times.md`` of this checkout."""
    return helpers.REPO_ROOT / "results" / TABLE


def read_table(path: Path | None = None) -> dict[str, tuple[int, int | None, str, str | None]]:
    """{chapter number "NN": (H200 seconds, emulated-T4 seconds or None, the H200 run's date
    "YYYY-MM-DD", the emulated-T4 run's date or None)} from the table.

    Raises:
        ValueError: the table has no chapter rows, or a row's H200 run names no date.
    """
    rows = {}
    for line in (path or table_path()).read_text().splitlines():
        m = _ROW.match(line)
        if m:
            date = _DATE.search(m.group(3))
            if date is None:
                raise ValueError(f"{line!r}: its H200 run column names no date (YYYY-MM-DD)")
            t4 = None if m.group(4) == "-" else int(m.group(4))
            t4_date = _DATE.search(m.group(5)) if t4 is not None else None
            rows[m.group(1)] = (int(m.group(2)), t4, date.group(), t4_date and t4_date.group())
    if not rows:
        raise ValueError(f"{path or table_path()} has no rows like '| NN_name | s | ... |'")
    return rows


def sentence(h200_s: int, t4_s: int | None, date: str, t4_date: str | None = None) -> str:
    """The **Run time** paragraph of a chapter's opening, from its two measured times (seconds)
    and the dates of the H200 run and of the emulated-T4 run (named apart when they differ)."""
    t4 = (
        f"{t4_s} s as an emulated T4, which is the H200 under a T4's limits and at\nthe H200's "
        "speed (a real T4 is slower)."
        if t4_s is not None
        else "not yet timed as an emulated T4 since the chapter last changed."
    )
    when = date if t4_s is None or t4_date in (None, date) else f"{date}, as a T4 {t4_date}"
    return (
        f"**Run time** (measured {when}, torch 2.11, `results/{TABLE}`):\n"
        f"{h200_s} s on an NVIDIA H200; {t4}"
    )


def rewrite(notebooks: list[Path]) -> list[Path]:
    """Replace the **Run time** paragraph of each notebook's first cell from the table; returns
    the notebooks that changed.

    Raises:
        ValueError: a notebook without a row in the table or without a **Run time** paragraph.
    """
    import nbformat

    rows, changed = read_table(), []
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        if path.name[:2] not in rows:
            raise ValueError(f"{path.name} has no row in results/{TABLE}: add one first")
        text = nb.cells[0].source
        if not _PARAGRAPH.search(text):
            raise ValueError(f"{path.name}: its first cell has no '**Run time**' paragraph")
        line = sentence(*rows[path.name[:2]])
        new = _PARAGRAPH.sub(lambda _, line=line: line, text, count=1)
        if new != text:
            nb.cells[0].source = new
            nbformat.write(nb, path)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m helpers.tools.run_times",
        description=f"Rewrite each chapter's **Run time** paragraph from results/{TABLE}.",
    )
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="chapter notebooks (default: every chapter)"
    )
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    paths = args.notebooks or sorted((helpers.REPO_ROOT / "notebooks").glob("[01][0-9]_*.ipynb"))
    for path in rewrite(paths):
        print(f"run time updated: {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
