"""Grading submissions (``python -m helpers.grading grade``) and the command line of both tools.

Every submission runs in a fresh kernel; a check cell scores its points (taken from the reference
notebook) when it runs without error. Teacher guide with the exact commands: docs/grading.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helpers
from helpers.grading.student import (
    _notebooks_in,
    check_cells,
    is_check_cell,
    make_student,
    nbgrader_metadata,
)

# Prepended to every check cell when grading: re-executes the checks' modules (common, then each
# chapter, then the package that lists them) in the kernel, so that checks a submission replaced are
# restored (a limit, not a sandbox: grade untrusted code in a container, docs/grading.md).
FRESH_CHECKS_PRELUDE = (
    "import importlib as _il, helpers.grading as _hg\n"
    "_hg = _il.reload(_hg)\n"  # restores its list of chapter modules
    "for _m in (_hg.common, *_hg.CHAPTERS): _il.reload(_m)\n"
    "grading = _il.reload(_hg)\n"  # binds the re-executed checks
)

TIMEOUT_ENAME = "CellTimeoutError"
REPO_ROOT = helpers.REPO_ROOT


@dataclass
class CellRun:
    """What happened to one code cell: status is ``ok``, ``error``, ``timeout`` or ``not run``."""

    index: int  # 0-based position in the notebook
    status: str
    ename: str = ""
    evalue: str = ""


@dataclass
class NotebookRun:
    """The result of :func:`execute_notebook`: one CellRun per code cell, and kernel events."""

    cells: dict[int, CellRun] = field(default_factory=dict)
    kernel_died_in: int | None = None  # 0-based index of the cell during which the kernel died
    stuck_after_timeout_in: int | None = None  # a timeout the interrupt could not end
    startup_error: str | None = None  # the kernel never started


def _kernel_manager_class(prefix: tuple[str, ...] = ()) -> type:
    """An AsyncKernelManager that always launches ipykernel with *this* Python interpreter, after
    ``prefix`` (the sandbox's command, :func:`sandbox_prefix`) when one is given.

    A ``python3`` kernelspec installed elsewhere (another conda env, ~/.local) would otherwise run
    the submissions with a different torch, or without ``helpers``.
    """
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    argv = [*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]

    class CurrentPythonKernelManager(AsyncKernelManager):
        @property
        def kernel_spec(self) -> KernelSpec:  # type: ignore[override]
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=argv,
                    display_name=(
                        f"Python {sys.version_info.major}.{sys.version_info.minor} (grader)"
                    ),
                    language="python",
                    resource_dir="",
                )
            return self._kernel_spec

    return CurrentPythonKernelManager


# Run inside a new mount namespace (unshare): bind each path before "--hide" read-only, cover each
# path after it with an empty tmpfs, then exec the kernel. Nothing outside the namespace changes.
_SANDBOX_SCRIPT = """mode=ro
for a in "$@"; do
  shift
  case "$a" in
    --hide) mode=hide ;;
    --) exec "$@" ;;
    *) if [ "$mode" = ro ]; then mount --bind "$a" "$a" && mount -o remount,bind,ro "$a" || exit 97
       else mount -t tmpfs -o size=1m grader-hidden "$a" || exit 97; fi ;;
  esac
