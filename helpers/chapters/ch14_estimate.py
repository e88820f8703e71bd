"""Chapter 14: the step's memory estimated, term by term, and the batch size the estimate picks.

Chapter 03's ``memory.training_step_estimate`` and chapter 14's ``memory.peak_estimate`` against a
snapshot's categories at the peak and against every committed eager H200 peak; the B that each
picks per GPU; and the choice checked on an emulated A100 40GB (a fresh process):

    COURSE_EMULATE_GPU=A100-40GB python -m helpers.chapters.ch14_estimate a100-check
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

import helpers
from helpers.core import data, train
from helpers.core.model import GPTConfig
from helpers.measure import allocator, gpus, hardware, memory, results
from helpers.tools import cli

UNITS = {"GiB": 2**30, "MiB": 2**20}


def unit_for(device: torch.device | str) -> str:
    """The unit the chapter's tables use on ``device``: GiB on a GPU (GPT-2 124M), MiB on a CPU
    (the small model)."""
    return "GiB" if torch.device(device).type == "cuda" else "MiB"


def size(n: int | None, unit: str = "GiB") -> str:
    """``n`` bytes in ``unit`` ("GiB" or "MiB"), two decimals; "-" for None."""
    return "-" if n is None else f"{n / UNITS[unit]:,.2f}"


def gib(n: int | None) -> str:
    """``n`` bytes in GiB, two decimals; "-" for None."""
    return size(n, "GiB")


def run_estimate(run: train.RunConfig, cfg: GPTConfig, **kw) -> dict[str, int] | None:
    """``memory.peak_estimate`` for ``run`` (None where it models nothing: a fused or Triton
    loss, the selective checkpoint policy)."""
    if run.loss_kernel != "pytorch" or (run.checkpoint_every and run.checkpoint_policy != "block"):
        return None
    return memory.peak_estimate(
        cfg,
        run.batch_size,
        run.seq_len,
        autocast=run.autocast is not None,
        attention=run.attention,
        residual_bf16=run.residual_dtype == "bf16",
        checkpoint_every=run.checkpoint_every,
        optimizer=run.optimizer,
        **kw,
    )


ESTIMATE_TERMS = [  # (row, chapter 14's estimate key, the snapshot's categories)
    ("parameters", "parameters", ["parameters"]),
    ("gradients", "gradients", ["gradients"]),
    ("AdamW state", "adamw_state", ["AdamW state"]),
    ("16-bit weight copies", "weight_copies", ["16-bit weight copies"]),
    ("activations", "activations", ["activations (saved for backward)"]),
    ("(T, T) attention scores", "attention_scores", ["(T, T) attention scores"]),
    ("logits-sized tensors", "logits", ["logits-sized (B, T, V)"]),
]


def estimate_rows(
    run: train.RunConfig, cfg: GPTConfig, parts: dict[str, int], total: int, unit: str = "GiB"
) -> list[list[str]]:
    """Rows term | chapter 03's estimate | chapter 14's | the snapshot at the peak (``unit``).
    Chapter 03's activations are split into its (T, T) part and the rest; "other" is what the
    snapshot holds that no term names."""
    ac, manual = run.autocast is not None, run.attention == "manual"
    old = memory.training_step_estimate(cfg, run.batch_size, run.seq_len, ac, manual)
    no_scores = cfg.n_layer * memory.activation_bytes_per_layer(
        run.batch_size, run.seq_len, cfg.n_embd, cfg.n_head, 2 if ac else 4, False
    )
    old = {**old, "activations": no_scores, "attention_scores": old["activations"] - no_scores}
    new = run_estimate(run, cfg) or {}
    rows, named = [], 0
    for label, key, cats in ESTIMATE_TERMS:
        measured = sum(parts.get(c, 0) for c in cats)
        named += measured
        rows.append([label, *(size(x, unit) for x in (old.get(key), new.get(key), measured))])
    rows.append(
        ["other", "-", size(new.get("optimizer_temporaries"), unit), size(total - named, unit)]
    )
    rows.append(["total", *(size(x, unit) for x in (old["total"], new.get("total"), total))])
    return rows


# --------------------------------------------------------------------------------------------
# The estimate against committed measurements, and the batch size it chooses
# --------------------------------------------------------------------------------------------


def committed_eager_peaks() -> list[dict]:
    """Every committed eager H200 step peak with what it ran: {"what", "config", "B", "kw"
    (``memory.peak_estimate``'s switches), "measured"} from the batch probe, the precision
    comparison, chapter 09's checkpointing and accumulation runs and the ladder's eager rungs at
    B=16 and B=64 (``results/``); [] where none is committed."""
    gpt2, padded = GPTConfig(), GPTConfig(vocab_multiple=64)
    rows = []

    def add(what, cfg, B, kw, measured):
        rows.append({"what": what, "config": cfg, "B": B, "kw": kw, "measured": measured})

    probe = results.load("h200-batch-probe.json") or {"rows": []}
    for row, kw in zip(
        probe["rows"], [{"autocast": False}, {"autocast": True, "attention": "sdpa"}]
    ):
        for i, (B, ok, peak) in enumerate(row["tried"]):
            if ok:  # the probe's first try is its trainer's first step: no AdamW state yet
                add(f"probe, {row['config']}, B={B}", gpt2, B, dict(kw, first_step=i == 0), peak)
    for r in (results.load("h200-precision.json") or {"precisions": []})["precisions"]:
        add(
            f"precision {r['name']}, B=16",
            gpt2,
            16,
            {"autocast": r["autocast"] is not None},
            r["peak_mem_bytes"],
        )
    ckpt = results.load("h200-checkpointing.json") or {"rows": [], "max_batch": []}
    for r in ckpt["rows"] + ckpt["max_batch"]:
        if r["checkpoint_policy"] == "block":  # its peak_bytes count from the memory held before
            B, k = r.get("max_batch_size", 16), r["checkpoint_every"]
            kw = {"autocast": True, "attention": "sdpa", "checkpoint_every": k}
            add(
                f"bf16 + SDPA, checkpoint_every={k}, B={B}",
                padded,
                B,
                kw,
                r["peak_bytes"] + r["baseline_bytes"],
            )
    for r in (results.load("h200-accumulation.json") or {"rows": []})["rows"]:
        kw = {"autocast": True, "attention": "sdpa", "grads_kept": r["grad_accum_steps"] > 1}
        n = r["grad_accum_steps"]
        add(f"bf16 + SDPA, {n} micro-step{'s' * (n != 1)}", padded, 16, kw, r["peak_bytes"])
    for B in (16, 64):
        for r in (results.load(f"h200-ladder-b{B}.json") or {"rungs": []})["rungs"]:
            s = r["switches"]
            if s["compile"] is None and r["peak_mem_bytes"]:
                kw = {"autocast": s["autocast"] is not None, "attention": s["attention"]}
                add(
                    f"ladder {r['name']}, B={B}",
                    GPTConfig(vocab_multiple=s["vocab_multiple"]),
                    B,
                    kw,
                    r["peak_mem_bytes"],
                )
    return rows


def committed_check_rows(rows: list[dict]) -> list[list[str]]:
    """Rows: run | measured (GB) | chapter 03 (GB, its difference) | chapter 14 (GB, its
    difference), for :func:`committed_eager_peaks`' rows."""
    out = []
    for r in rows:
        kw = r["kw"]
        new = memory.peak_estimate(r["config"], r["B"], 1024, **kw)["total"]
        old = memory.training_step_estimate(
            r["config"], r["B"], 1024, kw["autocast"], kw.get("attention", "manual") == "manual"
        )["total"]
        m = r["measured"]
        out.append(
            [
                r["what"],
                f"{m / 1e9:.2f}",
                f"{old / 1e9:.2f} ({100 * (old / m - 1):+.1f}%)",
                f"{new / 1e9:.2f} ({100 * (new / m - 1):+.1f}%)",
            ]
        )
    return out


def batch_choices(keys=("T4", "L4", "A100-40GB", "A100-80GB", "H200")) -> list[list[str]]:
    """Rows: GPU | memory (GB) | B from chapter 03's estimate | B from chapter 14's
    (:func:`train.batch_for_memory`, what ``default_shapes`` picks): the fp32 manual-attention
    step at T=1024 on each GPU's memory (a T4: the 15 GB Colab offers)."""
    cfg, rows = GPTConfig(), []
    for key in keys:
        usable = (
            hardware.T4_USABLE_BYTES if key == "T4" else int(gpus.PROFILES[key].memory_gb * 1e9)
        )
        old = next(
            (
                b
                for b in train.GPU_BATCH_SIZES
                if memory.training_step_estimate(cfg, b, 1024, False, True)["total"] <= usable
            ),
            1,
        )
        rows.append([key, f"{usable / 1e9:.0f}", old, train.batch_for_memory(usable, cfg)])
    return rows


def a100_check(timeout_s: int = 600) -> dict:
    """``train.default_shapes`` as an emulated A100 40GB (40 GB cap, in a fresh process with
    ``COURSE_EMULATE_GPU=A100-40GB``): the B it picks, and whether two fp32 steps of that B run.
    {"status": "needs CUDA", "reason"} without a GPU."""
    if not torch.cuda.is_available():
        return {"status": "needs CUDA", "reason": "emulating an A100 40GB caps a real GPU's memory"}
    env = {**os.environ, hardware.EMULATE_ENV: "A100-40GB"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(helpers.REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    cmd = [sys.executable, "-m", "helpers.chapters.ch14_estimate", "a100-check"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"status": "failed", "error": (out.stderr.strip() or out.stdout.strip())[-1000:]}
    return json.loads(lines[-1])


def _a100_child() -> dict:
    device = cli.device(None)  # applies $COURSE_EMULATE_GPU
    cfg, B, T = train.default_shapes(device)
    trainer = train.build(train.RunConfig(batch_size=B, seq_len=T), cfg, device)
    loader = data.BatchLoader(data.load_tokens(), B, T, device)
    memory.reset_peak(device)
    ok = True
    try:
        for _ in range(2):
            trainer.step(loader)
        torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        ok = False
    s = allocator.stats(device)
    est = memory.peak_estimate(cfg, B, T, autocast=False)["total"]
    return {
        "status": "measured",
        "device": results.provenance(device)["device"],
        "memory_cap_bytes": hardware.usable_memory_bytes(device),
        "batch_size": B,
        "fits": ok,
        "peak_allocated": s["peak_allocated"],
        "peak_reserved": s["peak_reserved"],
        "estimate": est,
        "estimate_with_margin": int(est * (1 + train.PEAK_MARGIN)),
    }


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.chapters.ch14_estimate a100-check``: the fresh process of
    :func:`a100_check` (one JSON line; set ``COURSE_EMULATE_GPU`` to the GPU to emulate)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m helpers.chapters.ch14_estimate")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("a100-check", help="default_shapes and two fp32 steps, on this (emulated) GPU")
    p.parse_args(argv)
    print(json.dumps(_a100_child()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
