"""Right answers of chapter 02's exercises, written independently of helpers/grading/ch02.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def time_steps(step, synchronize, warmup, iters):
    import time

    for _ in range(warmup):
        step()
    synchronize()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        synchronize()
        out.append(1e3 * (time.perf_counter() - t0))
    return out


def mfu(step_ms, tokens_per_step, flops_per_token, peak_flops):
    return flops_per_token * tokens_per_step / (step_ms / 1e3) / peak_flops


RIGHT_ANSWERS = {
    "ch02_step_timer": time_steps,
    "ch02_mfu": mfu,
}
