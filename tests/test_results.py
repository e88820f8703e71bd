from helpers import ladder
from helpers.measure import results


def test_committed_results_are_found_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = results.load("h200-ladder-b16.json")
    assert ref["device"] == "NVIDIA H200" and len(ref["rungs"]) == len(ladder.RUNGS)


def test_missing_result_is_none_with_advice(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_DIR_ENV, str(tmp_path))
    assert results.load("nope.json") is None
    assert "clone the course repository" in results.missing("nope.json")
