"""Readable text from a fetched body: HTML through trafilatura (main content, no menus or scripts), PDF
through pypdf, plain text as is. Both libraries are optional (`pip install 'asearch[web]'`); without
trafilatura a simple built-in HTML-to-text pass is used."""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Literal

from asearch.errors import ToolError

log = logging.getLogger(__name__)

PageKind = Literal["html", "pdf", "text"]
Favor = Literal["balanced", "recall", "precision"]
INSTALL_HINT = "pip install 'asearch[web]'"

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
PDF_TYPES = frozenset({"application/pdf", "application/x-pdf"})
TEXT_TYPES = frozenset({"text/plain", "text/markdown", "text/x-markdown"})
READABLE_TYPES = HTML_TYPES | PDF_TYPES | TEXT_TYPES

_warned_no_trafilatura = False


@dataclass(frozen=True, slots=True)
class ExtractedText:
    title: str
    text: str
    kind: PageKind


def parse_content_type(header: str | None) -> tuple[str, str | None]:
    """`text/html; charset=ISO-8859-1` -> ("text/html", "iso-8859-1"); a missing header -> ("", None)."""
    if not header:
        return "", None
    mime, *params = (p.strip() for p in header.split(";"))
    charset = None
    for p in params:
        name, _, value = p.partition("=")
        if name.strip().lower() == "charset" and value:
            charset = value.strip().strip("\"'").lower()
    return mime.lower(), charset


def sniff_type(body: bytes) -> str:
    """A media type from the first bytes, for servers that send none."""
    head = body[:512].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return "application/pdf"
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")) or b"<html" in head:
        return "text/html"
    return "text/plain"


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([a-zA-Z0-9_\-]+)""", re.IGNORECASE)


def decode_text(body: bytes, charset: str | None, *, html: bool) -> str:
    """Bytes to text: the header's charset, else a `<meta charset>`, else UTF-8; bad bytes are replaced."""
    candidates = [charset]
    if html:
        m = _META_CHARSET.search(body[:4096])
        candidates.append(m.group(1).decode("ascii").lower() if m else None)
    for enc in (*candidates, "utf-8"):
        if not enc:
            continue
        try:
            return body.decode(enc, errors="replace")
        except LookupError:  # an unknown charset name: try the next
            continue
    return body.decode("utf-8", errors="replace")


def extract_text(
    body: bytes, mime: str, charset: str | None, url: str, *, favor: Favor = "balanced"
) -> ExtractedText:
    """The title and readable text of a body whose media type is `mime` ("" = unknown: sniffed)."""
    mime = mime or sniff_type(body)
    if mime in PDF_TYPES:
        return pdf_to_text(body)
    if mime in HTML_TYPES:
        return html_to_text(decode_text(body, charset, html=True), url, favor=favor)
    return ExtractedText(title="", text=decode_text(body, charset, html=False).strip(), kind="text")


def html_to_text(html: str, url: str, *, favor: Favor = "balanced") -> ExtractedText:
    """Main content via trafilatura (tables kept; `favor` trades recall against precision); the built-in
    pass when trafilatura is not installed or finds no main content."""
    global _warned_no_trafilatura
    fallback = _SimpleHtmlText.run(html)
    try:
        import trafilatura
    except ImportError:
        if not _warned_no_trafilatura:
            log.warning("trafilatura is not installed; using a simple HTML-to-text pass (%s)", INSTALL_HINT)
            _warned_no_trafilatura = True
        return fallback
    try:
        doc = trafilatura.bare_extraction(
            html,
            url=url,
            favor_recall=favor == "recall",
            favor_precision=favor == "precision",
            include_comments=False,
            include_tables=True,
            with_metadata=True,
        )
    except Exception as e:  # a parser crash on hostile markup is this page's problem, not the run's
        log.info("trafilatura failed on %s (%s); using the simple pass", url, e)
        return fallback

    def field(name: str) -> str:  # a Document since trafilatura 2, a dict before
        value = doc.get(name) if isinstance(doc, dict) else getattr(doc, name, None)
        return str(value or "").strip()

    text = field("text")
    if not text:
        return fallback
    title = field("title") or fallback.title
    return ExtractedText(title=title, text=text, kind="html")


def pdf_to_text(body: bytes) -> ExtractedText:
    """Text of every page of a PDF, pages separated by a blank line."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise ToolError(f"reading PDF pages needs pypdf, which is not installed ({INSTALL_HINT})") from None
    try:
        reader = PdfReader(io.BytesIO(body))
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
        title = ""
        meta = reader.metadata
        if meta is not None and meta.title:
            title = str(meta.title).strip()
    except Exception as e:  # pypdf raises many types on hostile files; any of them means "unreadable"
        kind = "PdfReadError" if isinstance(e, PdfReadError) else type(e).__name__
        raise ToolError(f"the PDF could not be read ({kind}: {e})") from None
    return ExtractedText(title=title, text="\n\n".join(p for p in pages if p), kind="pdf")


class _SimpleHtmlText(HTMLParser):
    """Visible text of an HTML page: scripts, styles, head and page chrome (menus, footers) dropped, block
    elements on their own lines."""

    _SKIP = frozenset(
        {
            "script",
            "style",
            "noscript",
            "template",
            "svg",
            "head",
            "iframe",
            "object",
            "nav",
            "footer",
            "aside",
        }
    )
    _BLOCK = frozenset(
        {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer",
         "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "dd", "dt", "hr", "nav", "main"}
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self._SKIP:
            self._skip_depth += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self._SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_parts.append(data)
        elif not self._skip_depth:
            self.parts.append(data)

    @classmethod
    def run(cls, html: str) -> ExtractedText:
        p = cls()
        try:
            p.feed(html)
            p.close()
        except Exception:  # HTMLParser is lenient; anything it still chokes on keeps what was read so far
            pass
        lines = (" ".join(line.split()) for line in "".join(p.parts).splitlines())
        text = "\n".join(line for line in lines if line)
        return ExtractedText(title=" ".join("".join(p.title_parts).split()), text=text, kind="html")
