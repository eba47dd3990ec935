"""The viewer's web app: HTML pages plus the JSON endpoints the page polls for live updates.

GET /                       runs, training curves, evaluation tables (?metric=f1&estimate=pass_at_k)
GET /trajectories           browser: ?run=&outcome=correct|wrong|unscored&dataset=&min_turns=&max_turns=&q=&page=&open=
GET /synth                  synthesised questions: ?run=&q=&verified=1&page=
GET /fragment/trajectory    one trajectory as HTML (?run=&i=&id=), what a click in the browser loads
GET /api/runs               every run: kind, state (running | finished | idle), counts, skipped bad lines
GET /api/metrics            ?run=&cursor=N&generation=G: metric rows after the N the client has
GET /api/trajectories       ?run= + the browser's filters + offset/limit: list rows as JSON
GET /api/trajectory         ?run=&i=: one record as JSON (?segments=1 keeps the token ids)
GET /api/eval               every eval run's summary (summary.json, or computed live from results.jsonl)
GET /api/synth              ?run=&offset=&limit=: synthesised question records
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import Field, field_validator

from asearch.config import Config
from asearch.errors import DataFormatError
from asearch.net import is_loopback
from asearch.view import pages
from asearch.view.records import OUTCOMES, TrajectoryRow, matches
from asearch.view.runs import Catalog, EvalRun, Run, SynthRun, TrainRun, synth_question

__all__ = ["ViewConfig", "Viewer", "api_routes", "create_app", "page_routes"]

STATIC = Path(__file__).with_name("static")
_STATIC_FILES = {"viewer.js": "text/javascript; charset=utf-8", "viewer.css": "text/css; charset=utf-8"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class ViewConfig(Config):
    """`asearch view` settings."""

    host: str = Field(
        "127.0.0.1", description="Bind address; anything but loopback exposes the runs to the network."
    )
    port: int = Field(8765, ge=0, le=65535, description="TCP port (0: any free port).")
    poll_s: float = Field(
        2.0, gt=0, description="How often the page asks for new metric rows and run states."
    )
    page_size: int = Field(50, ge=1, le=1000, description="Trajectories or questions per page.")
    live_window_s: float = Field(
        120.0,
        gt=0,
        description="A run whose files changed this recently (and has no final summary) is 'running'.",
    )

    @field_validator("host")
    @classmethod
    def _host_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError(f"host must be an address or name, got {v!r}")
        return v.strip()


def _int(value: str | None) -> int | None:
    """A number from a form field, where an empty box means no filter."""
    if value is None or not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise HTTPException(400, f"expected a whole number, got {value!r}") from None


def create_app(paths: Sequence[str | Path], cfg: ViewConfig | None = None) -> FastAPI:
    """The viewer over the runs found under `paths` (run directories, trajectory or synthesis files)."""
    viewer = Viewer(Catalog(paths), cfg or ViewConfig())
    app = FastAPI(title="asearch view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.catalog = viewer.catalog
    app.state.viewer = viewer
    app.middleware("http")(_guard)
    app.include_router(page_routes)
    app.include_router(api_routes)
    return app


class Viewer:
    """What every route reads: the catalog of runs and the settings, with the lookups routes share."""

    def __init__(self, catalog: Catalog, cfg: ViewConfig) -> None:
        self.catalog, self.cfg = catalog, cfg
        self.poll_ms = int(cfg.poll_s * 1000)
        self.loopback_only = is_loopback(cfg.host)
        self.allowed_hosts = {"127.0.0.1", "localhost", "::1", cfg.host.strip("[]")}

    def host_allowed(self, host: str) -> bool:
        """Bound to loopback, only requests naming a loopback host (or the bound one) are served."""
        if not self.loopback_only:
            return True
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1 : host.find("]")]
        return name in self.allowed_hosts

    def get_run(self, run_id: str | None, *kinds: str) -> Run:
        if not run_id:
            raise HTTPException(400, "missing ?run=")
        try:
            run = self.catalog.get(run_id)
        except KeyError:
            raise HTTPException(404, f"no run {run_id!r}") from None
        if kinds and run.kind not in kinds:
            raise HTTPException(400, f"run {run_id!r} is a {run.kind} run, not {' or '.join(kinds)}")
        return run

    def browsable_run(self, run_id: str) -> Run:
        run = self.get_run(run_id)
        if not run.browsable:
            raise HTTPException(400, f"run {run_id!r} ({run.kind}) has no trajectories")
        return run

    def html_page(self, title: str, body: str, active: str) -> HTMLResponse:
        return HTMLResponse(pages.document(title, body, active=active, poll_ms=self.poll_ms))

    def page_of(self, items: list[Any], page: int) -> tuple[int, list[Any]]:
        """The page number clamped to the pages there are, and that page's items."""
        size = self.cfg.page_size
        page = min(max(page, 0), max(1, math.ceil(len(items) / size)) - 1)
        return page, items[page * size : (page + 1) * size]


