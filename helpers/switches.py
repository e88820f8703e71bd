"""The switch registry: every speed switch of the course, declared once.

Each :class:`Switch` names a :class:`helpers.core.train.RunConfig` field, its baseline value, the
ladder rung(s) that turn it on, the chapter that teaches it and the capstone's one-line advice. The
ladder's rungs (:func:`ladder_rungs`), the capstone's advice (:func:`advice_table`) and the
profiler's one-line description of a configuration (:func:`rung_fields`) are all read from
:data:`SWITCHES`. What a model switch needs from another switch is its record's ``requires``,
enforced by the model and the step alike (:func:`requirement_problem`); what it needs from the
hardware is checked by :func:`helpers.core.train.unsupported_reason`; what it does lives in its
mechanism (the model, the step or a kernel module).

``RunConfig``'s switch fields are made from these records
(:func:`helpers.core.train.run_config_class`). Adding a rung: one record here, its place in
:data:`RUNG_ORDER`, and its mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Switch:
    """One speed switch: a ``RunConfig`` field and what the course says about it."""

    field: str  # the RunConfig field
    baseline: object  # its value in the ladder's first rung ("fp32")
    # (rung name, value it sets), in ladder order; () = no rung
    rungs: tuple[tuple[str, object], ...]
    chapter: str  # the chapter that teaches it, e.g. "04"
    advice: dict = field(default_factory=dict)  # value -> when to use it (the capstone's checklist)
    general: str = ""  # advice for the switch whatever its value
    values: tuple | None = None  # the values RunConfig accepts (None: an int >= minimum)
    minimum: int | None = None  # for an int switch: its smallest value
    doc: str = ""  # what the field means, one line (RunConfig's docstring lists them)
    where: str = "step"  # its mechanism: "model" (a GPT keyword), "shape" (GPTConfig) or "step"
    # other switches' values it needs when it is not at its baseline, and why (one clause)
    requires: tuple[tuple[str, object], ...] = ()
    requires_why: str = ""

    def __post_init__(self) -> None:
        if (self.values is None) == (self.minimum is None):
            raise ValueError(f"switch {self.field!r}: give its values or, for an int, its minimum")

    def problem(self, value: object, owner: str = "RunConfig") -> str | None:
        """Why ``value`` is not a valid value of this switch (None if it is), as one sentence
        naming ``owner.field``."""
        if self.values is not None:
            if value in self.values and type(value) in {type(v) for v in self.values}:
                return None
            return f"{owner}.{self.field} must be one of {self.values}, got {value!r}"
        if isinstance(value, int) and not isinstance(value, bool) and value >= self.minimum:
            return None
        return f"{owner}.{self.field} must be >= {self.minimum} (an int), got {value!r}"


SWITCHES: tuple[Switch, ...] = (
    Switch(
        "matmul_precision",
        "fp32",
        (("+ tf32", "tf32"),),
        "04",
        {
            "tf32": (
                "fp32 matmuls on an NVIDIA GPU of compute capability >= 8.0 (A100, H100/H200, RTX "
                "30xx+): one line, torch.set_float32_matmul_precision('high'); nothing to gain on "
                "a T4/V100 or a CPU"
            ),
        },
        "choose TF32 ('high') on compute capability >= 8.0; keep 'highest' only to check numerics",
        values=("fp32", "tf32"),
        doc="\"fp32\": TF32 off ('highest'); \"tf32\": TF32 matmuls ('high')",
    ),
    Switch(
        "autocast",
        None,
        (("+ bf16 autocast", "bf16"),),
        "04",
        {
            "bf16": (
                "training on compute capability >= 8.0 (or a CPU with bf16 kernels): "
                "same exponent range as fp32, no loss scaling; "
                "keep the weights and AdamW state in fp32"
            ),
            "fp16": (
                "GPUs without native bf16 (T4, V100): fp16 autocast plus GradScaler, so small "
                "gradients do not underflow to zero"
            ),
        },
        "mixed precision: bf16 where native (compute capability >= 8.0), else fp16 + GradScaler",
        values=(None, "bf16", "fp16"),
        doc='None, "bf16", or "fp16" (fp16 adds a GradScaler)',
    ),
    Switch(
        "compile",
        None,
        (("+ torch.compile", "default"), ("+ CUDA graphs", "reduce-overhead")),
        "05",
        {
            "reduce-overhead": (
                "once the step is compiled and the GPU waits on the host between kernels "
                "(small batches, many short kernels): CUDA graphs replay the compiled forward "
                "and backward, each as one launch; CUDA only, shapes must stay the same, a "
                "compiled output is overwritten by the next step (clone what you keep), and the "
                "graphs hold their own memory pool"
            ),
        },
        (
            "runs long enough to repay the first-step compile time (compare first_step_ms with "
            "the ms saved per step); needs Triton (GPU, compute capability >= 7.0) or a C++ "
            "compiler (CPU); leave it off while the code changes every run"
        ),
        values=(None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        doc="None = eager, else a torch.compile mode",
    ),
    Switch(
        "attention",
        "manual",
        (("+ sdpa attention", "sdpa"),),
        "06",
        {
            "sdpa": (
                "always for causal attention: F.scaled_dot_product_attention picks a fused kernel "
                "(Flash, memory-efficient or cuDNN) and never stores the (T, T) scores, so memory "
                "drops and the gain grows with T"
            ),
        },
        "prefer F.scaled_dot_product_attention over hand-written attention",
        values=("manual", "sdpa"),
        doc='"manual" (the (T, T) scores in memory) or "sdpa"',
        where="model",
    ),
    Switch(
        "vocab_multiple",
        1,
        (("+ vocab 50304", 64),),
        "07",
        {},
        (
            "when a matmul dimension is odd (GPT-2's 50257 tokens): pad it to a multiple of 64 "
            "and mask the padded ids when sampling"
        ),
        minimum=1,
        doc="pad the LM head's rows to a multiple of this: 1 = 50257, 64 -> 50304",
        where="shape",
    ),
    Switch(
        "optimizer",
        "foreach",
        (("+ fused AdamW", "fused"), ("+ Triton AdamW", "triton")),
        "12",
        {
            "fused": (
                "on CUDA (and CPU) with many parameter tensors: one fused AdamW kernel instead of "
                "several per step; small once the step is compiled and the batch is large"
            ),
            "triton": (
                "on a CUDA GPU with Triton: one launch per parameter group that streams each "
                "tensor at a copy's speed, and no clipped gradients written back; the update "
                "is PyTorch's AdamW, element for element"
            ),
        },
        "AdamW: fused where available, else foreach; the for-loop version only for debugging",
        values=("for-loop", "foreach", "fused", "triton"),
        doc="AdamW implementation (triton: one Triton launch per parameter group)",
    ),
    Switch(
        "residual_dtype",
        "fp32",
        (("+ bf16 residual", "bf16"),),
        "12",
        {
            "bf16": (
                "with bf16 autocast: cast the embeddings' sum to bf16 once, so every residual "
                "add, LayerNorm read and residual gradient moves half the bytes; LayerNorm still "
                "computes in fp32 and the weights and AdamW state stay fp32; compare the loss "
                "curve with the fp32 stream's (bf16 keeps 8 bits of precision)"
            ),
        },
        values=("fp32", "bf16"),
        doc='"bf16": the residual stream in bf16 (needs autocast="bf16")',
        where="model",
    ),
    Switch(
        "detach_logits",
        False,
        (("+ detached logits", True),),
        "12",
        {
            True: (
                "whenever a compiled training step returns logits it never backpropagates "
                "through: an output that requires grad gets a (B, T, V) zero gradient that the "
                "compiled backward reads and adds, every step"
            ),
        },
        values=(False, True),
        doc="return detached logits when the model computes the loss",
        where="model",
    ),
    Switch(
        "loss_kernel",
        "pytorch",
        (("+ Triton CE", "triton"), ("+ fused LM-head CE", "fused")),
        "12",
        {
            "triton": (
                "when the profile shows cross-entropy over a large vocabulary: a hand-written "
                "kernel reads the logits once forward and once backward; on the course's H200 "
                "its gain was inside the steps' spread at B=16 and B=64 (chapter 12)"
            ),
            "fused": (
                "when the logits are the largest tensor in memory (large vocabulary, large B): "
                "the LM head and the loss run in chunks of rows with the logits' gradient made in "
                "the forward, so no logits-sized tensor waits for backward; mostly a memory "
                "saving (peak -6.5 GiB at B=64 on the H200, results/perf-log.md, 2026-11-30); "
                "not under fp16"
            ),
        },
        values=("pytorch", "triton", "fused"),
        doc='"pytorch" (F.cross_entropy), "triton" (hand-written CE) or "fused" (LM head + CE)',
        where="model",
    ),
    Switch(
        "fused_clip",
        False,
        (("+ clip in AdamW", True),),
        "12",
        {
            True: (
                "with fused AdamW and gradient clipping: AdamW divides by the clip factor while "
                "it reads the gradients, instead of a separate pass that rescales all of them; "
                "a fixed saving of one pass over the gradients, too small to show on the course's "
                "H200 at B=16 or B=64 (inside the steps' spread, chapter 12)"
            ),
        },
        values=(False, True),
        doc="clip by handing fused AdamW the clip factor instead of rescaling every gradient",
    ),
    Switch(
        "lm_head_fp8",
        False,
        (("+ fp8 LM head", True),),
        "12",
        {
            True: (
                "on a GPU with fp8 tensor cores (compute capability >= 8.9: L4, RTX 40xx, "
                "H100/H200) when the LM head is a large share of the matmul time (GPT-2 124M: "
                "about 30% of the weight matmuls' FLOPs): its three matmuls ran 1.5-1.9x faster "
                "than bf16 on the H200 (results/h200-fp8-matmul-2026-11-30.json); a numerics "
                "change (e4m3 inputs, e5m2 gradient), so compare the loss curve with bf16's "
                "before keeping it"
            ),
        },
        values=(False, True),
        doc='the fused LM-head CE\'s matmuls on fp8 tensor cores (needs loss_kernel="fused")',
        where="model",
        requires=(("loss_kernel", "fused"),),
        requires_why="its matmuls run inside the fused LM-head cross-entropy",
    ),
    Switch(
        "mlp_fp8",
        False,
        (("+ fp8 MLP", True),),
        "12",
        {
            True: (
                "on a GPU with fp8 tensor cores (compute capability >= 8.9) at large batches: the "
                "MLP's forward and input-gradient matmuls in fp8 with rowwise scales, the GELU and "
                "its casts in two one-pass Triton kernels; on the H200 it saved 4.4-5.0 ms per "
                "B=64 step and changed the B=16 step by -0.7 to +1.3 ms, inside the steps' spread "
                "(chapter 12); a numerics change (e4m3 activations and gradients), so compare the "
                "loss curve with bf16's first"
            ),
        },
        values=(False, True),
        doc="the MLP's forward and input-gradient matmuls on fp8 tensor cores (bf16 autocast)",
        where="model",
    ),
    Switch(
        "qkv_grad",
        False,
        (("+ one-pass QKV grad", True),),
        "12",
        {
            True: (
                "when the profile shows the concatenation of the attention's dq, dk, dv and the "
                "QKV bias gradient's sum as separate kernels: one kernel copies the three into "
                "c_attn's (B*T, 3C) gradient and sums the bias gradient in the same read "
                "(helpers.core.kernels.qkv_grad); bf16 autocast, n_embd a multiple of 256"
            ),
        },
        values=(False, True),
        doc=(
            "c_attn's backward: dq, dk, dv concatenated and the bias gradient summed in one "
            "kernel (bf16 autocast)"
        ),
        where="model",
    ),
    Switch(
        "fp8_fast_accum",
        False,
        (("+ fp8 fast accum", True),),
        "12",
        {
            True: (
                "with the fp8 MLP: its two input-gradient matmuls keep partial sums in the tensor "
                "cores' reduced-precision accumulator, as its forward's fp8 matmuls already do, "
                "instead of promoting them to fp32 every few steps of K; on an H100 those "
                "matmuls ran 1.13-1.16x as fast and the B=64 step 1.1 ms faster (inside its "
                "spread), and three 200-step loss checks stayed within 1% of plain bf16 "
                "(-0.78 / +0.59 / -0.68%); the LM head's gradient matmuls stay exact: there fast "
                "accumulation was slower (0.95-0.96x), and with it in both the loss was 2.2% "
                "above bf16's"
            ),
        },
        values=(False, True),
        doc=("the fp8 MLP's input-gradient matmuls with fast fp8 accumulation (needs mlp_fp8)"),
        where="model",
        requires=(("mlp_fp8", True),),
        requires_why="it changes the fp8 MLP's input-gradient matmuls",
    ),
    Switch(
        "grad_accum_steps",
        1,
        (),
        "09",
        {},
        (
            "when the batch you want does not fit in memory: the same gradient in several "
            "micro-steps; it saves memory, not time"
        ),
        minimum=1,
        doc="micro-steps per optimizer step",
    ),
    Switch(
        "checkpoint_every",
        0,
        (),
        "09",
        {},
        (
            "activation checkpointing: when activations do not fit; recomputes blocks in backward "
            "(about a third more compute for those blocks) to fit a larger B"
        ),
        minimum=0,
        doc="activation checkpointing: 0 = off, k = recompute every k-th block",
        where="model",
    ),
    Switch(
        "checkpoint_policy",
        "block",
        (),
        "09",
        {
            "selective": (
                "with checkpoint_every: keep the matmul and attention outputs and recompute only "
                "the elementwise operations (LayerNorm, GELU, adds): less memory saved than "
                "recomputing whole blocks, and no matmul run twice"
            ),
        },
        values=("block", "selective"),
        doc=(
            'what a checkpointed block keeps: "block" = only its input, "selective" = also its '
            "matmul and attention outputs (helpers.core.recompute)"
        ),
        where="model",
    ),
)

# The order the ladder turns the switches on (a rung's position, not a switch's).
RUNG_ORDER = (
    "+ tf32",
    "+ bf16 autocast",
    "+ torch.compile",
    "+ sdpa attention",
    "+ vocab 50304",
    "+ fused AdamW",
    "+ bf16 residual",
    "+ detached logits",
    "+ Triton CE",
    "+ clip in AdamW",
    "+ fused LM-head CE",
    "+ fp8 LM head",
    "+ fp8 MLP",
    "+ CUDA graphs",
    "+ one-pass QKV grad",
    "+ Triton AdamW",
    "+ fp8 fast accum",
)


def ladder_rungs(
    switches: tuple[Switch, ...] = SWITCHES, order: tuple[str, ...] = RUNG_ORDER
) -> list[tuple[str, dict]]:
    """The ladder as (rung name, switches it sets): first "fp32" with every rung switch at its
    baseline, then each rung of ``order`` with the one value it sets.

    Raises:
        ValueError: a rung in ``order`` that no switch declares, or a declared rung missing from it.
    """
    declared = {name: (s.field, value) for s in switches for name, value in s.rungs}
    if set(declared) != set(order):
        raise ValueError(
            f"rungs declared but not ordered {sorted(set(declared) - set(order))}, "
            f"ordered but not declared {sorted(set(order) - set(declared))}"
        )
    first = {s.field: s.baseline for s in switches if s.rungs}
    return [("fp32", first)] + [(name, {declared[name][0]: declared[name][1]}) for name in order]


def get(field_name: str, switches: tuple[Switch, ...] = SWITCHES) -> Switch:
    """The record of the switch on RunConfig field ``field_name`` (``get("optimizer").values``).

    Raises:
        KeyError: no switch has that field; the message lists the ones that exist.
    """
    for s in switches:
        if s.field == field_name:
            return s
    raise KeyError(f"no switch {field_name!r}; switches are {[s.field for s in switches]}")


def requirement_problem(
    values: dict, owner: str = "RunConfig", switches: tuple[Switch, ...] = SWITCHES
) -> str | None:
    """Why ``values`` (switch field -> value, e.g. a GPT's keywords or a RunConfig's fields) break
    a switch's ``requires``, as one sentence naming ``owner``; None if none does. A switch at its
    baseline, or one whose field is not in ``values``, requires nothing; a required field missing
    from ``values`` counts as its baseline."""
    for s in switches:
        value = values.get(s.field, s.baseline)
        if value == s.baseline:
            continue
        for field_name, needed in s.requires:
            got = values.get(field_name, get(field_name, switches).baseline)
            if got != needed:
                return (
                    f"{owner}({s.field}={value!r}) needs {field_name}={needed!r}: "
                    f"{s.requires_why}; got {field_name}={got!r}"
                )
    return None


def taught_after(
    run: object, chapter: str, switches: tuple[Switch, ...] = SWITCHES
) -> list[Switch]:
    """The switches that ``run`` (a RunConfig, or any object with the switch fields as attributes)
    sets away from their baseline and that a chapter after ``chapter`` teaches (``chapter``: two
    digits, "09"), in declaration order; [] when every switch it turns is taught by then.

    Raises:
        ValueError: if ``chapter`` is not a chapter number such as "09".
    """
    if not (isinstance(chapter, str) and chapter.isdigit()):
        raise ValueError(f"chapter must be a chapter number such as '09', got {chapter!r}")
    return [
        s
        for s in switches
        if int(s.chapter) > int(chapter) and getattr(run, s.field, s.baseline) != s.baseline
    ]


def rung_fields(switches: tuple[Switch, ...] = SWITCHES) -> tuple[str, ...]:
    """The RunConfig fields the ladder's rungs turn, in declaration order."""
    return tuple(s.field for s in switches if s.rungs)


def advice_table(switches: tuple[Switch, ...] = SWITCHES) -> dict:
    """{(field, value): advice} for every value with advice, and {field: advice} for the general
    one."""
    table: dict = {}
    for s in switches:
        table.update({(s.field, value): text for value, text in s.advice.items()})
        if s.general:
            table[s.field] = s.general
    return table
