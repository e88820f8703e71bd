import functools
import math

import pytest
import torch

from helpers.core import data, train
from helpers.core.model import GPTConfig
from helpers.measure import hardware

CFG = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=64)


def _losses(run, steps=8):
    tokens = data.load_tokens()[:20_000]
    loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, "cpu")
    return train.train(run, steps, CFG, "cpu", loader=loader, progress=False).losses


def test_loss_starts_near_ln_vocab_and_falls_on_real_text():
    losses = _losses(train.RunConfig(batch_size=4, seq_len=64, lr=1e-3), steps=15)
    assert abs(losses[0] - math.log(50257)) < 0.3
    assert losses[-1] < losses[0] - 1.0


BASE = train.RunConfig(batch_size=4, seq_len=64)


@functools.cache
def _base_losses(steps):
    """The fp32 baseline's losses, computed once for every switch compared with it."""
    return _losses(BASE, steps)


@pytest.mark.parametrize(
    "changes",
    [
        dict(attention="sdpa"),
        dict(vocab_multiple=64),
        dict(optimizer="for-loop"),
        dict(optimizer="fused"),
        dict(autocast="bf16"),
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_same_seed_and_data_give_close_losses_across_switches(changes):
    # bf16 matmuls are ~30x slower than fp32 on CPUs without bf16 instructions (AVX2 only): three
    # steps there, eight for the others
    steps = 3 if changes.get("autocast") else 8
    ref = _base_losses(steps)
    other = _losses(BASE.replace(**changes), steps)
    tol = 0.05 if changes.get("autocast") else 0.01  # bf16: ~3 significant digits
    for a, b in zip(ref, other, strict=False):
        assert abs(a - b) / a < tol, (ref, other)


def test_grad_accumulation_averages_micro_losses():
    base = train.RunConfig(batch_size=4, seq_len=64)
    one = _losses(base, steps=1)[0]
    two = _losses(base.replace(grad_accum_steps=2), steps=1)[0]
    assert two == pytest.approx(one, rel=0.02)  # mean, not sum, of the micro-losses


def test_hardware_it_cannot_run_is_refused_not_substituted():
    with pytest.raises(ValueError, match="TF32 needs"):
        train.build(train.RunConfig(matmul_precision="tf32", batch_size=1, seq_len=8), CFG, "cpu")


def test_bad_switch_values_are_rejected():
    with pytest.raises(ValueError, match="autocast"):
        train.RunConfig(autocast="fp8")
    with pytest.raises(ValueError, match="seq_len"):
        train.build(train.RunConfig(batch_size=1, seq_len=128), CFG, "cpu")


def test_optimizer_decays_only_2d_weights():
    trainer = train.build(train.RunConfig(batch_size=1, seq_len=8), CFG, "cpu")
    decay, no_decay = trainer.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])


def test_default_shapes_use_the_real_model_on_cuda_and_small_on_cpu():
    cfg, B, T = train.default_shapes("cpu")
    assert (cfg.n_layer, B, T) == (2, 4, 128)


@pytest.mark.parametrize(
    "gb, expected_b", [(150, 16), (80, 16), (40, 16), (24, 8), (16, 4), (15, 4), (8, 2), (3, 1)]
)
def test_default_batch_size_on_a_gpu_fits_its_memory(monkeypatch, gb, expected_b):
    """B=16 where the fp32 baseline fits (H200, A100 80GB and 40GB: chapter 14's estimate), smaller
    on a T4 (15 GB): chapter 01 must not run out of memory on Colab."""
    monkeypatch.setattr(hardware, "usable_memory_bytes", lambda device: gb * 10**9)
    cfg, B, T = train.default_shapes(torch.device("cuda"))
    assert (cfg.n_layer, cfg.n_embd, B, T) == (12, 768, expected_b, 1024)


def test_usable_memory_is_the_emulated_cap_while_emulating(monkeypatch):
    monkeypatch.setattr(hardware, "_emulated_memory", 15 * 10**9)
    assert hardware.usable_memory_bytes("cuda") == 15 * 10**9
    assert train.default_shapes("cuda")[1] == 4
    assert hardware.usable_memory_bytes("cpu") is None


def test_every_compiled_build_starts_from_a_fresh_dynamo_state(monkeypatch):
    calls = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append(1))
    monkeypatch.setattr(
        torch, "compile", lambda model, mode=None: model
    )  # no real compile needed here
    run = train.RunConfig(batch_size=1, seq_len=8, compile="default")
    train.build(run, CFG, "cpu")
    train.build(run.replace(attention="sdpa"), CFG, "cpu")
    assert len(calls) == 2  # a stale graph from the previous rung can never be reused
    train.build(run.replace(compile=None), CFG, "cpu")
    assert len(calls) == 2


