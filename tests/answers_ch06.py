"""Right answers of chapter 06's exercises, written independently of helpers/grading/ch06.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def causal_attention(q, k, v):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def combine_two_tiles(s1, v1, s2, v2):
    import torch

    m1 = s1.amax(dim=1, keepdim=True)
    m = torch.maximum(m1, s2.amax(dim=1, keepdim=True))
    p1, p2 = torch.exp(s1 - m), torch.exp(s2 - m)
    return (p1 @ v1 + p2 @ v2) / (p1.sum(1, keepdim=True) + p2.sum(1, keepdim=True))


RIGHT_ANSWERS = {
    "ch06_sdpa_attention": causal_attention,
    "ch06_online_softmax": combine_two_tiles,
}
