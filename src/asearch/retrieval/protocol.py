"""Wire format of the retrieval server (/retrieve, /access, /health, /stats), shared by server and client.

Compatible with Search-R1 / verl / ASearcher clients (`queries` + `topk` + `return_scores`) and with
SkyRL's single `query` string. Also holds the one url normalisation rule every page lookup uses.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from asearch.corpus.types import Page, Passage
from asearch.retrieval.base import PageStore, SearchHit


class _Wire(BaseModel):
    """Requests reject unknown keys so a typo (`top_k`) is a 422 naming the key, not a silent default."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- /retrieve


class RetrieveRequest(_Wire):
    """`{"queries": [...], "topk": k, "return_scores": bool}`, or `{"query": "..."}` in place of `queries`."""

    queries: list[str] | None = Field(None, description="Queries to run as one batch.")
    query: str | None = Field(
        None, description="A single query (SkyRL style); the answer still nests one list."
    )
    topk: int | None = Field(None, ge=1, description="Hits per query; the server default when omitted.")
    return_scores: bool = Field(False, description="Wrap each doc as {document, score}.")

    @model_validator(mode="after")
    def _one_of_query_or_queries(self) -> RetrieveRequest:
        if (self.queries is None) == (self.query is None):
            raise ValueError("give exactly one of 'queries' (a list of strings) or 'query' (a string)")
        return self

    def query_list(self) -> list[str]:
        return self.queries if self.queries is not None else [self.query or ""]


class Doc(BaseModel):
    """One retrieved passage: `contents` is the quoted title line + text (wiki-18 style)."""

    model_config = ConfigDict(extra="ignore")  # other servers add their own fields; we keep ours

    id: str
    contents: str
    url: str = ""
    title: str = ""
    text: str = ""

    def to_passage(self) -> Passage:
        text = self.text
        if not text and not self.title:  # a Search-R1 server sends only id + contents
            return Passage(id=self.id, title="", text=self.contents, url=self.url)
        return Passage(id=self.id, title=self.title, text=text, url=self.url)


class ScoredDoc(BaseModel):
    document: Doc
    score: float

    def to_hit(self) -> SearchHit:
        return SearchHit(passage=self.document.to_passage(), score=self.score)


_TRUNCATED = (
    "Queries of the request cut to the server's max_query_chars before searching (0 from servers without it)."
)


class RetrieveResponse(BaseModel):
    """`{"result": [[doc, ...], ...], "truncated_queries": n}`: one list per query, best first."""

    result: list[list[Doc]]
    truncated_queries: int = Field(0, description=_TRUNCATED)


class ScoredRetrieveResponse(BaseModel):
    """`{"result": [[{"document": doc, "score": s}, ...], ...]}` (when `return_scores` is true)."""

    result: list[list[ScoredDoc]]
    truncated_queries: int = Field(0, description=_TRUNCATED)


def hits_to_wire(hits: list[list[SearchHit]], return_scores: bool) -> list[list[dict[str, Any]]]:
    """The `result` value of /retrieve as plain dicts (skips pydantic on the hot path)."""
    if return_scores:
        return [[{"document": h.passage.to_doc(), "score": float(h.score)} for h in row] for row in hits]
    return [[h.passage.to_doc() for h in row] for row in hits]


# --------------------------------------------------------------------------- /access


class AccessRequest(_Wire):
    urls: list[str] = Field(
        description="Urls to fetch; each is normalised (see normalize_url) before lookup."
    )


class PageDoc(BaseModel):
    url: str
    title: str = ""
    contents: str

    def to_page(self) -> Page:
        return Page(url=self.url, title=self.title, contents=self.contents)


class AccessResponse(BaseModel):
    """`{"result": [page-or-null, ...]}` in request order; null means the url is not in the corpus."""

    result: list[PageDoc | None]


# --------------------------------------------------------------------------- /health, /stats


class HealthResponse(BaseModel):
    status: str
    retriever: str
    pages: int
    uptime_s: float
    info: dict[str, Any] = Field(default_factory=dict)


class Percentiles(BaseModel):
    """Nearest-rank percentiles over the rolling window, milliseconds; None before the first sample."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    samples: int = 0


class EndpointStats(BaseModel):
    requests: int = 0
    errors: int = 0
    status_codes: dict[str, int] = Field(default_factory=dict)
    latency_ms: Percentiles = Field(default_factory=Percentiles)


class BatchStats(BaseModel):
    batches: int = 0
    queries: int = 0
    max_size: int = 0
    size_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="Queries per retriever call, bucketed by powers of two ('1', '2', '3-4', ...).",
    )
    latency_ms: Percentiles = Field(default_factory=Percentiles)


class StatsResponse(BaseModel):
    uptime_s: float
    endpoints: dict[str, EndpointStats]
    batching: BatchStats
    truncated_queries: int = Field(0, description="Queries cut to max_query_chars since the server started.")
    index: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body: `detail` is one readable sentence naming the field or limit at fault."""

    detail: str


# --------------------------------------------------------------------------- urls

_WRAPPERS = (("<", ">"), ('"', '"'), ("'", "'"), ("`", "`"), ("[", "]"), ("(", ")"))


def normalize_url(raw: str) -> str:
    """Clean a url as an agent writes it: strip whitespace and any wrapping `<>`, quotes, backticks, brackets."""
    url = raw.strip()
    changed = True
    while changed and len(url) >= 2:
        changed = False
        for left, right in _WRAPPERS:
            if url.startswith(left) and url.endswith(right):
                url, changed = url[1:-1].strip(), True
    return url


def url_variants(raw: str) -> list[str]:
    """Lookup keys tried in order: the normalised url; it without its `#fragment`; that with its trailing
    slash removed (or added when it had none). Duplicates are tried once."""
    url = normalize_url(raw)
    if not url:
        return []
    base = url.split("#", 1)[0]
    toggled = base.rstrip("/") if base.endswith("/") else base + "/"
    keys: list[str] = []
    for key in (url, base, toggled):
        if key and key not in keys:
            keys.append(key)
    return keys


def lookup_page(pages: PageStore, raw_url: str) -> Page | None:
    """The page for `raw_url` under the normalisation rule (`url_variants`), or None if none is stored."""
    for key in url_variants(raw_url):
        page = pages.get(key)
        if page is not None:
            return page
    return None
