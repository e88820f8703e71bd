"""Fast GPT-2 training, chapter by chapter: the importable package of the course.

Layers, each a folder; a layer imports only the layers above it in this list:

- ``helpers.measure``: the device (capabilities, GPU datasheets, T4 emulation), timing, memory,
  the profiler (kernel families, a step's profile), committed results and plots. It knows nothing
  of the model, so the step below can ask it.
- ``helpers.switches``: the switch registry, every speed switch declared once (no imports).
- ``helpers.core``: the model (``model``), the training step and ``RunConfig`` (``train``), the
  hand-written kernels (``kernels``), data-parallel training on N processes (``distributed``), the
  data and the tokenizer.
- ``helpers.ladder``: the speed-up ladder, the course's main job (``python -m helpers.ladder``).
- ``helpers.chapters``: one module per chapter that needs its own code, named by the chapter's
  number (``ch04_precision`` for ``notebooks/04_mixed_precision.ipynb``).
- ``helpers.grading``: the graded checks (``ch00`` ... ``ch12``), the student versions, the grader.
- ``helpers.tools``: the command-line checks and the notebook recorder.

Notebooks import modules by name: ``from helpers.core import model, train``.
"""

from pathlib import Path

__version__ = "0.1.0"
# The checkout that holds helpers/ (results/, notebooks/, tests/ beside it in a source install).
REPO_ROOT = Path(__file__).resolve().parent.parent
