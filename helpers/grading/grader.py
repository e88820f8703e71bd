"""Grading submissions (``python -m helpers.grading grade``) and the command line of both tools.

Every submission runs in a fresh kernel (:mod:`helpers.grading.kernel`), inside the OS sandbox
where the machine allows it (:mod:`helpers.grading.sandbox`); a check cell scores its points (taken
from the reference notebook) when it runs without error. Teacher guide with the exact commands:
docs/grading.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helpers
from helpers.grading import kernel, remote
from helpers.grading.intake import csv_cell, modified, read_submission, shown, submitted_notebooks
from helpers.grading.kernel import (
    CHECKER_FOLDER,
    CellRun,
    NotebookRun,
    execute_notebook,
    first_line,
)
from helpers.grading.sandbox import sandbox_available, sandbox_paths, sandbox_prefix
from helpers.grading.student import (
    _notebooks_in,
    check_cells,
    is_check_cell,
    make_student,
    nbgrader_metadata,
    read_notebook,
)
from helpers.tools import cli

REPO_ROOT = helpers.REPO_ROOT


@dataclass
class Reference:
    """One solution notebook: its graded cells, their points and their check code."""

    path: Path
    points: dict[str, float]  # grade_id -> points, in notebook order
    functions: dict[str, str]  # grade_id -> the name of the learner's function it checks
    code_cells: int = 0  # how many code cells the reference has (the time budget of a submission)


def check_call(source: str, grade_id: str) -> str:
    """The name of the learner's function that a check cell ``grading.check_x(name)`` checks.

    A check cell is run by the grader's checker process, not by the kernel
    (:mod:`helpers.grading.remote`), so it must be exactly that one call, of the check that
    ``grading.CHECKS`` registers under ``grade_id``.

    Raises:
        ValueError: the cell is anything else (hidden tests included: the course's grader does
            not run them; nbgrader does).
    """
    import ast

    from helpers import grading

    check = grading.CHECKS.get(grade_id)
    expected = f"grading.{check.__name__}(<function name>)" if check else None
    try:
        body = ast.parse(source).body
    except SyntaxError:
        body = []
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
    if (
        check is not None
        and isinstance(call, ast.Call)
        and ast.unparse(call.func) == f"grading.{check.__name__}"
        and len(call.args) == 1
        and not call.keywords
        and isinstance(call.args[0], ast.Name)
    ):
        return call.args[0].id
    if check is None:
        raise ValueError(f"the check cell {grade_id!r} names no check of helpers.grading")
    raise ValueError(f"the check cell {grade_id!r} must be exactly `{expected}`")


def load_references(folder: Path) -> dict[str, Reference]:
    """``{file name: Reference}`` for every notebook in ``folder`` with at least one check cell.

    Raises:
        FileNotFoundError: when ``folder`` holds no such notebook.
        ValueError: a check cell is not one call of its check (:func:`check_call`).
    """

    refs = {}
    for path in _notebooks_in(folder):
        nb = read_notebook(path)
        cells = check_cells(nb)
        if cells:
            try:
                functions = {
                    gid: check_call(nb.cells[i].source, gid) for gid, (i, _) in cells.items()
                }
            except ValueError as exc:
                raise ValueError(f"{path.name}: {exc}") from None
            points = {gid: pts for gid, (_, pts) in cells.items()}
            code = sum(c.cell_type == "code" for c in nb.cells)
            refs[path.name] = Reference(path, points, functions, code)
    if not refs:
        raise FileNotFoundError(
            f"No notebook in {folder} has graded cells (nbgrader metadata with grade: true). "
            "Pass the folder of the solution notebooks with --reference."
        )
    return refs


COLUMNS = ["student", "notebook", "grade_id", "points", "max_points", "status", "reason"]


def _row(
    student: str, notebook: str, gid: str, pts: float, max_pts: float, status: str, reason: str
) -> dict[str, Any]:
    return dict(
        zip(
            COLUMNS,
            [student, notebook, gid, _fmt(pts), _fmt(max_pts), status, reason],
            strict=False,
        )
    )


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def grade_notebook(
    path: Path,
    ref: Reference,
    student: str,
    timeout: int,
    text: str | None = None,
    sandbox: dict[str, list[Path]] | None = None,
    checker: Any = None,
) -> list[dict[str, Any]]:
    """Execute one submission and return one CSV row per graded cell of its reference.

    Each check cell runs the reference's check in the grader's checker process on the learner's
    function (:mod:`helpers.grading.remote`; ``checker``: a :class:`~helpers.grading.remote.Checker`
    the grading run shares, else one of this notebook's own), so an edited check cannot pass;
    points always come from the reference. ``text`` is the
    submission as read before any submission ran (default: read ``path`` now). The kernel runs in a
    fresh temporary folder that holds its working folder, home and temporary files, under the OS
    sandbox when ``sandbox`` gives :func:`sandbox_prefix`'s ``read_only`` and ``hidden`` paths
    (that folder is then the only place it can write).
    """

    import nbformat

    name = ref.path.name
    rows = lambda status, reason: [  # noqa: E731 - every graded cell gets the same verdict
        _row(student, name, gid, 0, pts, status, reason) for gid, pts in ref.points.items()
    ]
    try:
        nb = nbformat.reads(path.read_text() if text is None else text, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as exc:
        return rows("error", f"notebook unreadable: {type(exc).__name__}: {first_line(str(exc))}")

    where: dict[str, int] = {}  # grade_id -> index of the student's (last) check cell
    for index, cell in enumerate(nb.cells):
        gid = nbgrader_metadata(cell).get("grade_id")
        if gid in ref.points and is_check_cell(cell):
            where[gid] = index
    own = Path(tempfile.mkdtemp(prefix="grading-"))
    try:
        (own / "work").mkdir()
        (own / CHECKER_FOLDER).mkdir()  # the checker's socket: read-only for the kernel
        prefix: tuple[str, ...] = ()
        if sandbox:
            ro = [*sandbox["read_only"], own / CHECKER_FOLDER]
            prefix = sandbox_prefix(ro, sandbox["hidden"], [own], sandbox["scratch"])
        run = execute_notebook(
            nb,
            cwd=own / "work",
            timeout=timeout,
            sandbox=prefix,
            private=own,
            guarded=frozenset(where.values()),  # restored before each check: helpers.grading.guard
            # each check runs in the grader's checker process, on the learner's function
            checks={index: (gid, ref.functions[gid]) for gid, index in where.items()},
            budget_s=notebook_budget(ref, timeout),
            checker=checker,
        )
    finally:
        kernel.remove_tree(own)

    out = []
    for gid, pts in ref.points.items():
        index = where.get(gid)
        if run.startup_error:
            status, reason = "error", f"kernel failed to start: {run.startup_error}"
        elif index is None:
            status, reason = "missing", "check cell missing (deleted or metadata lost)"
        else:
            status, reason = _verdict(run, index, timeout, frozenset(where.values()))
        out.append(_row(student, name, gid, pts if status == "passed" else 0, pts, status, reason))
    return out


def notebook_budget(ref: Reference, timeout: int) -> int:
    """Seconds a submission of ``ref`` may run in all: ``timeout`` for each of the reference's code
    cells and 10 more (every cell of an honest submission fits; hundreds of slow extra cells do
    not hold up the students graded after it)."""
    return timeout * (ref.code_cells + 10)


def _broke(cell: CellRun) -> bool:
    """A cell that failed for a reason other than an exercise's expected failure."""
    expected = ("AssertionError", "NotImplementedError")
    return cell.status == "timeout" or (cell.status == "error" and cell.ename not in expected)


def _verdict(
    run: NotebookRun, index: int, timeout: int, check_indices: frozenset[int] = frozenset()
) -> tuple[str, str]:
    """(status, reason) of the check cell at ``index``;
    ``check_indices`` are never blamed as the cause."""
    cell = run.cells.get(index, CellRun(index, "not run"))
    k = index + 1  # cells are counted from 1, markdown included, as a reader counts them
    if cell.status == "ok":
        return "passed", "passed"
    if cell.status == "timeout":
        return "failed", f"timeout after {timeout} s in cell {k}"
    if cell.status == "error":
        if cell.ename == "NotImplementedError":
            return "failed", "NotImplementedError: not attempted"
        reason = f"{cell.ename}: {first_line(cell.evalue)}" if cell.evalue else cell.ename
        if cell.ename != "AssertionError":  # e.g. a NameError: say which earlier cell broke first
            earlier = [
                c
                for i, c in sorted(run.cells.items())
                if i < index and i not in check_indices and _broke(c)
            ]
            if earlier:
                first = earlier[-1]
                what = "timed out" if first.status == "timeout" else f"raised {first.ename}"
                reason += f" (cell {first.index + 1} {what} before)"
        return "failed", reason
    if run.over_budget_at is not None and index >= run.over_budget_at:
        return (
            "failed",
            f"the notebook ran past its time budget before cell {run.over_budget_at + 1}",
        )
    if run.kernel_died_in is not None:
        at = f" in cell {run.kernel_died_in + 1}" if run.kernel_died_in >= 0 else ""
        return "failed", f"kernel died{at}"
    if run.stuck_after_timeout_in is not None:
        return (
            "failed",
            f"timeout after {timeout} s in cell {run.stuck_after_timeout_in + 1} "
            "(kernel did not recover)",
        )
    return "error", "cell not run"


def _match_reference(path: Path, refs: dict[str, Reference]) -> Reference | None:
    """The reference with the same file name, else the one sharing most grade ids
    (renamed files; read by :func:`read_submission`'s rules, so a FIFO or a link is not)."""
    if path.name in refs:
        return refs[path.name]
    try:
        import nbformat

        text = read_submission(path, path.parent)
        ids = set(check_cells(nbformat.reads(text, as_version=4)))
    except Exception:
        return None
    best = max(refs.values(), key=lambda r: len(ids & set(r.points)))
    return best if ids & set(best.points) else None


def grade(
    submissions: Path, reference: Path, timeout: int = 600, out: Path | None = None
) -> list[dict[str, Any]]:
    """Grade every student folder in ``submissions``; return the CSV rows (see ``COLUMNS``).

    Layout: ``submissions/<student id>/<notebook>.ipynb`` (sub-folders below the student's are
    searched too, so nbgrader's ``submitted/<student>/<assignment>/`` works). A notebook is graded
    against the reference notebook of the same file name, or, when renamed, the one sharing most
    grade ids. A notebook that some students submitted and others did not gives the others
    ``missing`` rows. Nothing a submission does stops the grading of the others. ``out`` (the
    grades CSV to be written) is hidden from the submissions too.

    Raises:
        FileNotFoundError: when ``submissions`` has no student folder,
            or ``reference`` no graded notebook.
    """
    submissions, reference = Path(submissions).resolve(), Path(reference).resolve()
    # the checker's socket lies in each kernel's folder under the temporary folder, and a Unix
    # socket's path has at most 107 bytes: say so now, not as a failed check for every student
    socket_path = Path(tempfile.gettempdir(), "grading-xxxxxxxx", CHECKER_FOLDER, "check.sock")
    if len(os.fsencode(str(socket_path))) > 107:
        raise ValueError(
            f"the temporary folder {tempfile.gettempdir()} is too long a path for the grader's "
            "socket (at most 107 bytes): set TMPDIR to a shorter folder, e.g. /tmp"
        )
    refs = load_references(reference)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders.")
    for stray in sorted(submissions.glob("*.ipynb")):
        print(
            f"ignored {shown(stray)}: put each student's notebooks in {submissions}/<student id>/",
            file=sys.stderr,
        )
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise FileNotFoundError(
            f"{submissions} has no student folders ({submissions}/<student id>/<notebook>.ipynb)."
        )

    chosen: dict[str, dict[str, Path]] = {}  # student -> reference name -> submitted file
    rows: list[dict[str, Any]] = []
    for folder in students:
        chosen[folder.name] = {}
        notebooks = submitted_notebooks(folder)
        for path in notebooks:
            ref = _match_reference(path, refs)
            if ref is None:
                print(
                    f"ignored {shown(path)}: matches no reference notebook in {reference}",
                    file=sys.stderr,
                )
                continue
            current = chosen[folder.name].get(ref.path.name)
            if current is None or _prefer(path, current, ref):
                if current is not None:
                    print(
                        f"ignored {shown(current)}: {shown(path)} is graded as "
                        f"{ref.path.name} instead",
                        file=sys.stderr,
                    )
                chosen[folder.name][ref.path.name] = path
            else:
                print(
                    f"ignored {shown(path)}: {shown(current)} is graded as {ref.path.name} instead",
                    file=sys.stderr,
                )
        if not notebooks:
            rows.append(_row(folder.name, "", "", 0, 0, "missing", "no notebook submitted"))
    assignment = sorted({name for per_student in chosen.values() for name in per_student})

    # Every submission is read before any of them runs,
    # so one cannot change what another is graded on.
    texts: dict[Path, str | None] = {}
    unreadable: dict[Path, str] = {}
    for student, per_student in chosen.items():
        for path in per_student.values():
            try:
                texts[path] = read_submission(path, submissions / student)
            except (OSError, UnicodeDecodeError, ValueError) as e:
                texts[path] = None  # graded as an error with this reason
                unreadable[path] = str(e) if isinstance(e, ValueError) else "cannot read the file"
    sandbox: dict[str, list[Path]] | None = None
    ok, why = sandbox_available()
    if ok:
        sandbox = sandbox_paths(submissions, reference, out)
    else:
        print(
            f"warning: no OS sandbox ({why}): submissions run with this account's rights and can "
            "read and change its files; grade in a container (docs/grading.md)",
            file=sys.stderr,
        )

    # One checker process for the whole run: it never runs a submission's code (each check is
    # a request of its own), and a fresh interpreter per notebook costs seconds of imports.
    checker = remote.Checker()
    try:
        _grade_all(students, assignment, refs, chosen, texts, unreadable, timeout, sandbox,
                   checker, rows)
    finally:
        checker.close()
    return rows


def _grade_all(students, assignment, refs, chosen, texts, unreadable, timeout, sandbox,
               checker, rows) -> None:  # fmt: skip
    """:func:`grade`'s loop: every student's notebooks, in order, appended to ``rows``."""
    for folder in students:
        for name in assignment:
            ref = refs[name]
            path = chosen[folder.name].get(name)
            if path is None:
                rows.extend(
                    _row(folder.name, name, g, 0, p, "missing", "notebook not submitted")
                    for g, p in ref.points.items()
                )
                continue
            print(f"grading {shown(path)} against {ref.path} ...", file=sys.stderr, flush=True)
            text = texts[path]
            if text is None:
                rows.extend(
                    _row(
                        folder.name,
                        name,
                        g,
                        0,
                        p,
                        "error",
                        f"notebook unreadable: {unreadable.get(path, 'cannot read the file')}",
                    )
                    for g, p in ref.points.items()
                )
                continue
            try:
                rows.extend(
                    grade_notebook(
                        path, ref, folder.name, timeout, text=text, sandbox=sandbox, checker=checker
                    )
                )
            except Exception as exc:  # a fault of the grader's: this notebook only, say which
                why = f"grader error: {type(exc).__name__}: {first_line(str(exc))}"
                rows.extend(
                    _row(folder.name, name, g, 0, p, "error", why) for g, p in ref.points.items()
                )


def _prefer(new: Path, old: Path, ref: Reference) -> bool:
    """Of two files graded as the same notebook: a file wins over a link (which is refused), then
    the exact name, then the newer file."""
    if new.is_symlink() != old.is_symlink():
        return old.is_symlink()
    if (new.name == ref.path.name) != (old.name == ref.path.name):
        return new.name == ref.path.name
    return modified(new) > modified(old)


def check_csv_out(path: Path, submissions: Path, reference: Path, force: bool = False) -> Path:
    """``grade --out path``, checked before any grading (:func:`helpers.tools.cli.out_path`): not
    a notebook's name, not in the submissions or reference folder, not a folder, writable, and an
    existing file only when it is a grades CSV (its first line is :data:`COLUMNS`) or with
    ``force``.

    Raises:
        ValueError: with the one-line reason.
    """
    folders = {submissions: "submissions", reference: "reference notebooks"}
    return cli.out_path(
        path,
        "--out",
        ".csv",
        force=force,
        same_kind=lambda p: cli.csv_has_header(p, COLUMNS),
        what=" and is not a grades CSV",
        folders=folders,
    )


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Write grading rows with the columns ``COLUMNS``, atomically
    (:func:`helpers.tools.cli.replace_file`: a symlink planted at ``path`` is replaced, never
    followed)."""

    def write(f) -> None:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in r.items()} for r in rows)

    cli.replace_file(path, write)


def totals_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: per student, points / max points and checks passed."""
    per: dict[str, list[float]] = {}
    for r in rows:
        t = per.setdefault(r["student"], [0.0, 0.0, 0, 0])
        t[0] += float(r["points"])
        t[1] += float(r["max_points"])
        t[2] += r["status"] == "passed"
        t[3] += bool(r["grade_id"])
    width = max([len("student")] + [len(s) for s in per])
    lines = [f"{'student':<{width}}  {'points':>12}  {'checks passed':>13}"]
    for student, (pts, max_pts, passed, checks) in per.items():
        lines.append(
            f"{student:<{width}}  {_fmt(pts) + ' / ' + _fmt(max_pts):>12}  "
            f"{f'{passed} / {checks}':>13}"
        )
    return "\n".join(lines)


def _seconds(text: str) -> int:
    """``--timeout``: a whole number of seconds, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} s: give at least 1 second per cell")
    return value


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make-student``, ``grade`` and ``leaderboard`` (see docs/grading.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading",
        description=(
            "Graded exercises: student versions of the notebooks, grading of submissions, and the "
            "class leaderboard of the capstone ladders."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ms = sub.add_parser("make-student", help="write student versions of the exercise notebooks")
    ms.add_argument(
        "notebooks",
        nargs="?",
        default="notebooks",
        help="folder of solution notebooks, or one notebook (default: notebooks)",
    )
    ms.add_argument(
        "--out", default="student", help="folder for the student versions (default: student)"
    )
    ms.add_argument(
        "--force",
        action="store_true",
        help="replace files in --out that make-student did not write",
    )
    ms.add_argument(
        "--keep-outputs",
        action="store_true",
        help="keep the recorded outputs of cells outside the exercises (how learner/ is made)",
    )
    gr = sub.add_parser("grade", help="execute and grade submissions/<student>/<notebook>.ipynb")
    gr.add_argument("submissions", help="folder with one sub-folder per student id")
    gr.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    gr.add_argument("--timeout", type=_seconds, default=600, help="seconds per cell (default: 600)")
    gr.add_argument(
        "--reference", default="notebooks", help="folder of solution notebooks (default: notebooks)"
    )
    gr.add_argument(
        "--force", action="store_true", help="replace an --out file that is not a grades CSV"
    )
    from helpers.grading import leaderboard  # it imports this module

    leaderboard.add_arguments(
        sub.add_parser(
            "leaderboard",
            help=f"rank submissions/<student>/{leaderboard.SUBMISSION_FILE} per GPU model",
        )
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "leaderboard":
            leaderboard.command(args)
        elif args.command == "make-student":
            written = make_student(
                Path(args.notebooks), Path(args.out), args.force, args.keep_outputs
            )
            print(f"{len(written)} student notebook(s) in {args.out}/")
        else:
            # Absolute paths before anything runs: the sandbox mounts them from the kernel's own
            # temporary folder, where a relative path would name nothing.
            out, submissions, reference = (
                Path(args.out).absolute(),
                Path(args.submissions).resolve(),
                Path(args.reference).resolve(),
            )
            check_csv_out(out, submissions, reference, args.force)  # before hours of grading
            rows = grade(submissions, reference, timeout=args.timeout, out=out)
            write_csv(rows, out)
            print(totals_table(rows))
            print(f"wrote {args.out} ({len(rows)} rows)")
    except (OSError, ValueError) as exc:  # SolutionMarkerError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
