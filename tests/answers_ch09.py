"""Right answers of chapter 09's exercises (tests/test_grading.py loads RIGHT_ANSWERS)."""


def accumulation_step(model, micro_batches):
    import torch

    n = len(micro_batches)
    total = torch.zeros(())
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / n).backward()
        total += loss.detach()
    return total / n


def checkpointed(block, x):
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)


RIGHT_ANSWERS = {
    "ch09_accumulation_step": accumulation_step,
    "ch09_checkpointed_block": checkpointed,
}