def _viewer(request: Request) -> Viewer:
    return request.app.state.viewer


ViewerDep = Annotated[Viewer, Depends(_viewer)]


async def _guard(request: Request, call_next: Any) -> Response:
    # Bound to loopback, refuse requests naming another host: a web page elsewhere could otherwise
    # read the runs through DNS rebinding (its name resolving to 127.0.0.1).
    host = request.headers.get("host", "")
    if not _viewer(request).host_allowed(host):
        return Response(f"host {host!r} not allowed", status_code=421)
    response: Response = await call_next(request)
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@dataclass
class TrajectoryQuery:
    """The browser's filters as query parameters (empty: no filter)."""

    outcome: str = ""
    dataset: str = ""
    min_turns: str | None = None
    max_turns: str | None = None
    q: str = ""

    def filters(self) -> pages.TrajectoryFilters:
        if self.outcome and self.outcome not in OUTCOMES:
            raise HTTPException(400, f"outcome must be one of {', '.join(OUTCOMES)}, got {self.outcome!r}")
        return pages.TrajectoryFilters(
            self.outcome, self.dataset, _int(self.min_turns), _int(self.max_turns), self.q.strip()
        )


def _filtered(
    run: Run, query: TrajectoryQuery
) -> tuple[pages.TrajectoryFilters, list[TrajectoryRow], list[TrajectoryRow]]:
    """(the filters, every row of the run, the rows they keep, newest first)."""
    f = query.filters()
    rows = run.trajectory_rows()
    kept = [
        r for r in reversed(rows)
        if matches(r, outcome=f.outcome, dataset=f.dataset, text=f.text, min_turns=f.min_turns, max_turns=f.max_turns)
    ]  # fmt: skip
    return f, rows, kept


def _resolve(run: Run, i: int, traj_id: str) -> int:
    rows = run.trajectory_rows()
    if traj_id and not (0 <= i < len(rows) and rows[i].id == traj_id):
        # the file was rewritten since the link was made: find the trajectory by id
        i = next((r.index for r in rows if r.id == traj_id), -1)
    if not 0 <= i < len(rows):
        raise HTTPException(404, f"run {run.id!r} has no trajectory {traj_id or i!r}")
    return i


def _detail(run: Run, i: int, traj_id: str) -> str:
    i = _resolve(run, i, traj_id)
    try:
        record = run.open_trajectory(i)
    except DataFormatError as e:
        return f'<p class="error">{pages.esc(e)}</p>'
    return pages.trajectory_detail(run.id, i, record)


# --------------------------------------------------------------------------- pages

page_routes = APIRouter()


@page_routes.get("/", response_class=HTMLResponse)
def overview(viewer: ViewerDep, metric: str = "em", estimate: str = "avg_at_k") -> HTMLResponse:
    if metric not in ("em", "f1", "cem", "judge") or estimate not in ("avg_at_k", "pass_at_k"):
        raise HTTPException(
            400,
            f"metric must be em|f1|cem|judge and estimate avg_at_k|pass_at_k, got {metric!r}, {estimate!r}",
        )
    catalog = viewer.catalog
    with catalog.lock:
        runs = catalog.all()
        infos = [r.info(viewer.cfg.live_window_s) for r in runs]
        evals = [(info, *r.summary()) for info, r in zip(infos, runs, strict=True) if isinstance(r, EvalRun)]
        body = pages.overview(
            infos,
            train=[i for i in infos if i["kind"] == "train"],
            evals=evals,
            details={r.id: pages.run_details(r) for r in runs},
            empty_roots=[str(p) for p in catalog.empty_roots],
            metric=metric,
            estimate=estimate,
        )
    return viewer.html_page("Overview", body, "overview")


