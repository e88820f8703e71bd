"""More than one GPU: data-parallel training (DDP), fully sharded training (FSDP), and scaling.

Chapter 11's runs. One script runs the course's training step on one process or on N, without a
code change, and measures the scaling:

    # one process
    python -m helpers.chapters.ch11_multi_gpu train --steps 20
    # 2 GPUs (or 2 CPU processes)
    torchrun --standalone --nproc_per_node=2 -m helpers.chapters.ch11_multi_gpu train --steps 20
    # tokens/s per world size
    python -m helpers.chapters.ch11_multi_gpu scaling --nproc 1 2 --out results/FILE.json ...
    # what FSDP sends per step (collectives vs arithmetic), ms/step, peak memory; 1 or N ranks
    torchrun --standalone --nproc_per_node=1 -m helpers.chapters.ch11_multi_gpu fsdp-traffic \\
             --json results/FILE.json ...

(``train`` is the default command: ``python -m helpers.chapters.ch11_multi_gpu --steps 20`` is the
same run.)

Several machines (nodes) take the same command on every node, plus where to meet:

    torchrun --nnodes=2 --node_rank=<0 or 1> --nproc_per_node=8 \\
             --rdzv_backend=c10d --rdzv_endpoint=<host of node 0>:29500 \\
             -m helpers.chapters.ch11_multi_gpu train ...

The mechanism (the process group from torchrun's variables, each rank's rows, DDP and FSDP, the
distributed step, checkpoints) is :mod:`helpers.core.distributed`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

import helpers
from helpers import switches
from helpers.core import collectives, data, distributed, train
from helpers.measure import results, timing
from helpers.tools import cli

REPO_ROOT = helpers.REPO_ROOT


# --------------------------------------------------------------------------------------------
# A training run on 1 or N processes
# --------------------------------------------------------------------------------------------


def run_config_from(
    args: argparse.Namespace, device: torch.device
) -> tuple[train.RunConfig, object]:
    """RunConfig and model config from the command line (B and T default to
    train.default_shapes)."""
    cfg, B, T = train.default_shapes(device)
    if args.model == "small":
        cfg = train.small_model_config()
    elif args.model == "tiny":
        # the unit tests' size (tests/conftest.py): seconds even under torchrun
        from helpers.core.model import GPTConfig

        cfg = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
    elif args.model == "gpt2":
        from helpers.core.model import GPTConfig

        cfg = GPTConfig()
    run = train.RunConfig(
        name=args.mode,
        batch_size=B if args.batch_size is None else args.batch_size,
        seq_len=T if args.seq_len is None else args.seq_len,
        grad_accum_steps=args.grad_accum,
        autocast=args.autocast,
        attention=args.attention,
        vocab_multiple=args.vocab_multiple,
        matmul_precision=args.matmul_precision,
        lr=args.lr,
    )
    return run, cfg


def train_run(args: argparse.Namespace, env: distributed.DistEnv) -> dict:
    """Train ``args.steps`` steps on this process's shard; every rank returns the same summary.

    The summary (JSON-ready): world size, mode, run, tokens per step over all ranks, median step
    time (ms, after ``args.warmup`` steps) and tokens/s, the losses averaged over the ranks,
    all-reduces in the last step (DDP, with --count-allreduces), rank 0's state bytes, and the sum
    of the parameters on each rank (DDP: equal on every rank). ``args.checkpoint``: rank 0 writes
    model + optimizer state there (:func:`helpers.core.distributed.save_checkpoint`).
    """
    run, cfg = run_config_from(args, env.device)
    trainer = train.build(run, cfg, env.device)
    counter = None
    if args.mode == "fsdp":
        distributed.wrap_fsdp(trainer, env)
    elif env.distributed:
        _, counter = distributed.wrap_ddp(
            trainer, env, args.bucket_cap_mb, count_allreduces=args.count_allreduces
        )
    loader = distributed.ShardedBatchLoader(data.load_tokens(), run.batch_size, run.seq_len, env)
    losses, calls = [], []

    def step() -> None:
        before = counter.calls if counter else 0
        losses.append(distributed.distributed_step(trainer, loader, args.sync_every_micro_step))
        calls.append((counter.calls - before) if counter else None)

    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    warm = min(args.warmup, args.steps - 1)
    t = timing.measure(step, env.device, warmup=warm, iters=args.steps - warm)
    loss_t = torch.stack(losses).float()
    if env.distributed:
        dist.all_reduce(loss_t)  # SUM (gloo has no AVG)
        loss_t /= env.world_size
    if args.checkpoint:
        distributed.save_checkpoint(args.checkpoint, trainer, env, step=args.steps)
    param_sums = None
    if args.mode != "fsdp" or not env.distributed:  # DDP: every rank must hold the same parameters
        mine = (
            torch.stack([p.detach().double().sum() for p in trainer.model.parameters()])
            .sum()
            .reshape(1)
        )
        gathered = [torch.zeros_like(mine) for _ in range(env.world_size)]
        if env.distributed:
            dist.all_gather(gathered, mine)
        else:
            gathered = [mine]
        param_sums = [float(g) for g in gathered]
    tokens_per_step = run.tokens_per_step * env.world_size
    return {
        "world_size": env.world_size,
        "mode": args.mode if env.distributed else "single",
        "backend": env.backend,
        "device": _device_name(env.device),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "run": dataclasses.asdict(run),
        "model": dataclasses.asdict(trainer.model_config),
        "tokens_per_step": tokens_per_step,
        "step_ms": t.median_ms,
        "step_ms_spread_pct": t.spread_pct,
        "tokens_per_s": timing.tokens_per_second(tokens_per_step, t.median_ms),
        "timed_steps": len(t.times_ms),
        "losses": loss_t.tolist(),
        "state_bytes_rank0": distributed.state_bytes(trainer.model, trainer.optimizer),
        "peak_bytes_rank0": torch.cuda.max_memory_allocated(env.device)
        if env.device.type == "cuda"
        else None,
        "allreduce_calls_last_step": calls[-1],
        "allreduce_bytes_total": counter.bytes if counter else None,
        "param_sum_per_rank": param_sums,
    }


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _train_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="first steps not timed (default 5)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="B per rank per micro-step (default: train.default_shapes)",
    )
    p.add_argument("--seq-len", type=int, default=None, help="T (default: train.default_shapes)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument(
        "--model",
        choices=("auto", "small", "tiny", "gpt2"),
        default="auto",
        help=(
            "auto: GPT-2 124M on CUDA, train.small_model_config on CPU; "
            "tiny: the unit tests' 2x32 model"
        ),
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default=None, help="default: cuda when available"
    )
    p.add_argument(
        "--mode", choices=("ddp", "fsdp"), default="ddp", help="how N > 1 processes share the work"
    )
    p.add_argument("--autocast", choices=("bf16", "fp16"), default=None)
    p.add_argument("--attention", choices=("manual", "sdpa"), default="manual")
    p.add_argument("--vocab-multiple", type=int, default=1)
    p.add_argument(
        "--matmul-precision", choices=switches.get("matmul_precision").values, default="fp32"
    )
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument(
        "--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size in MB (default 25)"
    )
    p.add_argument(
        "--count-allreduces", action="store_true", help="count DDP's bucket all-reduces per step"
    )
    p.add_argument(
        "--sync-every-micro-step",
        action="store_true",
        help="ablation: all-reduce on every micro-step",
    )
    p.add_argument("--checkpoint", default=None, help="rank 0 writes model + optimizer state here")
    p.add_argument("--json", default=None, help="rank 0 writes the summary here")
    cli.add_force(p, "--checkpoint/--json")


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    """The ``train`` command's options from a list of strings
    (see ``python -m helpers.chapters.ch11_multi_gpu train -h``)."""
    p = argparse.ArgumentParser(prog="python -m helpers.chapters.ch11_multi_gpu train")
    _train_parser(p)
    return p.parse_args(argv)


def run_here(argv: list[str]) -> dict:
    """The ``train`` command in THIS process as a single process (world size 1, no process group):
    what ``python -m helpers.chapters.ch11_multi_gpu train ARGV`` computes, returned instead of
    written.

    Raises:
        ValueError: when this process was started by torchrun (use :func:`launch` or the CLI).
    """
    env = distributed.env_from_environ(parse_train_args(argv).device, environ={})
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise ValueError("run_here is for one process; under torchrun use the train command")
    return train_run(parse_train_args(argv), env)


def main_train(args: argparse.Namespace, run_fn=None, group_of_one: bool = False) -> int:
    """Run ``run_fn(args, env)`` (default :func:`train_run`) on this torchrun process; rank 0
    prints a line and writes the summary to ``args.json``."""
    env = distributed.init(args.device, group_of_one=group_of_one)
    try:
        summary = (run_fn or train_run)(args, env)
        if env.is_main and run_fn is not None:
            for line in traffic_conclusions(summary):
                print(line)
        elif env.is_main:  # rank-0-only logging
            losses = summary["losses"]
            print(
                f"world_size={env.world_size} ({summary['mode']}, "
                f"{env.backend or 'no backend'}, {summary['device']}): "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, {summary['step_ms']:.1f} ms/step, "
                f"{summary['tokens_per_s']:,.0f} tokens/s"
            )
        if env.is_main and args.json:
            Path(args.json).write_text(json.dumps(summary, indent=1))
        # every rank waits here before leaving the group: a rank that tore gloo down while the other
        # was still busy aborted with "terminate called without an active exception" (seen once in
        # CI)
        distributed.barrier(env)
    finally:
        distributed.shutdown(env)
    if env.backend is not None:
        # A torchrun worker that finished cleanly leaves without Python's interpreter finalization.
        # Gloo's worker threads can still hold DDP's communication-hook futures (Python objects)
        # after the group is destroyed, and tearing those down during finalization aborted a worker
        # with "terminate called without an active exception" after its results were written (CI,
        # twice; pytorch/pytorch PR 179291 describes the mechanism). Everything is written and
        # flushed first.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


# --------------------------------------------------------------------------------------------
# What FSDP sends per step: recorded collectives against the arithmetic
# --------------------------------------------------------------------------------------------

# (name, wrapper, reshard_after_forward, param_dtype): measured in this order, in one job
TRAFFIC_VARIANTS = (
    ("no wrapper", None, None, None),
    ("DDP", "ddp", None, None),
    ("FSDP (default: root kept)", "fsdp", None, None),
    ("FSDP reshard_after_forward=True", "fsdp", True, None),
    ("FSDP reshard_after_forward=False", "fsdp", False, None),
    ("FSDP param_dtype=bf16", "fsdp", None, torch.bfloat16),
)


def _no_folders(argv: list[str]) -> list[str]:
    """``argv`` with each path argument reduced to its file name: a committed result records
    the command, not the folders of the machine that ran it."""
    return [Path(a).name if os.sep in a else a for a in argv]


def _traffic_row(variant: tuple, args: argparse.Namespace, env: distributed.DistEnv) -> dict:
    name, wrapper, reshard, param_dtype = variant
    run, cfg = run_config_from(args, env.device)
    trainer = train.build(run, cfg, env.device)
    shapes = [[list(p.shape) for p in ps] for _, ps in distributed.fsdp_units(trainer.model)]
    reduce_dtype = torch.float32 if param_dtype is not None else None  # gradients summed in fp32
    if wrapper == "ddp":
        distributed.wrap_ddp(trainer, env, args.bucket_cap_mb)
    elif wrapper == "fsdp":
        distributed.wrap_fsdp(trainer, env, reshard, param_dtype, reduce_dtype)
    loader = distributed.ShardedBatchLoader(data.load_tokens(), run.batch_size, run.seq_len, env)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    with collectives.CollectiveRecorder() as rec:  # the first step, recorded (and not timed)
        distributed.distributed_step(trainer, loader)
    t = timing.measure(
        lambda: distributed.distributed_step(trainer, loader),
        env.device,
        warmup=args.warmup,
        iters=args.steps,
    )
    expected = None
    if wrapper == "fsdp":
        expected = collectives.expected_fsdp_traffic(
            shapes,
            distributed.fsdp_reshard_choices(len(shapes), reshard),
            env.world_size,
            param_dtype or torch.float32,
            reduce_dtype,
        )
    row = {
        "variant": name,
        "wrapper": wrapper,
        "reshard_after_forward": reshard,
        "param_dtype": str(param_dtype or torch.float32),
        "reduce_dtype": str(reduce_dtype or param_dtype or torch.float32),
        "fsdp_units": len(shapes),
        "step_ms": t.median_ms,
        "step_ms_spread_pct": t.spread_pct,
        "peak_bytes_rank0": torch.cuda.max_memory_allocated(env.device)
        if env.device.type == "cuda"
        else None,
        "state_bytes_rank0": distributed.state_bytes(trainer.model, trainer.optimizer),
        "collectives": rec.summary(),
        "expected": expected,
    }
    return row


def _fresh(device: torch.device) -> None:
    gc.collect()  # the last variant's model and optimizer go before the next one is built
    if device.type == "cuda":
        torch.cuda.empty_cache()


def traffic_run(args: argparse.Namespace, env: distributed.DistEnv) -> dict:
    """What FSDP adds to a step on this process group: for each of :data:`TRAFFIC_VARIANTS` (no
    wrapper, DDP, FSDP with the reshard_after_forward choices and a bf16 param_dtype), build the
    model afresh, record the collectives of its first optimizer step
    (:class:`helpers.core.collectives.CollectiveRecorder`: count and bytes per kind), then time
    ``args.warmup`` + ``args.steps`` more steps (median ms) and read rank 0's CUDA peak memory
    (None on a CPU). FSDP rows carry ``expected``: the all-gather and reduce-scatter counts and
    bytes of :func:`helpers.core.collectives.expected_fsdp_traffic`. One micro-step per step
    (``--grad-accum`` is ignored). Every rank must call it; returns a JSON-ready dict led by
    :func:`helpers.measure.results.provenance`.
    """
    args = argparse.Namespace(**{**vars(args), "grad_accum": 1, "mode": "traffic"})
    rows = []
    for variant in TRAFFIC_VARIANTS:
        rows.append(_traffic_row(variant, args, env))
        _fresh(env.device)
    run, cfg = run_config_from(args, env.device)
    return {
        **results.provenance(env.device),
        "what": "collectives per optimizer step, step time and peak memory: DDP and FSDP variants",
        "command": "torchrun -m helpers.chapters.ch11_multi_gpu fsdp-traffic "
        + " ".join(_no_folders(getattr(args, "argv", []))),
        "world_size": env.world_size,
        "backend": env.backend,
        "run": dataclasses.asdict(run),
        "model": dataclasses.asdict(cfg),
        "timed_steps": args.steps,
        "rows": rows,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def traffic_table(summary: dict) -> str:
    """:func:`traffic_run`'s rows as a Markdown table: per variant the all-gathers and
    reduce-scatters measured (count / bytes) next to the arithmetic, the all-reduces, step time
    (ms) and rank 0's peak memory (GiB, CUDA only)."""

    def cell(got: dict | None, missing: str | None) -> str | None:
        return missing if got is None else f"{got['count']} / {_mib(got['bytes'])}"

    rows = []
    for r in summary["rows"]:
        done, want, peak = r["collectives"], r["expected"] or {}, r["peak_bytes_rank0"]
        rows.append([r["variant"]] + [
            cell(done.get("all_gather"), "0"), cell(want.get("all_gather"), None),
            cell(done.get("reduce_scatter"), "0"), cell(want.get("reduce_scatter"), None),
            cell(done.get("all_reduce"), "0"), f"{r['step_ms']:.1f}",
            None if peak is None else f"{peak / 2**30:.2f}",
        ])  # fmt: skip
    header = (
        "variant|all-gather|(arithmetic)|reduce-scatter|(arithmetic)|all-reduce|ms/step|peak GiB"
    )
    return results.markdown_table(header.split("|"), rows, "lrrrrrrr")


