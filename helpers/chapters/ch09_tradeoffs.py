"""Memory and throughput trade-offs (chapter 09): gradient accumulation and activation
checkpointing, each measured on the course's real model and data.

- Gradient accumulation: N micro-batches, each loss divided by N before ``backward``, give the
  gradient of one N-times larger batch; the logged loss is the mean of the detached micro-losses.
- Activation checkpointing (``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)``,
  switched by ``RunConfig.checkpoint_every``): keep only each checkpointed block's input and
  recompute its activations during backward; ``RunConfig.checkpoint_policy="selective"`` also
  keeps the matmul and attention outputs (:mod:`helpers.core.recompute`).
  PyTorch docs: https://pytorch.org/docs/stable/checkpoint.html

The chapter's data loading (pinned memory, prefetch, tokenising DataLoader workers) and optimizer
step (AdamW implementations, weight-decay groups, gradient clipping) are in
:mod:`helpers.chapters.ch09_data_and_optimizer`.

Command line (writes the committed H200 results):
``python -m helpers.chapters.ch09_tradeoffs checkpointing --out results/h200-checkpointing.json``
and
``python -m helpers.chapters.ch09_tradeoffs accumulation --out results/h200-accumulation.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import warnings

import torch
import torch.nn as nn
import torch.utils.checkpoint

from helpers import bench
from helpers.core import data, train
from helpers.core.model import GPT, GPTConfig
from helpers.measure import memory, results, timing
from helpers.tools import cli

# --------------------------------------------------------------------------------------------
# Gradient accumulation
# --------------------------------------------------------------------------------------------


def accumulate(
    model: nn.Module, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], divide: bool = True
) -> torch.Tensor:
    """Forward + backward over each (x, y) micro-batch, adding into ``p.grad`` (zero them first).

    Each micro-loss is divided by N = len(micro_batches) before ``backward`` (``divide=False`` is
    the mistake this chapter measures). ``model(x, y)`` must return ``(logits, mean loss)``.
    Returns the logged loss: the mean of the detached micro-losses, a 0-d fp32 tensor (nats).
    """
    n = len(micro_batches)
    total = torch.zeros((), device=micro_batches[0][0].device)
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / n if divide else loss).backward()
        total += loss.detach()
    return total / n


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every parameter's ``.grad`` by name (fp32; parameters with no gradient left
    out)."""
    return {
        n: p.grad.detach().float().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def grad_norm(grads: dict[str, torch.Tensor]) -> float:
    """Global L2 norm of a gradient dict (the number ``clip_grad_norm_`` compares with its
    limit)."""
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
    ).item()


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over parameters of ||a - b|| / ||b|| (L2 norms). Raises KeyError if the names differ."""
    if a.keys() != b.keys():
        raise KeyError(f"gradient dicts differ in names: {sorted(set(a) ^ set(b))[:3]}")
    return max(
        (
            torch.linalg.vector_norm(a[k] - b[k]) / torch.linalg.vector_norm(b[k]).clamp_min(1e-30)
        ).item()
        for k in a
    )


def _split(x: torch.Tensor, y: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if x.shape[0] % n != 0:
        raise ValueError(
            f"batch of {x.shape[0]} sequences does not split into {n} equal micro-batches"
        )
    return list(zip(x.chunk(n), y.chunk(n), strict=True))


def accumulation_report(
    model_config: GPTConfig,
    B: int,
    T: int,
    micro_steps: int,
    device: torch.device | str,
    clip: float = 1.0,
    lr: float = 6e-4,
    model_switches: dict | None = None,
) -> dict:
    """Gradients of one (B, T) batch against ``micro_steps`` micro-batches of B / micro_steps
    sequences, accumulated with and without dividing each loss; fp32 (TF32 off), real text.

    Then, for each of the three gradients, what one clipped AdamW step
    (:func:`train.make_optimizer`) does with it: the global norm before clipping, the clip
    coefficient min(1, clip / norm), the norm handed to AdamW, and the size of the parameter update
    ||delta theta||.

    Returns {"big_loss", "logged_loss", "rel_diff_divided", "rel_diff_undivided", "norm_ratio",
    "rows": [{"how", "norm_before", "clip_coef", "norm_after", "update_norm"}]}.
    Raises ValueError if B is not a multiple of ``micro_steps``.
    """
    device = torch.device(device)
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        x, y = data.BatchLoader(data.load_tokens(), B, T, device).next_batch()
        torch.manual_seed(1337)
        base = GPT(model_config, **(model_switches or {})).to(device)
        models = {
            how: copy.deepcopy(base)
            for how in ("one big batch", "accumulated, divided", "accumulated, not divided")
        }
        _, big_loss = models["one big batch"](x, y)
        big_loss.backward()
        logged = accumulate(models["accumulated, divided"], _split(x, y, micro_steps))
        accumulate(models["accumulated, not divided"], _split(x, y, micro_steps), divide=False)
        grads = {how: gradients(m) for how, m in models.items()}
        rows = []
        for how, m in models.items():
            before = [p.detach().clone() for p in m.parameters()]
            norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip).item()
            opt = train.make_optimizer(m, train.RunConfig(lr=lr, optimizer="for-loop"))
            after_clip = grad_norm(gradients(m))
            opt.step()
            update = torch.linalg.vector_norm(
                torch.stack(
                    [
                        torch.linalg.vector_norm(p.detach() - b)
                        for p, b in zip(m.parameters(), before, strict=True)
                    ]
                )
            ).item()
            rows.append(
                dict(
                    how=how,
                    norm_before=norm,
                    clip_coef=min(1.0, clip / (norm + 1e-6)),
                    norm_after=after_clip,
                    update_norm=update,
                )
            )
    finally:
        torch.set_float32_matmul_precision(old)
    ref = grads["one big batch"]
    return dict(
        big_loss=big_loss.item(),
        logged_loss=logged.item(),
        micro_steps=micro_steps,
        clip=clip,
        rel_diff_divided=max_relative_difference(grads["accumulated, divided"], ref),
        rel_diff_undivided=max_relative_difference(grads["accumulated, not divided"], ref),
        norm_ratio=grad_norm(grads["accumulated, not divided"]) / grad_norm(ref),
        rows=rows,
    )


def accumulation_sweep(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    accum_steps: list[int],
    warmup: int = 1,
    iters: int = 3,
) -> list[dict]:
    """Time one optimizer step for each number of micro-steps (one model, real text).

    Returns one row per entry: {"grad_accum_steps", "tokens_per_step", "ms", "tokens_per_s",
    "peak_bytes" (None on CPU), "loss" (the logged loss of the last timed step, nats)}.
    ms = median of ``iters`` steps after ``warmup``; peak over all of them.
    """
    device = torch.device(device)
    trainer = train.build(run, model_config, device)
    loader = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, device)
    rows = []
    for n in accum_steps:
        trainer.run = run.replace(grad_accum_steps=n)
        row = bench.measure(
            trainer.run,
            model_config,
            device,
            warmup=warmup,
            iters=iters,
            trainer=trainer,
            loader=loader,
        )
        if row["status"] != "measured":
            raise RuntimeError(f"grad_accum_steps={n}: {row['reason']}")
        rows.append(
            dict(
                grad_accum_steps=n,
                tokens_per_step=trainer.run.tokens_per_step,
                ms=row["ms_per_step"],
                tokens_per_s=row["tokens_per_s"],
                peak_bytes=row["peak_mem_bytes"],
                loss=row["loss"],
            )
        )
    return rows


# --------------------------------------------------------------------------------------------
# Activation checkpointing
# --------------------------------------------------------------------------------------------


class Checkpointed(nn.Module):
    """Wraps a module so that its forward runs under ``torch.utils.checkpoint.checkpoint``.

    ``use_reentrant=False`` (the default here, and PyTorch's recommendation) gives the wrapped
    parameters their gradients whatever the input; ``use_reentrant=True`` is kept only to show its
    trap: with an input that does not require grad, the wrapped parameters get no gradient at all.
    """

    def __init__(self, module: nn.Module, use_reentrant: bool = False):
        super().__init__()
        self.module = module
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.module, x, use_reentrant=self.use_reentrant)


def _held_bytes_of_one_forward(trainer, loader) -> dict:
    """{"held_bytes": bytes one extra forward of ``trainer``'s model allocates and still holds
    when it returns (:func:`helpers.measure.memory.held_bytes`): the activations kept for backward
    plus the logits and loss}."""
    trainer.optimizer.zero_grad(set_to_none=True)
    x, y = loader.next_batch()
    with trainer.autocast():
        (logits, loss), held = memory.held_bytes(
            lambda m=trainer.model, x=x, y=y: m(x, y), trainer.device
        )
    # the un-backwarded graph holds every kept activation: drop it before the next setting is
    # measured (kept alive, it added ~9 GiB per setting to the next peak on the H200)
    del logits, loss, x, y
    return {"held_bytes": held}


def _setting(s: int | tuple[int, str]) -> tuple[int, str]:
    """A sweep setting as (checkpoint_every, checkpoint_policy); an int k means (k, "block")."""
    return (s, "block") if isinstance(s, int) else s


def setting_label(row: dict) -> str:
    """'off', 'every block', 'every 2nd block', ..., with ', selective' for the selective policy:
    the name of a row of :func:`checkpointing_sweep` or :func:`max_batch_under_limit`."""
    k, policy = row["checkpoint_every"], row.get("checkpoint_policy", "block")
    if k == 0:
        return "off"
    nth = {1: "", 2: "2nd ", 3: "3rd "}.get(k, f"{k}th ")
    return f"every {nth}block" + (", selective" if policy == "selective" else "")


def checkpointing_sweep(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    settings: list[int | tuple[int, str]],
    warmup: int = 2,
    iters: int = 5,
) -> list[dict]:
    """Step time, peak memory and held bytes for each checkpointing setting: an int k is
    ``checkpoint_every=k`` with whole blocks recomputed, a pair (k, policy) also sets
    ``checkpoint_policy`` (``(1, "selective")``: every block, :mod:`helpers.core.recompute`).

    Returns rows {"checkpoint_every", "checkpoint_policy", "checkpointed_blocks", "ms",
    "tokens_per_s", "peak_bytes" (CUDA only, else None), "held_bytes", "baseline_bytes"} with ms the
    median of ``iters`` full training steps and the peak over all steps (warm-up included), counted
    from the memory allocated before the setting's model was built (``baseline_bytes``); held_bytes
    what one extra forward allocates and still holds when it returns
    (:func:`helpers.measure.memory.held_bytes`: the activations kept for backward, the logits and
    the loss; on any device).
    """
    device = torch.device(device)
    tokens = data.load_tokens()
    rows = []
    for k, policy in map(_setting, settings):
        memory.reset_peak(device)
        # tensors of earlier work, not of this setting
        baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        row = bench.measure(
            run.replace(checkpoint_every=k, checkpoint_policy=policy),
            model_config,
            device,
            tokens,
            warmup,
            iters,
            after=_held_bytes_of_one_forward,
        )
        if row["status"] != "measured":
            raise RuntimeError(f"checkpoint_every={k}, {policy}: {row['reason']}")
        peak = row["peak_mem_bytes"]
        rows.append(
            dict(
                checkpoint_every=k,
                checkpoint_policy=policy,
                checkpointed_blocks=0 if k == 0 else len(range(0, model_config.n_layer, k)),
                ms=row["ms_per_step"],
                tokens_per_s=timing.tokens_per_second(
                    run.batch_size * run.seq_len, row["ms_per_step"]
                ),
                peak_bytes=None if peak is None else peak - baseline,
                held_bytes=row["held_bytes"],
                baseline_bytes=baseline,
            )
        )
    memory.reset_peak(device)
    return rows


def max_batch_under_limit(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    limit_bytes: int,
    settings: list[int | tuple[int, str]],
    start: int = 8,
    limit_b: int = 512,
) -> list[dict]:
    """Largest B whose *measured* peak memory of one full training step stays under
    ``limit_bytes``, for each checkpointing setting (as in :func:`checkpointing_sweep`; CUDA only:
    the peak is
    ``torch.cuda.max_memory_allocated``).

    A step whose peak exceeds the limit counts as out of memory (the real GPU may be larger), so
    :func:`helpers.measure.memory.find_max_batch_size` doubles and bisects exactly as on a smaller
    GPU.
    The peak counts from the memory already allocated before the model is built (``baseline_bytes``,
    e.g. tensors an earlier notebook cell still holds), so only this step's own memory is budgeted.
    Returns rows {"checkpoint_every", "checkpoint_policy", "max_batch_size", "peak_bytes",
    "baseline_bytes"}.
    Raises ValueError on a CPU (no peak-memory counter there).
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("max_batch_under_limit measures CUDA peak memory: run it on a GPU")
    rows = []
    for k, policy in map(_setting, settings):
        memory.reset_peak(device)
        # tensors of earlier work: not this step's budget
        baseline = torch.cuda.memory_allocated(device)
        trainer = train.build(
            run.replace(checkpoint_every=k, checkpoint_policy=policy), model_config, device
        )
        probe = memory.make_step_probe(trainer, run.seq_len)

        def try_step(B: int, probe=probe, baseline=baseline) -> None:
            probe(B)
            used = memory.peak_bytes(device) - baseline
            if used > limit_bytes:
                raise torch.cuda.OutOfMemoryError(
                    f"measured peak {memory.format_bytes(used)} > "
                    f"limit {memory.format_bytes(limit_bytes)}"
                )

        found = memory.find_max_batch_size(try_step, device, start=start, limit=limit_b)
        peak = found["peak_mem_bytes"]
        rows.append(
            dict(
                checkpoint_every=k,
                checkpoint_policy=policy,
                max_batch_size=found["max_batch_size"],
                peak_bytes=None if peak is None else peak - baseline,
                baseline_bytes=baseline,
            )
        )
        # try_step's defaults hold probe and with it the trainer: all three go before the next
        # setting's baseline is read, or that baseline would count this model and its AdamW state
        # and the next search would leave them out of its peak while they are freed.
        trainer = probe = try_step = found = None
        gc.collect()
        memory.reset_peak(device)
        _check_baseline(rows, device)
    return rows


def _check_baseline(rows: list[dict], device: torch.device, slack: int = 64 * 2**20) -> None:
    """Raise if memory an earlier setting allocated is still held after it (the next baseline
    would then hide it from that setting's budget).

    Raises:
        RuntimeError: more than ``slack`` bytes more allocated than before the first setting.
    """
    now = torch.cuda.memory_allocated(device)
    if now > rows[0]["baseline_bytes"] + slack:
        raise RuntimeError(
            f"{memory.format_bytes(now - rows[0]['baseline_bytes'])} allocated by "
            f"{setting_label(rows[-1])} is still held after it: free its tensors before the next "
            "setting's baseline"
        )


def reentrant_trap(
    model_config: GPTConfig,
    device: torch.device | str,
    use_reentrant: bool,
    model_switches: dict | None = None,
) -> dict:
    """Fine-tuning with frozen embeddings and every block checkpointed: which parameters get a
    gradient?

    The token and position embeddings (and the LM head tied to the token embedding) are frozen, so
    the first block's input does not require grad. Every block is wrapped in :class:`Checkpointed`;
    one forward + backward on real text. Warnings are caught, not printed.
    Returns {"use_reentrant", "trainable" (tensors), "without_grad" (trainable tensors whose .grad
    is None), "without_grad_params" (their element count), "warnings": [first line of each
    message]}.
    """
    device = torch.device(device)
    torch.manual_seed(1337)
    m = GPT(model_config, **(model_switches or {})).to(device)
    m.transformer.wte.weight.requires_grad_(False)
    m.transformer.wpe.weight.requires_grad_(False)
    m.transformer.h = nn.ModuleList([Checkpointed(b, use_reentrant) for b in m.transformer.h])
    x, y = data.BatchLoader(
        data.load_tokens(), 2, min(64, model_config.block_size), device
    ).next_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, loss = m(x, y)
        loss.backward()
    trainable = [p for p in m.parameters() if p.requires_grad]
    missing = [p for p in trainable if p.grad is None]
    return dict(
        use_reentrant=use_reentrant,
        trainable=len(trainable),
        without_grad=len(missing),
        without_grad_params=sum(p.numel() for p in missing),
        # torch's own deprecation notices (torch 2.4's checkpoint calls the deprecated
        # torch.cpu.amp.autocast internally) are not about this code: left out
        warnings=[
            str(w.message).splitlines()[0]
            for w in caught
            if not issubclass(w.category, (FutureWarning, DeprecationWarning))
        ],
    )


def plot_checkpointing(rows: list[dict], title: str):
    """Step time (ms) against memory (GiB) per checkpointing setting: measured peak where the rows
    have one (CUDA), and the bytes one forward holds for backward (``held_bytes``). Returns the
    matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    series = [("held_bytes", "held after forward", "o")]
    if rows[0]["peak_bytes"] is not None:
        series.insert(0, ("peak_bytes", "peak memory of the step", "s"))
    for key, label, marker in series:
        xs, ys = [r[key] / 2**30 for r in rows], [r["ms"] for r in rows]
        ax.plot(xs, ys, marker=marker, ls="-", label=label)
        for r, xv, yv in zip(rows, xs, ys, strict=True):
            ax.annotate(
                setting_label(r),
                (xv, yv),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=8,
            )
    ax.set_xlabel("memory (GiB)")
    ax.set_ylabel("training step (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Command line: the committed GPU results
# --------------------------------------------------------------------------------------------


def benchmark_run(device: torch.device | str) -> tuple[train.RunConfig, GPTConfig]:
    """The configuration the chapter measures: eager bf16 autocast + SDPA + vocab 50304 on CUDA
    (the ladder's best eager rung; fp16 + GradScaler on a GPU without native bf16, see
    :func:`train.recipe_autocast`), fp32 + SDPA on a CPU; shapes from
    :func:`train.default_shapes`."""
    device = torch.device(device)
    cfg, B, T = train.default_shapes(device)
    if device.type == "cuda":
        autocast = train.recipe_autocast(device)
        run = train.RunConfig(
            name=f"{autocast}+sdpa",
            autocast=autocast,
            attention="sdpa",
            vocab_multiple=64,
            batch_size=B,
            seq_len=T,
        )
    else:
        run = train.RunConfig(name="fp32+sdpa", attention="sdpa", batch_size=B, seq_len=T)
    return run, dataclasses.replace(cfg, **train.shape_switches(run))


def _provenance(device: torch.device, run: train.RunConfig, cfg: GPTConfig, what: str) -> dict:
    return {
        **results.provenance(device),
        "what": what,
        "config": {"run": dataclasses.asdict(run), "model": dataclasses.asdict(cfg)},
    }


def run_benchmark(
    kind: str, device: torch.device | str, iters: int = 5, limit_gib: float = 16.0
) -> dict:
    """The JSON the command line writes. ``kind``: "checkpointing" (settings 0, 4, 2, 1 and every
    block selective: step time, peak and held memory, on CUDA the largest B under ``limit_gib``) or
    "accumulation" (fp32 gradients of one batch vs 4 micro-batches; step time, tokens/s and peak
    memory for 1..32 micro-steps: 32 x 16 x 1024 = 0.5M tokens per step on the GPU)."""
    device = torch.device(device)
    run, cfg = benchmark_run(device)
    if kind == "checkpointing":
        settings = [0, 4, 2, 1, (1, "selective")]
        out = _provenance(
            device,
            run,
            cfg,
            f"full training step per checkpoint_every (and policy), median of {iters}; "
            f"max B: largest B whose measured peak stays under {limit_gib:g} GiB",
        )
        out["rows"] = checkpointing_sweep(run, cfg, device, settings, warmup=2, iters=iters)
        out["limit_bytes"] = int(limit_gib * 2**30)
        out["max_batch"] = (
            max_batch_under_limit(run, cfg, device, out["limit_bytes"], settings)
            if device.type == "cuda"
            else None
        )
        return out
    if kind == "accumulation":
        steps = [1, 2, 4, 8, 16, 32] if device.type == "cuda" else [1, 2, 4]
        out = _provenance(
            device,
            run,
            cfg,
            f"one optimizer step per number of micro-steps, median of {iters}; "
            "gradient check in fp32 (TF32 off)",
        )
        out["gradient_check"] = accumulation_report(cfg, run.batch_size, run.seq_len, 4, device)
        out["rows"] = accumulation_sweep(run, cfg, device, steps, warmup=1, iters=iters)
        return out
    raise ValueError(f"unknown benchmark {kind!r}: use 'checkpointing' or 'accumulation'")


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.chapters.ch09_tradeoffs {checkpointing,accumulation} --out FILE.json
    [--iters N]``."""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(
        prog="python -m helpers.chapters.ch09_tradeoffs",
        description="Chapter 09 measurements (JSON).",
    )
    p.add_argument("kind", choices=["checkpointing", "accumulation"])
    p.add_argument(
        "--out", required=True, help="JSON file to write, e.g. results/h200-checkpointing.json"
    )
    p.add_argument("--iters", type=int, default=5, help="timed steps per setting (median reported)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    cli.add_force(p)
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error("--iters must be >= 1")
    device = cli.device(args.device)
    cli.result_out(args.out, ("what", "rows", "config"), force=args.force)  # before the run
    out = run_benchmark(args.kind, device, iters=args.iters)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['device']}, {len(out['rows'])} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
