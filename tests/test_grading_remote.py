"""Tests of helpers/grading/remote.py and wire.py: checks run the way the grader runs them, in
a checker of their own, the learner's function called over the socket protocol
(``remote.check_over_socket``), so only data comes back from the submission's kernel; and the
wire format refusing what is not data."""

from __future__ import annotations

import os
import pickle
import re
import socket
import tempfile
import time

import pytest
import torch
from test_grading import RIGHT_ANSWERS

from helpers import grading
from helpers.grading import remote, wire


@pytest.mark.parametrize("grade_id", sorted(grading.CHECKS))
def test_every_right_answer_passes_through_the_checker_with_the_in_process_pass_line(
    grade_id, capsys
):
    verdict = remote.check_over_socket(grade_id, RIGHT_ANSWERS[grade_id])
    assert verdict["status"] == "ok", verdict
    grading.CHECKS[grade_id](RIGHT_ANSWERS[grade_id])
    in_process = capsys.readouterr().out
    # the notebooks' compared PASS line is the same whether the check ran here or in a checker
    assert verdict["output"] == in_process and in_process.startswith(f"PASS {grade_id}:")


@pytest.mark.parametrize(
    "grade_id,wrong",
    [(gid, fn) for gid, fns in sorted(grading.WRONG_ANSWERS.items()) for fn in fns],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_every_wrong_answer_is_rejected_through_the_checker_with_the_in_process_hint(
    grade_id, wrong
):
    verdict = remote.check_over_socket(grade_id, wrong)
    assert (verdict["status"], verdict["ename"]) == ("error", "AssertionError"), verdict
    assert "Reread chapter" in verdict["evalue"] and "\n" not in verdict["evalue"], verdict
    assert "PASS" not in verdict["output"]
    with pytest.raises(AssertionError) as in_process:
        grading.CHECKS[grade_id](wrong)
    # the same hint names the same mistake (numbers aside: ch02's fake steps take real time)
    def shape(hint: str) -> str:
        return re.sub(r"[\d.]+", "#", hint)

    assert shape(verdict["evalue"]) == shape(str(in_process.value))


def test_a_not_implemented_answer_reaches_the_checker_as_not_implemented():
    def stub(M, N, K):
        raise NotImplementedError("Write this function")

    verdict = remote.check_over_socket("ch00_matmul_flops", stub)
    assert (verdict["status"], verdict["ename"]) == ("error", "NotImplementedError")


def test_data_round_trips_and_tensors_keep_dtype_shape_and_values():
    value = {
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "n": [1, 2.5, None, True, "s", float("inf")],
        "d": torch.float16,
        (1, 2): (3, torch.Size([4])),
    }
    back = wire.decode(wire.encode(value))
    assert torch.equal(back["t"], value["t"]) and back["t"].dtype == torch.bfloat16
    assert back["n"] == value["n"] and back["d"] is torch.float16 and back[(1, 2)] == (3, (4,))


def test_what_the_kernel_sends_is_never_unpickled_and_must_be_data():
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo never",))

    with pytest.raises(wire.ProtocolError):
        wire.decode(pickle.dumps(["result", Evil()]))
    for forged in (b'{"__tensor": ["float32", [2], "AAAA"], "requires_grad": false}',
                   b'{"__dtype": "os.system"}', b'{"__class": "os.system"}'):
        with pytest.raises(wire.ProtocolError):
            wire.decode(forged)
    for not_data in (print, os, object(), torch.nn.Linear(1, 1)):
        with pytest.raises(TypeError, match="not data the grader can receive"):
            wire.encode(not_data)


def test_only_a_harness_of_helpers_grading_can_be_asked_to_run_in_the_kernel():
    a, b = socket.socketpair()
    with a, b:
        fn = remote.RemoteFunction(a, "f", timeout=5)
        with pytest.raises(ValueError, match="not a harness"):
            fn.run(os.system, "echo never")
    with pytest.raises(ValueError, match="not a harness"):
        remote._resolve("os:system")


def test_the_checker_process_gives_a_verdict_when_the_kernel_never_connects_or_lies():
    checker = remote.Checker()
    try:
        with tempfile.TemporaryDirectory() as folder:
            address = os.path.join(folder, "check.sock")
            checker.begin("ch00_matmul_flops", address, "matmul_flops", timeout=60)
            started = time.monotonic()
            verdict = checker.finish(address, timeout=60)  # the cell ended, nobody connected
            assert verdict["ename"] == "GraderError", verdict
            assert "did not run the check" in verdict["evalue"]
            assert time.monotonic() - started < 30  # the grader ends the wait, not the timeout

            checker.begin("ch00_matmul_flops", address, "matmul_flops", timeout=60)
            with socket.socket(socket.AF_UNIX) as kernel:  # a kernel that guesses the token
                kernel.connect(address)
                wire.send(kernel, wire.encode(["hello", "guessed"]))
                verdict = checker.finish(address, timeout=60)
            assert verdict["evalue"] == "the kernel did not say hello"
    finally:
        checker.close()


def test_a_socket_file_left_by_a_stopped_checker_does_not_stop_the_next_check():
    checker = remote.Checker()
    try:
        with tempfile.TemporaryDirectory() as folder:
            address = os.path.join(folder, "check.sock")
            stale = socket.socket(socket.AF_UNIX)
            stale.bind(address)  # a checker killed mid-check leaves its file behind
            stale.close()
            checker.begin("ch00_matmul_flops", address, "matmul_flops", timeout=30)
            assert "did not run" in checker.finish(address, timeout=30)["evalue"]
    finally:
        checker.close()
