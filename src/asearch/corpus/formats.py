"""Read corpus jsonl files (wiki-18, title/text, pages) into Documents and Pages; write them back atomically.

Every reader streams (one line in memory at a time) and names file, line and field on bad input.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from asearch.corpus.types import Document, Page
from asearch.errors import DataFormatError
from asearch.files import iter_jsonl, write_jsonl  # noqa: F401  (re-exported by asearch.corpus)

SYNTHETIC_URL_SCHEME = "corpus"
"""Documents without a url get `corpus://<file name without .jsonl>/<percent-encoded id>`."""

_FORMATS_HELP = (
    '{"id","contents"} (wiki-18), {"id","title","text"[,"url"]} or {"url","contents"[,"title"]} (pages)'
)

# A first line is taken as a page title only if it is short and not a sentence (see `looks_like_title`).
_TITLE_MAX_CHARS = 150
_TITLE_MAX_WORDS = 15


def corpus_name_for(path: str | Path) -> str:
    """The corpus name of a jsonl file: its file name without `.jsonl` (`data/wiki-18.jsonl` -> `wiki-18`)."""
    name = Path(path).name
    for suffix in (".jsonl", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def synthetic_url(corpus_name: str, doc_id: str) -> str:
    """A stable url for a document that has none: `corpus://<corpus name>/<id>` (both percent-encoded)."""
    return f"{SYNTHETIC_URL_SCHEME}://{quote(corpus_name, safe='')}/{quote(doc_id, safe='')}"


def strip_title_quotes(line: str) -> str:
    """`"Title"` -> `Title` (wiki-18 wraps titles in double quotes); other strings are only trimmed."""
    line = line.strip()
    if len(line) >= 2 and line[0] == '"' and line[-1] == '"':
        return line[1:-1].strip()
    return line


def looks_like_title(line: str) -> bool:
    """Short, non-empty and not ending like a sentence or a clause: how a page's heading line looks."""
    line = line.strip()
    return (
        0 < len(line) <= _TITLE_MAX_CHARS
        and len(line.split()) <= _TITLE_MAX_WORDS
        and line[-1] not in ".!?:;,"
    )


# --------------------------------------------------------------------------- field checks


def _str_field(
    obj: dict[str, Any], field: str, path: Path, line: int, *, required: bool = True
) -> str | None:
    """`obj[field]` as a non-empty string, or a DataFormatError naming file, line and field."""
    if field not in obj:
        if not required:
            return None
        raise DataFormatError(path, line, field, f"missing (this line looks like {_guess_format(obj)})")
    value = obj[field]
    if not isinstance(value, str):
        raise DataFormatError(
            path, line, field, f"expected a string, got {type(value).__name__} {value!r:.60}"
        )
    if not value.strip():
        raise DataFormatError(path, line, field, "is empty")
    return value


def _id_field(obj: dict[str, Any], path: Path, line: int) -> str:
    """Ids may be strings or integers (some dumps write `"id": 12`); they are returned as strings."""
    value = obj.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _str_field(obj, "id", path, line)  # type: ignore[return-value]


def _guess_format(obj: dict[str, Any]) -> str:
    keys = set(obj)
    if "contents" in keys and "url" in keys and "id" not in keys:
        return 'a pages line {"url","contents"}'
    if "contents" in keys:
        return 'a wiki-18 line {"id","contents"}'
    if keys & {"title", "text"}:
        return 'a {"id","title","text"} line'
    return f"none of the accepted formats ({_FORMATS_HELP})"


# --------------------------------------------------------------------------- one line -> one record


def _split_titled_contents(contents: str) -> tuple[str, str]:
    """wiki-18 `contents`: the first line is the (quoted) title, the rest the text. No newline: no title."""
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents.strip()
    return strip_title_quotes(first), rest.strip()


def _page_title_and_text(
    obj: dict[str, Any], url: str, contents: str, path: Path, line: int
) -> tuple[str, str]:
    """Title and body of a pages line: an explicit `title`, else a title-like first line, else the url."""
    first, newline, rest = contents.partition("\n")
    heading = strip_title_quotes(first)
    title = _str_field(obj, "title", path, line, required=False)
    if title is not None:
        title = title.strip()
        return title, (rest.strip() if newline and heading == title else contents.strip())
    if newline and rest.strip() and looks_like_title(heading):
        return heading, rest.strip()
    return url, contents.strip()


