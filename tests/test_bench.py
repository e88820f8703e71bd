"""Tests for helpers/bench.py: the one measuring verb."""

import pytest
import torch

from helpers import bench
from helpers.core import train
from helpers.core.model import GPTConfig
from helpers.measure import results

TINY = GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32)
TOKENS = torch.randint(0, 50257, (4000,), generator=torch.Generator().manual_seed(0))
RUN = train.RunConfig(name="tiny", batch_size=2, seq_len=16)


def test_a_measured_row_has_the_time_the_peak_and_the_loss():
    row = bench.measure(RUN, TINY, "cpu", TOKENS, warmup=1, iters=2)
    assert row["status"] == "measured" and row["name"] == "tiny"
    assert row["ms_per_step"] > 0 and row["tokens_per_s"] > 0 and row["first_step_ms"] > 0
    assert row["peak_mem_bytes"] is None  # no peak counter on a CPU
    assert 9 < row["loss"] < 12  # ln(50257) = 10.8 at initialisation
    assert row["mfu"] is None and row["reason"].startswith("MFU not reported")
    t0, t1 = row["timed_window_s"]
    assert 0 < t1 - t0 < 60
    assert row["switches"]["batch_size"] == 2 and "name" not in row["switches"]


def test_a_run_the_hardware_cannot_do_is_skipped_with_its_reason_and_not_timed():
    row = bench.measure(RUN.replace(matmul_precision="tf32"), TINY, "cpu", TOKENS)
    assert row["status"] == "skipped" and "TF32" in row["reason"] and row["ms_per_step"] is None


def test_an_error_is_a_failed_row_with_its_first_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded\nsecond line")

    monkeypatch.setattr(bench, "build", broken)
    row = bench.measure(RUN, TINY, "cpu", TOKENS)
    assert row["status"] == "failed" and row["reason"] == "RuntimeError: kernel exploded"


def test_hooks_add_to_the_row_and_a_given_trainer_is_timed_as_it_is():
    trainer = train.build(RUN.replace(grad_accum_steps=2), TINY, "cpu")
    seen = []
    row = bench.measure(
        RUN,
        TINY,
        "cpu",
        TOKENS,
        warmup=0,
        iters=1,
        trainer=trainer,
        before=lambda tr, loader: seen.append(tr) or {"before": 1},
        after=lambda tr, loader: {"after": tr.run.grad_accum_steps},
    )
    assert seen == [trainer] and row["before"] == 1 and row["after"] == 2
    assert row["tokens_per_s"] == 2 * 16 * 2 / (row["ms_per_step"] / 1e3)


def test_provenance_names_the_device_torch_date_and_commit():
    p = results.provenance("cpu")
    assert p["device"].startswith("cpu (") and p["torch"] == torch.__version__
    assert p["cuda"] == torch.version.cuda and p["emulated"] is None
    assert len(p["date"]) == 10 and (p["commit"] is None or len(p["commit"]) >= 7)


def test_provenance_commit_says_when_the_measured_code_is_not_the_commits(tmp_path, monkeypatch):
    """A result measured with uncommitted changes to the code (helpers/, benchmarks/: a tracked
    file edited, staged or not, or a new one) says so ("<hash>+modified"); an edited notebook or
    an ignored file does not count; a package outside the top of a checkout has no commit."""
    import shutil
    import subprocess

    import helpers

    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        cfg = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
        subprocess.run(["git", "-C", str(repo), *cfg, *args], check=True, capture_output=True)

    git("init", "-q")
    for path, text in {
        "helpers/code.py": "x = 1\n",
        "benchmarks/bench.py": "y = 1\n",
        "chapter.ipynb": "{}\n",
        ".gitignore": "*.json\n",
    }.items():
        (repo / path).parent.mkdir(exist_ok=True)
        (repo / path).write_text(text)
    git("add", ".")
    git("commit", "-q", "--no-verify", "-m", "c")
    monkeypatch.setattr(helpers, "REPO_ROOT", repo)
    clean = results._commit()
    assert clean is not None and len(clean) >= 7 and "+" not in clean
    (repo / "helpers" / "result.json").write_text("{}")  # ignored: a result being written
    (repo / "chapter.ipynb").write_text('{"answered": 1}\n')
    assert results._commit() == clean
    for change in ("benchmarks/bench.py", "helpers/code.py", "helpers/new.py"):
        (repo / change).write_text("z = 2\n")
        assert results._commit() == clean + "+modified", change
        if change == "helpers/new.py":
            (repo / change).unlink()
        else:
            git("checkout", "-q", "--", change)
        assert results._commit() == clean
    (repo / "helpers" / "code.py").write_text("x = 3\n")
    git("add", "helpers/code.py")  # staged only
    assert results._commit() == clean + "+modified"
    # the package inside another repository's subfolder, or in no repository at all
    monkeypatch.setattr(helpers, "REPO_ROOT", repo / "helpers")
    assert results._commit() is None
    monkeypatch.setattr(helpers, "REPO_ROOT", tmp_path / "not-a-checkout")
    assert results._commit() is None


def test_configurations_are_measured_through_the_verb_outside_a_few_named_places():
    """Timing a trainer's step by hand is left only where a chapter measures something else than
    a configuration's step: chapter 05's first compiled step in a cold cache, chapter 09's parts
    of one step (AdamW alone, clipping, the data wait)."""
    import re

    import helpers

    allowed = {
        "helpers/bench.py",
        "helpers/chapters/ch05_compile.py",
        "helpers/chapters/ch09_data_and_optimizer.py",
    }
    pattern = re.compile(r"timing\.measure\(\s*lambda[^:]*:\s*(losses\.append\()?trainer\.step")
    root = helpers.REPO_ROOT
    found = {
        str(p.relative_to(root))
        for folder in ("helpers", "benchmarks")
        for p in (root / folder).rglob("*.py")
        if pattern.search(p.read_text())
    }
    assert found <= allowed, sorted(found - allowed)
