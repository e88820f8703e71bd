"""Chapter 08: the fastest correct recipe for a GPU, from what it has (T4 and Colab fallbacks).

The recipe is the ladder's answer to "the fastest configuration here": every rung switch at its
value in the ladder's last rung that can run on the target (:func:`helpers.ladder.last_runnable`),
each with the reason the switch record of :mod:`helpers.switches` gives for that value, and, where
a rung was skipped, the reason it cannot run there. So a new switch record shows up in the recipe
by itself. :func:`recommend_recipe` asks a device (this one; while emulating, the emulated GPU) or a
datasheet profile of :mod:`helpers.measure.gpus`; :func:`recipe_run_config` turns the choices into a
:class:`helpers.core.train.RunConfig`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import torch

from helpers import ladder, switches
from helpers.core.train import RunConfig
from helpers.measure import hardware
from helpers.measure.gpus import PROFILES, GPUProfile
from helpers.measure.results import markdown_table


@dataclass(frozen=True)
class RecipeChoice:
    """One switch of the recommended configuration, with the reason for it."""

    switch: str  # a RunConfig field name
    value: object
    reason: str


def attention_kernel(cap: tuple[int, int] | None) -> str:
    """Which fused kernel SDPA picks for causal training attention at compute capability ``cap``
    (None: a CPU). FlashAttention-2 and cuDNN attention need sm80; below it SDPA uses the
    memory-efficient kernel (PyTorch docs, ``torch.nn.attention.SDPBackend``)."""
    if cap is None:
        return "the fused CPU kernel"
    if cap >= (8, 0):
        return "FlashAttention-2 / cuDNN kernels"
    return "the memory-efficient kernel (no FlashAttention-2 below sm80)"


def recipe_from_ladder(
    configs: list[tuple[object, str | None]],
    registry: tuple[switches.Switch, ...] = switches.SWITCHES,
    notes: dict[str, str] | None = None,
) -> list[RecipeChoice]:
    """The recipe a ladder implies: for each rung switch of ``registry``, its value in the last
    runnable config of ``configs`` (``(run, reason)`` pairs as :func:`helpers.ladder.ladder_configs`
    returns, reason None where the rung runs) and why: the record's advice for that value (its
    general advice where it has none), then each skipped rung that would have changed the switch,
    with the reason it was skipped. ``notes`` ({field: text}) adds what the target does with a value
    (e.g. which attention kernel).

    Raises:
        ValueError: no config of ``configs`` can run.
    """
    runnable = [run for run, reason in configs if reason is None]
    if not runnable:
        raise ValueError("no rung of this ladder can run on the target: there is no recipe")
    fields = [s for s in registry if s.rungs]
    skipped: dict[str, list[str]] = {s.field: [] for s in fields}
    last_run = None
    for run, reason in configs:
        if reason is not None and last_run is not None:
            for s in fields:  # the switch(es) this rung would have changed
                if getattr(run, s.field) != getattr(last_run, s.field):
                    skipped[s.field].append(f"{run.name!r} skipped: {reason}")
        elif reason is None:
            last_run = run
    final = runnable[-1]
    choices = []
    for s in fields:
        value = getattr(final, s.field)
        if value == s.baseline and skipped[s.field]:
            why = []
        elif value == s.baseline:
            why = [f"the ladder's baseline; {s.general}" if s.general else "the ladder's baseline"]
        else:
            why = [s.advice.get(value, s.general) or f"turned on by the ladder's {s.rungs[0][0]!r}"]
        if notes and s.field in notes:
            why.append(notes[s.field])
        choices.append(RecipeChoice(s.field, value, "; ".join(why + skipped[s.field])))
    return choices


def recommend_recipe(
    target: GPUProfile | torch.device | str | None = None,
    batch_size: int | None = None,
    batch_reason: str = "",
) -> list[RecipeChoice]:
    """The fastest *correct* configuration for a profile (e.g. ``PROFILES["T4"]`` or ``"T4"``,
    ``PROFILES["CPU"]``, which means this CPU) or a device (default: this one; while emulating,
    the emulated GPU), switch by switch with the reason: :func:`recipe_from_ladder` of the
    ladder's rungs on that target, the same rules :func:`helpers.ladder.last_runnable` follows.
    A GPU profile is asked from its datasheet (:func:`helpers.measure.hardware.datasheet`), so the
    recipe of a T4 can be read on any machine.

    The batch size is never guessed: pass the one ``memory.find_max_batch_size`` measured as
    ``batch_size`` (with ``batch_reason`` saying how), else the choice says to measure it. Turn the
    choices into a RunConfig with :func:`recipe_run_config`.

    What it gives (the rules are in :func:`helpers.core.train.unsupported_reason`): bf16 autocast
    only with native bf16 (compute capability >= 8.0; never ``torch.cuda.is_bf16_supported()``,
    True on a T4), else fp16 + GradScaler, and then none of the rungs that need bf16; TF32 only
    from 8.0; the fp8 LM head and the fp8 MLP only from 8.9; on a CPU without fast bf16, fp32.
    """
    if isinstance(target, str) and target in PROFILES:  # "T4": the datasheet profile
        target = PROFILES[target]
    if isinstance(target, GPUProfile) and target.capability is not None:
        with hardware.datasheet(target) as device:
            return _recipe(device, target.name, batch_size, batch_reason)
    if isinstance(target, GPUProfile) or target is None:
        device = torch.device("cpu") if target is not None else hardware.default_device()
    else:
        try:
            device = torch.device(target)
        except RuntimeError:
            raise ValueError(
                f"{target!r} is neither a device ('cuda', 'cpu') nor a GPU profile "
                f"({', '.join(PROFILES)})"
            ) from None
    if device.type == "cuda":
        emulated = hardware.emulated_profile()
        name = emulated.name if emulated is not None else torch.cuda.get_device_name(device)
    else:
        name = "CPU"
    return _recipe(device, name, batch_size, batch_reason)


def _recipe(device, name, batch_size, batch_reason) -> list[RecipeChoice]:
    configs = ladder.ladder_configs(1, 1, device=device)
    notes = {"attention": f"here it uses {attention_kernel(hardware.capability(device))}"}
    choices = recipe_from_ladder(configs, notes=notes)
    if batch_size is None:
        reason = f"measure it on the {name}: memory.find_max_batch_size with a 10% margin"
    else:
        reason = batch_reason or f"measured on the {name} with memory.find_max_batch_size"
    return choices + [RecipeChoice("batch_size", batch_size, reason)]


def format_recipe(choices: list[RecipeChoice], width: int = 100) -> str:
    """The choices as a fixed-width table: switch, value, reason (wrapped to ``width`` columns)."""
    indent = " " * 30
    lines = [f"{'switch':<18} {'value':<10} reason"]
    for ch in choices:
        head = f"{ch.switch:<18} {ch.value!s:<10} "
        lines += textwrap.wrap(ch.reason, width, initial_indent=head, subsequent_indent=indent) or [
            head
        ]
    return "\n".join(lines)


def recipe_markdown(choices: list[RecipeChoice]) -> str:
    """The choices as a Markdown table (switch, value, the chapter that teaches it, reason), for
    ``IPython.display.Markdown``: a rendered notebook wraps its cells instead of clipping a wide
    text table."""
    chapter = {s.field: s.chapter for s in switches.SWITCHES}
    return markdown_table(
        ["switch", "value", "taught in", "reason"],
        [
            [f"`{ch.switch}`", f"`{ch.value!s}`", chapter.get(ch.switch, "03"), ch.reason]
            for ch in choices
        ],
    )


def row_text(row: dict) -> str:
    """One :func:`helpers.bench.measure` row in a few words: "42.2 ms, peak 9.07 GiB", or its
    status and reason."""
    from helpers.measure.memory import format_bytes

    if row["status"] != "measured":
        return f"{row['status']}: {row['reason']}"
    return f"{row['ms_per_step']:.1f} ms, peak {format_bytes(row['peak_mem_bytes'])}"


def compare_markdown(left: list[dict], right: list[dict], heads: tuple[str, str]) -> str:
    """Two ladders' rows side by side as a Markdown table, rung by rung: each side's rung name
    (they differ where a rung changes, e.g. the autocast rung on a T4) and :func:`row_text`.
    ``heads``: the two sides' names, e.g. ("H200", "emulated T4"). A rung only one side ran
    (the other ladder is shorter) gets "not in this run" on the other side."""
    import itertools

    def cells(row: dict | None) -> list[str]:
        return ["-", "not in this run"] if row is None else [row["name"], row_text(row)]

    return markdown_table(
        ["rung", heads[0], "rung", heads[1]],
        [cells(a) + cells(b) for a, b in itertools.zip_longest(left, right)],
    )


def recipe_run_config(choices, batch_size: int, seq_len: int, name: str = "recipe") -> RunConfig:
    """A RunConfig from :func:`recommend_recipe` choices plus a measured batch size."""
    chosen = {ch.switch: ch.value for ch in choices if ch.switch != "batch_size"}
    return RunConfig(name=name, batch_size=batch_size, seq_len=seq_len, **chosen)
