"""The built-in samples of the benchmark environments: a few rows each, in the real format.

Written for this project (never copied from the datasets), so that every environment runs
offline and the tests and the testing kit's oracles use them. See docs/environments.md.
"""

from __future__ import annotations

from pathlib import Path

__all__ = (
    "SWE_SAMPLE",
    "TBLITE_SAMPLE",
    "TBLITE_TASKS",
    "WEB_RESEARCH_SAMPLE",
    "YC_BENCH_SAMPLE_PRESET",
)

_HERE = Path(__file__).parent

#: HermesSweEnv: three rows in bigcode/humanevalpack's format (with canonical solutions).
SWE_SAMPLE = _HERE / "swe_sample.jsonl"
#: TBLiteEvalEnv: three tasks as NousResearch/openthoughts-tblite rows (+ ``solution_tar``),
#: made from :data:`TBLITE_TASKS` by scripts/tblite/make_sample.py.
TBLITE_SAMPLE = _HERE / "tblite_sample.jsonl"
#: The Harbor task folders the TBLite sample rows are made from.
TBLITE_TASKS = _HERE / "tasks"
#: WebResearchEnv: six rows in google/frames-benchmark's format, with the fake web's pages.
WEB_RESEARCH_SAMPLE = _HERE / "web_research_sample.jsonl"
#: YCBenchEvalEnv: a small yc-bench preset (a TOML extending ``fast_test``).
YC_BENCH_SAMPLE_PRESET = _HERE / "yc_bench_sample.toml"
