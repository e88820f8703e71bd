"""Data loading and the optimizer step (chapter 09), measured on the course's real model and data.

- Data loading: pinned memory + ``non_blocking`` copies, a one-batch prefetch, and DataLoader
  workers that tokenise on the fly (:class:`TokenizingDataset`) against a pre-tokenised array;
  :func:`data_wait_report` says whether the training step waits for its data.
- The optimizer step: AdamW implementations (for-loop / foreach / fused), weight-decay groups and
  gradient clipping.

Gradient accumulation and activation checkpointing, the chapter's memory trade-offs, and the
chapter's command line are in :mod:`helpers.chapters.ch09_tradeoffs`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
import torch.nn as nn

from helpers.core import data, tokenizer, train
from helpers.core.model import GPTConfig
from helpers.measure import results, timing

# --------------------------------------------------------------------------------------------
# Data loading
# --------------------------------------------------------------------------------------------


class TokenizingDataset(torch.utils.data.Dataset):
    """Samples tokenised on the fly: item i is the GPT-2 tokens of a slice of raw text.

    Item i tokenises ``chars_per_sample`` characters starting at i * ``chars_per_sample`` and
    returns (x, y), each (T,) int64, y = x shifted by one. A top-level class holding only a str and
    ints, so it pickles into DataLoader worker processes (fork or spawn).
    Raises ValueError from ``__getitem__`` if a slice yields fewer than T + 1 tokens.
    """

    def __init__(self, text: str, seq_len: int, chars_per_token: float = 6.0):
        self.text = text
        self.T = seq_len
        self.chars_per_sample = int(seq_len * chars_per_token)
        self.n = len(text) // self.chars_per_sample

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.chars_per_sample
        ids = tokenizer.encode(self.text[start : start + self.chars_per_sample])
        if len(ids) < self.T + 1:
            raise ValueError(
                f"sample {i}: {len(ids)} tokens < T + 1 = {self.T + 1}; raise chars_per_token"
            )
        buf = torch.tensor(ids[: self.T + 1], dtype=torch.long)
        return buf[:-1], buf[1:]


class PrefetchLoader:
    """``next_batch()`` over a DataLoader, one batch ahead: the host-to-device copy of batch i + 1
    (pinned, ``non_blocking``) is queued before batch i is returned, so it overlaps with the GPU's
    work on batch i. Cycles through the DataLoader forever. On a CPU it only moves tensors.
    """

    def __init__(self, loader: torch.utils.data.DataLoader, device: torch.device | str):
        self.loader = loader
        self.device = torch.device(device)
        self._it: Iterator | None = None
        self._next = None

    def _fetch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._it is None:
            self._it = iter(self.loader)
        try:
            x, y = next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            x, y = next(self._it)
        nb = self.device.type == "cuda"
        return x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        current = self._next if self._next is not None else self._fetch()
        self._next = self._fetch()
        return current


def tokenizing_loader(
    B: int, T: int, device: torch.device | str, num_workers: int
) -> PrefetchLoader:
    """A :class:`PrefetchLoader` over a DataLoader of :class:`TokenizingDataset` (Tiny Shakespeare),
    batch B, ``num_workers`` worker processes, ``pin_memory`` on CUDA."""
    device = torch.device(device)
    ds = TokenizingDataset(data.load_text(), T)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=B,
        shuffle=False,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=num_workers > 0,
    )
    return PrefetchLoader(dl, device)


def time_next_batch(loader, n: int = 10) -> dict:
    """Host time of ``loader.next_batch()``: the first call (worker start-up, first batch) apart,
    then the median of ``n`` calls, in ms. A GPU queue that is ahead of the host hides this time; a
    CPU does not."""
    t0 = time.perf_counter()
    loader.next_batch()
    first = 1e3 * (time.perf_counter() - t0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        loader.next_batch()
        times.append(1e3 * (time.perf_counter() - t0))
    times.sort()
    return dict(first_ms=first, median_ms=times[len(times) // 2])


def copy_time_us(
    B: int, T: int, device: torch.device | str, pinned: bool, iters: int = 20
) -> float | None:
    """Median time of copying one (B, T) int64 batch from host to ``device``, in microseconds, from
    pinned or pageable host memory (CUDA events). None on a CPU: there is no copy to time."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    host = torch.randint(0, 50257, (B, T))
    if pinned:
        host = host.pin_memory()
    t = timing.measure(lambda: host.to(device, non_blocking=pinned), device, warmup=3, iters=iters)
    return 1e3 * t.median_ms


