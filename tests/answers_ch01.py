"""Right answers of chapter 01's exercises, written independently of helpers/grading/ch01.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""

import math


def expected_initial_loss(vocab_size: int) -> float:
    return math.log(vocab_size)


def block_parameters(n_embd: int) -> int:
    return 12 * n_embd * n_embd + 13 * n_embd


RIGHT_ANSWERS = {
    "ch01_loss_at_init": expected_initial_loss,
    "ch01_block_params": block_parameters,
}