done
exit 98"""


def sandbox_prefix(read_only: Iterable[Path], hidden: Iterable[Path]) -> tuple[str, ...]:
    """The command that starts a kernel in an OS sandbox: a private mount namespace (``unshare``,
    util-linux; as an unprivileged user also a user namespace) in which ``read_only`` paths cannot
    be written and ``hidden`` paths look empty. Paths that do not exist are left out."""
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    ro = [str(p) for p in read_only if p.exists()]
    hide = [str(p) for p in hidden if p.is_dir()]
    return (
        "unshare",
        "--mount",
        "--propagation",
        "private",
        *user,
        "sh",
        "-c",
        _SANDBOX_SCRIPT,
        "sh",
        *ro,
        "--hide",
        *hide,
        "--",
    )


_sandbox_checked: tuple[bool, str] | None = None


def sandbox_available() -> tuple[bool, str]:
    """Whether :func:`sandbox_prefix` works on this machine (tried once per process), and why not.

    It needs ``unshare`` and the right to make mount namespaces: root, or user namespaces enabled
    for unprivileged users (most Linux distributions). Not on macOS or Windows.
    """
    global _sandbox_checked
    if _sandbox_checked is None:
        import shutil
        import subprocess
        import tempfile

        if shutil.which("unshare") is None:
            _sandbox_checked = (False, "the unshare command (util-linux) is not installed")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "secret").write_text("x")
                cmd = [
                    *sandbox_prefix([Path(tmp)], [Path(tmp)]),
                    "sh",
                    "-c",
                    "test ! -e $0/secret",
                    tmp,
                ]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                    ok = done.returncode == 0
                    why = "" if ok else _first_line(done.stderr or f"exit status {done.returncode}")
                except (OSError, subprocess.TimeoutExpired) as exc:
                    ok, why = False, _first_line(str(exc))
            _sandbox_checked = (ok, why)
    return _sandbox_checked


def kernel_env() -> dict[str, str]:
    """The kernel's environment: ours, with the repository root first on PYTHONPATH.

    So ``import helpers`` works in the kernel whether or not the course is pip-installed.
    """
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def execute_notebook(
    nb: Any, cwd: Path, timeout: int = 600, sandbox: tuple[str, ...] = ()
) -> NotebookRun:
    """Run every code cell of ``nb`` (in place) in a fresh kernel;
    never raises for the notebook's faults.

    Errors are allowed (later cells still run). A cell running longer than ``timeout`` seconds is
    interrupted (KeyboardInterrupt in the kernel) and recorded as ``timeout``; when the kernel does
    not answer after that, the remaining cells are ``not run``. A dying kernel (``os._exit``, out of
    memory) ends the run, and the remaining cells are ``not run``.

    Args:
        nb: nbformat v4 notebook; outputs are replaced by this run's.
        cwd: the kernel's working folder (the notebook's folder).
        timeout: seconds per cell.
        sandbox: a command the kernel starts under (:func:`sandbox_prefix`); () = none.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    run = NotebookRun()
    replies: dict[int, dict[str, Any]] = {}

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any] | None) -> None:
        if execute_reply is not None:
            replies[cell_index] = execute_reply.get("content", {})

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=_kernel_manager_class(sandbox),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": TIMEOUT_ENAME,
            "evalue": f"timeout after {timeout} s",
            "traceback": [],
        },
        record_timing=False,
        resources={"metadata": {"path": str(cwd)}},
        on_cell_executed=on_cell_executed,
    )
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    for i in code_cells:
        run.cells[i] = CellRun(i, "not run")
    try:
        with client.setup_kernel(env=kernel_env()):
            for i in code_cells:
                try:
                    client.execute_cell(nb.cells[i], i)
                except DeadKernelError:
                    run.kernel_died_in = i
                    break
                except CellTimeoutError:  # not expected with interrupt_on_timeout; be safe
                    run.cells[i] = CellRun(i, "timeout")
                    run.stuck_after_timeout_in = i
                    break
                reply = replies.get(i, {})
                if reply.get("status") == "error" and reply.get("ename") == TIMEOUT_ENAME:
                    run.cells[i] = CellRun(i, "timeout")
                    if not _kernel_answers(client, min(timeout, 30)):
                        run.stuck_after_timeout_in = i
                        break
                elif reply.get("status") == "error":
                    run.cells[i] = CellRun(
                        i, "error", str(reply.get("ename", "")), str(reply.get("evalue", ""))
                    )
                else:
                    run.cells[i] = CellRun(i, "ok")
    except DeadKernelError:
        run.kernel_died_in = run.kernel_died_in if run.kernel_died_in is not None else -1
    except Exception as exc:  # kernel could not start, or the client broke: report, never crash
        if not any(c.status != "not run" for c in run.cells.values()):
            run.startup_error = f"{type(exc).__name__}: {_first_line(str(exc))}"
        elif run.kernel_died_in is None:
            run.kernel_died_in = -1
    return run


def _kernel_answers(client: Any, timeout: int) -> bool:
    """After an interrupted timeout: does the kernel run a trivial cell within ``timeout`` s?"""
    import nbformat

    probe = nbformat.v4.new_code_cell("pass")
    saved = client.timeout
    client.timeout = timeout
    try:
        reply: dict[str, Any] = {}
        hook = client.on_cell_executed
        client.on_cell_executed = lambda cell, cell_index, execute_reply: reply.update(
            (execute_reply or {}).get("content", {})
        )
        try:
            client.execute_cell(probe, -1, store_history=False)
        finally:
            client.on_cell_executed = hook
        return reply.get("status") == "ok"
    except Exception:
        return False
    finally:
        client.timeout = saved


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class Reference:
    """One solution notebook: its graded cells, their points and their check code."""

    path: Path
    points: dict[str, float]  # grade_id -> points, in notebook order
    sources: dict[str, str]  # grade_id -> the check cell's code (hidden tests included)