class TokenWindows(torch.utils.data.Dataset):
    """The pre-tokenised stream as a map-style Dataset: item i is (x, y), each (T,) int64, the
    tokens [i*T, i*T + T) and the same window shifted by one. What a ``torch.utils.data.DataLoader``
    would read where the course's :class:`helpers.core.data.BatchLoader` slices the array itself.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens = tokens.to(torch.long).contiguous()
        self.T = seq_len
        self.n = (self.tokens.numel() - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.tokens[i * self.T : i * self.T + self.T + 1]
        return buf[:-1], buf[1:]


def dataloader_variants(device: torch.device | str) -> list[dict]:
    """The DataLoader settings the chapter times, as DataLoader keyword arguments: 0 workers, then
    2 workers with ``prefetch_factor`` 2 (PyTorch's default) and 4; ``pin_memory`` on CUDA only
    (there is no device copy to speed up on a CPU), plus 0 workers unpinned on CUDA."""
    pin = torch.device(device).type == "cuda"
    variants = [dict(num_workers=0, pin_memory=pin)]
    if pin:
        variants.insert(0, dict(num_workers=0, pin_memory=False))
    variants += [dict(num_workers=2, pin_memory=pin, prefetch_factor=f) for f in (2, 4)]
    return variants


def dataloader_knobs(
    B: int, T: int, device: torch.device | str, variants: list[dict] | None = None, n: int = 20
) -> list[dict]:
    """Host time per batch of the course's :class:`helpers.core.data.BatchLoader` against a
    ``torch.utils.data.DataLoader`` over the same tokens (:class:`TokenWindows`, shuffled) for each
    of ``variants`` (default :func:`dataloader_variants`), each batch copied to ``device``
    (``non_blocking`` when pinned, through :class:`PrefetchLoader`).

    Returns rows {"loader", "num_workers", "pin_memory", "prefetch_factor" (None without
    workers), "first_ms" (the first batch: worker start-up), "median_ms" (median of ``n`` further
    batches)}, the course's loader first. Worker processes end before this returns.
    """
    device = torch.device(device)
    tokens = data.load_tokens()
    course = time_next_batch(data.BatchLoader(tokens, B, T, device), n=n)
    rows = [
        dict(
            loader="course's BatchLoader",
            num_workers=0,
            pin_memory=device.type == "cuda",
            prefetch_factor=None,
            first_ms=course["first_ms"],
            median_ms=course["median_ms"],
        )
    ]
    for v in variants if variants is not None else dataloader_variants(device):
        dl = torch.utils.data.DataLoader(
            TokenWindows(tokens, T), batch_size=B, shuffle=True, drop_last=True, **v
        )
        t = time_next_batch(PrefetchLoader(dl, device), n=n)
        rows.append(
            dict(
                loader="torch DataLoader",
                num_workers=v["num_workers"],
                pin_memory=v.get("pin_memory", False),
                prefetch_factor=v.get("prefetch_factor"),
                first_ms=t["first_ms"],
                median_ms=t["median_ms"],
            )
        )
        del dl, t  # the iterator in the PrefetchLoader goes with it, and its workers end
    return rows


def knobs_table(rows: list[dict]) -> str:
    """A Markdown table of :func:`dataloader_knobs` rows (ms per batch, host side)."""
    body = [
        [
            r["loader"],
            r["num_workers"],
            r["pin_memory"],
            r["prefetch_factor"],
            f"{r['first_ms']:.1f}",
            f"{r['median_ms']:.3f}",
        ]
        for r in rows
    ]
    header = [
        "loader",
        "num_workers",
        "pin_memory",
        "prefetch_factor",
        "first batch ms",
        "ms per batch",
    ]
    return results.markdown_table(header, body, "lrllrr")


def knobs_conclusion(rows: list[dict], step_ms: float) -> str:
    """One sentence from :func:`dataloader_knobs` rows and a training step's time (ms): the course's
    loader and the fastest DataLoader setting, each as a share of the step."""
    course = rows[0]
    best = min(rows[1:], key=lambda r: r["median_ms"])
    knobs = f"num_workers={best['num_workers']}, pin_memory={best['pin_memory']}"
    if best["prefetch_factor"] is not None:
        knobs += f", prefetch_factor={best['prefetch_factor']}"
    return (
        f"The course's loader takes {course['median_ms']:.3f} ms per batch "
        f"({100 * course['median_ms'] / step_ms:.2g}% of a {step_ms:.1f} ms step); the fastest "
        f"DataLoader setting ({knobs}) {best['median_ms']:.3f} ms "
        f"({100 * best['median_ms'] / step_ms:.2g}%)."
    )


class FixedBatch:
    """``next_batch()`` returning the same (x, y) every time: a step with no data loading at all."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y


def data_wait_report(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    loaders: dict,
    warmup: int = 1,
    iters: int = 3,
) -> list[dict]:
    """Does the training step wait for data? For each named loader (anything with ``next_batch()``):
    the host time of one ``next_batch()`` call and the full step time with that loader, in ms; a
    :class:`FixedBatch` row (no loading at all) comes first as the baseline.

    On CUDA the step is queued asynchronously, so a loader costs step time only if the host needs
    longer to prepare a batch than the GPU needs to run a step. On a CPU every millisecond of
    loading is added to the step: there is nothing to overlap with.
    Returns rows {"loader", "next_batch_ms", "first_batch_ms", "step_ms"}.
    """
    device = torch.device(device)
    trainer = train.build(run, model_config, device)
    x, y = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, device).next_batch()
    rows = []
    for name, loader in {"no loading (one fixed batch)": FixedBatch(x, y), **loaders}.items():
        host = time_next_batch(loader, n=5)
        step = timing.measure(
            lambda loader=loader: trainer.step(loader), device, warmup=warmup, iters=iters
        )
        rows.append(
            dict(
                loader=name,
                next_batch_ms=host["median_ms"],
                first_batch_ms=host["first_ms"],
                step_ms=step.median_ms,
            )
        )
    return rows


