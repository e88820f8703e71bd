import json

import pytest
import torch

from helpers.chapters import ch09_tradeoffs as tradeoffs
from helpers.core import data, train
from helpers.core.model import GPT, GPTConfig
from helpers.measure import memory

CFG = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
RUN = train.RunConfig(attention="sdpa", batch_size=4, seq_len=32)


def _model(config=CFG, checkpoint_every=0):
    torch.manual_seed(0)
    return GPT(config, checkpoint_every=checkpoint_every)


def test_accumulated_gradients_equal_one_big_batch_and_the_logged_loss_is_the_mean():
    x, y = data.BatchLoader(data.load_tokens(), 8, 32).next_batch()
    big, acc, undivided = _model(), _model(), _model()
    _, loss = big(x, y)
    loss.backward()
    logged = tradeoffs.accumulate(acc, list(zip(x.chunk(4), y.chunk(4), strict=True)))
    tradeoffs.accumulate(undivided, list(zip(x.chunk(4), y.chunk(4), strict=True)), divide=False)
    ref = tradeoffs.gradients(big)
    assert tradeoffs.max_relative_difference(tradeoffs.gradients(acc), ref) < 1e-5
    assert tradeoffs.grad_norm(tradeoffs.gradients(undivided)) / tradeoffs.grad_norm(
        ref
    ) == pytest.approx(4, rel=1e-4)
    assert logged.item() == pytest.approx(loss.item(), rel=1e-6) and not logged.requires_grad


def test_accumulation_report_measures_the_missing_division():
    r = tradeoffs.accumulation_report(CFG, 4, 32, 4, "cpu", clip=1.0)
    assert r["rel_diff_divided"] < 1e-5 and r["rel_diff_undivided"] == pytest.approx(3, rel=1e-3)
    assert r["logged_loss"] == pytest.approx(r["big_loss"], rel=1e-6)
    rows = {row["how"]: row for row in r["rows"]}
    right, wrong = rows["accumulated, divided"], rows["accumulated, not divided"]
    assert wrong["norm_before"] == pytest.approx(4 * right["norm_before"], rel=1e-4)
    assert wrong["clip_coef"] == pytest.approx(min(1.0, 1.0 / wrong["norm_before"]), rel=1e-4)
    assert all(row["update_norm"] > 0 for row in r["rows"])
    with pytest.raises(ValueError, match="equal micro-batches"):
        tradeoffs.accumulation_report(CFG, 6, 32, 4, "cpu")


def test_accumulation_sweep_counts_tokens_per_optimizer_step():
    rows = tradeoffs.accumulation_sweep(RUN, CFG, "cpu", [1, 3], warmup=0, iters=1)
    assert [r["tokens_per_step"] for r in rows] == [4 * 32, 3 * 4 * 32]
    assert all(r["ms"] > 0 and r["peak_bytes"] is None and 9 < r["loss"] < 12 for r in rows)


def test_held_bytes_fall_as_more_blocks_are_checkpointed():
    import dataclasses

    idx = torch.randint(0, 50257, (2, 32))
    held = {}
    for k in (0, 2, 1):
        m = _model(dataclasses.replace(CFG, n_layer=4), checkpoint_every=k)
        (_, loss), held[k] = memory.held_bytes(lambda m=m: m(idx, idx), "cpu")
        loss.backward()
        del loss
    assert held[0] > held[2] > held[1] > 0


def test_checkpointing_sweep_rows():
    rows = tradeoffs.checkpointing_sweep(
        RUN, CFG, "cpu", [0, 1, (1, "selective")], warmup=0, iters=1
    )
    assert [r["checkpointed_blocks"] for r in rows] == [0, 2, 2]
    assert [tradeoffs.setting_label(r) for r in rows] == [
        "off",
        "every block",
        "every block, selective",
    ]
    assert rows[0]["held_bytes"] > rows[1]["held_bytes"] and all(
        r["peak_bytes"] is None for r in rows
    )
    fig = tradeoffs.plot_checkpointing(rows, "test")
    assert fig.axes[0].get_xlabel() == "memory (GiB)"


def test_max_batch_under_limit_needs_a_gpu():
    with pytest.raises(ValueError, match="GPU"):
        tradeoffs.max_batch_under_limit(RUN, CFG, "cpu", 2**30, [0])


def test_reentrant_checkpoint_leaves_block_parameters_without_gradients():
    trap = tradeoffs.reentrant_trap(CFG, "cpu", use_reentrant=True)
    safe = tradeoffs.reentrant_trap(CFG, "cpu", use_reentrant=False)
    per_block = len(list(GPT(CFG).transformer.h[0].parameters()))
    assert trap["without_grad"] == CFG.n_layer * per_block  # only ln_f learns
    assert trap["trainable"] == safe["trainable"] == CFG.n_layer * per_block + 2
    assert any("requires_grad" in w for w in trap["warnings"])
    assert safe["without_grad"] == 0 and safe["warnings"] == []


@pytest.mark.parametrize("kind", ["accumulation", "checkpointing"])
def test_command_line_writes_json_with_provenance(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(tradeoffs, "benchmark_run", lambda device: (RUN, CFG))
    out = tmp_path / "r.json"
    assert tradeoffs.main([kind, "--out", str(out), "--iters", "1", "--device", "cpu"]) == 0
    result = json.loads(out.read_text())
    assert {"device", "torch", "date", "what", "config", "rows"} <= result.keys()
    assert result["config"]["run"]["batch_size"] == 4 and result["config"]["model"]["n_embd"] == 32
    assert result["rows"]
    with pytest.raises(SystemExit):
        tradeoffs.main([kind, "--out", str(out), "--iters", "0"])


def test_a_setting_whose_memory_outlives_it_is_refused(monkeypatch):
    # The largest-B search subtracts each setting's baseline; memory of the previous setting still
    # held at that moment would be left out of the next setting's peak once freed.
    rows = [dict(checkpoint_every=0, checkpoint_policy="block", baseline_bytes=69 * 2**20)]
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 70 * 2**20)
    tradeoffs._check_baseline(rows, torch.device("cuda"))  # 1 MiB more: the allocator's noise
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1500 * 2**20)
    with pytest.raises(RuntimeError, match="off is still held after it"):
        tradeoffs._check_baseline(rows, torch.device("cuda"))
