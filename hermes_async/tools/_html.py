"""Turn fetched bodies into text for the model: HTML to Markdown-ish text, and head/tail cuts.

``trafilatura`` (the ``web`` extra, imported lazily) extracts the main content; ``basic``
(standard library) keeps boilerplate but never fails. ``auto`` falls back to ``basic`` when
trafilatura is missing or finds nothing. Pure, synchronous, bounded by the input size.
"""

from __future__ import annotations

import html as html_lib
import logging
import re
from html.parser import HTMLParser
from typing import Literal

from hermes_async.errors import ConfigError

__all__ = ("basic_html_to_text", "cut_head_tail", "html_to_text", "is_html", "is_text")

#: Media types converted from HTML.
_HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})
#: Non-``text/*`` media types that are returned as text unchanged.
_TEXT_MEDIA_TYPES = frozenset(
    {"application/json", "application/xml", "application/javascript", "application/ld+json"}
)

_SKIP = frozenset(
    {
        "script",
        "style",
        "noscript",
        "template",
        "svg",
        "canvas",
        "iframe",
        "head",
        "object",
        "title",
    }
)
_BLOCK = frozenset(
    {
        "p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "br",
        "tr", "table", "ul", "ol", "dl", "dt", "dd", "blockquote", "figure", "figcaption",
        "form", "hr", "address", "details", "summary",
    }
)  # fmt: skip
_HEADINGS = {"h1": "#", "h2": "##", "h3": "###", "h4": "####", "h5": "#####", "h6": "######"}
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "source"})
logger = logging.getLogger(__name__)

_TITLE_OPEN = re.compile(r"<title", re.IGNORECASE)
_TITLE_CLOSE = re.compile(r"</title\s*>", re.IGNORECASE)
#: Characters searched for the ``<title>``.
_TITLE_SEARCH_CHARS = 200_000
#: Characters of an unfinished construct at the end (``<a<a<a...``, ``<!--`` never closed)
#: given to ``HTMLParser.close``, which is quadratic in them on Python before 3.11.13.
_MAX_UNFINISHED_CHARS = 2048


def is_html(media_type: str) -> bool:
    """Whether ``media_type`` (lower case, no parameters) is HTML."""
    return media_type in _HTML_MEDIA_TYPES


def is_text(media_type: str) -> bool:
    """Whether ``media_type`` is a text format returned as is."""
    return media_type.startswith("text/") or media_type in _TEXT_MEDIA_TYPES


def _html_title(html: str) -> str | None:
    """The document's ``<title>``, unescaped and whitespace-collapsed, or ``None``."""
    # Three forward searches, not one regex: a backtracking search is quadratic on a page of
    # unclosed "<title>" tags.
    opening = _TITLE_OPEN.search(html, 0, _TITLE_SEARCH_CHARS)
    if opening is None:
        return None
    start = html.find(">", opening.end(), _TITLE_SEARCH_CHARS) + 1
    closing = _TITLE_CLOSE.search(html, start, _TITLE_SEARCH_CHARS) if start else None
    if closing is None:
        return None
    title = " ".join(html_lib.unescape(html[start : closing.start()]).split())
    return title or None


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._line: list[str] = []
        self._skip_depth = 0
        self._pre_depth = 0
        self._prefix = ""

    def _flush(self) -> None:
        text = "".join(self._line)
        if not self._pre_depth:
            text = " ".join(text.split())
        if text.strip():
            self.lines.append(self._prefix + text)
        elif self.lines and self.lines[-1] != "":
            self.lines.append("")
        self._line = []
        self._prefix = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            if tag not in _VOID:
                self._skip_depth += 1
            return
        if self._skip_depth:
            return
        if tag in _HEADINGS:
            self._flush()
            self._prefix = _HEADINGS[tag] + " "
        elif tag == "li":
            self._flush()
            self._prefix = "- "
        elif tag == "pre":
            self._flush()
            self.lines.append("```")
            self._pre_depth += 1
        elif tag in ("td", "th"):
            self._line.append(" | ")
        elif tag in _BLOCK:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
            return
        if self._skip_depth:
            return
        if tag == "pre" and self._pre_depth:
            text = "".join(self._line).strip("\n")
            if text:
                self.lines.extend(text.splitlines())
            self._line = []
            self.lines.append("```")
            self._pre_depth -= 1
        elif tag in _HEADINGS or tag == "li" or tag in _BLOCK:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self._line.append(data)

    def result(self) -> str:
        self._flush()
        text = "\n".join(self.lines).strip()
        return re.sub(r"\n{3,}", "\n\n", text)


def basic_html_to_text(html: str) -> str:
    """Convert HTML to Markdown-like plain text with the standard library only."""
    parser = _TextParser()
    parser.feed(html)
    # What ``feed`` left is an unfinished construct and all after it: cut it before ``close``.
    parser.rawdata = parser.rawdata[:_MAX_UNFINISHED_CHARS]
    parser.close()
    return parser.result()


def _trafilatura_available() -> bool:
    """Whether the optional trafilatura converter can be imported."""
    try:
        import trafilatura  # noqa: F401
    except ImportError:
        return False
    return True


def _trafilatura_extract(html: str, url: str | None) -> str | None:
    try:
        import trafilatura
    except ImportError:
        raise ConfigError(
            "html_extractor='trafilatura' needs the trafilatura package; install the web extra: "
            "pip install 'hermes-async[web]' (or set html_extractor='auto' or 'basic')"
        ) from None
    result = trafilatura.extract(
        html,
        url=url,
        output_format="markdown",
        include_comments=False,
        include_tables=True,
        include_links=False,
        favor_recall=True,
    )
    return result if isinstance(result, str) and result.strip() else None


def html_to_text(
    html: str,
    *,
    url: str | None = None,
    extractor: Literal["auto", "trafilatura", "basic"] = "auto",
) -> tuple[str | None, str]:
    """Convert an HTML page to ``(title, text)``.

    Args:
        url: The page's URL (helps trafilatura resolve relative metadata).
        extractor: ``auto``, ``trafilatura`` or ``basic``.

    Raises:
        ConfigError: ``extractor="trafilatura"`` but the ``web`` extra is not installed.
    """
    title = _html_title(html)
    text: str | None = None
    if extractor == "trafilatura" or (extractor == "auto" and _trafilatura_available()):
        try:
            text = _trafilatura_extract(html, url)
        except ConfigError:
            raise
        except Exception as exc:  # hostile input must not fail the page: fall back, say so
            logger.warning(
                "trafilatura failed on %s (%s: %s); using the basic converter",
                url or "a page",
                type(exc).__name__,
                exc,
            )
    if text is None:
        text = basic_html_to_text(html)
    return title, text


def cut_head_tail(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the first ~70 % and last ~30 % of ``max_chars``; return the text and if it was cut."""
    if len(text) <= max_chars:
        return text, False
    head_len = max_chars * 7 // 10
    tail_len = max_chars - head_len
    omitted = len(text) - head_len - tail_len
    note = (
        f"\n\n[... {omitted:,} characters omitted from the middle of this page "
        f"({len(text):,} characters in total) ...]\n\n"
    )
    return text[:head_len] + note + text[len(text) - tail_len :], True