def _is_page_line(obj: dict[str, Any]) -> bool:
    """No id and no text: a pages line (or a broken one, whose missing field will be named)."""
    return "id" not in obj and "text" not in obj and ("contents" in obj or "url" in obj)


def parse_document(obj: dict[str, Any], path: Path, line: int, corpus_name: str) -> Document:
    """Turn one parsed jsonl object of any accepted format into a Document (see module docstring)."""
    if "contents" in obj and "id" in obj:  # wiki-18 (our passage exports add url and title)
        doc_id = _id_field(obj, path, line)
        contents = _str_field(obj, "contents", path, line)
        assert contents is not None
        title, text = _split_titled_contents(contents)
        if not text:
            raise DataFormatError(path, line, "contents", "no text after the title line")
        url = _str_field(obj, "url", path, line, required=False) or synthetic_url(corpus_name, doc_id)
        return Document(id=doc_id, title=title, text=text, url=url)
    if _is_page_line(obj):  # pages line: the url is the id
        url = _str_field(obj, "url", path, line)
        contents = _str_field(obj, "contents", path, line)
        assert url is not None and contents is not None
        title, text = _page_title_and_text(obj, url, contents, path, line)
        if not text:
            raise DataFormatError(path, line, "contents", "no text after the title line")
        return Document(id=url, title=title, text=text, url=url)
    if "title" in obj or "text" in obj:
        doc_id = _id_field(obj, path, line)
        title = _str_field(obj, "title", path, line)
        text = _str_field(obj, "text", path, line)
        assert title is not None and text is not None
        url = _str_field(obj, "url", path, line, required=False) or synthetic_url(corpus_name, doc_id)
        return Document(id=doc_id, title=title.strip(), text=text.strip(), url=url)
    if "id" in obj:
        raise DataFormatError(path, line, "contents", f"missing: expected {_FORMATS_HELP}")
    raise DataFormatError(path, line, None, f"unrecognised keys {sorted(obj)}: expected {_FORMATS_HELP}")


def document_page_contents(doc: Document) -> str:
    """The access-tool text of a document: its title on the first line, then its text."""
    return f"{doc.title}\n{doc.text}" if doc.title else doc.text


# --------------------------------------------------------------------------- streaming readers


def read_documents(path: str | Path) -> Iterator[Document]:
    """Stream the Documents of a jsonl file; the format is detected per line.

    Accepted lines: wiki-18 `{"id","contents"[,"url"]}` (title = first line of contents, quotes
    stripped), `{"id","title","text"[,"url"]}`, and pages `{"url","contents"[,"title"]}` (id = url).
    Lines without a url get `synthetic_url(corpus_name_for(path), id)`.
    """
    path = Path(path)
    name = corpus_name_for(path)
    for line, obj in iter_jsonl(path):
        yield parse_document(obj, path, line, name)


def read_pages(path: str | Path) -> Iterator[Page]:
    """Stream the Pages (access-tool units) of a jsonl file, one per url.

    Pages lines `{"url","contents"[,"title"]}` are used as they are; document lines become a page
    of title + text. Consecutive lines with the same url (the passages of one article) are merged
    into one page, in order; a url that comes back after another url gives a second page.
    """
    path = Path(path)
    name = corpus_name_for(path)
    url: str | None = None
    title = ""
    parts: list[str] = []
    for line, obj in iter_jsonl(path):
        doc = parse_document(obj, path, line, name)
        if _is_page_line(obj):  # a page keeps its contents exactly (title line included)
            first_part = more_part = str(obj["contents"]).strip()
        else:
            first_part, more_part = document_page_contents(doc), doc.text
        if doc.url == url:
            parts.append(more_part)
            continue
        if url is not None:
            yield Page(url=url, title=title, contents="\n".join(parts))
        url, title, parts = doc.url, doc.title, [first_part]
    if url is not None:
        yield Page(url=url, title=title, contents="\n".join(parts))


def document_lines(path: str | Path, doc_id: str, limit: int = 2) -> list[int]:
    """The lines of a jsonl corpus whose document id is `doc_id`, the first `limit` of them: where a
    duplicate id is. A second pass over the file, made only to name both lines in an error."""
    path = Path(path)
    name = corpus_name_for(path)
    found: list[int] = []
    for line, obj in iter_jsonl(path):
        if parse_document(obj, path, line, name).id == doc_id:
            found.append(line)
            if len(found) == limit:
                break
    return found


# --------------------------------------------------------------------------- writing