def load_references(folder: Path) -> dict[str, Reference]:
    """``{file name: Reference}`` for every notebook in ``folder`` with at least one check cell.

    Raises:
        FileNotFoundError: when ``folder`` holds no such notebook.
    """
    import nbformat

    refs = {}
    for path in _notebooks_in(folder):
        nb = nbformat.read(path, as_version=4)
        cells = check_cells(nb)
        if cells:
            refs[path.name] = Reference(
                path,
                {gid: pts for gid, (_, pts) in cells.items()},
                {gid: nb.cells[i].source for gid, (i, _) in cells.items()},
            )
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
    sandbox: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Execute one submission and return one CSV row per graded cell of its reference.

    The check cells' code is restored from the reference before running (as ``nbgrader autograde``
    does), so an edited check cannot pass; points always come from the reference. ``text`` is the
    submission as read before any submission ran (default: read ``path`` now). The kernel runs in a
    fresh temporary folder, under ``sandbox`` (:func:`sandbox_prefix`) when one is given.
    """
    import tempfile

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
        return rows("error", f"notebook unreadable: {type(exc).__name__}: {_first_line(str(exc))}")

    where: dict[str, int] = {}  # grade_id -> index of the student's (last) check cell
    for index, cell in enumerate(nb.cells):
        gid = nbgrader_metadata(cell).get("grade_id")
        if gid in ref.points and is_check_cell(cell):
            # The reference's check code, run against a freshly re-executed helpers.grading: a
            # submission that reassigned grading.check_* (or the name `grading`) cannot pass
            # that way.
            cell.source = FRESH_CHECKS_PRELUDE + ref.sources[gid]
            where[gid] = index
    with tempfile.TemporaryDirectory(prefix="grading-") as folder:
        run = execute_notebook(nb, cwd=Path(folder), timeout=timeout, sandbox=sandbox)

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
        reason = f"{cell.ename}: {_first_line(cell.evalue)}" if cell.evalue else cell.ename
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
    (renamed files)."""
    if path.name in refs:
        return refs[path.name]
    try:
        import nbformat

        ids = set(check_cells(nbformat.read(path, as_version=4)))
    except Exception:
        return None
    best = max(refs.values(), key=lambda r: len(ids & set(r.points)))
    return best if ids & set(best.points) else None


def _submitted_notebooks(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts and not p.name.startswith(".")
    )


def grade(submissions: Path, reference: Path, timeout: int = 600) -> list[dict[str, Any]]:
    """Grade every student folder in ``submissions``; return the CSV rows (see ``COLUMNS``).

    Layout: ``submissions/<student id>/<notebook>.ipynb`` (sub-folders below the student's are
    searched too, so nbgrader's ``submitted/<student>/<assignment>/`` works). A notebook is graded
    against the reference notebook of the same file name, or, when renamed, the one sharing most
    grade ids. A notebook that some students submitted and others did not gives the others
    ``missing`` rows. Nothing a submission does stops the grading of the others.

    Raises:
        FileNotFoundError: when ``submissions`` has no student folder,
            or ``reference`` no graded notebook.
    """
    refs = load_references(reference)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of student folders.")
    for stray in sorted(submissions.glob("*.ipynb")):
        print(
            f"ignored {stray}: put each student's notebooks in {submissions}/<student id>/",
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
        notebooks = _submitted_notebooks(folder)
        for path in notebooks:
            ref = _match_reference(path, refs)
            if ref is None:
                print(
                    f"ignored {path}: matches no reference notebook in {reference}", file=sys.stderr
                )
                continue
            current = chosen[folder.name].get(ref.path.name)
            if current is None or _prefer(path, current, ref):
                if current is not None:
                    print(
                        f"ignored {current}: {path} is graded as {ref.path.name} instead",
                        file=sys.stderr,
                    )
                chosen[folder.name][ref.path.name] = path
            else:
                print(
                    f"ignored {path}: {current} is graded as {ref.path.name} instead",
                    file=sys.stderr,
                )
        if not notebooks:
            rows.append(_row(folder.name, "", "", 0, 0, "missing", "no notebook submitted"))
    assignment = sorted({name for per_student in chosen.values() for name in per_student})

    # Every submission is read before any of them runs,
    # so one cannot change what another is graded on.
    texts: dict[Path, str | None] = {}
    for per_student in chosen.values():
        for path in per_student.values():
            try:
                texts[path] = path.read_text()
            except (OSError, UnicodeDecodeError):
                texts[path] = None  # grade_notebook reports it unreadable
    sandbox: tuple[str, ...] = ()
    ok, why = sandbox_available()
    if (
        ok
    ):  # the repository and the environment read-only; solutions, answers and submissions hidden
        sandbox = sandbox_prefix(
            read_only=[REPO_ROOT, Path(sys.prefix)],
            hidden=[reference, REPO_ROOT / "notebooks", REPO_ROOT / "tests", submissions],
        )
    else:
        print(
            f"warning: no OS sandbox ({why}): submissions run with this account's rights and can "
            "read and change its files; grade in a container (docs/grading.md)",
            file=sys.stderr,
        )

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
            print(f"grading {path} against {ref.path} ...", file=sys.stderr, flush=True)
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
                        "notebook unreadable: cannot read the file",
                    )
                    for g, p in ref.points.items()
                )
                continue
            rows.extend(grade_notebook(path, ref, folder.name, timeout, text=text, sandbox=sandbox))
    return rows


