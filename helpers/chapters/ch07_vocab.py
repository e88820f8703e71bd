"""Vocabulary padding, measured (chapter 07).

- :func:`sweep_sizes` and :func:`lm_head_sweep`: the LM-head matmul timed for vocabulary sizes
  around GPT-2's 50257, that size and its padding 50304 always included.
- :func:`row_alignment`: where each row of a (rows, V) logits tensor starts, in bytes, and how
  many of those starts are 128-byte aligned (the seed article's claim, computed).
- :func:`profile_padding`: the training step profiled with 50257 and with 50304 rows
  (:func:`helpers.measure.profiler.profile_steps`), eager or compiled, compared kernel family by
  kernel family and kernel by kernel (:func:`compare_kernels`).

torch.profiler: https://pytorch.org/docs/stable/profiler.html
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.chapters import ch06_attention
from helpers.core import data, train
from helpers.core.model import GPTConfig, pad_to_multiple
from helpers.measure import profiler
from helpers.measure.results import markdown_table

GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary (tiktoken "gpt2")
PADDED_MULTIPLE = 64  # the course's padding: 50257 -> 50304 = 64 x 786
PADDED_VOCAB = 50304


def sweep_sizes(device: torch.device | str) -> list[int]:
    """Vocabulary sizes of chapter 07's LM-head sweep, ascending: every 8 from 50240 to 50432 on a
    GPU (every 16 to 50368 on a CPU, to keep it short), plus 50257 and 50304 themselves, which a
    step of 8 or 16 from 50240 never reaches (50257) or reaches only by luck (50304)."""
    if torch.device(device).type == "cuda":
        grid = range(50240, 50433, 8)
    else:
        grid = range(50240, 50369, 16)
    return sorted(set(grid) | {GPT2_VOCAB, PADDED_VOCAB})


def lm_head_sweep(device: torch.device | str) -> list[dict]:
    """:func:`helpers.chapters.ch06_attention.lm_head_sweep` over :func:`sweep_sizes`: on a GPU
    16·1024 tokens, n_embd 768, bf16 (fp16 below sm80); on a CPU 128 tokens, n_embd 128, fp32.
    Rows: {"V", "ms", "tflops", "multiple_of_64", "multiple_of_128"}."""
    device = torch.device(device)
    if device.type == "cuda":
        return ch06_attention.lm_head_sweep(device, sweep_sizes(device))
    return ch06_attention.lm_head_sweep(device, sweep_sizes(device), n_tokens=128, n_embd=128)


def row_alignment(vocab_size: int, dtype_bytes: int, boundary: int = 128) -> dict:
    """Where the rows of a contiguous (rows, ``vocab_size``) tensor start, given a base address
    aligned to ``boundary`` bytes (CUDA allocations are aligned to at least 256 bytes).

    Row i starts at byte i·vocab_size·dtype_bytes. Returns {"row_bytes", "aligned_to" (the largest
    power of two, at most ``boundary``, dividing every row start, bytes), "share_aligned" (the
    share of rows whose start is a multiple of ``boundary``, 0 < share <= 1)}.

    Raises:
        ValueError: if an argument is < 1 or ``boundary`` is not a power of two.
    """
    if min(vocab_size, dtype_bytes, boundary) < 1 or boundary & (boundary - 1):
        raise ValueError(
            f"need vocab_size, dtype_bytes >= 1 and a power-of-two boundary, got "
            f"{vocab_size}, {dtype_bytes}, {boundary}"
        )
    row = vocab_size * dtype_bytes
    aligned_to = min(row & -row, boundary)  # lowest set bit: the largest power of two dividing row
    return {"row_bytes": row, "aligned_to": aligned_to, "share_aligned": aligned_to / boundary}


def step_run(
    vocab_multiple: int, batch_size: int, seq_len: int, autocast: str | None, compile=None
) -> train.RunConfig:
    """Chapter 07's training step: ``autocast`` (the device's recipe), SDPA attention, the
    vocabulary padded to ``vocab_multiple`` (1: 50257 rows, 64: 50304), eager or compiled
    (``compile="default"``); every other switch at its baseline."""
    return train.RunConfig(
        name=f"vocab x{vocab_multiple}" + ("" if compile is None else ", compiled"),
        autocast=autocast,
        attention="sdpa",
        vocab_multiple=vocab_multiple,
        compile=compile,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def compare_kernels(before: list[dict], after: list[dict], top: int = 8) -> tuple[list, list]:
    """Two profiles' kernel rows (dicts with "name", "family", "ms" per step) side by side.

    Returns (families, kernels):
    - families: one dict per family in either profile, {"family", "before_ms", "after_ms",
      "diff_ms" = after - before}, in the order of ``before``'s largest first, families only in
      ``after`` last;
    - kernels: the ``top`` kernels whose time changed most (largest |diff| first), {"name",
      "family", "before_ms", "after_ms", "diff_ms"}; a kernel that ran in one profile only has 0 ms
      in the other (a different kernel chosen for the other shape shows as two rows).
    """
    fam_b, fam_a = profiler.family_totals(before), profiler.family_totals(after)
    families = [
        {
            "family": f,
            "before_ms": fam_b.get(f, 0.0),
            "after_ms": fam_a.get(f, 0.0),
            "diff_ms": fam_a.get(f, 0.0) - fam_b.get(f, 0.0),
        }
        for f in [*fam_b, *(f for f in fam_a if f not in fam_b)]
    ]
    by_name: dict[str, dict] = {}
    for side, rows in (("before_ms", before), ("after_ms", after)):
        for r in rows:
            entry = by_name.setdefault(
                r["name"],
                {"name": r["name"], "family": r["family"], "before_ms": 0.0, "after_ms": 0.0},
            )
            entry[side] += float(r["ms"])
    kernels = [{**e, "diff_ms": e["after_ms"] - e["before_ms"]} for e in by_name.values()]
    kernels.sort(key=lambda e: -abs(e["diff_ms"]))
    return families, kernels[:top]


def short_name(name: str, width: int = 60) -> str:
    """A kernel name without "void ", "at::native::" and "(anonymous namespace)::", cut to
    ``width`` characters ("..." at the end when cut)."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[: width - 3] + "..."


