"""Fast GPT-2 training, chapter by chapter: the importable core of the course.

Modules (import them by name: ``from helpers import model, train``):
model, tokenizer, data, paths, timing, memory, hardware, train, ladder, plots.
"""

__version__ = "0.1.0"
