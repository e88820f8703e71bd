import shutil

import pytest

from helpers.core import paths, tokenizer


@pytest.fixture(autouse=True)
def _fresh_encoding():
    tokenizer.get_encoding.cache_clear()
    yield
    tokenizer.get_encoding.cache_clear()


def test_hello_encodes_to_the_gpt2_ids():
    assert tokenizer.encode("Hello, I'm a language model,") == [
        15496,
        11,
        314,
        1101,
        257,
        3303,
        2746,
        11,
    ]


def test_literal_endoftext_in_text_encodes_without_raising():
    ids = tokenizer.encode("the end<|endoftext|>of text")
    assert tokenizer.EOT_ID not in ids
    assert tokenizer.decode(ids) == "the end<|endoftext|>of text"


def test_offline_encoding_is_built_from_the_rank_file():
    enc = tokenizer.get_encoding()
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256


def test_corrupted_rank_file_is_refused(tmp_path, monkeypatch):
    src = paths.data_dir() / tokenizer.RANKS_FILE
    bad = tmp_path / tokenizer.RANKS_FILE
    bad.write_bytes(src.read_bytes()[:1000])  # truncated
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(paths.DataFileError, match="corrupted or truncated"):
        tokenizer.get_encoding()


def test_no_rank_file_and_no_network_gives_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))  # empty folder

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding", offline)
    with pytest.raises(paths.DataFileError) as e:
        tokenizer.get_encoding()
    msg = str(e.value)
    assert "gpt2.tiktoken" in msg and "COURSE_DATA_DIR" in msg and "internet" in msg


def test_rank_file_copy_in_another_folder_works(tmp_path, monkeypatch):
    shutil.copy(paths.data_dir() / tokenizer.RANKS_FILE, tmp_path / tokenizer.RANKS_FILE)
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))
    assert tokenizer.encode("Hello") == [15496]
