"""Right answers of chapter 07's exercises, written independently of helpers/grading/ch07.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def pad_model_vocab(gpt, multiple):
    import torch

    weight = gpt.lm_head.weight  # (V, C), the same Parameter as gpt.transformer.wte.weight
    V, C = weight.shape
    rows = (V + multiple - 1) // multiple * multiple
    padded = torch.zeros(rows, C, dtype=weight.dtype, device=weight.device)
    padded[:V] = weight.detach()
    with torch.no_grad():
        weight.data = padded  # the tied Parameter keeps its identity
    gpt.config.vocab_multiple = multiple


def sample_next(logits, vocab_size, generator):
    import torch

    return torch.multinomial(logits[:, :vocab_size].float().softmax(-1), 1, generator=generator)


RIGHT_ANSWERS = {
    "ch07_pad_vocab": pad_model_vocab,
    "ch07_masked_sampling": sample_next,
}