# --------------------------------------------------------------------------------------------
# The optimizer step
# --------------------------------------------------------------------------------------------


def decay_groups(model: nn.Module, run: train.RunConfig) -> list[dict]:
    """Which parameters :func:`train.make_optimizer` decays: one row per param group
    {"weight_decay", "tensors", "parameters", "examples" (up to 3 names)}."""
    names = {id(p): n for n, p in model.named_parameters()}
    rows = []
    for g in train.make_optimizer(model, run).param_groups:
        rows.append(
            dict(
                weight_decay=g["weight_decay"],
                tensors=len(g["params"]),
                parameters=sum(p.numel() for p in g["params"]),
                examples=[names[id(p)] for p in g["params"][:3]],
            )
        )
    return rows


def optimizer_sweep(
    run: train.RunConfig,
    model_config: GPTConfig,
    device: torch.device | str,
    impls: tuple[str, ...] = train.TORCH_ADAMW,
    warmup: int = 1,
    iters: int = 3,
    step_iters: int = 3,
) -> list[dict]:
    """For each AdamW implementation (default: PyTorch's three, :data:`train.TORCH_ADAMW`):
    ``optimizer.step()`` alone (median of ``iters`` after ``warmup``) and the full training step
    (median of ``step_iters``), in ms; then, with ``run.optimizer``, ``clip_grad_norm_`` alone
    and the full step without clipping.

    One model; each implementation gets its own optimizer (and state). Returns rows {"what", "ms"}.
    Raises ValueError for an implementation the device lacks (:func:`train.unsupported_reason`),
    never replaced by another one.
    """
    device = torch.device(device)
    trainer = train.build(run, model_config, device)
    loader = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, device)
    rows = []
    for impl in impls:
        reason = train.unsupported_reason(run.replace(optimizer=impl), device)
        if reason is not None:
            raise ValueError(f"AdamW '{impl}' cannot run on {device}: {reason}")
        trainer.optimizer = train.make_optimizer(trainer.model, run.replace(optimizer=impl))
        # the full step first: its warm-up step creates the optimizer's state
        step = timing.measure(lambda: trainer.step(loader), device, warmup=1, iters=step_iters)
        alone = timing.measure(trainer.optimizer.step, device, warmup=warmup, iters=iters)
        rows.append(dict(what=f"optimizer.step(), {impl}", ms=alone.median_ms))
        rows.append(dict(what=f"full step, {impl}", ms=step.median_ms))
    trainer.optimizer = train.make_optimizer(trainer.model, run)
    trainer.step(loader)
    params = list(trainer.model.parameters())
    clip = timing.measure(
        lambda: torch.nn.utils.clip_grad_norm_(params, 1.0), device, warmup=warmup, iters=iters
    )
    rows.append(dict(what=f"clip_grad_norm_ alone ({run.optimizer} run)", ms=clip.median_ms))
    rows.append(
        dict(
            what=f"full step, {run.optimizer}, clipping",
            ms=timing.measure(lambda: trainer.step(loader), device, 0, step_iters).median_ms,
        )
    )
    trainer.run = run.replace(grad_clip=None)
    rows.append(
        dict(
            what=f"full step, {run.optimizer}, no clipping",
            ms=timing.measure(lambda: trainer.step(loader), device, 0, step_iters).median_ms,
        )
    )
    return rows
