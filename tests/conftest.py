"""Fixtures of the unit tests (COURSE_DATA_DIR and MPLBACKEND are set by the root conftest.py)."""

import pytest


@pytest.fixture
def tiny_config():
    from helpers.core.model import GPTConfig

    return GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)
