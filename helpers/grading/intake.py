"""What the grader takes in and gives out, made safe before any submission runs: a submitted
notebook is read only when it is a regular, reasonably sized file inside its student's folder, and a
grades CSV cell is never a spreadsheet formula."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_SUBMISSION_BYTES = 64 * 2**20  # a graded notebook with its outputs is well under 10 MiB


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


def csv_cell(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula (it starts with =, +, -, @, a tab or
    a carriage return; a submission controls the error text in the ``reason`` column) gets a
    leading ``'``, which spreadsheets show as text (OWASP, "CSV Injection"). Numbers are kept."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value
