import pytest

from helpers.chapters import ch09_recompute as recompute_chapter
from helpers.measure import results


def _row(k, policy, ms, peak, held, blocks=12):
    return dict(
        checkpoint_every=k,
        checkpoint_policy=policy,
        checkpointed_blocks=blocks if k else 0,
        ms=ms,
        peak_bytes=peak,
        held_bytes=held,
    )


ROWS = [
    _row(0, "block", 50.0, None, 10 * 2**30),
    _row(1, "block", 60.0, None, 4 * 2**30),
    _row(1, "selective", 52.0, None, 7 * 2**30),
]


def test_table_is_markdown_with_one_row_per_setting_and_needs_off_first():
    text = recompute_chapter.table(ROWS)
    lines = text.splitlines()
    assert len(lines) == 2 + len(ROWS) and lines[1].startswith("|---")
    assert "every block, selective" in lines[4] and "+4%" in lines[4] and "7.00 GiB" in lines[4]
    with pytest.raises(ValueError, match="off"):
        recompute_chapter.table(ROWS[1:])


def test_conclusion_is_computed_from_the_rows():
    line = recompute_chapter.conclusion(ROWS)
    assert "memory held after forward 7.00 GiB against 10.00 GiB" in line
    assert "50% of the 6.00 GiB" in line and "+4%" in line and "+20%" in line
    assert len(line.splitlines()) == 3 and max(len(part) for part in line.splitlines()) <= 100
    peak_rows = [dict(r, peak_bytes=r["held_bytes"] + 2**30) for r in ROWS]
    assert "peak memory 8.00 GiB" in recompute_chapter.conclusion(peak_rows)
    with pytest.raises(ValueError, match="every block, selective"):
        recompute_chapter.conclusion(ROWS[:2])


def test_article_check_reads_the_committed_h200_result():
    ref = results.load("h200-checkpointing.json")
    line = recompute_chapter.article_check(ref)
    assert line.startswith("**The article says** checkpointing costs about 30% more compute")
    assert ref["device"] in line and ref["date"] in line and "2x larger batch" in line
    off = next(r for r in ref["rows"] if r["checkpoint_every"] == 0)
    assert f"{off['ms']:.1f} to" in line and "largest B under" in line
