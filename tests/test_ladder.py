import json

import pytest
import torch

from helpers import bench, ladder, switches
from helpers.core.train import RunConfig
from helpers.measure import gpus, hardware, results


def test_rungs_are_cumulative_and_skip_what_the_cpu_cannot_run(monkeypatch):
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")  # a CPU with AVX-512 BF16 or AMX
    configs = ladder.ladder_configs(4, 64, device="cpu")
    names = [c.name for c, _ in configs]
    assert names == [
        "fp32",
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
    ]
    reasons = dict((c.name, r) for c, r in configs)
    assert "TF32" in reasons["+ tf32"]
    assert "Triton" in reasons["+ Triton CE"]  # the kernel runs on a CUDA GPU
    assert "Triton" in reasons["+ fused LM-head CE"]
    assert (
        "fp8 LM head cannot run" in reasons["+ fp8 LM head"]
        and "CUDA GPU" in reasons["+ fp8 LM head"]
    )
    assert "fp8 MLP cannot run" in reasons["+ fp8 MLP"] and "CUDA GPU" in reasons["+ fp8 MLP"]
    assert "CUDA graphs: CUDA only" in reasons["+ CUDA graphs"]
    skipped = ("+ tf32", "+ Triton CE", "+ fused LM-head CE", "+ fp8 LM head", "+ fp8 MLP")
    assert "QKV gradient kernel cannot run" in reasons["+ one-pass QKV grad"]
    assert "Triton AdamW kernel cannot run" in reasons["+ Triton AdamW"]
    fast = reasons["+ fp8 fast accum"]
    assert "fp8 fast accumulation cannot run" in fast and "CUDA GPU" in fast
    skipped += ("+ CUDA graphs", "+ one-pass QKV grad", "+ Triton AdamW", "+ fp8 fast accum")
    assert all(r is None for n, r in reasons.items() if n not in skipped)
    last = [c for c, r in configs if r is None][-1]
    # TF32 and the Triton kernels were skipped, so they are not carried into later rungs;
    # everything else is.
    assert (
        last.matmul_precision,
        last.autocast,
        last.compile,
        last.attention,
        last.vocab_multiple,
        last.optimizer,
    ) == ("fp32", "bf16", "default", "sdpa", 64, "fused")
    assert (last.residual_dtype, last.detach_logits, last.loss_kernel, last.fused_clip) == (
        "bf16",
        True,
        "pytorch",
        True,
    )


def test_gpu_ladder_carries_every_switch():
    configs = ladder.ladder_configs(16, 1024)
    assert configs[-1][0] == RunConfig(
        name="+ fp8 fast accum",
        matmul_precision="tf32",
        autocast="bf16",
        compile="reduce-overhead",
        attention="sdpa",
        vocab_multiple=64,
        optimizer="triton",
        batch_size=16,
        seq_len=1024,
        residual_dtype="bf16",
        detach_logits=True,
        loss_kernel="fused",
        fused_clip=True,
        lm_head_fp8=True,
        mlp_fp8=True,
        qkv_grad=True,
        fp8_fast_accum=True,
    )


def test_fp8_rung_is_skipped_below_compute_capability_8_9(monkeypatch):
    """An A100 (8.0) runs every rung but the fp8 ones (fast accumulation is the fp8 MLP's),
    and its last is the bf16 fused LM head with CUDA graphs, the one-pass QKV gradient and the
    Triton AdamW."""
    _fake_cuda(monkeypatch, (8, 0))
    configs = ladder.ladder_configs(16, 1024, device="cuda")
    reasons = dict((c.name, r) for c, r in configs)
    fp8_rungs = ("+ fp8 LM head", "+ fp8 MLP", "+ fp8 fast accum")
    assert all("8.9" in reasons[n] and "8.0" in reasons[n] for n in fp8_rungs)
    assert all(r is None for n, r in reasons.items() if n not in fp8_rungs)
    last = ladder.last_runnable(16, 1024, "cuda")
    assert last.name == "+ Triton AdamW" and not last.lm_head_fp8 and not last.mlp_fp8
    assert not last.fp8_fast_accum
    assert last.loss_kernel == "fused" and last.compile == "reduce-overhead"
    _fake_cuda(monkeypatch, (9, 0))  # an H100 / H200
    last = ladder.last_runnable(16, 1024, "cuda")
    assert last.name == "+ fp8 fast accum" and last.lm_head_fp8 and last.mlp_fp8


