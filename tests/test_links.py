"""The course's address lives in one place (pyproject.toml's [project.urls], read by
helpers.tools.links), and every copy of it agrees: each notebook's Colab set-up cell and every
Open-in-Colab badge, in README.md's chapter table and at the top of each notebook. Each badge opens
the learner version of its own chapter, a file that exists (or that make-student writes)."""

import email.message
import re
from pathlib import Path

import nbformat
import pytest

from helpers.grading import student
from helpers.tools import links

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
BADGE = re.compile(
    r"\[!\[Open In Colab\]\((?P<svg>[^)]*)\)\]"
    r"\(https://colab\.research\.google\.com/github/(?P<repo>[^/]+/[^/]+)/blob/(?P<branch>[^/]+)/"
    r"(?P<path>[^)]+)\)"
)
REPO_URL_LINE = re.compile(r'^REPO_URL = "([^"]*)"$', re.M)


def _badges(text: str) -> list[re.Match]:
    found = BADGE.findall(text)
    # a badge the pattern misses (a typo in its address) is still a badge: count the image text
    assert len(found) == text.count("[![Open In Colab]"), "a Colab badge does not match the format"
    return list(BADGE.finditer(text))


def test_repo_url_is_the_pyproject_repository_address():
    tomllib = pytest.importorskip("tomllib")
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert links.repo_url() == urls["Repository"].rstrip("/")
    assert links.repo_url().startswith("https://github.com/")


def test_python_310s_regex_reads_the_same_urls_as_tomllib():
    tomllib = pytest.importorskip("tomllib")
    text = (ROOT / "pyproject.toml").read_text()
    assert links._urls_by_regex(text) == tomllib.loads(text)["project"]["urls"]
    other = '[project]\nname = "x"\n\n[project.urls]\nHomepage = "https://a"\n"Bug Tracker" = "b"\n'
    assert links._urls_by_regex(other) == {"Homepage": "https://a", "Bug Tracker": "b"}
    assert links._urls_by_regex('[project]\nname = "x"\n') == {}


def test_without_a_checkout_repo_url_reads_the_installed_metadata(monkeypatch, tmp_path):
    from importlib import metadata

    meta = email.message.Message()
    meta["Project-URL"] = "Repository, https://github.com/someone/fork"
    monkeypatch.setattr(links, "_ROOT", tmp_path)  # no pyproject.toml there
    monkeypatch.setattr(metadata, "metadata", lambda name: meta)
    assert links.repo_url() == "https://github.com/someone/fork"
    monkeypatch.setattr(metadata, "metadata", lambda name: email.message.Message())
    with pytest.raises(LookupError, match=r"\[project.urls\]"):
        links.repo_url()


def test_every_colab_cell_clones_the_pyproject_address():
    assert len(NOTEBOOKS) >= 13
    for path in NOTEBOOKS:
        first_code = next(c for c in nbformat.read(path, 4).cells if c.cell_type == "code")
        assert REPO_URL_LINE.findall(first_code.source) == [links.repo_url()], (
            f"{path.name}: its Colab cell's REPO_URL must be pyproject.toml's Repository address"
        )


def test_each_notebook_opens_with_the_badge_of_its_own_learner_version():
    for path in NOTEBOOKS:
        cells = nbformat.read(path, 4).cells
        title, *rest = cells[0].source.splitlines()
        assert cells[0].cell_type == "markdown" and title.startswith("# Chapter ")
        assert [line for line in rest if line.strip()][0] == links.colab_badge(path.name), (
            f"{path.name}: the line under the title must be links.colab_badge({path.name!r})"
        )
        assert sum(len(_badges(c.source)) for c in cells) == 1, f"{path.name}: one badge only"


def test_readme_chapter_table_has_each_chapters_badge_in_its_row():
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if ".ipynb` |" in line]
    for path in NOTEBOOKS:
        (row,) = [r for r in rows if f"`{path.name}`" in r]
        assert links.colab_badge(path.name) in row, f"README.md's row of {path.name}: no badge"
    readme_badges = _badges((ROOT / "README.md").read_text())
    assert len(readme_badges) == len(NOTEBOOKS)


def _all_badges() -> list[tuple[str, re.Match]]:
    texts = [("README.md", (ROOT / "README.md").read_text())]
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, 4).cells:
            texts.append((path.name, cell.source))
    return [(where, m) for where, text in texts for m in _badges(text)]


def test_every_badge_uses_the_pyproject_address_and_the_colab_badge():
    badges = _all_badges()
    assert len(badges) == 2 * len(NOTEBOOKS)
    repo = links.repo_url().removeprefix("https://github.com/")
    for where, m in badges:
        assert m["repo"] == repo, f"{where}: badge opens {m['repo']}, not pyproject's {repo}"
        assert m["branch"] == links.BRANCH and m["svg"] == links.COLAB_BADGE_SVG, where


def test_every_badge_opens_a_learner_version_that_exists(tmp_path):
    """Before learner/ is committed: the file make-student writes from notebooks/ into learner/.
    Once it is: the committed file itself."""
    badges = _all_badges()
    assert len(badges) == 2 * len(NOTEBOOKS)
    learner = ROOT / links.LEARNER_DIR
    if learner.is_dir():
        existing = {p.name for p in learner.glob("*.ipynb")}
    else:
        written = student.make_student(ROOT / "notebooks", tmp_path / links.LEARNER_DIR)
        existing = {p.name for p in written}
    for where, m in badges:
        folder, name = m["path"].split("/")
        assert folder == links.LEARNER_DIR, f"{where}: badge opens {m['path']}, not a learner file"
        assert name in existing, f"{where}: {m['path']} is not a learner version in {learner}"
