"""The wire format between the grader's checker and a submission's kernel
(:mod:`helpers.grading.remote`): length-prefixed frames, and data as JSON.

What the kernel sends is decoded by :func:`decode`, which builds only data (None, bool, int,
float, str, lists, tuples, dicts, CPU tensors as dtype, shape and bytes, dtypes) and never runs
anything of the sender's; a frame is at most :data:`MAX_FRAME` bytes.
"""

from __future__ import annotations

import base64
import json
import math
import numbers
import socket
import struct
from typing import Any

# bytes of one message; more is refused (16 MiB of JSON took ~0.75 GB and 23 s to decode)
MAX_FRAME = 8 * 2**20
_HEADER = struct.Struct("!I")


class ProtocolError(ConnectionError):
    """The other side sent something that is not a message of this protocol, or hung up."""


def send(sock: socket.socket, body: bytes) -> None:
    if len(body) > MAX_FRAME:
        raise ValueError(f"a message of {len(body):,} bytes is over the {MAX_FRAME:,}-byte limit")
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 2**20))
        if not chunk:
            raise ProtocolError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> bytes:
    (n,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if n > MAX_FRAME:
        raise ProtocolError(f"a message of {n:,} bytes is over the {MAX_FRAME:,}-byte limit")
    return _recv_exactly(sock, n)


# ----------------------------------------------------------------------------------------------
# Data only: what the kernel may send
# ----------------------------------------------------------------------------------------------

_DTYPES = (
    "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool "
    "float8_e4m3fn float8_e5m2 complex64 complex128"
).split()
_MAX_DEPTH = 32


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data; TypeError for anything that is not data."""
    import torch

    if depth > _MAX_DEPTH:
        raise TypeError(f"it is nested more than {_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):  # int, numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # float, numpy floats, Fraction
        x = float(value)
        return x if math.isfinite(x) else {"__float": repr(x)}
    if isinstance(value, torch.dtype):
        return {"__dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise TypeError(f"a tensor of dtype {t.dtype} cannot be sent")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {
            "__tensor": [name, list(t.shape), base64.b64encode(raw).decode("ascii")],
            "requires_grad": bool(value.requires_grad),
        }
    if isinstance(value, tuple):  # torch.Size included
        return {"__tuple": [_plain(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _plain(v, depth + 1) for k, v in value.items()}
        return {"__items": [[_plain(k, depth + 1), _plain(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(
        f"a {type(value).__module__}.{type(value).__qualname__} is not data the grader can "
        "receive (numbers, strings, None, tensors, dtypes, and lists, tuples and dicts of them)"
    )


def encode(value: Any) -> bytes:
    """``value`` as bytes that only :func:`decode` reads back: JSON of data, tensors as
    (dtype, shape, base64 of their bytes).

    Raises:
        TypeError: ``value`` holds something that is not data (a function, a module, an object).
    """
    return json.dumps(_plain(value), allow_nan=False, separators=(",", ":")).encode()


def _unplain(value: Any, depth: int = 0) -> Any:
    import torch

    if depth > _MAX_DEPTH + 2:
        raise ProtocolError("nested too deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_unplain(v, depth + 1) for v in value]
    if not isinstance(value, dict):
        raise ProtocolError(f"unexpected {type(value).__name__}")
    if set(value) == {"__float"} and value["__float"] in ("inf", "-inf", "nan"):
        return float(value["__float"])
    if set(value) == {"__dtype"} and value["__dtype"] in _DTYPES:
        return getattr(torch, value["__dtype"])
    if set(value) == {"__tuple"} and isinstance(value["__tuple"], list):
        return tuple(_unplain(v, depth + 1) for v in value["__tuple"])
    if set(value) == {"__items"} and isinstance(value["__items"], list):
        pairs = [_unplain(p, depth + 1) for p in value["__items"]]
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ProtocolError("malformed items")
        try:
            return {k: v for k, v in pairs}
        except TypeError as exc:  # an unhashable key
            raise ProtocolError(str(exc)) from None
    if set(value) == {"__tensor", "requires_grad"}:
        return _tensor(value["__tensor"], value["requires_grad"])
    if any(k.startswith("__") for k in value):
        raise ProtocolError("unknown marker")
    return {k: _unplain(v, depth + 1) for k, v in value.items()}


def _tensor(spec: Any, requires_grad: Any):
    import torch

    if not (isinstance(spec, list) and len(spec) == 3 and spec[0] in _DTYPES):
        raise ProtocolError("malformed tensor")
    name, shape, data = spec
    if not (
        isinstance(shape, list)
        and len(shape) <= 16
        and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s for s in shape)
        and isinstance(data, str)
        and isinstance(requires_grad, bool)
    ):
        raise ProtocolError("malformed tensor")
    dtype = getattr(torch, name)
    raw = base64.b64decode(data, validate=True)
    n = math.prod(shape)
    if len(raw) != n * torch.empty((), dtype=dtype).element_size():
        raise ProtocolError("a tensor's bytes do not match its shape")
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0)
    t = (flat.view(dtype) if raw else torch.empty(0, dtype=dtype)).reshape(shape).clone()
    return t.requires_grad_(requires_grad) if t.is_floating_point() else t


def decode(body: bytes) -> Any:
    """What :func:`encode` wrote. Runs no code of the sender; tensors come back as CPU tensors.

    Raises:
        ProtocolError: ``body`` is not such data.
    """
    try:
        return _unplain(json.loads(body.decode()))
    except ProtocolError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"not data: {type(exc).__name__}") from None


def round_trip(value: Any) -> Any:
    """``value`` as the checker would receive it from a kernel.

    Raises:
        TypeError: ``value`` holds something that is not data."""
    return decode(encode(value))


def data_or_type_name(value: Any) -> Any:
    """``value`` when it is data (:func:`encode` takes it), else the str ``"<a TYPE>"``: what a
    harness reports of a learner's return value that cannot travel."""
    try:
        encode(value)
    except (TypeError, ValueError):
        return f"<a {type(value).__name__}>"
    return value
