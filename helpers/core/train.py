"""One training step whose speed is set by switches, and a short real training run.

:class:`RunConfig` holds every switch of the course; :func:`build` turns one into a
:class:`Trainer` (model + AdamW + step). The step is always the same work:
zero_grad -> forward + loss (under autocast if asked) -> backward (GradScaler for fp16) ->
gradient clipping (clip_grad_norm_, or folded into fused AdamW with ``fused_clip``) -> AdamW step.
Nothing in the step reads a value back to the host, so timing it measures the GPU, not a host
sync.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from helpers import switches
from helpers.core.model import GPT, GPTConfig
from helpers.measure import hardware

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# The RunConfig fields that are not speed switches: (name, default, meaning). The switches come
# from the registry (helpers.switches.SWITCHES), each with its baseline as default.
SETTINGS: tuple[tuple[str, object, str], ...] = (
    ("batch_size", 16, "B: sequences per micro-step"),
    ("seq_len", 1024, "T: tokens per sequence"),
    ("grad_clip", 1.0, "max global gradient norm (None = no clipping)"),
    ("lr", 6e-4, "AdamW learning rate"),
    ("weight_decay", 0.1, "AdamW weight decay, on 2-D weights only"),
    ("betas", (0.9, 0.95), "AdamW betas"),
    ("seed", 1337, "seed of the model's initial weights"),
)


class _RunConfigMethods:
    """What every RunConfig does besides holding its fields (see :func:`run_config_class`)."""

    _switches: tuple[switches.Switch, ...] = ()

    def __post_init__(self) -> None:
        for s in self._switches:
            problem = s.problem(getattr(self, s.field))
            if problem is not None:
                raise ValueError(problem)
        for name in ("batch_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"RunConfig.{name} must be >= 1, got {getattr(self, name)}")

    def replace(self, **changes) -> "RunConfig":
        """A copy with some fields changed
        (``cfg.replace(name="tf32", matmul_precision="tf32")``)."""
        return dataclasses.replace(self, **changes)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: B * T * grad_accum_steps."""
        return self.batch_size * self.seq_len * self.grad_accum_steps


def run_config_class(registry: tuple[switches.Switch, ...] = switches.SWITCHES) -> type:
    """The RunConfig dataclass of ``registry``: a ``name``, one field per switch (its default the
    switch's baseline, its values checked by :meth:`helpers.switches.Switch.problem`), then
    :data:`SETTINGS` (batch shape, clipping, AdamW). :data:`RunConfig` is the course's registry's;
    a test passes a registry with one record more and finds its field.

    Raises:
        ValueError: a switch whose field repeats another field's name.
    """
    names = ["name", *(s.field for s in registry), *(n for n, _, _ in SETTINGS)]
    if len(set(names)) != len(names):
        raise ValueError(f"a RunConfig field is declared twice: {sorted(names)}")
    fields = [("name", str, dataclasses.field(default="fp32"))]
    fields += [(s.field, object, dataclasses.field(default=s.baseline)) for s in registry]
    fields += [(n, object, dataclasses.field(default=d)) for n, d, _ in SETTINGS]
    lines = [f"    {s.field} = {s.baseline!r}: {s.doc}" for s in registry]
    lines += [f"    {n} = {d!r}: {doc}" for n, d, doc in SETTINGS]
    doc = (
        "Every speed switch of the course (from helpers.switches), then the batch shape and\n"
        "AdamW's hyper-parameters. Fields and defaults:\n\n" + "\n".join(lines)
    )
    cls = dataclasses.make_dataclass(
        "RunConfig",
        fields,
        bases=(_RunConfigMethods,),
        namespace={"_switches": tuple(registry), "__doc__": doc},
    )
    cls.__module__ = __name__
    return cls


RunConfig = run_config_class()


