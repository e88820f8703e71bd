"""Shared test set-up: offline data folder and a tiny model config."""

import os
from pathlib import Path

import pytest

# CI points COURSE_DATA_DIR at ../shared/data; a developer checkout next to shared/ gets the same.
_default = Path(__file__).resolve().parents[2] / "shared" / "data"
if not os.environ.get("COURSE_DATA_DIR") and _default.is_dir():
    os.environ["COURSE_DATA_DIR"] = str(_default)


@pytest.fixture
def tiny_config():
    from helpers.model import GPTConfig

    return GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
