"""Tests for helpers/chapters/ch09_data_and_optimizer.py: the tokenising dataset and loaders, the
data wait, weight-decay groups and the optimizer sweep."""

import pickle

import pytest
import torch

from helpers import switches
from helpers.chapters import ch09_data_and_optimizer as data_and_optimizer
from helpers.core import data, tokenizer, train
from helpers.core.model import GPT, GPTConfig

CFG = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
RUN = train.RunConfig(attention="sdpa", batch_size=4, seq_len=32)


def _model(config=CFG, checkpoint_every=0):
    torch.manual_seed(0)
    return GPT(config, checkpoint_every=checkpoint_every)


def test_tokenizing_dataset_gives_shifted_gpt2_tokens_and_pickles():
    text = data.load_text()
    ds = data_and_optimizer.TokenizingDataset(text, 32)
    x, y = ds[3]
    assert x.shape == y.shape == (32,) and x.dtype == torch.long
    assert torch.equal(x[1:], y[:-1])
    start = 3 * ds.chars_per_sample
    assert x.tolist() == tokenizer.encode(text[start : start + ds.chars_per_sample])[:32]
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[3][0], x)
    with pytest.raises(ValueError, match="tokens < T"):
        data_and_optimizer.TokenizingDataset(text, 32, chars_per_token=0.5)[0]


def test_worker_and_in_process_loaders_give_the_same_batches_in_order():
    batches = {}
    for workers in (0, 2):
        loader = data_and_optimizer.tokenizing_loader(4, 32, "cpu", workers)
        batches[workers] = [loader.next_batch() for _ in range(3)]
    ds = data_and_optimizer.TokenizingDataset(data.load_text(), 32)
    for (x0, y0), (x2, y2), i in zip(batches[0], batches[2], range(3), strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
        assert torch.equal(x0[0], ds[4 * i][0])


def test_prefetch_loader_cycles_through_the_data():
    ds = torch.utils.data.TensorDataset(torch.arange(6).view(6, 1), torch.arange(6).view(6, 1))
    loader = data_and_optimizer.PrefetchLoader(torch.utils.data.DataLoader(ds, batch_size=2), "cpu")
    firsts = [loader.next_batch()[0][0, 0].item() for _ in range(5)]
    assert firsts == [0, 2, 4, 0, 2]


def test_weight_decay_only_on_two_dimensional_parameters():
    m = _model()
    rows = data_and_optimizer.decay_groups(m, RUN)
    decayed, plain = rows
    assert decayed["weight_decay"] == RUN.weight_decay and plain["weight_decay"] == 0.0
    assert decayed["tensors"] == sum(p.dim() >= 2 for p in m.parameters())
    assert plain["tensors"] == sum(p.dim() < 2 for p in m.parameters())
    assert decayed["parameters"] + plain["parameters"] == sum(p.numel() for p in m.parameters())
    assert all(name.endswith(("bias", "weight")) for name in plain["examples"])


def test_optimizer_sweep_times_every_pytorch_implementation():
    rows = data_and_optimizer.optimizer_sweep(RUN, CFG, "cpu", warmup=0, iters=1, step_iters=1)
    whats = [r["what"] for r in rows]
    assert set(train.TORCH_ADAMW) < set(switches.get("optimizer").values)
    for impl in train.TORCH_ADAMW:
        assert f"optimizer.step(), {impl}" in whats and f"full step, {impl}" in whats
    with pytest.raises(ValueError, match="AdamW 'triton' cannot run on cpu"):
        data_and_optimizer.optimizer_sweep(RUN, CFG, "cpu", impls=("triton",), iters=1)
    assert "full step, foreach, no clipping" in whats
    assert all(r["ms"] > 0 for r in rows)


def test_data_wait_report_has_a_no_loading_baseline():
    loaders = {"pre-tokenised": data.BatchLoader(data.load_tokens(), 4, 32)}
    rows = data_and_optimizer.data_wait_report(RUN, CFG, "cpu", loaders, warmup=0, iters=1)
    assert [r["loader"] for r in rows] == ["no loading (one fixed batch)", "pre-tokenised"]
    assert all(r["step_ms"] > 0 and r["next_batch_ms"] >= 0 for r in rows)


def test_copy_time_is_none_on_cpu():
    assert data_and_optimizer.copy_time_us(4, 32, "cpu", pinned=True) is None


def test_token_windows_are_the_stream_shifted_by_one():
    tokens = torch.arange(11)
    ds = data_and_optimizer.TokenWindows(tokens, 5)
    assert len(ds) == 2
    x, y = ds[1]
    assert x.tolist() == [5, 6, 7, 8, 9] and y.tolist() == [6, 7, 8, 9, 10]


def test_dataloader_knobs_time_the_course_loader_and_each_variant():
    assert [v["num_workers"] for v in data_and_optimizer.dataloader_variants("cpu")] == [0, 2, 2]
    assert not any(v["pin_memory"] for v in data_and_optimizer.dataloader_variants("cpu"))
    rows = data_and_optimizer.dataloader_knobs(2, 16, "cpu", [dict(num_workers=0)], n=3)
    assert [r["loader"] for r in rows] == ["course's BatchLoader", "torch DataLoader"]
    assert all(r["median_ms"] > 0 and r["first_ms"] > 0 for r in rows)
    table = data_and_optimizer.knobs_table(rows)
    assert table.count("\n") == 3 and "prefetch_factor" in table
    line = data_and_optimizer.knobs_conclusion(rows, step_ms=10.0)
    assert line.startswith("The course's loader takes") and "num_workers=0" in line
