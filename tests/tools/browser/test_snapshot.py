"""The snapshot helpers: ref renaming, the compact view, the length cap (pure, no browser)."""

from __future__ import annotations

from hermes_async.tools.browser._snapshot import (
    TRUNCATION_MARKER,
    RefTable,
    compact_snapshot,
    cut_snapshot,
    parse_ref,
)

PAGE = """- generic [active] [ref=f2e1]:
  - navigation [ref=f2e2]:
    - list [ref=f2e3]:
      - listitem [ref=f2e4]:
        - link "Home" [ref=f2e5] [cursor=pointer]:
          - /url: /
  - main [ref=f2e6]:
    - generic [ref=f2e8]:
      - heading "Welcome" [level=1] [ref=f2e9]
      - paragraph [ref=f2e10]:
        - text: Some
        - emphasis [ref=f2e11]: intro
    - group "Shipping" [ref=f2e12]:
      - radio "Fast" [ref=f2e13]
    - iframe [ref=f2e14]:
      - button "inner" [ref=f5e2]"""


def test_refs_are_renamed_in_order_and_resolve_back() -> None:
    table = RefTable()
    text, count = table.rewrite(PAGE)
    assert count == 14
    assert "[ref=f2" not in text and "[ref=f5" not in text
    assert 'link "Home" [ref=e5]' in text
    assert 'button "inner" [ref=e14]' in text
    assert table.resolve("@e5") == "f2e5"
    assert table.resolve("e14") == "f5e2"
    assert table.resolve("[ref=e8]") == "f2e9"  # f2e7 does not exist: numbers are dense
    assert table.resolve("@e99") is None
    assert table.resolve("nonsense") is None


def test_refs_are_stable_within_a_document_and_restart_with_a_new_one() -> None:
    table = RefTable()
    table.rewrite(PAGE)
    # The same document grows an element: old numbers stay, the new one gets the next.
    grown = PAGE.replace(
        '      - radio "Fast" [ref=f2e13]',
        '      - radio "Fast" [ref=f2e13]\n      - radio "Slow" [ref=f2e20]',
    )
    text, _ = table.rewrite(grown)
    assert 'radio "Fast" [ref=e12]' in text and 'radio "Slow" [ref=e15]' in text
    # Another document (new prefix): numbering starts over and old refs no longer resolve.
    text, count = table.rewrite('- generic [ref=f3e1]:\n  - button "Next" [ref=f3e2]')
    assert text == '- generic [ref=e1]:\n  - button "Next" [ref=e2]'
    assert count == 2
    assert table.resolve("@e2") == "f3e2"
    assert table.resolve("@e12") is None


def test_parse_ref_accepts_the_spellings_models_use() -> None:
    assert [parse_ref(r) for r in ("@e5", "e5", " @e12 ", "[ref=e7]")] == [5, 5, 12, 7]
    assert [parse_ref(r) for r in ("", "@x5", "5", "e", "@e5x")] == [None] * 5


def test_compact_view_drops_unnamed_containers_and_cursor_hints() -> None:
    text, _ = RefTable().rewrite(PAGE)
    compact = compact_snapshot(text)
    assert compact.splitlines() == [
        "- navigation [ref=e2]:",
        "  - list [ref=e3]:",
        "    - listitem [ref=e4]:",
        '      - link "Home" [ref=e5]:',
        "        - /url: /",
        "- main [ref=e6]:",
        '  - heading "Welcome" [level=1] [ref=e8]',
        "  - paragraph [ref=e9]:",
        "    - text: Some",
        "    - emphasis [ref=e10]: intro",
        '  - group "Shipping" [ref=e11]:',
        '    - radio "Fast" [ref=e12]',
        "  - iframe [ref=e13]:",
        '    - button "inner" [ref=e14]',
    ]


def test_cut_keeps_short_snapshots_and_cuts_long_ones_at_a_line_end() -> None:
    assert cut_snapshot("short", 8000) == "short"
    lines = "\n".join(f"- text: line {i:04d}" for i in range(1000))
    cut = cut_snapshot(lines, 8000)
    assert cut.endswith(TRUNCATION_MARKER)
    body = cut[: -len(TRUNCATION_MARKER)]
    assert len(body) <= 8000 and lines.startswith(body) and body.endswith(tuple("0123456789"))
    # One huge line: cut inside it (no line end near the limit).
    assert cut_snapshot("x" * 9000, 8000) == "x" * 8000 + TRUNCATION_MARKER
