"""Tests for helpers/switches.py: the ladder, the capstone's advice and the profiler read
one registry."""

import dataclasses

import pytest

from helpers import ladder, switches
from helpers.chapters import ch08_t4_colab as t4_colab
from helpers.chapters import ch10_profiling as profiling
from helpers.chapters import ch12_capstone as capstone
from helpers.core import train
from helpers.core.train import RunConfig

# The ladder as it was written by hand before the registry: the registry must give the same.
LADDER_BEFORE_THE_REGISTRY = [
    ("+ tf32", dict(matmul_precision="tf32")),
    ("+ bf16 autocast", dict(autocast="bf16")),
    ("+ torch.compile", dict(compile="default")),
    ("+ sdpa attention", dict(attention="sdpa")),
    ("+ vocab 50304", dict(vocab_multiple=64)),
    ("+ fused AdamW", dict(optimizer="fused")),
    ("+ bf16 residual", dict(residual_dtype="bf16")),
    ("+ detached logits", dict(detach_logits=True)),
    ("+ Triton CE", dict(loss_kernel="triton")),
    ("+ clip in AdamW", dict(fused_clip=True)),
    ("+ fused LM-head CE", dict(loss_kernel="fused")),
    ("+ fp8 LM head", dict(lm_head_fp8=True)),
    ("+ fp8 MLP", dict(mlp_fp8=True)),
    ("+ CUDA graphs", dict(compile="reduce-overhead")),  # the compile switch's second rung
    ("+ one-pass QKV grad", dict(qkv_grad=True)),
    ("+ Triton AdamW", dict(optimizer="triton")),  # the optimizer switch's second rung
    ("+ fp8 fast accum", dict(fp8_fast_accum=True)),
]


def test_the_ladder_is_read_from_the_registry_and_unchanged_by_it():
    assert ladder.RUNGS == switches.ladder_rungs()
    assert ladder.RUNGS[0][0] == "fp32" and ladder.RUNGS[1:] == LADDER_BEFORE_THE_REGISTRY
    first = RunConfig().replace(**ladder.RUNGS[0][1])
    assert first == RunConfig().replace(
        matmul_precision="fp32",
        autocast=None,
        compile=None,
        attention="manual",
        vocab_multiple=1,
        optimizer="foreach",
    )


def test_every_switch_is_a_run_config_field_whose_default_is_its_baseline():
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for s in switches.SWITCHES:
        assert s.field in defaults, s.field
        assert defaults[s.field] == s.baseline, s.field
        assert s.advice or s.general, f"{s.field} has no advice for the capstone"
    assert len({s.field for s in switches.SWITCHES}) == len(switches.SWITCHES)


def test_the_capstone_advice_and_the_profilers_description_come_from_the_registry():
    for s in switches.SWITCHES:
        for value, text in s.advice.items():
            assert capstone.WHEN_TO_USE[(s.field, value)] == text
    described = profiling.describe(RunConfig(name="x"))
    assert all(f"{field}=" in described for field in switches.rung_fields())
    assert "lm_head_fp8=False" in described and "mlp_fp8=False" in described


