"""What the grader takes in and gives out, made safe before any submission runs: a submitted
notebook is read only when it is a regular, reasonably sized file inside its student's folder, and a
grades CSV cell is never a spreadsheet formula."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_SUBMISSION_BYTES = 64 * 2**20  # a graded notebook with its outputs is well under 10 MiB
# How deep below a student's folder notebooks are looked for: nbgrader's layout
# (submitted/<student>/<assignment>/) needs 1; a tree nested deeper is not walked.
MAX_DEPTH = 4


def submitted_notebooks(folder: Path) -> list[Path]:
    """The ``*.ipynb`` files in a student's ``folder`` and its sub-folders down to
    :data:`MAX_DEPTH`, sorted; links to folders are not followed, checkpoints
    (``.ipynb_checkpoints``) and hidden names are skipped, and a folder that cannot be listed is
    skipped. Never raises for what a submission's tree holds (a loop of links, 1000 nested
    folders, a dangling link)."""
    import os

    found, stack = [], [(Path(folder), 0)]
    while stack:
        here, depth = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for e in entries:
            if e.name.startswith("."):  # hidden, .ipynb_checkpoints included
                continue
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir and depth < MAX_DEPTH:
                stack.append((Path(e.path), depth + 1))
            elif not is_dir and e.name.endswith(".ipynb"):
                found.append(Path(e.path))
    return sorted(found)


def modified(path: Path) -> float:
    """The file's modification time (of a link itself, not its target), 0.0 when it cannot be
    read: used to prefer the newer of two files, never raising for a dangling link."""
    import os

    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def shown(path: Any) -> str:
    """``path`` as text safe to print on a terminal: a control character in a submitted file's
    name (an escape sequence that would retitle or recolour the teacher's terminal) is shown
    escaped, e.g. ``\\x1b``."""
    text = str(path)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def read_submission(path: Path, student_folder: Path) -> str:
    """The text of a submitted notebook, read before any submission runs.

    Only a regular file of at most :data:`MAX_SUBMISSION_BYTES` bytes that lies, links resolved,
    inside the student's own folder (itself not a link) is read: a link to a reference notebook
    or to another student's file, a FIFO (reading it would block the grader) and a huge or sparse
    file (reading it would exhaust the grader's memory) are refused.

    Raises:
        ValueError: with the reason (graded as "notebook unreadable: <reason>").
        OSError, UnicodeDecodeError: the file cannot be read as text.
    """
    import os
    import stat

    if student_folder.is_symlink():
        raise ValueError(f"the student folder {student_folder.name} is a link, not a folder")
    own = student_folder.resolve()
    if path.is_symlink() or own not in path.resolve().parents:
        raise ValueError("the notebook is a link, not a file in the student's folder")
    info = os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("the notebook is not a regular file")
    if info.st_nlink > 1:  # one file under two names: another student's, or a solution
        raise ValueError("the notebook is a hard link to another file: submit a copy of it")
    if info.st_size > MAX_SUBMISSION_BYTES:
        raise ValueError(
            f"the notebook is {info.st_size / 2**20:.0f} MiB, over the "
            f"{MAX_SUBMISSION_BYTES // 2**20} MiB limit: clear its outputs and submit again"
        )
    with open(path, "rb") as f:
        data = f.read(MAX_SUBMISSION_BYTES + 1)
    if len(data) > MAX_SUBMISSION_BYTES:
        raise ValueError("the notebook grew past the size limit while it was read")
    return data.decode("utf-8")


# What starts a formula in a spreadsheet cell (OWASP, "CSV Injection"), full-width forms included.
FORMULA_START = ("=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def csv_cell(value: Any) -> Any:
    """A text cell that a spreadsheet could run as a formula gets a leading ``'``, which
    spreadsheets show as text (OWASP, "CSV Injection"): one that starts with a tab, a carriage
    return or a line feed, or whose first other character is one of :data:`FORMULA_START` (a
    submission controls the error text in the grades' ``reason`` column and the device name in a
    leaderboard). Other control characters than tab and line breaks (NUL, an escape sequence
    that would clear or recolour a terminal showing the file) are written escaped, e.g. ``\x1b``.
    Numbers are kept."""
    if not isinstance(value, str):
        return value
    value = "".join(
        c.encode("unicode_escape").decode()
        if ord(c) < 32 and c not in "\t\r\n" or c == "\x7f"
        else c
        for c in value
    )
    if value[:1] in ("\t", "\r", "\n") or value.lstrip(" \t\r\n")[:1] in FORMULA_START:
        return "'" + value
    return value
