"""The GPT-2 BPE tokenizer, through tiktoken, online or offline.

Offline (``COURSE_DATA_DIR`` set and holding ``gpt2.tiktoken``) the encoding is built from that rank
file, which is byte-identical to tiktoken's ``r50k_base`` ranks and tokenizes exactly like ``gpt2``.
Otherwise tiktoken's own ``gpt2`` encoding is used (downloaded and cached by tiktoken on first use).
"""

from __future__ import annotations

import functools

import tiktoken

from helpers.core import paths

RANKS_FILE = "gpt2.tiktoken"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
RANKS_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
# The GPT-2 pre-tokenisation regex (tiktoken's r50k pattern); newer tiktoken versions spell it with
# possessive quantifiers, older ones (Colab) without: both split text the same way.
_CLASSIC_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _pat_str() -> str:
    try:
        from tiktoken_ext.openai_public import r50k_pat_str

        return r50k_pat_str
    except ImportError:
        return _CLASSIC_PAT


def _offline_encoding() -> tiktoken.Encoding | None:
    """The encoding from a local rank file: ``$COURSE_DATA_DIR`` first, then the course cache
    (where ``python -m helpers.core.data fetch`` puts it). None when neither folder has the file."""
    folder = paths.data_dir()
    if folder is not None and (folder / RANKS_FILE).exists():
        fix = (
            f"Replace it with a fresh copy of {RANKS_URL}, or unset {paths.DATA_DIR_ENV} to let "
            "tiktoken download it."
        )
        path = paths.verify(folder / RANKS_FILE, RANKS_SHA256, fix)
    elif (paths.cache_dir() / RANKS_FILE).exists():
        path = paths.verify(
            paths.cache_dir() / RANKS_FILE,
            RANKS_SHA256,
            "Delete it and run: python -m helpers.core.data fetch",
        )
    else:
        return None
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(path), expected_hash=RANKS_SHA256)
    return tiktoken.Encoding(
        name="gpt2", pat_str=_pat_str(), mergeable_ranks=ranks, special_tokens={EOT_TOKEN: EOT_ID}
    )


@functools.lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding (50,257 ids; ``<|endoftext|>`` = 50256).

    Raises:
        paths.DataFileError: the offline rank file is corrupted, or there is neither an offline
            rank file nor a way to download tiktoken's ``gpt2`` files. The message names both fixes.
    """
    enc = _offline_encoding()
    if enc is not None:
        return enc
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises requests/urllib/OSError variants when offline
        raise paths.DataFileError(
            "The GPT-2 tokenizer is not available: tiktoken could not fetch its 'gpt2' files "
            f"({type(e).__name__}: {e}). "
            f"Either connect to the internet once (tiktoken caches the files), or put {RANKS_FILE} "
            f"(the r50k_base rank file, sha256 {RANKS_SHA256[:12]}...) into a folder and set "
            f"{paths.DATA_DIR_ENV} to that folder."
        ) from e


def encode(text: str) -> list[int]:
    """Token ids of ``text``. A literal "<|endoftext|>" in the text is encoded as ordinary text."""
    return get_encoding().encode_ordinary(text)


def decode(ids: list[int]) -> str:
    """Text of token ids (each < 50257)."""
    return get_encoding().decode(ids)
