"""The install files agree with each other, and every command they name really runs somewhere."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_environment_yml_installs_the_pyproject_dependencies():
    project = _pyproject()
    wanted = {
        r.replace(" ", "")
        for r in project["dependencies"] + project["optional-dependencies"]["test"]
    }
    lines = (ROOT / "environment.yml").read_text().splitlines()
    pip_reqs = {
        line.strip()[2:].strip().replace(" ", "") for line in lines if line.startswith("      - ")
    }
    assert "-e." in pip_reqs
    assert pip_reqs - {"-e."} == wanted


def test_readme_test_command_is_exactly_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = re.search(r"^python -m pytest .*$", readme, re.M).group(0)
    assert any(line.strip() == command for line in ci.splitlines())
    assert "torch==2.13.0" in ci and ".[test]" in ci
    assert "bash .ci/run" in readme and "python -m helpers.ladder" in readme


def test_no_cpu_install_command_can_fall_back_to_a_cuda_build():
    """README's online CPU command and .ci/run's fallback ask PyTorch's CPU index alone for
    torch==2.13.0+cpu: no CUDA build matches that pin, and no PyPI index is added for torch.
    .ci/run's offline branch (the local wheel) is the plain pin."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    ci = (ROOT / ".ci" / "run").read_text()
    cpu_index = "--index-url https://download.pytorch.org/whl/cpu"
    assert f"pip install torch==2.13.0+cpu {cpu_index}" in readme
    fallback = ci[ci.index("else\n") : ci.index("fi\n")]
    assert '"torch==2.13.0+cpu"' in fallback and cpu_index in fallback
    assert "extra-index-url" not in ci and "pypi.org" not in ci
    offline = ci[ci.index("then\n") : ci.index("else\n")]
    assert "--disable-pip-version-check torch==2.13.0\n" in offline


def test_dockerfile_runs_only_commands_that_ci_or_tests_run():
    docker = (ROOT / "Dockerfile").read_text()
    floor = next(r for r in _pyproject()["dependencies"] if r.startswith("torch>="))[7:]
    assert f"pip install --no-cache-dir torch=={floor}.0" in docker  # the oldest supported torch
    runs = re.findall(r"^RUN (.*)$", docker, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    for cmd in runs:
        if cmd.startswith("apt-get") or "torch==" in cmd:  # the compiler, the pinned torch
            continue
        if "pip install" in cmd:
            assert '-e ".[test]"' in cmd and '-e ".[test]"' in ci  # .ci/run installs the same way
        else:  # the data fetch: tests/test_data.py runs the same CLI
            assert cmd.startswith("python -m helpers.core.data fetch --into"), cmd


def test_an_older_torch_than_the_floor_is_named_with_what_to_do():
    import helpers

    floor = next(r for r in _pyproject()["dependencies"] if r.startswith("torch>="))[7:]
    assert ".".join(map(str, helpers.OLDEST_TORCH)) == floor
    note = helpers.torch_version_note("2.5.1+cu124")
    assert "older than 2.11" in note and "pip install -U 'torch>=2.11'" in note
    assert helpers.torch_version_note("2.11.0+cu130") is None
    assert helpers.torch_version_note("2.13.0+cpu") is None
    assert helpers.torch_version_note("3.0.0") is None
    assert helpers.torch_version_note("2.10.0a0+git1234") is not None


def test_dockerfile_entry_point_starts_jupyterlab():
    docker = (ROOT / "Dockerfile").read_text()
    assert 'CMD ["jupyter", "lab"' in docker
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent))
    assert jupyter, "jupyter is not installed in this environment"
    out = subprocess.run([jupyter, "lab", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and re.match(r"\d+\.", out.stdout.strip())


def test_dependencies_name_no_cuda_only_package():
    names = {_name(r) for r in _pyproject()["dependencies"]}
    assert names == {
        "torch",
        "tiktoken",
        "jupyterlab",
        "nbval",
        "matplotlib",
        "ipywidgets",
        "tqdm",
        "nbformat",
        "nbclient",
    }


def test_code_comments_say_what_and_why_not_the_history_of_the_work():
    """The history (which session, which device call) belongs in git and results/perf-log.md."""
    history = re.compile(r"\b(session[ -]\d+|device[- ]session|call \d+\b|device calls?\b)", re.I)
    found = []
    for folder in ("helpers", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "test_packaging.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if (
                    history.search(line) and '"session-3-final"' not in line
                ):  # a committed variant name
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, "\n".join(found)


def test_no_module_of_helpers_is_over_600_lines_or_writes_globals():
    """A module over ~600 lines holds more than one idea: split it by idea (the redesign's rule);
    a registry is written out, never made by writing into a module's globals()."""
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 600, f"{path.relative_to(ROOT)}: split it by idea"
        assert "globals()[" not in text, f"{path.relative_to(ROOT)} writes its globals()"


# The layers of helpers/ in order (see helpers/__init__.py): a module imports only its own layer
# and the layers before it. tools/ (command-line checks) is used by every layer's CLI.
LAYERS = ("measure", "switches", "core", "bench", "ladder", "chapters", "grading")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "helpers" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS or parts[1] == "tools" else None


def test_each_layer_imports_only_itself_and_the_layers_before_it():
    import ast

    root = Path(__file__).resolve().parents[1]
    wrong = []
    for path in sorted((root / "helpers").rglob("*.py")):
        own = _layer(".".join(path.relative_to(root).with_suffix("").parts))
        if own in (None, "tools"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                layer = _layer(target)
                if layer not in (None, "tools") and LAYERS.index(layer) > LAYERS.index(own):
                    wrong.append(f"{path.relative_to(root)} imports {target} ({layer})")
    assert not wrong, wrong