@page_routes.get("/trajectories", response_class=HTMLResponse)
def trajectories(
    viewer: ViewerDep,
    query: Annotated[TrajectoryQuery, Depends()],
    run: str = "",
    page: int = 0,
    open: str | None = None,  # noqa: A002 - the query parameter's name
    id: str = "",  # noqa: A002
) -> HTMLResponse:
    catalog = viewer.catalog
    with catalog.lock:
        catalog.refresh()
        order = {"train": 0, "eval": 1, "trajectories": 2}  # the first is shown when no ?run= is given
        browsable = sorted(
            (r for r in catalog.runs.values() if r.browsable), key=lambda r: order.get(r.kind, 3)
        )
        if not browsable:
            body = pages.nothing("Trajectories", "None of the runs has trajectories.")
            return viewer.html_page("Trajectories", body, "trajectories")
        the_run = viewer.get_run(run or browsable[0].id)
        if not the_run.browsable:
            raise HTTPException(400, f"run {the_run.id!r} ({the_run.kind}) has no trajectories")
        f, rows, kept = _filtered(the_run, query)
        page, shown = viewer.page_of(kept, page)
        open_i = _int(open)
        body = pages.trajectories_page(
            runs=[(r.id, f"{r.name} ({r.kind})") for r in browsable],
            run_id=the_run.id,
            rows=shown,
            matched=len(kept),
            total=len(rows),
            page=page,
            page_size=viewer.cfg.page_size,
            datasets=sorted({r.dataset for r in rows if r.dataset}),
            filters=f,
            detail=_detail(the_run, open_i, id) if open_i is not None else "",
            open_index=open_i,
        )
    return viewer.html_page("Trajectories", body, "trajectories")


@page_routes.get("/fragment/trajectory", response_class=HTMLResponse)
def fragment(viewer: ViewerDep, run: str, i: int, id: str = "") -> HTMLResponse:  # noqa: A002
    with viewer.catalog.lock:
        return HTMLResponse(_detail(viewer.get_run(run), i, id))


@page_routes.get("/synth", response_class=HTMLResponse)
def synth(viewer: ViewerDep, run: str = "", q: str = "", verified: str = "", page: int = 0) -> HTMLResponse:
    catalog = viewer.catalog
    with catalog.lock:
        catalog.refresh()
        runs = [r for r in catalog.runs.values() if isinstance(r, SynthRun)]
        if not runs:
            body = pages.nothing("Synthesis", "None of the runs is synthesis output.")
            return viewer.html_page("Synthesis", body, "synth")
        the_run = viewer.get_run(run or runs[0].id, "synth")
        assert isinstance(the_run, SynthRun)
        rows = the_run.questions.rows
        needle = q.strip().casefold()
        kept = [
            r for r in rows
            if (not verified or r.verified) and (not needle or needle in f"{r.question}\n{r.answer}".casefold())
        ]  # fmt: skip
        page, shown = viewer.page_of(kept, page)
        body = pages.synth_page(
            runs=[(r.id, r.name) for r in runs],
            run_id=the_run.id,
            cards=[_synth_card(the_run, r.index) for r in shown],
            matched=len(kept),
            total=len(rows),
            verified=sum(1 for r in rows if r.verified),
            page=page,
            page_size=viewer.cfg.page_size,
            text=q,
            only_verified=bool(verified),
            report=the_run.report.get(),
        )
    return viewer.html_page("Synthesis", body, "synth")


def _synth_card(run: SynthRun, index: int) -> str:
    try:
        rec = run.read(index)
    except DataFormatError as e:
        return f'<p class="error">{pages.esc(e)}</p>'
    return pages.synth_card(index + 1, rec, *synth_question(rec))


@page_routes.get("/favicon.ico")
def favicon() -> Response:
    return Response(status_code=204)


