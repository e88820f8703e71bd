"""Right answers of chapter 13's exercises, written independently of helpers/grading/ch13.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def kv_attention(q, k_cache, v_cache, pos):
    import math

    import torch

    k, v = k_cache[:, :, :pos], v_cache[:, :, :pos]
    att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)  # (B, nh, 1, pos)
    return att @ v  # (B, nh, 1, hs)


RIGHT_ANSWERS = {
    "ch13_kv_attention": kv_attention,
}