def test_last_runnable_taught_by_stops_before_the_first_later_chapters_switch(monkeypatch):
    """Chapter 10's step: on an H200 every rung up to "+ vocab 50304" is taught by chapter 09;
    "+ fused AdamW" and the rungs after it are chapter 12's."""
    _fake_cuda(monkeypatch, (9, 0))
    run = ladder.last_runnable(16, 1024, "cuda", taught_by="09")
    assert run.name == "+ vocab 50304" and not switches.taught_after(run, "09")
    assert run.autocast == "bf16" and run.attention == "sdpa" and run.optimizer == "foreach"
    assert [s.field for s in switches.taught_after(ladder.last_runnable(16, 1024, "cuda"), "09")][
        :2
    ] == ["optimizer", "residual_dtype"]
    assert ladder.last_runnable(16, 1024, "cuda", taught_by="04").name == "+ bf16 autocast"
    assert ladder.last_runnable(16, 1024, "cuda", taught_by="03").name == "fp32"
    with pytest.raises(ValueError, match="chapter number"):
        switches.taught_after(run, "nine")


def test_cli_writes_results_json_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    rc = ladder.main(
        [
            "--device",
            "cpu",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--warmup",
            "1",
            "--iters",
            "2",
            "--rungs",
            "fp32",
            "tf32",
            "sdpa attention",
            "--out",
            str(out),
            "--plot",
            str(plot),
            "--no-progress",
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res) >= {"device", "torch", "date", "config", "rungs"}
    assert res["config"]["batch_size"] == 2 and res["config"]["seq_len"] == 32
    rows = {r["name"]: r for r in res["rungs"]}
    for r in rows.values():
        assert set(r) >= {
            "name",
            "status",
            "ms_per_step",
            "tokens_per_s",
            "speedup",
            "mfu",
            "peak_mem_bytes",
            "reason",
        }
    assert rows["fp32"]["status"] == "measured" and rows["fp32"]["speedup"] == 1.0
    assert rows["fp32"]["tokens_per_s"] > 0 and rows["fp32"]["mfu"] is None
    assert rows["+ tf32"]["status"] == "skipped" and "TF32" in rows["+ tf32"]["reason"]
    assert rows["+ sdpa attention"]["status"] == "measured"
    assert plot.stat().st_size > 1000
    text = capsys.readouterr().out
    assert "fp32" in text and "skipped" in text


def test_unknown_rung_and_too_long_sequence_are_clear_errors(capsys):
    assert ladder.main(["--device", "cpu", "--rungs", "fp64"]) == 2
    assert ladder.main(["--device", "cpu", "--seq-len", "4096"]) == 2
    err = capsys.readouterr().err
    assert "unknown rung" in err and "quote names with spaces" in err and "block_size" in err


def test_an_out_or_plot_path_that_cannot_be_written_is_refused_before_the_run(capsys, tmp_path):
    (tmp_path / "README.md").write_text("a file")
    for flag in ("--out", "--plot"):
        assert ladder.main(["--device", "cpu", flag, str(tmp_path / "README.md" / "x.json")]) == 2
        assert f"error: {flag}" in capsys.readouterr().err


def test_bad_arguments_are_refused_not_replaced(capsys):
    for argv in (
        ["--batch-size", "0"],
        ["--seq-len", "0"],
        ["--iters", "0"],
        ["--warmup", "-1"],
        ["--device", "tpu"],
    ):
        assert ladder.main(["--device", "cpu", *argv] if argv[0] != "--device" else argv) == 2, argv
    err = capsys.readouterr().err
    for named in ("--batch-size must be >= 1, got 0", "--seq-len must be >= 1, got 0",
                  "--iters must be >= 1, got 0", "--warmup must be >= 0, got -1"):  # fmt: skip
        assert named in err, named  # each message names the one value that is wrong
    assert "unknown device 'tpu'" in err


def test_cuda_asked_without_cuda_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setattr(ladder.torch.cuda, "is_available", lambda: False)
    assert ladder.main(["--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def _cpu_result(names: list[str], **row_changes) -> dict:
    """A ladder result as run_ladder returns it on a CPU: one measured row per name (10 ms,
    spread 1%, no MFU, no peak memory), with ``row_changes`` applied to every row."""
    row = {
        "status": "measured",
        "ms_per_step": 10.0,
        "spread_pct": 1.0,
        "tokens_per_s": 800.0,
        "speedup": 1.0,
        "mfu": None,
        "peak_mem_bytes": None,
        "reason": "ok",
        **row_changes,
    }
    return {
        "device": "cpu",
        "torch": "x",
        "date": "d",
        "config": {"batch_size": 1, "seq_len": 8},
        "rungs": [{**row, "name": name} for name in names],
    }


def test_table_shows_spread_and_the_speedup_baseline():
    text = ladder.format_table(_cpu_result(["fp32"], spread_pct=40.0))
    assert (
        "relative to the first measured rung (fp32)" in text and "40%" in text and "warning" in text
    )
    assert "the CPU was shared" in text


def test_table_says_a_shared_note_once_and_handles_no_measured_rung():
    res = _cpu_result(
        ["fp32", "+ sdpa attention"],
        reason="MFU not reported: peak FLOP/s unknown for this device",
    )
    text = ladder.format_table(res)
    assert text.count("MFU not reported") == 1 and "note for every measured rung" in text
    res["rungs"] = [{"name": "+ Triton CE", "status": "skipped", "reason": "needs a CUDA GPU"}]
    text = ladder.format_table(res)
    assert "(None)" not in text and "no rung was measured" in text and "needs a CUDA GPU" in text


def test_table_says_when_rows_skip_rungs_and_why_cpu_peaks_are_missing():
    """A --rungs subset is cumulative (its rows also hold the rungs not listed): the table says so,
    and says once why a CPU run has no peak memory; a whole ladder from fp32 needs neither line."""
    text = ladder.format_table(_cpu_result(["fp32", "+ sdpa attention"], mfu=0.1))
    assert "rungs are cumulative" in text and text.count("on a GPU only") == 1
    names = [n for n, _ in ladder.RUNGS[:3]]
    assert "rungs are cumulative" not in ladder.format_table(_cpu_result(names))
    names[2] = ladder.FP16_AUTOCAST_RUNG  # a T4's ladder is whole too
    assert "rungs are cumulative" not in ladder.format_table(_cpu_result(names))
    full = results.load("h200-ladder-b16.json")
    text = ladder.format_table(full)
    assert "rungs are cumulative" not in text and "on a GPU only" not in text
    with pytest.raises(ValueError, match=r"rungs are \['fp32', 'tf32'"):
        ladder.select_rungs([c for c, _ in ladder.ladder_configs(1, 8, device="cpu")], ["nope"])


def test_emulation_without_a_gpu_is_a_clear_error(capsys):
    assert ladder.main(["--device", "cpu", "--emulate", "T4"]) == 2
    assert "needs one" in capsys.readouterr().err


# ---- chapter 08: the autocast rung in the device's recipe dtype ----


def _fake_cuda(monkeypatch, cap):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cap)


def test_autocast_rung_is_fp16_with_gradscaler_where_bf16_is_not_native(monkeypatch):
    _fake_cuda(monkeypatch, (7, 5))  # a T4 (or a bigger GPU emulating one)
    configs = ladder.ladder_configs(16, 1024, device="cuda")
    names = [c.name for c, _ in configs]
    assert "+ bf16 autocast" not in names and names[2] == "+ fp16 autocast + GradScaler"
    reasons = dict((c.name, r) for c, r in configs)
    assert reasons["+ fp16 autocast + GradScaler"] is None  # it runs, it is not skipped
    assert "TF32" in reasons["+ tf32"]
    assert (
        "bf16 autocast" in reasons["+ bf16 residual"]
    )  # a bf16 residual stream needs bf16 matmul inputs
    assert "GradScaler" in reasons["+ clip in AdamW"]
    assert (
        "GradScaler" in reasons["+ fused LM-head CE"]
    )  # its gradient is rounded before the loss scale reaches it
    assert "8.9" in reasons["+ fp8 LM head"]  # no fp8 tensor cores on a T4
    assert "8.9" in reasons["+ fp8 MLP"]
    runnable = [c for c, r in configs if r is None]
    assert runnable[-1].autocast == "fp16" and runnable[-1].matmul_precision == "fp32"
    assert (
        runnable[-1].residual_dtype == "fp32"
        and not runnable[-1].fused_clip
        and runnable[-1].loss_kernel == "triton"
    )
    assert all(c.autocast == "fp16" for c in runnable[2:])


def test_last_runnable_rung_is_what_a_t4_can_build(monkeypatch):
    from helpers.chapters import ch10_profiling as profiling
    from helpers.core import train

    _fake_cuda(monkeypatch, (7, 5))
    reasons = {c.name: r for c, r in ladder.ladder_configs(16, 1024, device="cuda")}
    assert reasons["+ clip in AdamW"] is not None and reasons["+ fp8 MLP"] is not None
    assert reasons["+ CUDA graphs"] is None  # CUDA graphs need CUDA, not a capability
    assert "bf16" in reasons["+ one-pass QKV grad"]  # its c_attn is bf16; a T4 runs fp16
    run = ladder.last_runnable(16, 1024, "cuda")
    assert (
        train.unsupported_reason(run, "cuda") is None
        and run.name == "+ Triton AdamW"
        and run.optimizer == "triton"
        and not run.qkv_grad
        and run.compile == "reduce-overhead"
        and run.autocast == "fp16"
        and not run.fused_clip
    )
    final = profiling.final_rung(16, 1024, "cuda", eager=True)
    assert train.unsupported_reason(final, "cuda") is None and final.compile is None


def test_cuda_graphs_rung_follows_the_compile_mode(monkeypatch):
    """--compile-mode sets the "+ torch.compile" rung; "+ CUDA graphs" adds CUDA graphs to that
    mode, and is skipped as adding nothing when the mode already has them."""
    _fake_cuda(monkeypatch, (9, 0))

    def modes(mode):
        return {c.name: (c.compile, r) for c, r in ladder.ladder_configs(16, 1024, mode, "cuda")}

    assert modes("default")["+ torch.compile"] == ("default", None)
    assert modes("default")["+ CUDA graphs"] == ("reduce-overhead", None)
    assert modes("max-autotune-no-cudagraphs")["+ CUDA graphs"] == ("max-autotune", None)
    for mode in ("reduce-overhead", "max-autotune"):
        compiled, (graphs, reason) = modes(mode)["+ torch.compile"], modes(mode)["+ CUDA graphs"]
        assert compiled == (mode, None) and graphs == mode and "already uses CUDA graphs" in reason
        assert ladder.last_runnable(16, 1024, "cuda", mode).name == "+ fp8 fast accum"


def test_autocast_rung_stays_bf16_where_it_is_native(monkeypatch):
    _fake_cuda(monkeypatch, (9, 0))
    names = [c.name for c, _ in ladder.ladder_configs(16, 1024, device="cuda")]
    assert names[2] == "+ bf16 autocast"
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "fast")
    cpu = ladder.ladder_configs(4, 64, device="cpu")
    assert cpu[2][0].name == "+ bf16 autocast" and cpu[2][1] is None


def test_bf16_rungs_are_skipped_on_a_slow_bf16_cpu_unless_asked(monkeypatch, tiny_config):
    monkeypatch.setenv(hardware.CPU_BF16_ENV, "slow")
    configs = ladder.ladder_configs(4, 64, device="cpu")
    reasons = {run.name: reason for run, reason in configs}
    assert "uses fp32" in reasons["+ bf16 autocast"]
    assert (
        "needs bf16 autocast" in reasons["+ bf16 residual"]
    )  # not carried: it needs the rung above
    assert all(run.autocast is None for run, reason in configs if reason is None)
    asked = ladder.ladder_configs(2, 32, device="cpu", run_slow=True)
    assert asked[2][1] is None and asked[2][0].autocast == "bf16"
    assert ladder.names_autocast_rung(["fp32", "bf16 autocast"]) and not ladder.names_autocast_rung(
        ["fp32"]
    )
    tokens = torch.randint(0, tiny_config.vocab_size, (4096,))
    row = bench.measure(asked[2][0], tiny_config, torch.device("cpu"), tokens, 0, 1)
    assert row["status"] == "skipped" and "uses fp32" in row["reason"]
    row = bench.measure(asked[2][0], tiny_config, torch.device("cpu"), tokens, 0, 1, run_slow=True)
    assert row["status"] == "measured"


def test_autocast_rung_follows_t4_emulation(monkeypatch):
    from helpers.measure import hardware

    _fake_cuda(monkeypatch, (9, 0))
    monkeypatch.setattr(hardware, "_emulated", gpus.PROFILES["T4"])
    assert ladder.ladder_configs(16, 1024, device="cuda")[2][0].name == ladder.FP16_AUTOCAST_RUNG


def test_rung_names_select_the_autocast_rung_in_either_dtype(monkeypatch):
    _fake_cuda(monkeypatch, (7, 5))
    fp16 = [c for c, _ in ladder.ladder_configs(16, 1024, device="cuda")]
    bf16 = [c for c, _ in ladder.ladder_configs(16, 1024, device="cpu")]
    for configs, want in ((fp16, "+ fp16 autocast + GradScaler"), (bf16, "+ bf16 autocast")):
        for alias in ("autocast", "bf16 autocast", "fp16 autocast", want):
            assert [c.name for c in ladder.select_rungs(configs, ["fp32", alias])] == [
                "fp32",
                want,
            ], alias
    with pytest.raises(ValueError, match="unknown rung"):
        ladder.select_rungs(fp16, ["fp64"])
    assert [c.name for c in ladder.select_rungs(fp16, ["FP32", "Vocab 50304"])] == [
        "fp32",
        "+ vocab 50304",
    ]  # any case


def test_a_near_miss_rung_name_gets_a_suggestion():
    configs = [c for c, _ in ladder.ladder_configs(16, 1024, device="cpu")]
    for typed, meant in (
        ("TritonAdamW", "Triton AdamW"),
        ("one pass QKV grad", "one-pass QKV grad"),
        ("cuda graph", "CUDA graphs"),
    ):
        with pytest.raises(ValueError, match="unknown rung") as e:
            ladder.select_rungs(configs, ["fp32", typed])
        assert f"did you mean {meant!r}?" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:
        ladder.select_rungs(configs, ["Foo rung"])
    assert "did you mean" not in str(e.value)


def test_out_of_memory_rung_is_failed_with_a_short_reason(monkeypatch, tiny_config):
    import torch

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has 125 GiB free"
        )

    monkeypatch.setattr(bench, "build", oom)
    row = bench.measure(
        RunConfig(batch_size=2, seq_len=16),
        tiny_config,
        torch.device("cpu"),
        torch.zeros(1000, dtype=torch.long),
        warmup=0,
        iters=1,
    )
    assert row["status"] == "failed" and row["ms_per_step"] is None
    assert row["reason"].startswith("out of memory at B=2 on this device")
    assert (
        "GiB free" not in row["reason"]
    )  # torch's text names the real GPU's free memory: misleading under emulation


