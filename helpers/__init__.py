"""Fast GPT-2 training, chapter by chapter: the importable package of the course.

Layers, each a folder; a layer imports only the layers above it in this list:

- ``helpers.measure``: the device (capabilities, GPU datasheets, T4 emulation), timing, memory,
  the profiler (kernel families, a step's profile), committed results and plots. It knows nothing
  of the model, so the step below can ask it.
- ``helpers.switches``: the switch registry, every speed switch declared once (no imports).
- ``helpers.core``: the model (``model``), the training step and ``RunConfig`` (``train``), the
  hand-written kernels (``kernels``), data-parallel training on N processes (``distributed``), the
  data and the tokenizer, the released GPT-2 weights (``pretrained``) and the validation loss
  (``evaluate``).
- ``helpers.ladder``: the speed-up ladder, the course's main job (``python -m helpers.ladder``).
- ``helpers.chapters``: one module per chapter that needs its own code, named by the chapter's
  number (``ch04_precision`` for ``notebooks/04_mixed_precision.ipynb``).
- ``helpers.grading``: the graded checks (``ch00`` ... ``ch14``), the student versions, the grader.
- ``helpers.tools``: the command-line checks, the notebook recorder and the course's addresses
  (``links.repo_url()``, the Colab badges).

Notebooks import modules by name: ``from helpers.core import model, train``.
"""

import warnings
from pathlib import Path

__version__ = "0.1.0"
OLDEST_TORCH = (2, 11)  # the oldest torch the course runs (pyproject.toml's floor; the H200's)


def torch_version_note(version: str) -> str | None:
    """Why ``version`` (a ``torch.__version__`` such as ``"2.9.1+cu126"``) is not one the course
    runs, or None when it is at least :data:`OLDEST_TORCH`. Warned once, when ``helpers`` is
    imported: an older torch (an old Colab image) may still run most chapters, but nothing here was
    tested on it."""
    parts = version.split("+")[0].split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None  # a source build with an unusual version string: nothing to compare
    if (int(parts[0]), int(parts[1])) >= OLDEST_TORCH:
        return None
    oldest = ".".join(map(str, OLDEST_TORCH))
    return (
        f"torch {version} is older than {oldest}, the oldest version this course is tested with "
        f"(GPU: {oldest}, CI: 2.13): some rungs or chapters may fail; "
        f"upgrade with pip install -U 'torch>={oldest}'"
    )


def _warn_about_old_torch() -> None:
    import torch

    note = torch_version_note(torch.__version__)
    if note:
        warnings.warn(note, stacklevel=3)


_warn_about_old_torch()
# The checkout that holds helpers/ (results/, notebooks/, tests/ beside it in a source install).
REPO_ROOT = Path(__file__).resolve().parent.parent
