"""The course's addresses, each kept in one place: the repository (``pyproject.toml``'s
``[project.urls]``) and the Open-in-Colab link of each chapter's learner version.

The Colab set-up cell of every notebook runs before the course is installed, so it cannot import
this module: it keeps the address as a literal. ``tests/test_links.py`` keeps that literal and every
Colab badge (README.md's chapter table, the top of each notebook) equal to :func:`repo_url`.
"""

from __future__ import annotations

import re
from pathlib import Path

# The committed learner versions: ``python -m helpers.grading make-student notebooks --out learner``
# (the same file names as notebooks/, solutions stubbed, outputs cleared).
LEARNER_DIR = "learner"
BRANCH = "main"  # the branch Colab opens
COLAB_BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"
_ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds helpers/ (a source install)
_GITHUB = "https://github.com/"


def _urls_from_pyproject(text: str) -> dict[str, str]:
    """``[project.urls]`` of a pyproject.toml's text, with tomllib (Python >= 3.11) or, on 3.10, a
    regular expression that reads the table's ``Key = "value"`` lines."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: no TOML parser in the standard library
        return _urls_by_regex(text)
    return tomllib.loads(text).get("project", {}).get("urls", {})


def _urls_by_regex(text: str) -> dict[str, str]:
    table = re.search(r"^\[project\.urls\][ \t]*\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        return {}
    pairs = re.findall(r'^[ \t]*"?([\w .-]+?)"?[ \t]*=[ \t]*"([^"]*)"', table.group(1), re.M)
    return dict(pairs)


def _urls_from_metadata() -> dict[str, str]:
    """The installed package's ``Project-URL`` entries (``"Repository, https://..."``)."""
    from importlib import metadata

    try:
        entries = metadata.metadata("fast-gpt2-course").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return {}
    return dict(tuple(part.strip() for part in e.split(",", 1)) for e in entries if "," in e)


def repo_url() -> str:
    """The course's GitHub repository, e.g. ``"https://github.com/OWNER/NAME"`` (no trailing
    slash): ``Repository`` in ``pyproject.toml``'s ``[project.urls]`` in a source checkout, else
    the installed package's metadata (which pip writes from the same table).

    Raises:
        LookupError: neither names a repository (add ``Repository = "..."`` to ``[project.urls]``).
    """
    pyproject = _ROOT / "pyproject.toml"
    urls = _urls_from_pyproject(pyproject.read_text()) if pyproject.is_file() else {}
    url = urls.get("Repository") or _urls_from_metadata().get("Repository")
    if not url:
        raise LookupError(
            f'no repository address: add Repository = "https://github.com/OWNER/NAME" to '
            f"[project.urls] in {pyproject}"
        )
    return url.rstrip("/")


def learner_path(notebook: str) -> str:
    """The learner version of ``notebook`` (a file name such as ``"00_setup_and_hardware.ipynb"``
    or a path ending in one), relative to the repository: ``"learner/00_setup_and_hardware.ipynb"``.
    """
    return f"{LEARNER_DIR}/{Path(notebook).name}"


def colab_url(path: str) -> str:
    """The address that opens ``path`` (a notebook relative to the repository) from GitHub in
    Colab. Format: https://colab.research.google.com/github/ (Colab's "GitHub" tab).

    Raises:
        ValueError: the repository is not on GitHub (Colab opens notebooks from GitHub only).
    """
    repo = repo_url()
    if not repo.startswith(_GITHUB):
        raise ValueError(f"{repo} is not a GitHub address: Colab opens notebooks from GitHub only")
    return f"https://colab.research.google.com/github/{repo[len(_GITHUB) :]}/blob/{BRANCH}/{path}"


def colab_badge(notebook: str) -> str:
    """The Markdown of the Open-in-Colab badge for ``notebook``'s learner version (exercises
    stubbed), as README.md's chapter table and the top of each notebook carry it."""
    return f"[![Open In Colab]({COLAB_BADGE_SVG})]({colab_url(learner_path(notebook))})"
