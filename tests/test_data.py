import pytest
import torch

from helpers.core import data, paths


def test_whole_text_is_338_025_tokens():
    tokens = data.load_tokens()
    assert tokens.shape == (data.SHAKESPEARE_TOKENS,)
    assert tokens.dtype == torch.int64


def test_batches_are_shifted_by_one_and_wrap_around():
    tokens = torch.arange(100)
    loader = data.BatchLoader(tokens, batch_size=2, seq_len=10)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (2, 10) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)
    seen = [loader.next_batch()[0][0, 0].item() for _ in range(5)]
    assert seen == [20, 40, 60, 0, 20]  # 80 + 21 > 100 tokens: wraps to the start


def test_too_few_tokens_for_one_batch_is_a_clear_error():
    with pytest.raises(ValueError, match="lower B or T"):
        data.BatchLoader(torch.arange(10), batch_size=2, seq_len=10)


def test_corrupted_offline_text_is_never_used(tmp_path, monkeypatch):
    (tmp_path / data.SHAKESPEARE_FILE).write_text("First Citizen:\nBefore we proceed")  # truncated
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(paths.DataFileError, match="corrupted or truncated"):
        data.shakespeare_path()


def test_missing_data_offline_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.DATA_DIR_ENV, str(tmp_path / "empty"))
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    with pytest.raises(paths.DataFileError) as e:
        data.shakespeare_path()
    assert "COURSE_DATA_DIR" in str(e.value) and "internet" in str(e.value)
    assert not (tmp_path / "cache" / data.SHAKESPEARE_FILE).exists()


class _FakeResponse:
    """Stands in for urllib's response: serves ``body`` in chunks."""

    def __init__(self, body: bytes):
        self.left = body

    def read(self, n):
        chunk, self.left = self.left[:n], self.left[n:]
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_download_is_verified_and_cached(tmp_path, monkeypatch):
    good = (paths.data_dir() / data.SHAKESPEARE_FILE).read_bytes()
    monkeypatch.setenv(paths.DATA_DIR_ENV, "")
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    served = {"body": good[:5000]}  # first a truncated download, then the real file
    monkeypatch.setattr(
        "urllib.request.urlopen", lambda url, timeout: _FakeResponse(served["body"])
    )
    with pytest.raises(paths.DataFileError):
        data.shakespeare_path()
    assert not (tmp_path / data.SHAKESPEARE_FILE).exists()  # nothing corrupt left to train on
    served["body"] = good
    path = data.shakespeare_path()
    assert path == tmp_path / data.SHAKESPEARE_FILE and path.read_bytes() == good


def test_corrupted_cache_is_set_aside_and_fetched_again(tmp_path, monkeypatch):
    good = (paths.data_dir() / data.SHAKESPEARE_FILE).read_bytes()
    monkeypatch.setenv(paths.DATA_DIR_ENV, "")
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    (tmp_path / data.SHAKESPEARE_FILE).write_bytes(good[:-10])
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: _FakeResponse(good))
    assert data.shakespeare_path().read_bytes() == good
    assert (tmp_path / (data.SHAKESPEARE_FILE + ".corrupt")).exists()


def test_fetch_cli_copies_verified_files_into_a_folder(tmp_path):
    assert data.main(["fetch", "--into", str(tmp_path)]) == 0
    assert (tmp_path / "tinyshakespeare.txt").stat().st_size == 1_115_394
    assert (
        paths.sha256_of(tmp_path / "gpt2.tiktoken")
        == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    )


def test_fetch_into_an_existing_file_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert data.main(["fetch", "--into", str(f)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_default_tokens_are_still_the_whole_text():
    """Every training chapter calls load_tokens() with no argument: the whole stream, as before."""
    assert torch.equal(data.load_tokens(), data.load_tokens("all"))
    assert data.load_tokens().shape == (data.SHAKESPEARE_TOKENS,)


def test_train_and_val_splits_are_disjoint_and_cover_the_text():
    train, val = data.load_tokens("train"), data.load_tokens("val")
    assert (train.numel(), val.numel()) == (304_223, 33_802)
    assert (train.numel(), val.numel()) == data.split_sizes(data.SHAKESPEARE_TOKENS)
    assert torch.equal(torch.cat([train, val]), data.load_tokens())  # contiguous, in order
    assert val.data_ptr() == data.load_tokens()[train.numel() :].data_ptr()  # the tail, no copy
    assert data.load_tokens("val", val_fraction=0.2).numel() == round(0.2 * 338_025)


@pytest.mark.parametrize("kwargs", [{"split": "test"}, {"split": "val", "val_fraction": 0.0}])
def test_a_bad_split_is_a_clear_error(kwargs):
    with pytest.raises(ValueError, match="split must be one of|val_fraction must be between"):
        data.load_tokens(**kwargs)
