"""Right answers of chapter 00's exercises, written independently of helpers/grading/ch00.py
(tests/test_grading.py loads RIGHT_ANSWERS)."""


def matmul_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def achieved_tflops(flops: float, ms: float) -> float:
    return flops / (ms / 1e3) / 1e12


RIGHT_ANSWERS = {
    "ch00_matmul_flops": matmul_flops,
    "ch00_tflops": achieved_tflops,
}
