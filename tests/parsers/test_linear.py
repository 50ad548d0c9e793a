"""Work is linear in the length of the stream, for every parser name and any chunking.

Cost is measured as this thread's CPU time (``time.thread_time``), the best of five runs, the
two sizes taking turns: on a shared machine wall time swings several-fold with other
processes' load, CPU time much less, and taking turns gives both sizes the same load.
The inputs are made of the formats' own markers (and, for the name case, long call headers),
the text that drives a parser through the most states per character.
"""

from __future__ import annotations

import gc
import random
import time

import pytest

from hermes_async.parsers import get_parser, list_parsers
from tests.parsers.helpers import ATOMS

#: 4x the input may cost at most this many times as much (linear: ~4).
MAX_RATIO = 6.0


def _costs(name: str, texts: tuple[str, ...], chunk: int) -> list[float]:
    """The least CPU time of five runs of each text, the texts taking turns."""
    best = [float("inf")] * len(texts)
    gc.collect()
    gc.disable()  # a collection of the whole test process inside one run is not the parser's cost
    try:
        for _ in range(5):
            for k, text in enumerate(texts):
                parser = get_parser(name)
                start = time.thread_time()
                for i in range(0, len(text), chunk):
                    parser.feed(text[i : i + chunk])
                parser.finish()
                best[k] = min(best[k], time.thread_time() - start)
    finally:
        gc.enable()
    return best


def _atoms(name: str, count: int, seed: int) -> str:
    rng = random.Random(seed)
    atoms = ATOMS[name]
    return "".join(rng.choice(atoms) for _ in range(count))


@pytest.mark.parametrize("chunk", [1, 10**9], ids=["one-char", "whole"])
@pytest.mark.parametrize("name", [n for n in list_parsers() if n in ATOMS])
def test_all_marker_input_costs_linear_time(name: str, chunk: int) -> None:
    # Random markers cut into names that never end: before names were counted as they grew,
    # deepseek_v4 took 8.2x the time for 4x this input (a name's parts summed per chunk).
    text = _atoms(name, 2000 if chunk == 1 else 20_000, seed=3)
    small, large = _costs(name, (text[: len(text) // 4], text), chunk)
    assert large < MAX_RATIO * small, (name, chunk, small, large)


def test_a_long_call_header_costs_no_more_per_character_than_a_short_one() -> None:
    def headers(length: int) -> str:
        unit = "<｜DSML｜tool_call_begin｜>" + "a" * length + "\n{}\n< | DSML | tool_call_end >"
        return unit * (60_000 // len(unit))

    short, long = _costs("deepseek_v4", (headers(20), headers(500)), 1)
    # Before: 2.7x as much per character at 400 characters as at 10 (quadratic per name).
    assert long < 1.6 * short, (short, long)
