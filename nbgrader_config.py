"""nbgrader configuration for teachers who run nbgrader itself (see docs/grading.md).

Course folder layout (nbgrader's default, flat, run every command from this folder):
    source/<assignment>/<notebook>.ipynb       solution notebooks (copied from notebooks/)
    release/<assignment>/...                   written by `nbgrader generate_assignment`
    submitted/<student id>/<assignment>/...    collected submissions
    autograded/, feedback/, gradebook.db       written by `nbgrader autograde` and friends

The course's own tools (`python -m helpers.grading make-student | grade`) do the same without
nbgrader; both use the stub below, so student versions look the same either way.
"""

import sys
from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

# Make `helpers` importable when the course is not pip-installed (nbgrader runs from this folder).
_root = Path(globals().get("__file__", "nbgrader_config.py")).resolve().parent
if str(_root) not in sys.path:
    sys.path.insert(0, str(_root))
from helpers.grading import CODE_STUB, TEXT_STUB  # noqa: E402 - one home for the stub

c.CourseDirectory.course_id = "fast-gpt2-course"
c.CourseDirectory.root = str(_root)

# Student versions: the same friendly stub as `python -m helpers.grading make-student`.
c.ClearSolutions.code_stub = {"python": CODE_STUB}
c.ClearSolutions.text_stub = TEXT_STUB

# Autograding executes whole notebooks: torch.compile and the first CUDA call can take minutes.
# Seconds per cell; nbgrader's Execute preprocessor inherits this from ExecutePreprocessor.
c.ExecutePreprocessor.timeout = 1800