@dataclass
class PaddingProfile:
    """Chapter 07's step profiled at two vocabulary sizes. Times in ms per step: device (kernel)
    time on a GPU, operator self CPU time on a CPU (see :class:`profiler.StepProfile`)."""

    mode: str  # "eager" or "compiled"
    sizes: tuple[int, int]  # (rows before, rows after): (50257, 50304)
    profiles: dict  # rows -> StepProfile
    families: list[dict]  # compare_kernels' families
    kernels: list[dict]  # compare_kernels' kernels

    @property
    def what(self) -> str:
        """What the rows are: "kernels" (GPU) or "operators" (CPU, aten operators' self time)."""
        first = next(iter(self.profiles.values()))
        return "kernels" if first.device_type == "cuda" else "operators"

    def family_markdown(self) -> str:
        """The families as a Markdown table, with a total row."""
        a, b = self.sizes
        rows = [
            [f["family"], f"{f['before_ms']:.2f}", f"{f['after_ms']:.2f}", f"{f['diff_ms']:+.2f}"]
            for f in self.families
        ]
        tb, ta = (sum(f[k] for f in self.families) for k in ("before_ms", "after_ms"))
        rows.append([f"**all {self.what}**", f"{tb:.2f}", f"{ta:.2f}", f"{ta - tb:+.2f}"])
        head = ["family", f"ms at {a}", f"ms at {b}", "difference (ms)"]
        return markdown_table(head, rows, "lrrr")

    def kernel_markdown(self, width: int = 60) -> str:
        """The kernels whose time changed most as a Markdown table (names shortened)."""
        a, b = self.sizes
        rows = [
            [
                f"`{short_name(k['name'], width)}`",
                k["family"],
                f"{k['before_ms']:.2f}",
                f"{k['after_ms']:.2f}",
                f"{k['diff_ms']:+.2f}",
            ]
            for k in self.kernels
        ]
        head = ["kernel", "family", f"ms at {a}", f"ms at {b}", "difference (ms)"]
        return markdown_table(head, rows, "llrrr")

    def conclusion(self) -> str:
        """Two lines computed from the tables: the family that saved most (or, if none got faster,
        the one that changed most), then its ms per step at both sizes and the total change."""
        a, b = self.sizes
        total = sum(f["diff_ms"] for f in self.families)
        best = min(self.families, key=lambda f: f["diff_ms"])
        if best["diff_ms"] < 0:
            lead = f"the family that saved most is {best['family']}"
        else:
            best = max(self.families, key=lambda f: abs(f["diff_ms"]))
            lead = f"no family got faster; the largest change is {best['family']}"
        return (
            f"{self.mode}, {a} -> {b} rows: {lead},\n  {best['before_ms']:.2f} -> "
            f"{best['after_ms']:.2f} ms per step ({best['diff_ms']:+.2f} ms) of {total:+.2f} ms "
            f"in all {self.what}"
        )