def traffic_conclusions(summary: dict) -> list[str]:
    """Sentences computed from :func:`traffic_run`'s numbers: whether the recorded collectives
    match the arithmetic, what reshard_after_forward and a bf16 param_dtype change, and FSDP's
    step time and peak memory against the unwrapped step on the same device."""
    rows = {r["variant"]: r for r in summary["rows"]}
    base, fsdp = rows["no wrapper"], rows["FSDP (default: root kept)"]
    fsdp_rows = [r for r in summary["rows"] if r["wrapper"] == "fsdp"]
    w = summary["world_size"]
    out = []
    if all(not r["collectives"].get("all_gather") for r in fsdp_rows):
        out.append(f"world size {w}: FSDP issued no all-gather or reduce-scatter.")
        out.append("A rank that holds every row copies instead of communicating.")
    else:
        ok = [
            r["variant"] for r in fsdp_rows if collectives.matches(r["collectives"], r["expected"])
        ]
        out.append(
            f"world size {w}: recorded all-gathers and reduce-scatters equal the arithmetic "
            f"in {len(ok)} of {len(fsdp_rows)} FSDP variants"
        )
        t, f = rows["FSDP reshard_after_forward=True"], rows["FSDP reshard_after_forward=False"]
        ag_t, ag_f = t["collectives"]["all_gather"], f["collectives"]["all_gather"]
        out.append(
            f"reshard_after_forward=True gathers {ag_t['bytes'] / ag_f['bytes']:.2f}x the bytes "
            f"of False ({ag_t['count']} vs {ag_f['count']} all-gathers)"
        )
        bf = rows["FSDP param_dtype=bf16"]["collectives"]["all_gather"]["bytes"]
        fp = fsdp["collectives"]["all_gather"]["bytes"]
        out.append(f"param_dtype=bf16 gathers {bf / fp:.2f}x the bytes of fp32")
    line = (
        f"FSDP (default) step: {fsdp['step_ms']:.1f} ms vs {base['step_ms']:.1f} ms "
        f"without a wrapper ({fsdp['step_ms'] / base['step_ms']:.2f}x)"
    )
    if fsdp["peak_bytes_rank0"] and base["peak_bytes_rank0"]:
        line += (
            f"; peak memory {fsdp['peak_bytes_rank0'] / 2**30:.2f} vs "
            f"{base['peak_bytes_rank0'] / 2**30:.2f} GiB"
        )
    out.append(line)
    return out


