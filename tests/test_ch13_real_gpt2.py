"""Tests for helpers/chapters/ch13_real_gpt2.py (chapter 13): where the weights come from, the
equality table against transformers, chapter 12's configuration, the speed and memory tables."""

import pytest
import torch

from helpers.chapters import ch13_real_gpt2 as ch13
from helpers.core.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def random_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2-random")
    return folder, ch13.random_checkpoint(folder, seed=0)


def test_equality_rows_are_equal_for_both_attentions_and_vocabularies(random_folder):
    folder, hf = random_folder
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(1))
    rows = ch13.equality_rows(folder, hf, idx)
    assert [(r["attention"], r["rows"]) for r in rows] == [
        ("manual", 50257), ("manual", 50304), ("sdpa", 50257), ("sdpa", 50304)
    ]  # fmt: skip
    assert all(r["equal"] and r["padded_zero"] for r in rows)
    table = ch13.equality_markdown(rows)
    assert table.count("\n") == 5 and "NO" not in table


def test_a_folder_in_the_environment_variable_is_used_and_a_missing_one_says_what_to_do(
    random_folder, monkeypatch, tmp_path
):
    folder, _ = random_folder
    monkeypatch.setenv(ch13.WEIGHTS_ENV, str(folder))
    assert ch13.released_folder()[0] == folder
    monkeypatch.setenv(ch13.WEIGHTS_ENV, str(tmp_path / "nowhere"))
    found, line = ch13.released_folder()
    assert found is None and "not reachable" in line and ch13.WEIGHTS_ENV in line
    assert "\n" not in line


def test_chapter12_run_is_the_ladders_last_runnable_rung_on_the_cpu():
    run, steps, cfg = ch13.chapter12_run("cpu")
    assert steps == 20 and cfg.n_layer == 2 and (run.batch_size, run.seq_len) == (4, 128)


def test_speed_rows_give_a_speedup_per_batch_and_render():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=100, n_layer=1, n_head=2, n_embd=16))
    rows = ch13.speed_rows(model, "cpu", (1, 2), 4, 3, ch13.SPEED_RUNS[:2], iters=1)
    assert [(r["batch"], r["method"]) for r in rows] == [
        (1, "recompute"), (1, "cache"), (2, "recompute"), (2, "cache")
    ]  # fmt: skip
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0
    assert ch13.fastest(rows, 2)["batch"] == 2
    assert ch13.speed_markdown(rows).count("\n") == 5


def test_cache_memory_table_is_the_formula():
    table = ch13.cache_memory_markdown(GPTConfig(), (1,), 1024)
    assert "| 1 | 1024 | 72.0 | 36.0 |" in table  # 75,497,472 bytes = 72 MiB in fp32