def test_shape_switches_must_be_positive():
    for field in ("batch_size", "seq_len", "vocab_multiple", "grad_accum_steps"):
        with pytest.raises(ValueError, match=field):
            train.RunConfig(**{field: 0})
    with pytest.raises(ValueError, match="attention"):
        train.RunConfig(attention="flash")
    with pytest.raises(ValueError, match="block_size"):
        GPTConfig(block_size=0)


def test_a_failing_compile_falls_back_to_eager_and_says_so():
    class BackendCompilerFailed(RuntimeError):
        pass

    BackendCompilerFailed.__module__ = "torch._dynamo.exc"

    def broken(*args, **kwargs):
        raise BackendCompilerFailed("inductor could not compile")

    tokens = data.load_tokens()[:5000]
    loader = data.BatchLoader(tokens, 2, 32, "cpu")
    trainer = train.build(
        train.RunConfig(batch_size=2, seq_len=32), CFG, "cpu", compile_fallback=True
    )
    trainer.forward = broken
    loss = trainer.step(loader)
    assert torch.isfinite(loss) and trainer.forward is trainer.model
    assert "fell back to eager" in trainer.notes[0]
    strict = train.build(
        train.RunConfig(batch_size=2, seq_len=32), CFG, "cpu", compile_fallback=False
    )
    strict.forward = broken
    with pytest.raises(BackendCompilerFailed):
        strict.step(loader)  # the ladder never substitutes eager for a compiled rung


def test_checkpoint_every_reaches_the_model_and_keeps_the_losses():
    tokens = data.load_tokens()[:5000]
    losses = {}
    for every in (0, 1):
        run = train.RunConfig(batch_size=2, seq_len=32, checkpoint_every=every)
        trainer = train.build(run, CFG, "cpu")
        assert trainer.model.switches["checkpoint_every"] == every
        loader = data.BatchLoader(tokens, 2, 32, "cpu")
        losses[every] = [trainer.step(loader).item() for _ in range(3)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_negative_checkpoint_every_is_rejected_by_run_config():
    with pytest.raises(ValueError, match="checkpoint_every must be >= 0"):
        train.RunConfig(checkpoint_every=-2)


def test_recipe_autocast_is_bf16_where_native_else_fp16(monkeypatch):
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")
    assert train.recipe_autocast("cpu") == "bf16"
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "slow")  # an AVX2-only CPU: fp32, not fp16
    assert train.recipe_autocast("cpu") is None and train.autocast_label(None) == "fp32"
    slow = train.RunConfig(autocast="bf16")
    assert train.unsupported_reason(slow, "cpu") is None  # it runs if asked ...
    assert "uses fp32" in train.slow_reason(slow, "cpu")  # ... but is not timed by default
    monkeypatch.setattr(hardware, "capability", lambda device: (7, 5))  # a T4 (or an emulated one)
    assert train.recipe_autocast("cuda") == "fp16"
    run = train.RunConfig(autocast=train.recipe_autocast("cuda"))
    assert train.unsupported_reason(run, torch.device("cuda")) is None  # bf16 would be refused here
    monkeypatch.setattr(hardware, "capability", lambda device: (8, 0))
    assert train.recipe_autocast("cuda") == "bf16"


def test_train_progress_bar_redraws_at_most_twice_a_second(monkeypatch):
    """set_postfix(refresh=True) redrew every step: thousands of widget messages in a long run."""
    import tqdm.auto

    seen = {}

    class Bar:
        def __init__(self, iterable, **kw):
            seen.update(kw)
            self.it = iterable

        def __iter__(self):
            return iter(self.it)

        def set_postfix(self, refresh=True, **kw):
            seen.setdefault("refresh", []).append(refresh)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    run = train.RunConfig(batch_size=2, seq_len=16)
    train.train(run, 3, train.small_model_config(), "cpu")
    assert seen["mininterval"] >= 0.5 and seen["refresh"] == [False, False, False]
    assert seen["leave"] is True  # the bar stays by default
    train.train(run, 1, train.small_model_config(), "cpu", leave=False)
    assert seen["leave"] is False  # closed and hidden when the run ends


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable CUDA GPU")
def test_a_cuda_run_without_a_gpu_gets_a_reason_not_a_torch_assertion():
    for run in (train.RunConfig(matmul_precision="tf32"), train.RunConfig(autocast="bf16")):
        why = train.unsupported_reason(run, torch.device("cuda"))
        assert why is not None and why.startswith("no CUDA GPU is usable here"), why


def test_a_cuda_index_past_the_visible_gpus_is_named(monkeypatch):
    def no_such_device(device):
        raise AssertionError("Invalid device id")

    monkeypatch.setattr(hardware, "capability", no_such_device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    why = train.unsupported_reason(train.RunConfig(), torch.device("cuda:5"))
    assert why == "cuda:5 is not a CUDA device here (2 visible: cuda:0 to cuda:1)"
