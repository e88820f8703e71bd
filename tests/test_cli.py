"""Tests for helpers/tools/cli.py: user errors of the command-line tools end in one line
and exit 2."""

import json
import re
from pathlib import Path

import pytest
import torch

from helpers.tools import cli


def test_device_refuses_cuda_without_a_gpu_and_unknown_names(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA GPU: use --device cpu"):
        cli.device("cuda")
    with pytest.raises(ValueError, match="is not a device"):
        cli.device("bogus")
    assert cli.device("cpu") == torch.device("cpu") and cli.device(None) == torch.device("cpu")


def test_out_path_refuses_a_folder_and_makes_the_parent(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        cli.out_path(tmp_path)
    assert cli.out_path(tmp_path / "new" / "x.json").parent.is_dir()
    assert cli.out_path(None) is None


def test_out_path_that_cannot_be_written_is_one_clear_error(tmp_path):
    (tmp_path / "README.md").write_text("a file, not a folder")
    with pytest.raises(ValueError, match="cannot make its folder"):
        cli.out_path(tmp_path / "README.md" / "x.json")


def test_out_path_in_a_read_only_folder_is_one_clear_error(tmp_path, monkeypatch):
    # CI runs as root, who may write anywhere: the permission answer is faked
    monkeypatch.setattr(cli.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ValueError, match="not writable"):
        cli.out_path(tmp_path / "x.json")
    assert cli.out_path(tmp_path / "sub" / "x.json") == tmp_path / "sub" / "x.json"


def test_at_least_accepts_none_and_refuses_zero():
    cli.at_least("steps", None)
    cli.at_least("warmup", 0, 0)
    with pytest.raises(ValueError, match="--batch-size must be >= 1, got 0"):
        cli.at_least("batch_size", 0)


def test_guarded_main_turns_user_errors_into_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")

    @cli.guarded
    def main(path):
        return json.loads(path.read_text()) and 0

    assert main(bad) == 2 and "error: not valid JSON" in capsys.readouterr().err
    assert main(tmp_path / "missing.json") == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "tool,args",
    [
        ("chapters.ch04_precision", ["compare", "--batch-size", "0"]),
        ("chapters.ch04_precision", ["compare", "--steps", "1", "--out", "{tmp}"]),
        ("chapters.ch09_tradeoffs", ["accumulation", "--out", "{tmp}", "--iters", "1"]),
        ("chapters.ch10_profiling", ["run", "--steps", "0"]),
        (
            "chapters.ch10_profiling",
            ["from-perf", "{tmp}/missing.json", "--out", "{tmp}/p.json", "--date", "2026-11-29"],
        ),
        (
            "chapters.ch11_multi_gpu",
            ["train", "--steps", "1", "--batch-size", "0", "--model", "tiny", "--device", "cpu"],
        ),
        ("chapters.ch11_multi_gpu", ["scaling", "--out", "{tmp}/s.json", "--nproc", "0"]),
    ],
)
def test_tools_refuse_bad_input_before_running(tool, args, tmp_path, capsys):
    import importlib

    main = importlib.import_module(f"helpers.{tool}").main
    assert main([a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_an_output_place_that_refuses_new_files_is_refused_before_the_run(tmp_path):
    import os

    from helpers.tools import cli

    if os.path.isdir("/proc"):  # root may "write" to /proc by os.access, yet no file can be made
        with pytest.raises(ValueError, match="cannot create a file there"):
            cli.out_path("/proc/course-results.json")
    with pytest.raises(ValueError, match=r"must end in \.png"):
        cli.out_path(tmp_path / "ladder.txt", "--plot", suffix=".png")
    ok = cli.out_path(tmp_path / "sub" / "ladder.png", "--plot", suffix=".png")
    assert ok.parent.is_dir() and not ok.exists()  # the probe leaves nothing behind
    existing = tmp_path / "keep.json"
    existing.write_text("learner's file")
    with pytest.raises(ValueError, match="exists: pass --force to replace it"):
        cli.out_path(existing)
    assert existing.read_text() == "learner's file"


def test_an_existing_file_is_replaced_only_when_it_is_an_earlier_output_of_that_kind(tmp_path):
    """The one rule of every tool that writes files (ladder, chapter tools, grade, leaderboard)."""
    result = tmp_path / "ladder.json"
    result.write_text(json.dumps({"device": "cpu", "torch": "2.13.0", "date": "2026-12-01"}))
    readme, png = tmp_path / "README.md", tmp_path / "figure.png"
    readme.write_text("docs")
    png.write_bytes(b"\x89PNG")
    kind = {"same_kind": cli.is_course_result, "what": " and is not a course result JSON"}
    assert cli.out_path(result, **kind) == result  # an earlier result: replaced
    for path, suffix, match in (
        (readme, None, "README.md exists and is not a course result JSON: pass --force"),
        (tmp_path / "notes.ipynb", ".json", "is a notebook's name"),
        (tmp_path / "x.png", ".json", r"must end in \.json"),
    ):
        with pytest.raises(ValueError, match=match):
            cli.out_path(path, suffix=suffix, **kind)
    with pytest.raises(ValueError, match="figure.png exists and is not a figure this tool wrote"):
        cli.out_path(png, "--plot", ".png")  # a PNG it did not write: only with --force
    assert cli.out_path(png, "--plot", ".png", force=True) == png
    with pytest.raises(ValueError, match="notebook's name"):
        cli.out_path(tmp_path / "a.ipynb", force=True)  # never, not even with --force
    assert readme.read_text() == "docs" and png.read_bytes() == b"\x89PNG"


def test_replace_file_never_writes_through_a_planted_symlink(tmp_path):
    victim, out = tmp_path / "victim.txt", tmp_path / "grades.csv"
    victim.write_text("important")
    out.symlink_to(victim)
    cli.replace_file(out, lambda f: f.write("new\n"))
    assert victim.read_text() == "important"
    assert not out.is_symlink() and out.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grades.csv", "victim.txt"]


def test_every_tool_that_writes_files_checks_them_with_the_one_rule():
    """No tool checks an output path its own way: each calls cli.out_path (grep-able)."""
    root = Path(__file__).resolve().parents[1] / "helpers"
    option = re.compile(r'add_argument\(\s*"--(out|plot|json|checkpoint|csv|png)"')
    writers = [p for p in root.rglob("*.py") if option.search(p.read_text())]
    assert writers
    for p in writers:
        text = p.read_text()
        assert any(f in text for f in ("cli.out_path(", "cli.result_out(", "check_csv_out(")), p
        assert "out_file_problem" not in text, p


def test_a_committed_result_is_replaced_only_with_force(tmp_path, monkeypatch):
    """A CPU run pointed at results/h200-*.json must not wipe the committed H200 measurement,
    although that file is a course result of the same kind."""
    import helpers

    root = tmp_path / "checkout"
    (root / "results").mkdir(parents=True)
    (root / "helpers").mkdir()
    (root / "helpers" / "__init__.py").write_text("")  # what makes it a course checkout
    committed = root / "results" / "h200-ladder-b16.json"
    committed.write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11", "date": "x"}))
    monkeypatch.setattr(helpers, "REPO_ROOT", root)
    with pytest.raises(ValueError, match="committed result .*pass --force"):
        cli.result_out(committed, ())
    assert cli.result_out(committed, (), force=True) == committed
    assert cli.result_out(root / "results" / "new.json", ()) is not None  # a new file is fine
    elsewhere = tmp_path / "ladder.json"
    elsewhere.write_text(committed.read_text())
    assert cli.result_out(elsewhere, ()) == elsewhere  # an earlier output outside results/


def test_a_committed_result_of_another_checkout_is_protected_too(tmp_path):
    # The installed package was built from one clone; the command runs against a second one,
    # whose results/ is as committed as the first's.
    other = tmp_path / "second-clone"
    (other / "helpers").mkdir(parents=True)
    (other / "helpers" / "__init__.py").write_text("")
    (other / "results").mkdir()
    committed = other / "results" / "h200-ladder-b16.json"
    committed.write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11", "date": "x"}))
    with pytest.raises(ValueError, match="committed result .*pass --force"):
        cli.result_out(committed, ())
    assert cli.result_out(committed, (), force=True) == committed
    plain = tmp_path / "results"  # a folder called results outside any checkout: an output
    plain.mkdir()
    (plain / "run.json").write_text(committed.read_text())
    assert cli.result_out(plain / "run.json", ()) == plain / "run.json"


def test_out_path_checked_by_two_processes_at_once_passes_in_both(tmp_path, monkeypatch):
    # The other process made its probe file between this one's exists() and open("x"): the
    # folder takes new files, so that is no reason to refuse the path.
    target = tmp_path / "ddp.pt"
    real_open = Path.open

    def open_after_the_other_process(self, mode="r", *a, **k):
        if self == target and mode == "x":
            real_open(self, "x").close()  # the other rank's probe
            try:
                return real_open(self, "x", *a, **k)
            finally:
                self.unlink()  # ... which it removes again
        return real_open(self, mode, *a, **k)

    monkeypatch.setattr(Path, "open", open_after_the_other_process)
    assert cli.out_path(target, "--checkpoint") == target and not target.exists()


def test_ch11_checks_its_output_paths_on_rank_0_only(tmp_path, monkeypatch):
    from helpers.chapters import ch11_multi_gpu

    checked = []
    monkeypatch.setattr(cli, "out_path", lambda path, flag, **k: checked.append(flag))
    monkeypatch.setattr(cli, "result_out", lambda path, kind, flag, **k: checked.append(flag))
    monkeypatch.setattr(ch11_multi_gpu, "main_train", lambda args, *a, **k: 0)
    argv = ["train", "--checkpoint", str(tmp_path / "c.pt"), "--json", str(tmp_path / "s.json")]
    for rank, expected in (("1", []), ("0", ["--checkpoint", "--json"])):
        checked.clear()
        monkeypatch.setenv("RANK", rank)
        assert ch11_multi_gpu.main(argv) == 0 and checked == expected


def test_one_tools_result_is_not_replaced_by_another_tools_out(tmp_path, capsys):
    """Every course result starts with the same provenance keys; "the same kind" is the same
    tool's result: a ladder --out refuses a chapter 11 summary and takes an earlier ladder."""
    from helpers import ladder

    summary = tmp_path / "ch11-summary.json"
    prov = {"device": "cpu", "torch": "2.13.0", "date": "2026-12-02"}
    summary.write_text(json.dumps({**prov, "world_size": 2, "run": {}, "model": {}}))
    before = summary.read_text()
    argv = ["--device", "cpu", "--rungs", "fp32", "--iters", "1", "--no-progress"]
    assert ladder.main([*argv, "--out", str(summary)]) == 2
    assert "is not a result JSON of this tool: pass --force" in capsys.readouterr().err
    assert summary.read_text() == before
    earlier = tmp_path / "ladder.json"
    earlier.write_text(json.dumps({**prov, "rungs": []}))
    assert cli.result_out(earlier, ("rungs",)) == earlier
    with pytest.raises(ValueError, match="pass --force"):
        cli.result_out(summary, ("rungs",))
