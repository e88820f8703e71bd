"""Chapter 13: the released GPT-2 in the course's model, its validation loss, and generating fast.

What only this chapter needs: where the released weights come from (the hub, or a folder named by
``$COURSE_GPT2_WEIGHTS``), a random GPT-2 checkpoint written with transformers for the offline
proof of equality, the equality table itself, chapter 12's configuration retrained on the train
split, and the generation-speed table (measured here or committed in ``results/``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.nn import functional as F

from helpers import ladder
from helpers.core import generation, pretrained, train
from helpers.core.model import GPT, GPT2_VOCAB_SIZE, GPTConfig
from helpers.core.train import RunConfig
from helpers.measure.results import markdown_table

WEIGHTS_ENV = "COURSE_GPT2_WEIGHTS"  # a folder holding the released weights (offline machines)
GENERATION_FILE = "h200-generation-2026-12-01.json"  # benchmarks/generation_speed.py's output
# The random checkpoint of the offline proof: GPT-2's real vocabulary, a small body (CPU seconds).
RANDOM_SHAPE = dict(n_layer=2, n_head=2, n_embd=64, n_positions=128, vocab_size=GPT2_VOCAB_SIZE)
TOLERANCE = 1e-4  # fp32 logits and loss: rounding of a different summation order, not a bug


def weights_source() -> str:
    """Where the released weights are read from: ``$COURSE_GPT2_WEIGHTS`` (a folder) when set,
    else the hub name ``"gpt2"`` (124M; with ``HF_HUB_OFFLINE=1`` only its local cache)."""
    return os.environ.get(WEIGHTS_ENV, "").strip() or "gpt2"


def released_folder() -> tuple[Path | None, str]:
    """(the folder holding the released GPT-2 124M, one line saying where it came from), or
    (None, one line saying why it cannot be reached and what to do). Never raises for missing
    weights: :class:`helpers.core.pretrained.WeightsNotFoundError` becomes the line."""
    source = weights_source()
    try:
        folder = pretrained.resolve(source)
        pretrained.read_checkpoint(folder)  # a folder without weights fails here, not later
    except pretrained.WeightsNotFoundError as e:
        why = str(e).split(". ")[0]
        return None, (
            f"released GPT-2 weights not reachable here ({why}); online, load_gpt2('gpt2') "
            f"downloads them, offline set {WEIGHTS_ENV} to a folder holding them "
            "(pretrained.MAKE_A_FOLDER makes one)"
        )
    return folder, f"released GPT-2 weights: {source} -> {folder}"


def random_checkpoint(folder: str | Path, seed: int = 0):
    """Write a GPT-2 with random weights (transformers' ``GPT2LMHeadModel``, :data:`RANDOM_SHAPE`,
    biases and LayerNorms perturbed so a misplaced one shows) to ``folder`` with
    ``save_pretrained``, and return that model (eval mode, fp32, CPU): the reference of the offline
    proof.

    Raises:
        ImportError: transformers is not installed (pip install transformers).
    """
    import transformers

    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**RANDOM_SHAPE)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:  # biases and LayerNorm weights start at 0 and 1: move them
                p.add_(0.1 * torch.randn_like(p))
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bar
    try:
        hf.save_pretrained(folder)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return hf


def reference_model(folder: str | Path):
    """transformers' ``GPT2LMHeadModel`` from ``folder``, fp32, eval mode, SDPA-free ("eager"
    attention: its own reference path)."""
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()


@torch.no_grad()
def equality_rows(folder: str | Path, hf, idx: torch.Tensor) -> list[dict]:
    """The course's model loaded from ``folder`` against transformers' ``hf`` on the same tokens
    ``idx`` (B, T) int64, CPU, fp32: one row per attention ("manual", "sdpa") and vocabulary (50257,
    padded 50304) with "max_logit_diff" (max |difference| of the 50257 real logits), "loss_diff"
    (|difference| of the mean next-token loss, nats), "padded_zero" (every padded logit exactly 0)
    and "equal" (both diffs <= :data:`TOLERANCE`)."""
    ref_logits = hf(idx).logits.float()  # (B, T, 50257)
    V = ref_logits.size(-1)
    ref_loss = F.cross_entropy(ref_logits[:, :-1].reshape(-1, V), idx[:, 1:].reshape(-1)).item()
    rows = []
    for attention in ("manual", "sdpa"):
        for multiple in (1, 64):
            model = pretrained.load_gpt2(folder, vocab_multiple=multiple, attention=attention)
            logits, _ = model(idx)  # (B, T, V_padded)
            _, loss = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
            logit_diff = (logits[..., :V] - ref_logits).abs().max().item()
            loss_diff = abs(loss.item() - ref_loss)
            rows.append(
                dict(
                    attention=attention,
                    rows=model.config.padded_vocab_size,
                    max_logit_diff=logit_diff,
                    loss_diff=loss_diff,
                    padded_zero=bool(torch.all(logits[..., V:] == 0)),
                    equal=logit_diff <= TOLERANCE and loss_diff <= TOLERANCE,
                )
            )
    return rows


def equality_markdown(rows: list[dict]) -> str:
    """:func:`equality_rows` as a Markdown table."""
    body = [
        (
            r["attention"],
            f"{r['rows']:,}",
            f"{r['max_logit_diff']:.1e}",
            f"{r['loss_diff']:.1e}",
            "yes" if r["rows"] == GPT2_VOCAB_SIZE else ("yes" if r["padded_zero"] else "NO"),
            "yes" if r["equal"] else "NO",
        )
        for r in rows
    ]
    header = ("attention", "vocab rows", "max abs logit diff", "abs loss diff (nats)",
              "padded logits 0", f"equal (<= {TOLERANCE:g})")  # fmt: skip
    return markdown_table(header, body, "llrrll")


def chapter12_run(device: torch.device | str) -> tuple[RunConfig, int, GPTConfig]:
    """(run, steps, model config): chapter 12's trained configuration, retrained here on the train
    split. Chapter 12 trains the ladder's last rung that runs on this device
    (:func:`helpers.ladder.last_runnable`) at the device's default shapes
    (:func:`helpers.core.train.default_shapes`); here for 1000 steps on a GPU (chapter 12's 100 s
    run is about 2800 on an H200) and 20 on a CPU (its minimum there)."""
    device = torch.device(device)
    cfg, B, T = train.default_shapes(device)
    run = ladder.last_runnable(B, T, device)
    return run, 1000 if device.type == "cuda" else 20, cfg


SPEED_RUNS = (  # (method, mode) pairs of the speed table, in its order
    ("recompute", "no_grad"),
    ("cache", "no_grad"),
    ("cache", "inference_mode"),
    ("cache_compiled", "no_grad"),
)


def speed_rows(
    model: GPT,
    device: torch.device | str,
    batches: tuple[int, ...],
    prompt_len: int,
    new_tokens: int,
    runs: tuple[tuple[str, str], ...] = SPEED_RUNS,
    iters: int = 3,
) -> list[dict]:
    """:func:`helpers.core.generation.generation_speed` for each batch size and (method, mode) of
    ``runs``: greedy generation of ``new_tokens`` after a ``prompt_len``-token random prompt, with
    the speed-up of each row over the "recompute" row of its batch ("speedup", x)."""
    rows = []
    for batch in batches:
        base = None
        for method, mode in runs:
            row = generation.generation_speed(
                model, batch, prompt_len, new_tokens, method, device, mode, iters=iters
            )
            if method == "recompute":
                base = row["ms_per_token"]
            ok = row["status"] == "measured" and base
            row["speedup"] = base / row["ms_per_token"] if ok else None
            rows.append(row)
    return rows


def speed_markdown(rows: list[dict]) -> str:
    """:func:`speed_rows` (or the committed file's rows) as a Markdown table: ms per token,
    tokens/s, speed-up over recomputation, peak memory (CUDA) and the mode or skip reason."""

    def num(v, fmt):
        return None if v is None else format(v, fmt)

    body = [
        (
            r["batch"],
            r["method"],
            r["mode"],
            num(r["ms_per_token"], ".2f"),
            num(r["tokens_per_s"], ",.0f"),
            None if r.get("speedup") is None else f"{r['speedup']:.2f}x",
            num(r["peak_mem_bytes"] and r["peak_mem_bytes"] / 2**20, ",.0f"),
            r["reason"] if r["method"] == "cache_compiled" or r["status"] != "measured" else "",
        )
        for r in rows
    ]
    header = ("B", "method", "grad mode", "ms/token", "tokens/s", "vs recompute",
              "peak MiB", "note")  # fmt: skip
    return markdown_table(header, body, "rllrrrrl")


def fastest(rows: list[dict], batch: int) -> dict:
    """The measured row of ``batch`` with the most tokens/s."""
    measured = [r for r in rows if r["batch"] == batch and r["status"] == "measured"]
    return max(measured, key=lambda r: r["tokens_per_s"])


def cache_memory_markdown(config: GPTConfig, batches: tuple[int, ...], t_max: int) -> str:
    """The KV cache's size, 2 · L · B · T · C · bytes (:func:`generation.cache_bytes`), for each
    batch size at ``t_max`` positions in fp32 and bf16, next to the fp32 weights' size."""
    weights = sum(p.numel() for p in GPT(config).parameters()) * 4
    body = []
    for batch in batches:
        fp32 = generation.cache_bytes(config, batch, t_max, torch.float32)
        bf16 = generation.cache_bytes(config, batch, t_max, torch.bfloat16)
        body.append((batch, t_max, f"{fp32 / 2**20:,.1f}", f"{bf16 / 2**20:,.1f}",
                     f"{fp32 / weights:.2f}x"))  # fmt: skip
    header = ("B", "T", "fp32 cache (MiB)", "bf16 cache (MiB)", "fp32 cache / fp32 weights")
    return markdown_table(header, body, "rrrrr")