def test_a_new_record_shows_up_in_the_rungs_the_advice_and_the_description():
    fake = switches.Switch(
        "fake_switch",
        False,
        (("+ fake", True),),
        "12",
        {True: "use it when faked"},
        values=(False, True),
        doc="a switch only this test has",
    )
    registry = (*switches.SWITCHES, fake)
    rungs = switches.ladder_rungs(registry, (*switches.RUNG_ORDER, "+ fake"))
    assert rungs[-1] == ("+ fake", {"fake_switch": True}) and rungs[0][1]["fake_switch"] is False
    assert switches.advice_table(registry)[("fake_switch", True)] == "use it when faked"
    assert "fake_switch" in switches.rung_fields(registry)
    with pytest.raises(ValueError, match="declared but not ordered"):
        switches.ladder_rungs(registry)  # a rung must have its place in the ladder
    FakeRunConfig = train.run_config_class(registry)
    assert FakeRunConfig().fake_switch is False and FakeRunConfig(fake_switch=True).fake_switch
    assert "fake_switch = False: a switch only this test has" in FakeRunConfig.__doc__
    with pytest.raises(ValueError, match="fake_switch must be one of"):
        FakeRunConfig(fake_switch="yes")
    assert not hasattr(RunConfig(), "fake_switch")  # the course's RunConfig is untouched
    # the recipe of a ladder with the fake rung: on where it runs, off with its reason where not
    runs = [FakeRunConfig(name=rungs[0][0]).replace(**rungs[0][1])]
    for name, changes in rungs[1:]:
        runs.append(runs[-1].replace(name=name, **changes))
    recipe = {c.switch: c for c in t4_colab.recipe_from_ladder([(r, None) for r in runs], registry)}
    assert recipe["fake_switch"].value is True
    assert recipe["fake_switch"].reason == "use it when faked"
    refused = [(r, "fakes need a fake GPU" if r.name == "+ fake" else None) for r in runs]
    recipe = {c.switch: c for c in t4_colab.recipe_from_ladder(refused, registry)}
    assert recipe["fake_switch"].value is False
    assert recipe["fake_switch"].reason == "'+ fake' skipped: fakes need a fake GPU"


def test_run_config_fields_are_the_registry_s_switches_then_the_settings():
    names = [f.name for f in dataclasses.fields(RunConfig)]
    assert names == [
        "name",
        *(s.field for s in switches.SWITCHES),
        *(n for n, _, _ in train.SETTINGS),
    ]
    for s in switches.SWITCHES:
        assert s.field in RunConfig.__doc__ and s.doc


@pytest.mark.parametrize(
    "field,bad",
    [
        ("attention", "flash"),
        ("autocast", "bf32"),
        ("compile", "fast"),
        ("detach_logits", 1),
        ("vocab_multiple", 0),
        ("vocab_multiple", 1.5),
        ("checkpoint_every", -1),
        ("grad_accum_steps", True),
    ],
)
def test_run_config_refuses_a_value_its_switch_does_not_accept(field, bad):
    with pytest.raises(ValueError, match=f"RunConfig.{field} must be"):
        RunConfig(**{field: bad})


def test_a_record_without_values_or_minimum_is_refused():
    with pytest.raises(ValueError, match="give its values"):
        switches.Switch("x", 0, (), "12")


def test_the_readmes_rung_table_lists_every_rung_in_ladder_order():
    """README.md's "| rung | switch |" table names fp32 and then each rung of RUNG_ORDER, in order:
    a rung added to the registry without its README row (or a row left behind) fails here."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = lines.index("| rung | switch |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1].strip())
    assert rows == ["fp32", *switches.RUNG_ORDER]


def test_each_switch_requirement_is_refused_without_and_accepted_with_its_value():
    """A switch's ``requires`` (declared once, in its record) is what GPT and
    train.unsupported_reason both enforce: refused while the other switch is at another value,
    accepted once it has the needed one, and nothing is asked of a switch at its baseline."""
    needing = [s for s in switches.SWITCHES if s.requires]
    assert {s.field for s in needing} >= {"lm_head_fp8", "fp8_fast_accum"}
    for s in needing:
        assert s.requires_why, s.field
        on = next(v for v in s.values if v != s.baseline)
        for field_name, needed in s.requires:
            other = switches.get(field_name)  # raises for a field that is not a switch
            wrong = next(v for v in (other.values or (other.baseline,)) if v != needed)
            problem = switches.requirement_problem({s.field: on, field_name: wrong}, owner="GPT")
            assert problem is not None and f"GPT({s.field}={on!r})" in problem
            assert f"needs {field_name}={needed!r}" in problem and repr(wrong) in problem
            assert switches.requirement_problem({s.field: on, field_name: needed}) is None
            assert switches.requirement_problem({s.field: s.baseline, field_name: wrong}) is None
            # a required field left out counts as its baseline
            if other.baseline != needed:
                assert switches.requirement_problem({s.field: on}) is not None
            # GPT checks its own keywords only: a model switch may require only model switches
            assert s.where != "model" or other.where == "model", (s.field, field_name)
