"""Where the course finds its two data files: an offline folder, a cache, or the internet.

- ``COURSE_DATA_DIR`` (environment variable): a folder holding ``tinyshakespeare.txt`` and
  ``gpt2.tiktoken``; used first when set (offline machines, CI).
- ``COURSE_CACHE_DIR`` (default ``~/.cache/fast-gpt2-course``): where downloads are kept.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DATA_DIR_ENV = "COURSE_DATA_DIR"
CACHE_DIR_ENV = "COURSE_CACHE_DIR"


class DataFileError(RuntimeError):
    """A data file is missing, corrupted or cannot be downloaded. The message says how to fix it."""


def data_dir() -> Path | None:
    """The offline folder named by ``COURSE_DATA_DIR``, or None when the variable is unset/empty."""
    value = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """The download cache folder (created on demand)."""
    value = os.environ.get(CACHE_DIR_ENV, "").strip()
    path = Path(value).expanduser() if value else Path.home() / ".cache" / "fast-gpt2-course"
    return path


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, expected_sha256: str, how_to_fix: str) -> Path:
    """Return ``path`` if its sha256 matches;
    raise DataFileError (with ``how_to_fix``) otherwise."""
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise DataFileError(
            f"{path} is corrupted or truncated ({path.stat().st_size:,} bytes, "
            f"sha256 {actual[:12]}..., expected {expected_sha256[:12]}...). It was not used. "
            f"{how_to_fix}"
        )
    return path


def download(url: str, dest: Path, expected_sha256: str, timeout_s: float = 30.0) -> Path:
    """Download ``url`` to ``dest`` atomically (temp file, sha256 check, rename).

    A failed or corrupted download leaves nothing at ``dest``. Raises DataFileError.
    """
    import urllib.request

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r, open(tmp, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DataFileError(f"could not download {url}: {e}") from e
    try:
        verify(tmp, expected_sha256, "The download was discarded; try again.")
    except DataFileError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return dest


def find_or_fetch(filename: str, url: str, expected_sha256: str) -> Path:
    """Locate ``filename``: ``$COURSE_DATA_DIR`` first, then the cache,
    then download into the cache.

    Every file is sha256-checked before it is returned. Raises DataFileError with instructions.
    """
    offline = data_dir()
    if offline is not None:
        path = offline / filename
        if path.exists():
            return verify(
                path,
                expected_sha256,
                f"Replace it with a fresh copy of {url}, or unset {DATA_DIR_ENV} to download it.",
            )
    cached = cache_dir() / filename
    if cached.exists():
        try:
            return verify(cached, expected_sha256, "")
        except DataFileError:
            # A broken cache entry is ours, not the learner's: keep it aside and fetch again.
            os.replace(cached, cached.with_suffix(cached.suffix + ".corrupt"))
    try:
        return download(url, cached, expected_sha256)
    except DataFileError as e:
        where = f"{offline / filename} does not exist, and " if offline is not None else ""
        raise DataFileError(
            f"{filename} is not available: {where}downloading it failed ({e}). "
            f"Either connect to the internet, or put {filename} into a folder and set "
            f"{DATA_DIR_ENV} to that folder (e.g. export {DATA_DIR_ENV}=/path/to/data)."
        ) from e
