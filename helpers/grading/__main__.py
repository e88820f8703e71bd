"""``python -m helpers.grading make-student | grade | leaderboard``: see docs/grading.md."""

import sys

from helpers.grading.grader import main

sys.exit(main())
