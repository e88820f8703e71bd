"""Student versions of the exercise notebooks (``python -m helpers.grading make-student``).

nbgrader's notebook format (schema 3, ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers): each
solution is replaced by a stub, outputs are cleared, check cells are kept. nbgrader itself is not
needed. Format: https://nbgrader.readthedocs.io/en/stable/user_guide/creating_and_grading_assignments.html
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

CODE_STUB = (
    "# YOUR CODE HERE\n"
    'raise NotImplementedError("Write this function: see the exercise text above")'
)
TEXT_STUB = "YOUR ANSWER HERE"
_BEGIN = re.compile(r"^\s*#+\s*BEGIN SOLUTION\b")
_END = re.compile(r"^\s*#+\s*END SOLUTION\b")
_BEGIN_HIDDEN = re.compile(r"^\s*#+\s*BEGIN HIDDEN TESTS\b")
_END_HIDDEN = re.compile(r"^\s*#+\s*END HIDDEN TESTS\b")


class SolutionMarkerError(ValueError):
    """A notebook's ``BEGIN SOLUTION`` / ``END SOLUTION`` markers do not pair up."""


def nbgrader_metadata(cell: Any) -> dict[str, Any]:
    """The cell's ``metadata.nbgrader`` dict (empty when the cell is not an nbgrader cell)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def is_solution_cell(cell: Any) -> bool:
    """True for a cell the learner writes in (``solution: true``)."""
    return bool(nbgrader_metadata(cell).get("solution", False))


def is_check_cell(cell: Any) -> bool:
    """True for an autograded check cell: ``grade: true, solution: false``, a code cell."""
    meta = nbgrader_metadata(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def check_cells(nb: Any) -> dict[str, tuple[int, float]]:
    """``{grade_id: (cell index, points)}`` for every check cell of ``nb``, in notebook order."""
    found: dict[str, tuple[int, float]] = {}
    for index, cell in enumerate(nb.cells):
        if is_check_cell(cell):
            meta = nbgrader_metadata(cell)
            found[str(meta.get("grade_id", f"cell-{index}"))] = (
                index,
                float(meta.get("points", 0)),
            )
    return found


def has_exercises(nb: Any) -> bool:
    """True when any cell carries nbgrader metadata or a solution marker."""
    return any(
        nbgrader_metadata(cell) or any(_BEGIN.match(line) for line in cell.source.splitlines())
        for cell in nb.cells
    )


def _where(name: str, index: int, cell: Any) -> str:
    gid = nbgrader_metadata(cell).get("grade_id")
    return f"{name}, cell {index + 1}" + (f" (grade_id {gid!r})" if gid else "")


def _replace_regions(
    lines: list[str], begin: re.Pattern[str], end: re.Pattern[str], stub: str | None, where: str
) -> tuple[list[str], bool]:
    """Replace each begin..end region (markers included) by ``stub`` indented like its begin line.

    ``stub=None`` deletes the region. Returns the new lines and whether any region was found.
    Raises SolutionMarkerError when the markers do not pair up.
    """
    out: list[str] = []
    begin_line: int | None = None
    found = False
    for number, line in enumerate(lines, start=1):
        if begin.match(line):
            if begin_line is not None:
                raise SolutionMarkerError(
                    f"{where}: line {number} opens a region while the one opened on line "
                    f"{begin_line} is still open ({line.strip()!r}). Add the missing END marker."
                )
            begin_line = number
            found = True
            if stub is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + stub_line for stub_line in stub.splitlines())
        elif end.match(line):
            if begin_line is None:
                raise SolutionMarkerError(
                    f"{where}: line {number} ({line.strip()!r}) closes a region that was never "
                    "opened. Add the missing BEGIN marker or delete this line."
                )
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise SolutionMarkerError(
            f"{where}: the region opened on line {begin_line} is never closed. Add the END marker."
        )
    return out, found


def is_exercise_cell(cell: Any) -> bool:
    """True for a cell that is part of an exercise: a solution cell, a check cell, or a cell with
    a solution region; their outputs would show the answer."""
    return (
        is_solution_cell(cell)
        or is_check_cell(cell)
        or any(_BEGIN.match(line) for line in cell.source.splitlines())
    )


def student_version(nb: Any, name: str = "notebook", keep_outputs: bool = False) -> Any:
    """A copy of ``nb`` as learners get it (nbgrader's ``generate_assignment``, without nbgrader).

    - every ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes ``CODE_STUB`` (code) or
      ``TEXT_STUB`` (markdown), indented like the BEGIN line; a solution cell without markers is
      replaced whole, as nbgrader does;
    - ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions are deleted;
    - outputs, execution counts, execution timings and saved widget state are cleared, or, with
      ``keep_outputs``, only those of exercise cells (:func:`is_exercise_cell`): the learner
      versions a self-learner opens keep the recorded measurements of every other cell;
    - nbgrader metadata is kept, so the grader can find the check cells.

    Args:
        nb: an nbformat v4 notebook (not modified).
        name: shown in error messages (e.g. the file name).
        keep_outputs: keep the outputs of the cells that are not part of an exercise.
    Raises:
        SolutionMarkerError: naming the notebook and cell whose markers do not pair up.
    """
    student = copy.deepcopy(nb)
    for index, cell in enumerate(student.cells):
        where = _where(name, index, cell)
        exercise = is_exercise_cell(cell)
        stub = TEXT_STUB if cell.cell_type == "markdown" else CODE_STUB
        lines, replaced = _replace_regions(cell.source.splitlines(), _BEGIN, _END, stub, where)
        lines, _ = _replace_regions(lines, _BEGIN_HIDDEN, _END_HIDDEN, None, where)
        if is_solution_cell(cell) and not replaced:
            lines = stub.splitlines()
        cell.source = "\n".join(lines)
        if cell.cell_type == "code" and (exercise or not keep_outputs):
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
        if "attachments" in cell and is_solution_cell(cell):
            del cell["attachments"]
    if not keep_outputs:
        student.metadata.pop("widgets", None)
    return student


def _notebooks_in(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is neither a notebook nor a folder of notebooks.")
    return sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))


def read_notebook(path: Path) -> Any:
    """``path`` read as an nbformat v4 notebook.

    Raises:
        ValueError: it is not a notebook nbformat can read, or has no list of cells (a one-line
            message naming the file, never a traceback of nbformat's).
    """
    import nbformat

    try:
        nb = nbformat.read(path, as_version=4)
        cells = nb.get("cells")
        if not isinstance(cells, list) or not all(
            isinstance(c, dict) and "cell_type" in c and "source" in c for c in cells
        ):
            raise ValueError("it has no list of cells")
    except Exception as exc:
        why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise ValueError(
            f"{path} is not a notebook ({type(exc).__name__}{': ' + why if why else ''}): "
            "fix it or move it out of the folder"
        ) from None
    return nb


# Notebook metadata make_student writes into each student version: a fingerprint of its cells, so a
# later run can tell its own unchanged output (safe to replace) from a file someone has worked in.
STUDENT_MARK = "fast_gpt2_student_version"


def fingerprint(nb: Any) -> str:
    """SHA-256 of the notebook's cell types, sources and outputs (metadata left out): a learner
    who edited a cell or ran the notebook has changed it."""
    import hashlib
    import json

    cells = [(c.cell_type, c.source, c.get("outputs", [])) for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, sort_keys=True, default=str).encode()).hexdigest()


def overwrite_problem(target: Path) -> str | None:
    """Why writing a student version to ``target`` would destroy work, or None when it would not:
    ``target`` does not exist, or is a student version this command wrote and nobody changed."""
    import nbformat

    if target.is_symlink():  # writing would create or change the file it points at
        return f"{target} is a link"
    if not target.exists():
        return None
    if target.is_dir():
        return f"{target} is a folder"
    try:
        nb = nbformat.read(target, as_version=4)
    except Exception:
        return f"{target} exists and is not a notebook make-student wrote"
    mark = nb.metadata.get(STUDENT_MARK)
    if not isinstance(mark, dict):
        return f"{target} exists and was not written by make-student (a solution notebook?)"
    if mark.get("sha256") != fingerprint(nb):
        return f"{target} was changed after make-student wrote it (a learner's work?)"
    return None


def make_student(
    source: Path, out: Path, force: bool = False, keep_outputs: bool = False
) -> list[Path]:
    """Write the student version of every exercise notebook in ``source`` to ``out``.

    ``source`` is a folder (its ``*.ipynb``, not recursive) or one notebook. Notebooks without any
    nbgrader cell are skipped (said on stdout): they have nothing to hide. Nothing else is copied.
    An existing file in ``out`` is replaced only when it is this command's own unchanged output
    (:func:`overwrite_problem`), or with ``force``; otherwise nothing is written. ``keep_outputs``:
    see :func:`student_version` (the committed ``learner/`` versions are made with it).

    Returns:
        The written paths.
    Raises:
        FileNotFoundError: when ``source`` does not exist.
        ValueError: when ``out`` is a file or the source folder, or a file there would be
            overwritten (without ``force``).
        SolutionMarkerError: on unbalanced markers (nothing is written).
    """
    import nbformat

    notebooks = _notebooks_in(source)
    source_dir = (source if source.is_dir() else source.parent).resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the student versions")
    if out.resolve() == source_dir:
        raise ValueError(
            f"--out {out} is the folder of the solution notebooks; choose another folder."
        )
    versions = []
    for path in notebooks:
        nb = read_notebook(path)
        if not has_exercises(nb):
            print(f"skipped {path} (no nbgrader cells)")
            continue
        student = student_version(nb, name=path.name, keep_outputs=keep_outputs)
        student.metadata[STUDENT_MARK] = {"source": path.name, "sha256": fingerprint(student)}
        nbformat.validate(student)
        versions.append((out / path.name, student))
    problems = [p for p in (overwrite_problem(target) for target, _ in versions) if p]
    if problems and not force:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(f"{problems[0]}{more}: nothing written; pass --force to replace")
    written = []
    for target, student in versions:
        out.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():  # with force: the link is replaced, its target left alone
            target.unlink()
        nbformat.write(student, target)
        print(f"wrote {target} ({len(check_cells(student))} graded cells)")
        written.append(target)
    return written