# --------------------------------------------------------------------------------------------
# Launching torchrun from Python, and the scaling measurement
# --------------------------------------------------------------------------------------------


def launch(nproc: int, args: list[str], timeout_s: float = 600, command: str = "train") -> dict:
    """Run ``torchrun --standalone --nproc_per_node=nproc -m helpers.chapters.ch11_multi_gpu
    COMMAND ARGS --json TMP`` (or plain ``python -m`` for nproc=0) from the repository root, and
    return the summary rank 0 wrote. ``--standalone`` picks a free port, so runs never clash.
    ``command``: "train" or "fsdp-traffic".

    Raises:
        RuntimeError: the job failed; the message holds the tail of its output.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "summary.json"
        if nproc == 0:
            cmd = [
                sys.executable,
                "-m",
                "helpers.chapters.ch11_multi_gpu",
                command,
                *args,
                "--json",
                str(out),
            ]
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                "-m",
                "helpers.chapters.ch11_multi_gpu",
                command,
                *args,
                "--json",
                str(out),
            ]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here so it does not warn
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"{' '.join(cmd[1:])} failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def scaling(nprocs: list[int], modes: list[str], train_args: list[str], command: str = "") -> dict:
    """Tokens/s of the same per-GPU work on 1..N processes (weak scaling: B per rank fixed, so the
    global batch grows with N). Efficiency = tokens/s(N) / (N x tokens/s(1 process)); 1.0 would be
    perfect. Runs one job per (mode, N); N=1 is a plain single process (no DDP)."""
    rows = []
    for mode in modes:
        for n in nprocs:
            if n == 1 and mode != modes[0]:
                continue
            summary = launch(0 if n == 1 else n, [*train_args, "--mode", mode])
            rows.append(summary)
            print(
                f"{summary['mode']:>6} N={n}: {summary['tokens_per_s']:,.0f} tokens/s, "
                f"{summary['step_ms']:.1f} ms/step"
            )
    single = next((r for r in rows if r["world_size"] == 1), None)
    for r in rows:
        r["efficiency"] = (
            r["tokens_per_s"] / (r["world_size"] * single["tokens_per_s"]) if single else None
        )
    return {
        "what": "tokens/s per world size, same per-rank batch (weak scaling)",
        "command": command,
        "gpus_visible": torch.cuda.device_count(),
        "rows": rows,
    }


@cli.guarded
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.chapters.ch11_multi_gpu",
        description=__doc__.splitlines()[0],
        allow_abbrev=False,
    )
    sub = p.add_subparsers(dest="command", required=True)
    _train_parser(
        sub.add_parser("train", help="train on this process (or on each torchrun process)")
    )
    f = sub.add_parser(
        "fsdp-traffic", help="collectives, ms/step, peak memory of DDP and FSDP variants"
    )
    _train_parser(f)
    s = sub.add_parser("scaling", help="tokens/s on 1..N GPUs, one torchrun job each; writes JSON")
    s.add_argument(
        "--out", required=True, help="JSON file to write (e.g. results/h200x2-ddp-scaling.json)"
    )
    s.add_argument(
        "--nproc", type=int, nargs="+", default=None, help="world sizes (default 1 .. visible GPUs)"
    )
    s.add_argument("--modes", nargs="+", choices=("ddp", "fsdp"), default=["ddp"])
    cli.add_force(s)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] not in ("train", "fsdp-traffic", "scaling", "-h", "--help"):
        # `python -m helpers.chapters.ch11_multi_gpu --steps 20` means the train command
        argv = ["train", *argv]
    args, rest = p.parse_known_args(argv)
    if args.command in ("train", "fsdp-traffic"):
        if rest:
            p.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.steps < 1 or not 0 <= args.warmup:
            p.error(f"need --steps >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
        cli.at_least("batch_size", args.batch_size)
        cli.at_least("seq_len", args.seq_len)
        if args.device is not None:
            cli.device(args.device)
        # checked before training, not after it, and by rank 0 only: it alone writes them, and
        # two ranks probing one path at once would see each other's probe file
        if os.environ.get("RANK", "0") == "0":
            ckpt = {"force": args.force, "same_kind": distributed.is_checkpoint}
            cli.out_path(args.checkpoint, "--checkpoint", **ckpt)
            summary = ("world_size", "run", "model")  # a run's summary
            cli.result_out(args.json, summary, "--json", force=args.force)
        if args.command == "fsdp-traffic":
            args.argv = argv[1:]  # written into the result
            return main_train(args, traffic_run, group_of_one=True)
        return main_train(args)
    for n in args.nproc or []:
        cli.at_least("nproc", n)
    scaling_keys = ("what", "rows", "gpus_visible")  # scaling's result has no provenance keys
    cli.result_out(args.out, scaling_keys, force=args.force, provenance=False)
    nprocs = args.nproc or list(range(1, max(1, torch.cuda.device_count()) + 1))
    command = "python -m helpers.chapters.ch11_multi_gpu " + " ".join(argv)
    result = scaling(nprocs, args.modes, rest, command=command)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