@page_routes.get("/static/{name}")
def static(name: str) -> Response:
    if name not in _STATIC_FILES:
        raise HTTPException(404, f"no static file {name!r}")
    return Response(
        (STATIC / name).read_bytes(), media_type=_STATIC_FILES[name], headers={"Cache-Control": "no-cache"}
    )


@page_routes.get("/file/{run_id}/{name}")
def run_file(viewer: ViewerDep, run_id: str, name: str) -> FileResponse:
    the_run = viewer.get_run(run_id)
    if name not in the_run.images():  # a fixed list of names: no path from the request reaches the disk
        raise HTTPException(404, f"run {run_id!r} has no image {name!r}")
    return FileResponse(the_run.path / name, media_type="image/png")


# --------------------------------------------------------------------------- JSON

api_routes = APIRouter(prefix="/api")


@api_routes.get("/runs")
def api_runs(viewer: ViewerDep) -> JSONResponse:
    catalog = viewer.catalog
    with catalog.lock:
        infos = [r.info(viewer.cfg.live_window_s) for r in catalog.all()]
        return JSONResponse({"runs": infos, "waiting_for": [str(p) for p in catalog.empty_roots]})


@api_routes.get("/metrics")
def api_metrics(viewer: ViewerDep, run: str, cursor: int = 0, generation: int | None = None) -> JSONResponse:
    with viewer.catalog.lock:
        the_run = viewer.get_run(run, "train")
        assert isinstance(the_run, TrainRun)
        return JSONResponse(the_run.metrics_since(cursor, generation))


@api_routes.get("/trajectories")
def api_trajectories(
    viewer: ViewerDep,
    query: Annotated[TrajectoryQuery, Depends()],
    run: str,
    offset: int = 0,
    limit: int = 100,
) -> JSONResponse:
    with viewer.catalog.lock:
        _, rows, kept = _filtered(viewer.browsable_run(run), query)
        part = kept[max(offset, 0) : max(offset, 0) + min(max(limit, 0), 1000)]
        return JSONResponse(
            {"run": run, "total": len(rows), "matched": len(kept), "rows": [r.to_json() for r in part]}
        )


@api_routes.get("/trajectory")
def api_trajectory(viewer: ViewerDep, run: str, i: int, id: str = "", segments: bool = False) -> JSONResponse:  # noqa: A002
    with viewer.catalog.lock:
        the_run = viewer.browsable_run(run)
        i = _resolve(the_run, i, id)
        try:
            record = the_run.open_trajectory(i)
        except DataFormatError as e:
            raise HTTPException(409, str(e)) from None
    if not segments:
        record = _without_token_ids(record)
    return JSONResponse({"run": run, "index": i, "record": record})


@api_routes.get("/eval")
def api_eval(viewer: ViewerDep) -> JSONResponse:
    with viewer.catalog.lock:
        out = []
        for r in viewer.catalog.all():
            if isinstance(r, EvalRun):
                summary, source = r.summary()
                out.append({"run": r.id, "name": r.name, "source": source, "summary": summary})
        return JSONResponse({"evals": out})


@api_routes.get("/synth")
def api_synth(viewer: ViewerDep, run: str, offset: int = 0, limit: int = 100) -> JSONResponse:
    with viewer.catalog.lock:
        the_run = viewer.get_run(run, "synth")
        assert isinstance(the_run, SynthRun)
        n = len(the_run.questions)
        lo = max(offset, 0)
        idx = range(lo, min(n, lo + min(max(limit, 0), 1000)))
        return JSONResponse({"run": run, "total": n, "records": [the_run.read(i) for i in idx]})


def _without_token_ids(record: dict[str, Any]) -> dict[str, Any]:
    """The record with each segment's token lists replaced by their lengths (they are the bulk)."""

    def strip(traj: dict[str, Any]) -> dict[str, Any]:
        segs = traj.get("segments")
        if not isinstance(segs, list):
            return traj
        small = [
            {k: (len(v) if isinstance(v, list) else v) for k, v in s.items()} if isinstance(s, dict) else s
            for s in segs
        ]
        return {**traj, "segments": small}

    if isinstance(record.get("trajectory"), dict):
        return {**record, "trajectory": strip(record["trajectory"])}
    return strip(record)
