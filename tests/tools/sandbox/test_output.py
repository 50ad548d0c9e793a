"""OutputCapture: the one head + tail buffer."""

from __future__ import annotations

import pytest

from hermes_async.tools.sandbox.output import OutputCapture


def test_under_the_limit_everything_is_kept() -> None:
    cap = OutputCapture(10)
    cap.feed(b"abc")
    cap.feed(b"defg")
    assert (cap.value(), cap.text(), cap.truncated, cap.dropped) == (
        b"abcdefg",
        "abcdefg",
        False,
        0,
    )


def test_over_the_limit_head_and_tail_are_kept_with_a_marker() -> None:
    cap = OutputCapture(10)
    for chunk in (b"0123", b"4567", b"89ab", b"cdef"):
        cap.feed(chunk)
    assert cap.truncated and cap.dropped == 6
    assert cap.value() == b"01234\n\n... [6 bytes of output omitted] ...\n\nbcdef"
    assert cap.text() == "01234\n\n... [6 bytes of output omitted] ...\n\nbcdef"


def test_memory_is_bounded_however_much_is_fed() -> None:
    cap = OutputCapture(1000)
    for _ in range(10_000):
        cap.feed(b"y" * 997)
    assert cap.dropped == 10_000 * 997 - 1000
    assert len(cap.value()) < 1100


def test_a_character_cut_by_the_truncation_is_replaced_not_merged() -> None:
    cap = OutputCapture(4)
    cap.feed("é".encode() + b"x" + "€".encode())  # c3 a9 | 78 e2 82 ac
    assert cap.text().startswith("é") and cap.text().endswith("\ufffd\ufffd")


def test_unbounded_and_invalid_limits() -> None:
    cap = OutputCapture(None)
    cap.feed(b"z" * 5_000_000)
    assert len(cap.value()) == 5_000_000 and not cap.truncated
    with pytest.raises(ValueError, match="output_limit must be >= 0 bytes or None, got -1"):
        OutputCapture(-1)
    zero = OutputCapture(0)
    zero.feed(b"abc")
    assert zero.value() == b"\n\n... [3 bytes of output omitted] ...\n\n"