def compiled_skip_reason(device: torch.device | str) -> str | None:
    """Why :func:`profile_padding` is not run compiled here, or None. On a CPU the chapter skips
    it to stay fast (compiling the step twice would take longer than the rest of the chapter);
    on a GPU, the reason torch.compile cannot run (:func:`train.unsupported_reason`)."""
    device = torch.device(device)
    if device.type != "cuda":
        return (
            "compiled profile skipped on a CPU: compiling the step for both sizes would take "
            "longer than the rest of this chapter; on a GPU this cell profiles it"
        )
    return train.unsupported_reason(step_run(1, 1, 1, None, compile="default"), device)


def profile_padding(
    device: torch.device | str,
    model_config: GPTConfig,
    batch_size: int,
    seq_len: int,
    autocast: str | None,
    compile=None,
    active: int | None = None,
    top: int = 8,
    tokens: torch.Tensor | None = None,
    multiples: tuple[int, int] = (1, PADDED_MULTIPLE),
) -> PaddingProfile:
    """Profile :func:`step_run` at two paddings, by default 50257 rows (``vocab_multiple=1``) and
    50304 (64); ``multiples=(8, 64)`` compares 50264 with 50304. Each: one plain step (where
    torch.compile compiles), then the profiler's steps: on a GPU 1 ignored, 1 warm-up and
    ``active`` (default 3) recorded; on a CPU, to keep chapter 07 fast there, 1 warm-up and
    ``active`` (default 1) recorded. Then the two are compared (:func:`compare_kernels`).

    ``tokens`` defaults to ``data.load_tokens()``. Each size builds its own trainer from the same
    seed and frees it before the next.

    Raises:
        ValueError: if the device cannot run the step as asked (see :func:`train.build`), or the
            two multiples give the same number of rows.
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    rows = {pad_to_multiple(model_config.vocab_size, m) for m in multiples}
    if len(multiples) != 2 or len(rows) != 2:
        raise ValueError(f"multiples {multiples} give {sorted(rows)} rows: need two sizes")
    tokens = data.load_tokens() if tokens is None else tokens
    profiles = {}
    for multiple in multiples:
        run = step_run(multiple, batch_size, seq_len, autocast, compile)
        trainer = train.build(run, model_config, device)
        loader = data.BatchLoader(tokens, batch_size, seq_len, device)
        profiles[trainer.model_config.padded_vocab_size] = profiler.profile_steps(
            trainer, loader, wait=int(cuda), active=active or (3 if cuda else 1)
        )
        trainer = loader = None
    sizes = tuple(profiles)
    families, kernels = compare_kernels(profiles[sizes[0]].kernels, profiles[sizes[1]].kernels, top)
    mode = "eager" if compile is None else "compiled"
    return PaddingProfile(mode, sizes, profiles, families, kernels)