def _prefer(new: Path, old: Path, ref: Reference) -> bool:
    """Of two files graded as the same notebook: the exact name wins, then the newer file."""
    if (new.name == ref.path.name) != (old.name == ref.path.name):
        return new.name == ref.path.name
    return new.stat().st_mtime > old.stat().st_mtime


def csv_out_problem(path: Path, submissions: Path, reference: Path) -> str | None:
    """Why ``grade --out path`` must not be written (None if it may): a notebook's name, a path in
    the submissions or reference folder, a folder, or an existing file that is not a grades CSV
    (its first line is not :data:`COLUMNS`)."""
    if path.suffix.lower() == ".ipynb":
        return f"--out {path} is a notebook's name: give a .csv file"
    where = path.resolve()
    for folder, what in ((submissions, "submissions"), (reference, "reference notebooks")):
        if folder.resolve() == where or folder.resolve() in where.parents:
            return f"--out {path} lies in the {what} folder {folder}: write the grades elsewhere"
    if path.is_dir():
        return f"--out {path} is a folder: give a file name, e.g. {path / 'grades.csv'}"
    if path.exists():
        try:
            with open(path, newline="") as f:
                first = f.readline().strip()
        except (OSError, UnicodeDecodeError):
            first = ""
        if first != ",".join(COLUMNS):
            return f"--out {path} exists and is not a grades CSV: pass --force to replace it"
    return None


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """Write grading rows with the columns ``COLUMNS``."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


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


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make-student`` and ``grade`` (see docs/grading.md)."""
    parser = argparse.ArgumentParser(
        prog="python -m helpers.grading",
        description=(
            "Graded exercises: student versions of the notebooks, and grading of submissions."
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
    gr = sub.add_parser("grade", help="execute and grade submissions/<student>/<notebook>.ipynb")
    gr.add_argument("submissions", help="folder with one sub-folder per student id")
    gr.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    gr.add_argument("--timeout", type=int, default=600, help="seconds per cell (default: 600)")
    gr.add_argument(
        "--reference", default="notebooks", help="folder of solution notebooks (default: notebooks)"
    )
    gr.add_argument(
        "--force", action="store_true", help="replace an --out file that is not a grades CSV"
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "make-student":
            written = make_student(Path(args.notebooks), Path(args.out), force=args.force)
            print(f"{len(written)} student notebook(s) in {args.out}/")
        else:
            out, submissions, reference = (
                Path(args.out),
                Path(args.submissions),
                Path(args.reference),
            )
            problem = csv_out_problem(out, submissions, reference)
            if problem and not (args.force and "--force" in problem):
                raise ValueError(problem)
            rows = grade(submissions, reference, timeout=args.timeout)
            write_csv(rows, out)
            print(totals_table(rows))
            print(f"wrote {args.out} ({len(rows)} rows)")
    except (OSError, ValueError) as exc:  # SolutionMarkerError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