def small_model_config() -> GPTConfig:
    """The CPU configuration, chosen in this one place: the GPT-2 architecture and real vocabulary,
    2 layers of width 128 and a 128-token context, so each notebook runs in seconds on 2 cores."""
    return GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=128)


GPU_BATCH_SIZES = (
    16,
    8,
    4,
    2,
    1,
)  # default B on a GPU: the first whose fp32 step fits (default_shapes)
# What default_shapes adds to the estimated peak for what the estimate leaves out: the caching
# allocator's free cached blocks and rounding, library workspaces (chapter 14 measures them).
PEAK_MARGIN = 0.10


def batch_for_memory(usable_bytes: int, config: GPTConfig | None = None, T: int = 1024) -> int:
    """The largest B of :data:`GPU_BATCH_SIZES` whose estimated peak of the fp32 step with manual
    attention (chapter 14's ``memory.peak_estimate``) plus :data:`PEAK_MARGIN` fits
    ``usable_bytes``; 1 when none does. ``config`` defaults to GPT-2 124M."""
    from helpers.measure import memory

    cfg = config or GPTConfig()

    def fits(b: int) -> bool:
        peak = memory.peak_estimate(cfg, b, T, autocast=False, attention="manual")
        return peak["total"] * (1 + PEAK_MARGIN) <= usable_bytes

    return next((b for b in GPU_BATCH_SIZES if fits(b)), 1)


