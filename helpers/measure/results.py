"""The course's committed measurements (``results/*.json``), found from anywhere.

Notebooks show reference numbers measured on the course's own GPU next to the learner's. They look
them up here instead of by a relative path, so a notebook copied elsewhere (a student folder, a
grading directory) still finds them, or says plainly that they are not there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import helpers

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


def missing(name: str) -> str:
    """What to print when :func:`load` found nothing."""
    return (
        f"committed result {name} not found: clone the course repository (its results/ folder "
        f"holds the course's own GPU measurements) or set {RESULTS_DIR_ENV} to that folder."
    )
