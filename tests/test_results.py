import pytest

from helpers import ladder
from helpers.measure import results


def test_committed_results_are_found_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = results.load("h200-ladder-b16.json")
    names = [r["name"] for r in ref["rungs"]]
    # measured before the ladder's newest rungs, so its rungs are the ladder's first ones, in order
    assert ref["device"] == "NVIDIA H200" and names == [n for n, _ in ladder.RUNGS][: len(names)]
    assert len(names) >= 13


def test_missing_result_is_none_with_advice(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_DIR_ENV, str(tmp_path))
    assert results.load("nope.json") is None
    assert "clone the course repository" in results.missing("nope.json")


def test_load_each_names_the_file_that_is_absent(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_DIR_ENV, str(tmp_path))
    (tmp_path / "a.json").write_text('{"x": 1}')
    found, absent = results.load_each({"A": "a.json", "B": "b.json"})
    assert found == {"A": {"x": 1}} and absent == ["b.json"]
    assert results.load_each({"A": "a.json"}) == ({"A": {"x": 1}}, [])


def test_markdown_table_writes_cells_as_given_and_escapes_pipes():
    md = results.markdown_table(
        ["rung", "ms/step", "note"],
        [["fp32", f"{366.5626:.1f}", None], ["a | b", 12, "two\nlines"]],
        align="lrl",
    )
    assert md.splitlines() == [
        "| rung | ms/step | note |",
        "|---|---:|---|",
        "| fp32 | 366.6 | - |",
        "| a \\| b | 12 | two lines |",
    ]


def test_markdown_table_refuses_a_row_or_alignment_of_the_wrong_length():
    with pytest.raises(ValueError, match="row 1 has 1 cells, the header 2"):
        results.markdown_table(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError, match="one 'l' or 'r' per column"):
        results.markdown_table(["a", "b"], [], align="lc")


def test_save_rows_writes_provenance_and_rows_only_when_asked(tmp_path, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    rows = [{"rows": 16384, "ms": 1.0}]
    results.save_rows(rows, None, "cpu")
    assert list(tmp_path.iterdir()) == []
    results.save_rows(rows, tmp_path / "out.json", "cpu")
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["rows"] == rows and saved["device"].startswith("cpu") and "torch" in saved