def default_shapes(device: torch.device | str) -> tuple[GPTConfig, int, int]:
    """(model config, batch size B, sequence length T) for ``device``.

    CUDA: GPT-2 124M, T=1024 and B = :func:`batch_for_memory` of the GPU's usable memory
    (``hardware.usable_memory_bytes``; the cap while emulating): the largest of 16, 8, 4, 2, 1
    whose estimated peak of the fp32 step with manual attention (the course's most memory-hungry
    step, chapter 01), plus :data:`PEAK_MARGIN`, fits. The estimate is chapter 14's
    ``memory.peak_estimate``, within 0.5% of the measured peak at B=16 on the H200 (34.10 GB
    estimated, 34.20 GB measured); chapter 03's ``training_step_estimate`` (44.2 GB) would give an
    A100 40GB B=8. So: B=16 on 40 GB and larger GPUs, 8 on an L4 (24 GB), 4 on a T4 (15 GB:
    9.65 GB estimated, 9.75 GB measured at B=4). CPU: :func:`small_model_config`, B=4, T=128.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return GPTConfig(), batch_for_memory(hardware.usable_memory_bytes(device)), 1024
    return small_model_config(), 4, 128


def recipe_autocast(device: torch.device | str) -> str | None:
    """The autocast dtype name the course uses for mixed precision on ``device``: ``"bf16"`` where
    bf16 is native (CUDA compute capability >= 8.0; a CPU with AVX-512 BF16 or AMX), ``"fp16"`` on
    older GPUs (a T4, a V100, an emulated T4), where ``RunConfig(autocast="fp16")`` adds the
    GradScaler, and None (fp32) on a CPU without fast bf16, where bf16 would run ~30x slower than
    fp32 (:func:`helpers.measure.hardware.cpu_bf16`). Every chapter's "bf16" configuration takes its
    dtype from here, so it runs on a Colab T4 and on any CPU too (chapter 04 explains why)."""
    device = torch.device(device)
    if hardware.native_bf16(device):
        return "bf16"
    return None if device.type == "cpu" else "fp16"


def autocast_label(autocast: str | None) -> str:
    """How tables and titles name an autocast setting: ``"bf16"``, ``"fp16"``, or ``"fp32"`` for
    None."""
    return autocast or "fp32"


def slow_reason(run: RunConfig, device: torch.device | str) -> str | None:
    """Why ``run`` can run on ``device`` but the course does not time it by default (None if it
    does): bf16 autocast on a CPU without fast bf16
    (:func:`helpers.measure.hardware.no_native_bf16_reason`). Callers that are asked for such a run
    explicitly still run it."""
    device = torch.device(device)
    if run.autocast == "bf16" and device.type == "cpu":
        return hardware.no_native_bf16_reason(device)
    return None


def unsupported_reason(run: RunConfig, device: torch.device | str) -> str | None:
    """Why ``run`` cannot run as asked on ``device`` (None if it can). Never silently
    substituted."""
    device = torch.device(device)
    if device.type == "cuda":
        try:  # a CPU-only torch asserts, a CUDA torch without a GPU or driver raises
            hardware.capability(device)
        except (AssertionError, RuntimeError, ValueError) as e:
            if torch.cuda.is_available():  # a GPU exists: the index is what is wrong
                return (
                    f"{device} is not a CUDA device here ({torch.cuda.device_count()} visible: "
                    f"cuda:0 to cuda:{torch.cuda.device_count() - 1})"
                )
            return (
                f"no CUDA GPU is usable here ({str(e).splitlines()[0][:120]}): run it on a GPU, "
                "or on device='cpu'"
            )
    if run.matmul_precision == "tf32" and not hardware.tf32_supported(device):
        cap = hardware.capability(device)
        where = "a CPU" if device.type == "cpu" else f"compute capability {cap[0]}.{cap[1]}"
        return f"TF32 needs an NVIDIA GPU of compute capability >= 8.0; this device is {where}"
    if run.autocast == "bf16" and device.type == "cuda" and not hardware.native_bf16(device):
        return (
            "bf16 is not native below compute capability 8.0 (emulated, slow): "
            "use autocast='fp16' + GradScaler"
        )
    if run.compile is not None:
        ok, reason = hardware.compile_support(device)
        if not ok:
            return f"torch.compile unavailable: {reason}"
        if run.compile in ("reduce-overhead",) and device.type != "cuda":
            return "mode 'reduce-overhead' uses CUDA graphs: CUDA only"
    if run.residual_dtype == "bf16" and run.autocast != "bf16":
        return (
            "a bf16 residual stream needs bf16 autocast (the blocks' matmuls take bf16 inputs); "
            f"this run's autocast is {run.autocast!r}: keep residual_dtype='fp32' with it"
        )
    if run.fused_clip and (
        run.optimizer not in ("fused", "triton") or run.autocast == "fp16" or run.grad_clip is None
    ):
        return (
            "fused_clip hands the clip factor to fused AdamW: it needs optimizer='fused' "
            "(or 'triton'), "
            "a grad_clip, and no fp16 GradScaler "
            f"(this run: optimizer={run.optimizer!r}, grad_clip={run.grad_clip}, "
            f"autocast={run.autocast!r})"
        )
    if run.loss_kernel in ("triton", "fused"):
        what = "fused LM-head" if run.loss_kernel == "fused" else "Triton"
        if (why := _triton_problem(f"the {what} cross-entropy", device, run.compile)) is not None:
            return why
        if run.loss_kernel == "fused" and run.autocast == "fp16":
            return (
                "the fused LM-head cross-entropy computes the logits' gradient before the fp16 "
                "GradScaler's scale reaches it (small values would round to 0): "
                "keep loss_kernel='triton' with fp16"
            )
    # each needs fp8 tensor cores (or the interpreter)
    if run.lm_head_fp8 or run.mlp_fp8 or run.fp8_fast_accum:
        from helpers.core import kernels

        ok, why = kernels.fp8_available(device)
        if not ok:
            what = (
                "the fp8 LM head"
                if run.lm_head_fp8
                else "the fp8 MLP"
                if run.mlp_fp8
                else "fp8 fast accumulation"
            )
            return f"{what} cannot run: {why}"
    values = {s.field: getattr(run, s.field) for s in switches.SWITCHES}
    if (why := switches.requirement_problem(values)) is not None:
        return why  # one switch needs another's value (their records' ``requires``)
    if run.lm_head_fp8:
        if run.vocab_multiple % 16:
            return (
                "fp8 matmuls need a vocabulary padded to a multiple of 16; "
                f"this run pads to {run.vocab_multiple}: use vocab_multiple=64"
            )
    if run.mlp_fp8 and (why := _compiled_off_cuda("the fp8 MLP", device, run.compile)):
        return why  # (fp8_available above checked that its kernels run here)
    if run.mlp_fp8 and run.autocast != "bf16":
        return (
            "the fp8 MLP returns bf16 into a bf16-autocast step: it needs autocast='bf16', "
            f"not {run.autocast!r}"
        )
    if run.qkv_grad:
        why = _triton_problem("the one-pass QKV gradient kernel", device, run.compile)
        if why is not None:
            return why
        if run.autocast != "bf16":
            return (
                "the one-pass QKV gradient computes c_attn in bf16, as bf16 autocast does: it "
                f"needs autocast='bf16', not {run.autocast!r}"
            )
    if run.optimizer == "fused" and device.type not in ("cuda", "cpu"):
        return f"fused AdamW is not implemented for device type {device.type}"
    if run.optimizer == "triton":  # it runs eagerly, outside the compiled step
        return _triton_problem("the Triton AdamW kernel", device, compile_mode=None)
    return None


def _triton_problem(what: str, device: torch.device, compile_mode: str | None) -> str | None:
    """Why ``what`` (a rung's hand-written Triton kernels) cannot run on ``device`` in a step
    compiled with mode ``compile_mode`` (None: eager): Triton unavailable here, or a compiled
    step off CUDA (Triton's CPU interpreter runs the kernels eagerly only); None if it can."""
    from helpers.core import kernels

    ok, why = kernels.available(device)
    if not ok:
        return f"{what} cannot run: {why}"
    return _compiled_off_cuda(what, device, compile_mode)


def _compiled_off_cuda(what: str, device: torch.device, compile_mode: str | None) -> str | None:
    """Why ``what``'s Triton kernels cannot run in a step compiled with ``compile_mode`` on
    ``device``: off CUDA, Triton's CPU interpreter runs them only eagerly; None if they can."""
    if compile_mode is not None and device.type != "cuda":
        return (
            f"{what} runs compiled only on a CUDA GPU (Triton's CPU interpreter runs it "
            "eagerly): use compile=None here"
        )
    return None


def param_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict]:
    """AdamW's two parameter groups: ``weight_decay`` on the 2-D tensors (matmul weights,
    embeddings), none on the 1-D ones (biases, LayerNorm gains)."""
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


# PyTorch's own AdamW implementations among the optimizer switch's values (chapter 9 times them)
TORCH_ADAMW = ("for-loop", "foreach", "fused")


def make_optimizer(model: torch.nn.Module, run: RunConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights only (matmul weights, embeddings), none on biases and
    LayerNorm gains; implementation chosen by ``run.optimizer`` (for-loop / foreach / fused /
    triton: :class:`helpers.core.kernels.adamw.TritonAdamW`)."""
    groups = param_groups([p for p in model.parameters() if p.requires_grad], run.weight_decay)
    if run.optimizer == "triton":
        from helpers.core.kernels.adamw import TritonAdamW

        return TritonAdamW(groups, lr=run.lr, betas=run.betas, eps=1e-8)
    impl = {
        "for-loop": dict(foreach=False),
        "foreach": dict(foreach=True),
        "fused": dict(fused=True),
    }[run.optimizer]
    return torch.optim.AdamW(groups, lr=run.lr, betas=run.betas, eps=1e-8, **impl)


@dataclass
class Trainer:
    """Model, optimizer and the step of one RunConfig on one device (made by :func:`build`)."""

    run: RunConfig
    model_config: GPTConfig
    device: torch.device
    model: GPT  # the eager module (parameters live here)
    forward: torch.nn.Module  # what the step calls: the model, or its compiled wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    compile_fallback: bool = False
    notes: list[str] = field(default_factory=list)  # fallbacks taken, printed by callers

    def autocast(self):
        """The autocast context of this run (a no-op context for fp32/tf32)."""
        if self.run.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=_DTYPES[self.run.autocast])

    def _apply_precision(self) -> None:
        # Global switch: set before every step so that two Trainers in one process cannot leak it.
        torch.set_float32_matmul_precision(
            "highest" if self.run.matmul_precision == "fp32" else "high"
        )

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            _, loss = self.forward(x, y)
        loss = loss / self.run.grad_accum_steps  # mean over micro-steps, not a sum
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        return loss.detach()

    def step(self, batches) -> torch.Tensor:
        """One optimizer step over ``grad_accum_steps`` micro-batches.

        ``batches``: a :class:`helpers.core.data.BatchLoader` (or anything with ``next_batch()``)
        yielding (x, y) of shape (B, T) int64 on this device. Returns the mean loss as a detached
        0-d fp32 tensor on the device (reading it with ``.item()`` is the caller's choice: a sync).
        """
        self._apply_precision()
        self.optimizer.zero_grad(set_to_none=True)
        total = None
        for _ in range(self.run.grad_accum_steps):
            x, y = batches.next_batch()
            try:
                loss = self._micro_step(x, y)
            except Exception as e:  # only compile failures are turned into a fallback
                if not (
                    self.compile_fallback
                    and self.forward is not self.model
                    and _is_compile_error(e)
                ):
                    raise
                self.notes.append(f"torch.compile failed ({type(e).__name__}); fell back to eager")
                self.forward = self.model
                self.optimizer.zero_grad(set_to_none=True)
                loss = self._micro_step(x, y)
            total = loss if total is None else total + loss
        self.clip()
        self.optimizer_step()
        return total

    def clip(self) -> None:
        """Gradient clipping of the step: unscale (fp16 GradScaler), then clip to
        ``run.grad_clip``."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.run.grad_clip is not None and self.run.fused_clip:
            # fused AdamW divides every gradient by optimizer.grad_scale as it reads it (the hook
            # GradScaler uses): the same clipped update without a separate pass that rescales 124M
            # gradients in memory.
            self.optimizer.grad_scale = clip_divisor(self.model.parameters(), self.run.grad_clip)
        elif self.run.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.run.grad_clip)

    def optimizer_step(self) -> None:
        """The AdamW step (through the GradScaler for fp16, which skips it if a gradient is
        inf/nan)."""
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        # a fused clip's divisor is for this step only
        self.optimizer.__dict__.pop("grad_scale", None)


def clip_divisor(parameters, max_norm: float) -> torch.Tensor:
    """What ``clip_grad_norm_(parameters, max_norm)`` multiplies every gradient by, as a divisor.

    Returns a 0-d fp32 tensor on the gradients' device: ``max(1, (total_norm + 1e-6) / max_norm)``,
    the reciprocal of clip_grad_norm_'s clamped clip coefficient
    ``min(1, max_norm / (total_norm + 1e-6))`` (total_norm = L2 norm of all gradients together,
    computed on the device: no host sync). Dividing the gradients by it is the clipping; fused
    AdamW does that while it reads them when it is given as ``optimizer.grad_scale``
    (torch.amp.GradScaler hands over its loss scale the same way).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    else:
        total = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0
        )
    return torch.clamp((total.float() + 1e-6) / max_norm, min=1.0)


def _is_compile_error(e: Exception) -> bool:
    mod = type(e).__module__
    return (
        mod.startswith("torch._dynamo")
        or mod.startswith("torch._inductor")
        or "BackendCompilerFailed" in type(e).__name__
    )


def model_switches(run: RunConfig) -> dict:
    """The run's switches whose mechanism is in the model (registry ``where="model"``), as
    :class:`helpers.core.model.GPT`'s keyword arguments."""
    return {s.field: getattr(run, s.field) for s in run._switches if s.where == "model"}


def shape_switches(run: RunConfig) -> dict:
    """The run's switches that change the model's shape (registry ``where="shape"``: the padded
    vocabulary), as :class:`helpers.core.model.GPTConfig` fields."""
    return {s.field: getattr(run, s.field) for s in run._switches if s.where == "shape"}


def build(
    run: RunConfig,
    model_config: GPTConfig | None = None,
    device: torch.device | str | None = None,
    compile_fallback: bool = False,
) -> Trainer:
    """Build model, AdamW and step for ``run`` on ``device``.

    The model is initialised on the CPU from ``run.seed`` (so every switch and every device starts
    from the same weights), then moved to ``device``. The run's model switches
    (:func:`model_switches`) are the model's keyword arguments; its shape switch
    (``vocab_multiple``, :func:`shape_switches`) sets the padded vocabulary of ``model_config``.
    Compiled runs call ``torch._dynamo.reset()`` first, so a graph compiled for an earlier model is
    never reused.

    Raises:
        ValueError: if the hardware cannot run ``run`` as asked (see :func:`unsupported_reason`),
            or ``run.seq_len`` > block_size.
    """
    device = torch.device(device) if device is not None else hardware.default_device()
    reason = unsupported_reason(run, device)
    if reason is not None:
        raise ValueError(f"RunConfig '{run.name}' cannot run on {device}: {reason}")
    base = model_config if model_config is not None else default_shapes(device)[0]
    cfg = dataclasses.replace(base, **shape_switches(run))
    if run.seq_len > cfg.block_size:
        raise ValueError(f"seq_len={run.seq_len} > block_size={cfg.block_size}: lower seq_len.")
    torch.manual_seed(run.seed)
    model = GPT(cfg, **model_switches(run)).to(device)
    model.train()
    forward: torch.nn.Module = model
    if run.compile is not None:
        torch._dynamo.reset()  # a fresh graph for every compiled build
        forward = torch.compile(model, mode=None if run.compile == "default" else run.compile)
    scaler = torch.amp.GradScaler(device.type) if run.autocast == "fp16" else None
    return Trainer(
        run, cfg, device, model, forward, make_optimizer(model, run), scaler, compile_fallback
    )


@dataclass
class TrainResult:
    losses: list[float]  # loss of every step, nats
    trainer: Trainer


def train(
    run: RunConfig,
    steps: int,
    model_config: GPTConfig | None = None,
    device: torch.device | str | None = None,
    loader=None,
    progress: bool = True,
    compile_fallback: bool = True,
    leave: bool = True,
) -> TrainResult:
    """A short real training run on Tiny Shakespeare; returns the loss of every step.

    ``loader`` defaults to a :class:`helpers.core.data.BatchLoader` over the whole text with the
    run's B and T. A tqdm.auto progress bar shows the loss (disable with ``progress=False``;
    ``leave=False`` closes and hides it when the run ends, for a cell that prints the result). A
    failing torch.compile falls back to eager, and says so in ``trainer.notes`` and on the bar.
    """
    from tqdm.auto import tqdm

    from helpers.core import data

    trainer = build(run, model_config, device, compile_fallback=compile_fallback)
    if loader is None:
        loader = data.BatchLoader(data.load_tokens(), run.batch_size, run.seq_len, trainer.device)
    losses = []
    # At most 2 redraws a second (refresh=False: set_postfix would redraw every step, thousands of
    # widget messages in a minutes-long run). A redraw per step makes nbval time out waiting for
    # the end of chapter 12's 100 s training cell on the H200.
    bar = tqdm(range(steps), desc=run.name, disable=not progress, mininterval=0.5, leave=leave)
    for _ in bar:
        losses.append(trainer.step(loader).item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    for note in trainer.notes:
        print(f"[{run.name}] {note}")
    return TrainResult(losses, trainer)
