"""The course's address lives in one place (pyproject.toml's [project.urls], read by
helpers.tools.links), and every copy of it agrees: each notebook's Colab set-up cell."""

import email.message
import re
from pathlib import Path

import nbformat
import pytest

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
