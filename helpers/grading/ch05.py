"""Chapter 05 (torch.compile): graded checks, listed in :mod:`helpers.grading`.

Each check runs the learner's function on small CPU inputs, prints one ``PASS <grade_id>: ...``
line, or raises ``AssertionError`` whose one-line message says what is wrong and which section to
reread. ``WRONG_ANSWERS`` holds plausible mistakes each check must reject (tests/test_grading.py).
This module never imports :mod:`helpers.grading` at import time (grading imports it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from helpers.grading.common import as_number, passed, reread, run_learner

SECTIONS = {
    "ch05_fused_chain": "chapter 05, section 2 (Exercise: fuse bias + GELU + residual)",
    "ch05_compile_pays_off": "chapter 05, section 4 (Exercise: when does compiling pay off?)",
}


def _reread(grade_id: str) -> str:
    return reread(SECTIONS[grade_id])


# ----------------------------------------------------------------------------------------------
# ch05_fused_chain
# ----------------------------------------------------------------------------------------------


def _reference_chain(
    x: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    half: float = 0.5,
    exact: bool = False,
    with_residual: bool = True,
) -> torch.Tensor:
    """residual + GELU(x + bias) in float64, computed here independently of
    helpers.chapters.ch05_compile."""
    u = (x + bias).double()
    if exact:  # the erf GELU, not GPT-2's
        g = u * 0.5 * (1.0 + torch.erf(u / math.sqrt(2.0)))
    else:
        g = half * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))
    return (residual.double() + g) if with_residual else g


def _harness_fused_chain(
    make_fused_chain: Callable[[], Callable],
    x: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    device: str,
) -> dict:
    """Where the learner's function lives: reset Dynamo, call ``make_fused_chain()``, and run the
    function it returns on ``x``, ``bias``, ``residual`` moved to ``device`` ("cpu" or "cuda"):
    once through :func:`helpers.chapters.ch05_compile.count_kernels` (which compiles it, then
    profiles a second call), counting the Dynamo graphs compiled meanwhile
    (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``), then once more under
    ``torch.no_grad()`` for the output.

    Returns:
        ``{"made": str, the type name of what make_fused_chain() returned, "callable": bool}``,
        and when it is callable also ``"graphs"``, the int number of graphs compiled;
        ``"kernels"``, the int number of kernels the profiler saw; ``"names"``, the first 8 of
        their names (str); ``"out"``, the output as a CPU tensor (the shape and dtype the function
        gave it), or None when it is not a tensor; ``"out_type"``, the output's type name.
    """
    from torch._dynamo.utils import counters

    from helpers.chapters import ch05_compile as compilation

    torch._dynamo.reset()
    fused = make_fused_chain()
    report: dict[str, Any] = {"made": type(fused).__name__, "callable": callable(fused)}
    if fused is None or not callable(fused):
        return report
    args = tuple(t.to(device) for t in (x, bias, residual))
    g0 = int(counters["stats"]["unique_graphs"])
    counted = compilation.count_kernels(fused, args, device)
    report["graphs"] = int(counters["stats"]["unique_graphs"]) - g0
    report["kernels"], report["names"] = int(counted["kernels"]), list(counted["names"][:8])
    with torch.no_grad():
        out = fused(*args)
    report["out_type"] = type(out).__name__
    report["out"] = out.detach().cpu() if isinstance(out, torch.Tensor) else None
    return report


def check_fused_chain(make_fused_chain: Callable[[], Callable]) -> None:
    """Check ``make_fused_chain() -> f`` where
    ``f(x, bias, residual) = residual + GELU_tanh(x + bias)`` is compiled with ``torch.compile``.

    On fp32 CPU tensors (CUDA where the CPU has no C++ compiler) x, residual (64, 96) and bias
    (96,): the output must match a float64 reference (relative error < 1e-5), Dynamo must have
    compiled exactly one graph for the call
    (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``), and the profiler must see at most
    one kernel (:func:`helpers.chapters.ch05_compile.count_kernels`; where this torch version
    records inductor's C++ kernels).

    The function is made, compiled and run where the learner's function lives
    (:func:`_harness_fused_chain`) on inputs drawn here; the output is checked here against the
    reference computed here. The graph and kernel counts cannot be verified here: when grading,
    they are the submission's own report.

    Raises:
        AssertionError: with a hint, when the output, the graph count or the kernel count is wrong.
    """
    from helpers.measure import hardware

    gid = "ch05_fused_chain"
    device, why = torch.device("cpu"), hardware.compile_support(torch.device("cpu"))[1]
    if not hardware.compile_support(device)[
        0
    ]:  # no C++ compiler: use the GPU's Triton if there is one
        if not (torch.cuda.is_available() and hardware.compile_support(torch.device("cuda"))[0]):
            raise AssertionError(
                f"torch.compile cannot run on this machine ({why}); "
                f"run this check where it can. {_reread(gid)}"
            )
        device = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 96, generator=gen) * 2.0
    bias = torch.randn(96, generator=gen)
    residual = torch.randn(64, 96, generator=gen)
    report = run_learner(make_fused_chain, _harness_fused_chain, x, bias, residual, device.type)
    if not isinstance(report, dict) or report.get("callable") is not True:
        made = report.get("made") if isinstance(report, dict) else None
        raise AssertionError(
            f"make_fused_chain() returned {made}, expected the compiled function: "
            f"return torch.compile(...). {_reread(gid)}"
        )
    out = report.get("out")
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        raise AssertionError(
            f"f(x, bias, residual) returned {report.get('out_type')} "
            f"{getattr(out, 'shape', '')}, expected a tensor of shape {tuple(x.shape)}. "
            f"{_reread(gid)}"
        )
    graphs, kernels, names = report.get("graphs"), report.get("kernels"), report.get("names")
    if not (isinstance(graphs, int) and isinstance(kernels, int) and isinstance(names, list)):
        raise AssertionError(
            f"the learner's side sent no well-formed graph and kernel counts (the course's "
            f"harness was changed?). {_reread(gid)}"
        )

    def rel(ref: torch.Tensor) -> float:
        return float((out.detach().double() - ref).norm() / ref.norm())

    err = rel(_reference_chain(x, bias, residual))
    if not err <= 1e-5:  # a NaN output fails too
        if rel(_reference_chain(x, bias, residual, exact=True)) < 1e-5:
            why = (
                "your GELU is the exact (erf) one; GPT-2 uses the tanh approximation "
                "0.5*u*(1 + tanh(sqrt(2/pi)*(u + 0.044715*u**3)))"
            )
        elif rel(_reference_chain(x, bias, residual, half=1.0)) < 1e-5:
            why = "the factor 0.5 of the GELU is missing"
        elif rel(_reference_chain(x, bias, residual, with_residual=False)) < 1e-5:
            why = "the residual is not added: f must return residual + GELU(x + bias)"
        elif rel(_reference_chain(x, torch.zeros_like(bias), residual)) < 1e-5:
            why = "the bias is not added before the GELU"
        else:
            why = (
                f"the output differs from residual + GELU_tanh(x + bias) (relative error {err:.1e})"
            )
        raise AssertionError(f"{why}. {_reread(gid)}")
    if graphs == 0:
        raise AssertionError(
            "the result is right but nothing was compiled (0 Dynamo graphs): "
            f"wrap the chain in torch.compile and return the compiled function. {_reread(gid)}"
        )
    if graphs > 1:
        raise AssertionError(
            f"the chain was split into {graphs} graphs (a graph break: print, .item(), "
            f"torch._dynamo.graph_break ...), so it cannot fuse into one kernel. {_reread(gid)}"
        )
    if kernels > 1:
        raise AssertionError(
            f"one graph, but {kernels} kernels ran ({', '.join(map(str, names[:4]))}): "
            f"keep only tensor ops in the chain. {_reread(gid)}"
        )
    passed(
        gid,
        "one compiled graph, at most one kernel, output equals "
        "residual + GELU_tanh(x + bias) (rel. error < 1e-5)",
    )


def _fused_nan() -> Callable:
    return torch.compile(lambda x, bias, residual: x * float("nan"))


def _fused_returns_eager() -> Callable:
    def chain(x, bias, residual):
        u = x + bias
        return residual + 0.5 * u * (
            1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3))
        )

    return chain


def _fused_erf_gelu() -> Callable:
    return torch.compile(lambda x, bias, residual: residual + torch.nn.functional.gelu(x + bias))


def _fused_missing_half() -> Callable:
    def chain(x, bias, residual):
        u = x + bias
        return residual + u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))

    return torch.compile(chain)


def _fused_graph_break() -> Callable:
    def chain(x, bias, residual):
        u = x + bias
        g = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))
        torch._dynamo.graph_break()
        return residual + g

    return torch.compile(chain)


def _fused_no_residual() -> Callable:
    return torch.compile(
        lambda x, bias, residual: torch.nn.functional.gelu(x + bias, approximate="tanh")
    )


# ----------------------------------------------------------------------------------------------
# ch05_compile_pays_off
# ----------------------------------------------------------------------------------------------

# (compile_s, eager_ms, compiled_ms): none divides evenly, so ceil, int() and round() all differ
PAYS_OFF_CASES = [
    (33.4, 144.1, 49.7),  # H200-like: 353.8 -> 354
    (10.0, 80.0, 50.0),  # 333.3 -> 334
    (0.01, 100.0, 20.0),  # 0.125 -> 1: even a tiny compile needs one step
    (7.3, 12.0, 10.7),  # 5615.4 -> 5616
    (30.0, 2400.0, 2600.0),  # compiled is slower: never
    (0.0, 40.0, 30.0),  # nothing to pay back: 0
    (5.0, 40.0, 40.0),  # equally fast: never
]


def _break_even(compile_s: float, eager_ms: float, compiled_ms: float) -> float:
    saved_s = (eager_ms - compiled_ms) / 1e3
    return math.inf if saved_s <= 0 else float(math.ceil(compile_s / saved_s))


def check_compile_pays_off(steps_to_break_even: Callable[[float, float, float], Any]) -> None:
    """Check ``steps_to_break_even(compile_s, eager_ms, compiled_ms)``: the smallest whole number of
    steps N with ``compile_s + N*compiled_ms/1e3 <= N*eager_ms/1e3``, i.e.
    ``ceil(compile_s / ((eager_ms - compiled_ms) / 1e3))``; ``math.inf`` when the compiled step is
    not faster; 0 when ``compile_s`` is 0 and compiled is faster.

    Raises:
        AssertionError: with a hint naming the likely mistake (ms vs s, rounding, never-pays case).
    """

    gid = "ch05_compile_pays_off"
    for compile_s, eager_ms, compiled_ms in PAYS_OFF_CASES:
        call = f"steps_to_break_even({compile_s}, {eager_ms}, {compiled_ms})"
        want = _break_even(compile_s, eager_ms, compiled_ms)
        try:
            returned = steps_to_break_even(compile_s, eager_ms, compiled_ms)
        except ZeroDivisionError:
            raise AssertionError(
                f"{call} divided by zero: when the compiled step saves nothing it never pays off, "
                f"return math.inf. {_reread(gid)}"
            ) from None
        if returned is None and math.isinf(want):
            raise AssertionError(
                f"{call} returned None: when compiling never pays off, return math.inf "
                f"(as the exercise asks). {_reread(gid)}"
            )
        got = as_number(returned, call, _reread(gid))
        if got == want or (not math.isinf(want) and abs(got - want) < 1e-9):
            continue
        per_ms = compile_s / (eager_ms - compiled_ms) if eager_ms != compiled_ms else math.inf
        if math.isinf(want):
            why = (
                f"{call} returned {got:g}, but the compiled step ({compiled_ms} ms) is not faster "
                f"than eager ({eager_ms} ms): it never pays off, return math.inf"
            )
        elif math.isclose(got, per_ms, rel_tol=1e-6) or got == math.ceil(per_ms):
            why = (
                f"{call} returned {got:g}: compile_s is in seconds and the step times in ms; "
                "convert before dividing"
            )
        elif got == want - 1:
            why = (
                f"{call} returned {got:g}, expected {want:g}: "
                "a fraction of a step still has to be run, round up with math.ceil"
            )
        elif not float(got).is_integer():
            why = (
                f"{call} returned {got:g}: a number of steps is a whole number; "
                "round up with math.ceil"
            )
        else:
            why = f"{call} returned {got:g}, expected {want:g} steps"
        raise AssertionError(f"{why}. {_reread(gid)}")
    passed(
        gid,
        f"break-even steps right for {len(PAYS_OFF_CASES)} cases, "
        "including compiled slower (inf) and no compile cost (0)",
    )


def _pays_forgot_ms_to_s(compile_s, eager_ms, compiled_ms):
    saved = eager_ms - compiled_ms
    return math.inf if saved <= 0 else math.ceil(compile_s / saved)


def _pays_ignores_slower(compile_s, eager_ms, compiled_ms):
    return math.ceil(compile_s / ((eager_ms - compiled_ms) / 1e3))


def _pays_truncates(compile_s, eager_ms, compiled_ms):
    saved = (eager_ms - compiled_ms) / 1e3
    return math.inf if saved <= 0 else int(compile_s / saved)


def _pays_rounds(compile_s, eager_ms, compiled_ms):
    saved = (eager_ms - compiled_ms) / 1e3
    return math.inf if saved <= 0 else round(compile_s / saved)


def _pays_none_when_never(compile_s, eager_ms, compiled_ms):
    saved = (eager_ms - compiled_ms) / 1e3
    return None if saved <= 0 else math.ceil(compile_s / saved)


CHECKS = {
    "ch05_fused_chain": check_fused_chain,
    "ch05_compile_pays_off": check_compile_pays_off,
}

WRONG_ANSWERS = {
    "ch05_fused_chain": [
        _fused_returns_eager,
        _fused_erf_gelu,
        _fused_missing_half,
        _fused_graph_break,
        _fused_no_residual,
        _fused_nan,
    ],
    "ch05_compile_pays_off": [
        _pays_forgot_ms_to_s,
        _pays_ignores_slower,
        _pays_truncates,
        _pays_rounds,
        _pays_none_when_never,
    ],
}
