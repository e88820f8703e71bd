"""The course's committed measurements (``results/*.json``), found from anywhere.

Notebooks show reference numbers measured on the course's own GPU next to the learner's. They look
them up here instead of by a relative path, so a notebook copied elsewhere (a student folder, a
grading directory) still finds them, or says plainly that they are not there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

import helpers
from helpers.tools import cli

RESULTS_DIR_ENV = "COURSE_RESULTS_DIR"


def results_dir() -> Path | None:
    """The first existing folder of: ``$COURSE_RESULTS_DIR``, the repository's ``results/`` next to
    this package (a clone or an editable install), ``./results``, ``../results``.
    None if none exists."""
    candidates = [os.environ.get(RESULTS_DIR_ENV, "").strip()]
    candidates += [str(helpers.REPO_ROOT / "results"), "results", "../results"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def load(name: str) -> dict | None:
    """The committed result ``name`` (e.g. "h200-ladder-b16.json") as a dict,
    or None if not found."""
    folder = results_dir()
    if folder is None or not (folder / name).is_file():
        return None
    return json.loads((folder / name).read_text())


def load_each(names: dict[str, str]) -> tuple[dict[str, dict], list[str]]:
    """Several committed results at once: ``names`` maps a label (a table's column, "H200 B=16")
    to a file name. Returns ``({label: result} for the files found, [names not found])``, so a
    notebook can print :func:`missing` for the file that is actually absent."""
    found, absent = {}, []
    for label, name in names.items():
        res = load(name)
        if res is None:
            absent.append(name)
        else:
            found[label] = res
    return found, absent


def missing(name: str) -> str:
    """What to print when :func:`load` found nothing."""
    return (
        f"committed result {name} not found: clone the course repository (its results/ folder "
        f"holds the course's own GPU measurements) or set {RESULTS_DIR_ENV} to that folder."
    )


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None
) -> str:
    """A Markdown (GitHub pipe) table, for ``IPython.display.display(Markdown(...))``: a rendered
    notebook shows it as a table, where a wide fixed-width text table wraps and loses its columns.

    Every cell is written as given (``str(cell)``): format numbers before (``f"{ms:.1f}"``), so
    the table shows the digits you chose. None is written "-" (nothing measured); a "|" inside a
    cell is escaped ("\\|", so it does not end the cell) and a newline becomes a space.
    ``align``: one letter per column, "l" (left) or "r" (right, for numbers); default all left.

    Returns the table's lines joined by newlines: the header row, the delimiter row, one row each.

    Raises:
        ValueError: a row's length differs from the header's, or ``align`` is not one "l"/"r"
            per column.
    """
    n = len(header)
    align = align or "l" * n
    if len(align) != n or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column ({n}), got {align!r}")

    def line(cells: Sequence[object]) -> str:
        text = ["-" if c is None else str(c).replace("|", "\\|").replace("\n", " ") for c in cells]
        return "| " + " | ".join(text) + " |"

    out = [line(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"row {i} has {len(row)} cells, the header {n}: {list(row)!r}")
        out.append(line(row))
    return "\n".join(out)


def provenance(device: torch.device | str) -> dict:
    """Where and when a measurement is made, the first keys of every result the course writes:
    {"device": the GPU's name (with "emulating <GPU>" while emulating) or "cpu (<processor>)",
    "torch": version, "cuda": CUDA version or None, "python": version, "date": ISO date,
    "commit": the checkout's git commit (short hash, "+modified" when tracked code files differ
    from it; None outside a git checkout), "emulated": the emulated profile's key or None}."""
    from helpers.measure import hardware

    device = torch.device(device)
    summ = hardware.summary(device, probe_sdpa=False)
    emulated = hardware.emulated_profile()
    return {
        "device": summ.name if device.type == "cuda" else f"cpu ({summ.name})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "emulated": emulated.key if emulated is not None else None,
    }


def add_out(parser: argparse.ArgumentParser, required: bool = False, help: str = "") -> None:
    """A benchmark's ``--out FILE.json`` and ``--force`` options; :func:`checked_out` checks the
    path once the arguments are parsed."""
    parser.add_argument(
        "--out", type=Path, default=None, required=required,
        help=help or "write the result as JSON to this file",
    )  # fmt: skip
    cli.add_force(parser)


def checked_out(
    parser: argparse.ArgumentParser,
    path: str | Path | None,
    force: bool = False,
    kind: tuple[str, ...] = (),
    flag: str = "--out",
) -> Path | None:
    """A benchmark's ``--out`` checked before it measures anything, by the rule every course tool
    follows (:func:`helpers.tools.cli.out_path`): a ``.json`` file name; an existing file is
    replaced only when it is a course result (it holds "device", "torch" and "date", and the
    tool's own keys ``kind``), never a file committed in a checkout's ``results/``, and with
    ``force`` (``--force``) anything but a notebook or a folder. None stays None (nothing is
    written). ``flag`` is the option's name in the messages.

    Raises:
        SystemExit(2): through ``parser.error``, which prints ``error: <reason>``.
    """
    try:
        what = " and is not a course result JSON" + (f" holding {list(kind)}" if kind else "")
        return cli.result_out(path, kind, flag, force, what=what)
    except ValueError as e:
        parser.error(str(e))


def save(out: dict, path: str | Path | None, say: bool = True) -> None:
    """Write ``out`` as indented JSON to ``path`` (a benchmark's ``--out``, already passed through
    :func:`checked_out`; nothing when None), atomically (:func:`helpers.tools.cli.replace_file`),
    and with ``say`` print that it did."""
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        cli.replace_file(path, lambda f: f.write(json.dumps(out, indent=1) + "\n"))
        if say:
            print(f"wrote {path}")


def print_and_save(out: dict, path: str | Path | None) -> None:
    """Print ``out`` as indented JSON and :func:`save` it to ``path``."""
    print(json.dumps(out, indent=1))
    save(out, path)


def gpu_benchmark_main(
    argv: list[str] | None,
    doc: str,
    script: str,
    need: str,
    measure: Callable[[argparse.Namespace], dict],
    available: Callable[[], tuple[bool, str]] | None = None,
    add_args: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """The ``main()`` of a benchmark that measures on one CUDA GPU and writes one JSON.

    The parser (its description the first line of ``doc``; ``--out``/``--force`` from
    :func:`add_out`, then what ``add_args`` adds); the output path checked before anything runs
    (:func:`checked_out`); then, without a CUDA GPU or when ``available()`` (e.g.
    ``lambda: fp8_available("cuda")``) says no, "benchmarks/<script> needs <need>: <why>" and
    exit status 2; else ``{**provenance("cuda"), **measure(args)}`` printed and saved
    (:func:`print_and_save`).

    Returns:
        The exit status: 0, or 2 when the GPU is missing or lacks what it needs (argparse exits 2
        on bad usage).
    """
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    add_out(p, help="write the JSON here too")
    if add_args is not None:
        add_args(p)
    args = p.parse_args(argv)
    args.out = checked_out(p, args.out, args.force)
    ok, why = (False, "no CUDA GPU") if not torch.cuda.is_available() else (True, "")
    if ok and available is not None:
        ok, why = available()
    if not ok:
        print(f"benchmarks/{Path(script).name} needs {need}: {why}", file=sys.stderr)
        return 2
    print_and_save({**provenance(torch.device("cuda")), **measure(args)}, args.out)
    return 0


def save_rows(rows: list[dict], path: str | Path | None, device: torch.device | str) -> None:
    """:func:`save` a benchmark's measured ``rows`` as ``{**provenance(device), "rows": rows}``."""
    save({**provenance(device), "rows": rows}, path)


CODE_PATHS = ("helpers", "benchmarks")  # what a "+modified" commit is about


def _commit() -> str | None:
    """The checkout's short commit hash, with "+modified" when the measuring code (helpers/,
    benchmarks/) differs from that commit: a tracked file changed or a new file not ignored;
    "+unknown" when git could not tell. None unless the package runs from the top of a git
    checkout (an installed copy inside another repository is not that repository's commit). A
    learner's edited notebook does not count: the code it measures with is the package's."""

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(
                ["git", "-C", str(helpers.REPO_ROOT), *args],
                capture_output=True,
                text=True,
                timeout=10,
                # status takes no index lock: two runs measuring at once do not fail each other
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            )
        except (OSError, subprocess.SubprocessError):
            return None

    where = git("rev-parse", "--show-toplevel", "--short", "HEAD")  # two lines: top, hash
    lines = where.stdout.splitlines() if where is not None and where.returncode == 0 else []
    if len(lines) != 2 or Path(lines[0]).resolve() != Path(helpers.REPO_ROOT).resolve():
        return None
    status = git("status", "--porcelain", "--", *CODE_PATHS)  # one line per changed/new file
    if status is None or status.returncode != 0:
        return lines[1] + "+unknown"
    return lines[1] + ("+modified" if status.stdout.strip() else "")
