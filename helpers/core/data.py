"""Tiny Shakespeare, tokenized with the GPT-2 BPE, and a batch loader.

The text (1,115,394 bytes, 338,025 GPT-2 tokens) comes from ``$COURSE_DATA_DIR`` when set, else
from the download cache, else from its public URL (sha256-checked; a corrupted or truncated file is
never trained on). Source: karpathy/char-rnn, data/tinyshakespeare/input.txt.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from helpers.core import paths, tokenizer

SHAKESPEARE_FILE = "tinyshakespeare.txt"
SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_TOKENS = 338_025


def shakespeare_path() -> "paths.Path":
    """Path of a verified copy of Tiny Shakespeare (offline folder, cache, or fresh download).

    Raises:
        paths.DataFileError: missing offline with no network, or corrupted;
            the message says what to do.
    """
    return paths.find_or_fetch(SHAKESPEARE_FILE, SHAKESPEARE_URL, SHAKESPEARE_SHA256)


def load_text() -> str:
    """The whole Tiny Shakespeare text (str, 1,115,394 characters)."""
    return shakespeare_path().read_text(encoding="utf-8")


SPLITS = ("all", "train", "val")
VAL_FRACTION = 0.1  # the last 10% of the tokens are held out when a split is asked for


@functools.lru_cache(maxsize=1)
def _all_tokens() -> torch.Tensor:
    return torch.tensor(tokenizer.encode(load_text()), dtype=torch.long)


def split_sizes(n_tokens: int, val_fraction: float = VAL_FRACTION) -> tuple[int, int]:
    """(train, val) token counts of a stream of ``n_tokens``: val = round(n * val_fraction), the
    train split the rest. Tiny Shakespeare at 0.1: (304223, 33802).

    Raises:
        ValueError: ``val_fraction`` not strictly between 0 and 1, or a split left empty.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    n_val = round(n_tokens * val_fraction)
    if n_val < 1 or n_val >= n_tokens:
        raise ValueError(
            f"val_fraction={val_fraction} of {n_tokens:,} tokens leaves a split empty: "
            "pick a fraction that keeps both splits non-empty"
        )
    return n_tokens - n_val, n_val


def load_tokens(split: str = "all", val_fraction: float = VAL_FRACTION) -> torch.Tensor:
    """Tiny Shakespeare as GPT-2 token ids, int64 on the CPU.

    ``split="all"`` (the default) is the whole text, (338025,): what every training chapter
    trains and measures on, so their recorded numbers stay as they are. ``"train"`` is the
    first ``1 - val_fraction`` of the tokens, ``"val"`` the last ``val_fraction`` (a contiguous
    held-out tail: the end of the play collection, never seen by a model trained on ``"train"``);
    at the default 0.1: (304223,) and (33802,). A model whose validation loss you report must be
    trained on ``"train"``, not on ``"all"``. The splits are views of one cached tensor.

    Raises:
        ValueError: an unknown ``split`` or a ``val_fraction`` outside (0, 1).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    tokens = _all_tokens()
    if split == "all":
        return tokens
    n_train, _ = split_sizes(tokens.numel(), val_fraction)
    return tokens[:n_train] if split == "train" else tokens[n_train:]


class BatchLoader:
    """Sequential (x, y) batches over a token stream, wrapping around at the end.

    Each call of :meth:`next_batch` returns ``x, y`` of shape (B, T), int64, on ``device``, where
    ``y`` is ``x`` shifted left by one token. The read position advances by B*T tokens and wraps
    to the start when fewer than B*T + 1 tokens are left. On CUDA the host batch is pinned and
    copied with ``non_blocking=True`` so the copy overlaps with GPU work already queued.

    Raises:
        ValueError: if the stream has fewer than B*T + 1 tokens, or B, T < 1.
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        batch_size: int,
        seq_len: int,
        device: str | torch.device = "cpu",
    ):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(
                f"batch_size and seq_len must be >= 1, got B={batch_size}, T={seq_len}"
            )
        if tokens.numel() < batch_size * seq_len + 1:
            raise ValueError(
                f"{tokens.numel():,} tokens cannot fill one batch of "
                f"B*T+1 = {batch_size * seq_len + 1:,} tokens: lower B or T."
            )
        self.tokens = tokens.to(torch.long).contiguous()
        self.B, self.T = batch_size, seq_len
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda"
        self.position = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = self.B, self.T
        if self.position + B * T + 1 > self.tokens.numel():
            self.position = 0
        buf = self.tokens[self.position : self.position + B * T + 1]
        self.position += B * T
        x = buf[:-1].view(B, T)  # (B, T)
        y = buf[1:].view(B, T)  # (B, T)
        if self.pin:
            x, y = x.pin_memory(), y.pin_memory()
            return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()


def fetch(into: "str | paths.Path | None" = None) -> dict[str, "paths.Path"]:
    """Make sure both course files are available and verified; optionally copy them into ``into``
    (a folder you can then name in ``COURSE_DATA_DIR``). Returns {file name: path}.

    Raises:
        paths.DataFileError: a file is missing offline or corrupted (the message says what to do).
    """
    import shutil

    from helpers.core import tokenizer

    found = {
        SHAKESPEARE_FILE: shakespeare_path(),
        tokenizer.RANKS_FILE: paths.find_or_fetch(
            tokenizer.RANKS_FILE, tokenizer.RANKS_URL, tokenizer.RANKS_SHA256
        ),
    }
    if into is not None:
        target = paths.Path(into)
        if target.exists() and not target.is_dir():
            raise paths.DataFileError(
                f"--into {target} is a file, not a folder: name a new or existing folder"
            )
        target.mkdir(parents=True, exist_ok=True)
        for name, src in list(found.items()):
            if src.resolve() != (target / name).resolve():
                shutil.copyfile(src, target / name)
            found[name] = target / name
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.core.data fetch [--into DIR]``:
    download (or find offline) and verify the data."""
    import argparse
    import sys

    p = argparse.ArgumentParser(
        prog="python -m helpers.core.data", description="Fetch and verify the course data files."
    )
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser(
        "fetch", help="download Tiny Shakespeare and the GPT-2 rank file (sha256-checked)"
    )
    f.add_argument(
        "--into",
        default=None,
        help="also copy the verified files into this folder (use it as COURSE_DATA_DIR)",
    )
    args = p.parse_args(argv)
    try:
        for name, path in fetch(args.into).items():
            print(f"{name}: {path} (sha256 ok)")
    except paths.DataFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
