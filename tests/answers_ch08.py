"""Right answers of chapter 08's exercises, written independently of helpers/grading/ch08.py."""

from __future__ import annotations


def precision_recipe(device):
    if device.capability is None:  # a CPU: fp32
        return {"autocast": None, "grad_scaler": False, "tf32": False}
    ampere = tuple(device.capability) >= (8, 0)  # never device.is_bf16_supported(): True on a T4
    return {"autocast": "bf16" if ampere else "fp16", "grad_scaler": not ampere, "tf32": ampere}


def max_batch_for_budget(parts_for_batch, budget_gb):
    budget_bytes = budget_gb * 1e9
    B = 0
    while sum(parts_for_batch(B + 1).values()) <= budget_bytes:
        B += 1
    return B


RIGHT_ANSWERS = {
    "ch08_recipe_dtype": precision_recipe,
    "ch08_max_batch_15gb": max_batch_for_budget,
}