def test_rungs_flag_without_names_is_an_error_not_all_rungs(capsys):
    import pytest

    with pytest.raises(SystemExit):
        ladder.parse_args(["--rungs"])
    assert "expected at least one argument" in capsys.readouterr().err


def test_ladder_refuses_a_folder_for_out_or_plot_before_running(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(ladder, "run_ladder", lambda *a, **k: ran.append(1))
    assert ladder.main(["--device", "cpu", "--out", str(tmp_path)]) == 2
    assert ladder.main(["--device", "cpu", "--plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "--plot" in err and "is a folder" in err and ran == []


def test_ladder_never_replaces_a_file_that_is_not_its_output_without_force(
    tmp_path, capsys, monkeypatch
):
    ran = []
    monkeypatch.setattr(ladder, "run_ladder", lambda *a, **k: ran.append(1))
    readme, figure = tmp_path / "README.md", tmp_path / "figure.png"
    readme.write_text("docs")
    figure.write_bytes(b"png")
    for flag, path in (
        ("--out", readme),
        ("--out", tmp_path / "solution.ipynb"),
        ("--out", tmp_path / "x.png"),  # JSON is not written into a .png
        ("--plot", figure),
    ):
        assert ladder.main(["--device", "cpu", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 4 and "pass --force" in err and ran == []
    assert readme.read_text() == "docs" and figure.read_bytes() == b"png"


def test_ladder_plot_without_a_suffix_is_written_and_reported_as_png(tmp_path, capsys):
    plot = tmp_path / "ladder"
    assert (
        ladder.main(
            [
                "--device",
                "cpu",
                "--rungs",
                "fp32",
                "--warmup",
                "0",
                "--iters",
                "1",
                "--plot",
                str(plot),
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        tmp_path / "ladder.png"
    ).is_file() and f"wrote {tmp_path / 'ladder.png'}" in capsys.readouterr().out


def test_markdown_table_has_the_text_tables_cells_and_can_start_at_a_rung():
    ref = results.load("h200-ladder-b64.json")
    text = ladder.format_table(ref).splitlines()
    md = ladder.markdown_table(ref).split("\n\n")
    assert md[0] == f"**{ref['device']}**, torch {ref['torch']}, B=64, T=1024, {ref['date']}"
    table = md[2].splitlines()
    assert table[0] == "| rung | status | ms/step | spread | tokens/s | speed-up | MFU | peak mem |"
    for text_row, md_row in zip(text[4:], table[2:], strict=True):  # no notes: no note column
        cells = md_row.strip("| ").split(" | ")
        assert cells[0] == f"`{text_row[:20].strip()}`"
        assert text_row[20:].split() == " ".join(cells[1:]).split()
    part = ladder.markdown_table(ref, from_rung="+ fused AdamW").split("\n\n")[2].splitlines()
    assert part[2].startswith("| `+ fused AdamW` | measured | 124.5 | 15% |") and len(part) == 9
    with pytest.raises(ValueError, match="no rung named 'nope'"):
        ladder.markdown_table(ref, from_rung="nope")
    cpu = ladder.markdown_table(results.load("cpu-ladder-2026-12-01.json"))
    assert "| peak mem | note |" in cpu and "| skipped | - | - |" in cpu  # skipped rows say why


def test_a_run_that_measured_nothing_leaves_an_earlier_result_alone(capsys, tmp_path):
    """Only the fp8 MLP rung asked for on a CPU: it is skipped, nothing is measured, and the
    ladder at --out (here a copy of a committed one) is not replaced by an empty run."""
    earlier = tmp_path / "ladder.json"
    earlier.write_text(json.dumps(results.load("h200-ladder-b16.json")))
    before = earlier.read_bytes()
    rc = ladder.main(["--device", "cpu", "--rungs", "fp8 MLP", "--out", str(earlier)])
    assert rc == 1 and earlier.read_bytes() == before
    err = capsys.readouterr().err
    assert "no rung could be measured" in err and "nothing written" in err


def test_help_keeps_hyphenated_rung_names_whole(capsys):
    """--help lists the rungs without breaking a name at its hyphen ('one-pass QKV grad',
    'fused LM-head CE'), so a name can be copied from it."""
    with pytest.raises(SystemExit):
        ladder.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "'one-pass" in out and "LM-head" in out
    assert not any(line.rstrip().endswith("-") for line in out.splitlines() if "'" in line)
