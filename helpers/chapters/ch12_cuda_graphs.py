"""Chapter 12's "+ CUDA graphs" rung: what it changes, measured.

- :func:`launch_counts`: the CUDA launch calls the CPU makes in one training step of the last
  rung without and with CUDA graphs (on a GPU), counted by :func:`count_launches`.
- :func:`variant_changes`: the committed ``benchmarks/perf.py`` runs of the last rung with and
  without them.
"""

from __future__ import annotations

import re

import torch

from helpers.chapters import ch12_rungs
from helpers.core import train
from helpers.core.model import GPTConfig
from helpers.measure import results as results_io

# The committed benchmarks/perf.py runs that timed the last rung with and without CUDA graphs.
CUDA_GRAPHS_PERF_FILES = (
    "h200-perf-reduce-overhead-b16-2026-12-04.json",
    "h200-perf-ce-tgrad-mix-order-2026-12-05.json",
)


def variant_changes(
    names: tuple[str, ...] = CUDA_GRAPHS_PERF_FILES,
    variant: str = "reduce-overhead",
    base: str = "final",
) -> list[dict]:
    """The step time of ``variant`` against ``base`` in committed ``benchmarks/perf.py`` results
    (both measured in the same process, 3 warm-up steps, median of 10): one dict per file and
    batch size where both ran, with ``device``, ``date``, ``B``, ``ms_base``, ``ms`` (ms/step),
    ``delta_ms``, ``delta_pct`` (% of ``ms_base``) and ``spread_pct`` (the larger of the two rows'
    (max - min) / median, %).

    Raises:
        FileNotFoundError: a result is not in results/.
    """
    out = []
    for name in names:
        res = results_io.load(name)
        if res is None:
            raise FileNotFoundError(results_io.missing(name))
        by_key = {(r["variant"], r["batch_size"]): r for r in res["rows"]}
        for (v, b), row in by_key.items():
            ref = by_key.get((base, b))
            if v != variant or ref is None:
                continue
            delta = row["ms_per_step"] - ref["ms_per_step"]
            out.append(
                dict(
                    device=res["device"],
                    date=res["date"],
                    B=b,
                    ms_base=ref["ms_per_step"],
                    ms=row["ms_per_step"],
                    delta_ms=delta,
                    delta_pct=100 * delta / ref["ms_per_step"],
                    spread_pct=max(row["spread_pct"], ref["spread_pct"]),
                )
            )
    return out


# The host calls that start work on the GPU, as the CUDA profiler (CUPTI) names them: a kernel
# launch through the runtime or the driver API (Triton's kernels use the driver's), or the replay
# of a whole recorded CUDA graph.
_KERNEL_LAUNCH = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel)")
_GRAPH_LAUNCH = re.compile(r"^(cudaGraphLaunch|cuGraphLaunch)")


def count_launches(events) -> dict:
    """Count, in ``torch.profiler`` events (``prof.events()`` of a run with the CPU and CUDA
    activities), the host's kernel launches, its graph launches and the kernels the GPU ran.

    Returns ``{"kernel_launches": int, "graph_launches": int, "gpu_kernels": int}``: the first two
    are CPU-side CUDA API calls (``cudaLaunchKernel``/``cuLaunchKernel*``, and
    ``cudaGraphLaunch``), the last the GPU's kernel records (memcpy and memset left out).
    """
    from torch.autograd import DeviceType

    counts = dict(kernel_launches=0, graph_launches=0, gpu_kernels=0)
    for e in events:
        if e.device_type == DeviceType.CUDA:
            if not e.name.lower().startswith(("memcpy", "memset")):
                counts["gpu_kernels"] += 1
        elif _KERNEL_LAUNCH.match(e.name):
            counts["kernel_launches"] += 1
        elif _GRAPH_LAUNCH.match(e.name):
            counts["graph_launches"] += 1
    return counts


def launch_counts(
    device: torch.device | str,
    model_config: GPTConfig | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    warmup: int = 3,
) -> dict:
    """The last rung's training step without and with CUDA graphs: after ``warmup`` untimed steps
    (the compile and the graphs' recording), one step under ``torch.profiler``, counted by
    :func:`count_launches`. The model and shapes default to
    :func:`helpers.chapters.ch12_rungs.demo_shape`'s (GPT-2 124M at the course's B and T=1024 on a
    GPU).

    Returns ``{"without CUDA graphs": counts, "with CUDA graphs": counts}``, each with the run's
    ``compile`` mode added; or ``{"skipped": reason}`` where the ladder has no CUDA graphs rung
    (a CPU, or a compile mode that already uses them).
    """
    from torch.profiler import ProfilerActivity, profile

    from helpers import ladder
    from helpers.core import data

    device = torch.device(device)
    cfg, B, T = ch12_rungs.demo_shape(device)
    cfg = model_config or cfg
    B, T = batch_size or B, seq_len or T
    if device.type != "cuda":
        return {"skipped": "CUDA graphs record CUDA kernels: this needs a CUDA GPU"}
    graphs = ladder.last_runnable(B, T, device)
    if graphs.compile not in ladder.WITH_CUDA_GRAPHS.values():
        return {"skipped": f"the last rung here ({graphs.name}) does not use CUDA graphs"}
    runs = {
        "without CUDA graphs": graphs.replace(name="without CUDA graphs", compile="default"),
        "with CUDA graphs": graphs,
    }
    tokens = data.load_tokens()
    out = {}
    for label, run in runs.items():
        trainer = train.build(run, cfg, device)
        loader = data.BatchLoader(tokens, run.batch_size, run.seq_len, device)
        for _ in range(warmup):
            trainer.step(loader)
        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            trainer.step(loader)
            torch.cuda.synchronize(device)
        out[label] = dict(count_launches(prof.events()), compile=run.compile)
        del trainer, loader
        torch.cuda.empty_cache()
    return out
