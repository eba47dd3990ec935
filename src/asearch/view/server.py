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
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import Field, field_validator

from asearch.config import Config
from asearch.errors import DataFormatError
from asearch.net import is_loopback
from asearch.view import pages
from asearch.view.records import OUTCOMES, TrajectoryRow, matches
from asearch.view.runs import Catalog, EvalRun, Run, SynthRun, TrainRun, synth_question

__all__ = ["ViewConfig", "create_app"]

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
    cfg = cfg or ViewConfig()
    catalog = Catalog(paths)
    app = FastAPI(title="asearch view", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.catalog = catalog
    poll_ms = int(cfg.poll_s * 1000)
    loopback_only = is_loopback(cfg.host)
    allowed_hosts = {"127.0.0.1", "localhost", "::1", cfg.host.strip("[]")}

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        # Bound to loopback, refuse requests naming another host: a web page elsewhere could otherwise
        # read the runs through DNS rebinding (its name resolving to 127.0.0.1).
        if loopback_only:
            host = request.headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1 : host.find("]")]
            if name not in allowed_hosts:
                return Response(f"host {host!r} not allowed", status_code=421)
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = _CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    def get_run(run_id: str | None, *kinds: str) -> Run:
        if not run_id:
            raise HTTPException(400, "missing ?run=")
        try:
            run = catalog.get(run_id)
        except KeyError:
            raise HTTPException(404, f"no run {run_id!r}") from None
        if kinds and run.kind not in kinds:
            raise HTTPException(400, f"run {run_id!r} is a {run.kind} run, not {' or '.join(kinds)}")
        return run

    def html_page(title: str, body: str, active: str) -> HTMLResponse:
        return HTMLResponse(pages.document(title, body, active=active, poll_ms=poll_ms))

    # ---------------------------------------------------------------- pages

    @app.get("/", response_class=HTMLResponse)
    def overview(metric: str = "em", estimate: str = "avg_at_k") -> HTMLResponse:
        if metric not in ("em", "f1", "cem", "judge") or estimate not in ("avg_at_k", "pass_at_k"):
            raise HTTPException(
                400,
                f"metric must be em|f1|cem|judge and estimate avg_at_k|pass_at_k, got {metric!r}, {estimate!r}",
            )
        with catalog.lock:
            runs = catalog.all()
            infos = [r.info(cfg.live_window_s) for r in runs]
            evals = [
                (info, *r.summary()) for info, r in zip(infos, runs, strict=True) if isinstance(r, EvalRun)
            ]
            body = pages.overview(
                infos,
                train=[i for i in infos if i["kind"] == "train"],
                evals=evals,
                details={r.id: pages.run_details(r) for r in runs},
                empty_roots=[str(p) for p in catalog.empty_roots],
                metric=metric,
                estimate=estimate,
            )
        return html_page("Overview", body, "overview")

    def filtered(run: Run, outcome: str, dataset: str, min_turns: str | None, max_turns: str | None, q: str):
        if outcome and outcome not in OUTCOMES:
            raise HTTPException(400, f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        f = pages.TrajectoryFilters(outcome, dataset, _int(min_turns), _int(max_turns), q.strip())
        rows = run.trajectory_rows()
        criteria = {"outcome": f.outcome, "dataset": f.dataset, "text": f.text}
        criteria |= {"min_turns": f.min_turns, "max_turns": f.max_turns}
        kept = [r for r in reversed(rows) if matches(r, **criteria)]  # newest first
        return f, rows, kept

    @app.get("/trajectories", response_class=HTMLResponse)
    def trajectories(
        run: str = "",
        outcome: str = "",
        dataset: str = "",
        min_turns: str | None = None,
        max_turns: str | None = None,
        q: str = "",
        page: int = 0,
        open: str | None = None,  # noqa: A002 - the query parameter's name
        id: str = "",  # noqa: A002
    ) -> HTMLResponse:
        with catalog.lock:
            catalog.refresh()
            order = {"train": 0, "eval": 1, "trajectories": 2}  # the first is shown when no ?run= is given
            browsable = sorted(
                (r for r in catalog.runs.values() if r.browsable), key=lambda r: order.get(r.kind, 3)
            )
            choices = [(r.id, f"{r.name} ({r.kind})") for r in browsable]
            if not browsable:
                return html_page(
                    "Trajectories",
                    pages.nothing("Trajectories", "None of the runs has trajectories."),
                    "trajectories",
                )
            the_run = get_run(run or browsable[0].id)
            if not the_run.browsable:
                raise HTTPException(400, f"run {the_run.id!r} ({the_run.kind}) has no trajectories")
            f, rows, kept = filtered(the_run, outcome, dataset, min_turns, max_turns, q)
            pages_n = max(1, math.ceil(len(kept) / cfg.page_size))
            page = min(max(page, 0), pages_n - 1)
            shown = kept[page * cfg.page_size : (page + 1) * cfg.page_size]
            open_i = _int(open)
            detail = _detail(the_run, open_i, id) if open_i is not None else ""
            body = pages.trajectories_page(
                runs=choices,
                run_id=the_run.id,
                rows=shown,
                matched=len(kept),
                total=len(rows),
                page=page,
                page_size=cfg.page_size,
                datasets=sorted({r.dataset for r in rows if r.dataset}),
                filters=f,
                detail=detail,
                open_index=open_i,
            )
        return html_page("Trajectories", body, "trajectories")

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

    @app.get("/fragment/trajectory", response_class=HTMLResponse)
    def fragment(run: str, i: int, id: str = "") -> HTMLResponse:  # noqa: A002
        with catalog.lock:
            the_run = get_run(run)
            return HTMLResponse(_detail(the_run, i, id))

    @app.get("/synth", response_class=HTMLResponse)
    def synth(run: str = "", q: str = "", verified: str = "", page: int = 0) -> HTMLResponse:
        with catalog.lock:
            catalog.refresh()
            runs = [r for r in catalog.runs.values() if isinstance(r, SynthRun)]
            if not runs:
                return html_page(
                    "Synthesis", pages.nothing("Synthesis", "None of the runs is synthesis output."), "synth"
                )
            the_run = get_run(run or runs[0].id, "synth")
            assert isinstance(the_run, SynthRun)
            rows = the_run.questions.rows
            needle = q.strip().casefold()
            kept = [
                r
                for r in rows
                if (not verified or r.verified)
                and (not needle or needle in f"{r.question}\n{r.answer}".casefold())
            ]
            pages_n = max(1, math.ceil(len(kept) / cfg.page_size))
            page = min(max(page, 0), pages_n - 1)
            cards = []
            for r in kept[page * cfg.page_size : (page + 1) * cfg.page_size]:
                try:
                    rec = the_run.read(r.index)
                except DataFormatError as e:
                    cards.append(f'<p class="error">{pages.esc(e)}</p>')
                    continue
                cards.append(pages.synth_card(r.index + 1, rec, *synth_question(rec)))
            body = pages.synth_page(
                runs=[(r.id, r.name) for r in runs],
                run_id=the_run.id,
                cards=cards,
                matched=len(kept),
                total=len(rows),
                verified=sum(1 for r in rows if r.verified),
                page=page,
                page_size=cfg.page_size,
                text=q,
                only_verified=bool(verified),
                report=the_run.report.get(),
            )
        return html_page("Synthesis", body, "synth")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in _STATIC_FILES:
            raise HTTPException(404, f"no static file {name!r}")
        return Response(
            (STATIC / name).read_bytes(),
            media_type=_STATIC_FILES[name],
            headers={"Cache-Control": "no-cache"},
        )

    @app.get("/file/{run_id}/{name}")
    def run_file(run_id: str, name: str) -> FileResponse:
        the_run = get_run(run_id)
        if name not in the_run.images():  # a fixed list of names: no path from the request reaches the disk
            raise HTTPException(404, f"run {run_id!r} has no image {name!r}")
        return FileResponse(the_run.path / name, media_type="image/png")

    # ---------------------------------------------------------------- JSON

    @app.get("/api/runs")
    def api_runs() -> JSONResponse:
        with catalog.lock:
            infos = [r.info(cfg.live_window_s) for r in catalog.all()]
            return JSONResponse({"runs": infos, "waiting_for": [str(p) for p in catalog.empty_roots]})

    @app.get("/api/metrics")
    def api_metrics(run: str, cursor: int = 0, generation: int | None = None) -> JSONResponse:
        with catalog.lock:
            the_run = get_run(run, "train")
            assert isinstance(the_run, TrainRun)
            return JSONResponse(the_run.metrics_since(cursor, generation))

    @app.get("/api/trajectories")
    def api_trajectories(
        run: str,
        outcome: str = "",
        dataset: str = "",
        min_turns: str | None = None,
        max_turns: str | None = None,
        q: str = "",
        offset: int = 0,
        limit: int = 100,
    ) -> JSONResponse:
        with catalog.lock:
            the_run = get_run(run)
            if not the_run.browsable:
                raise HTTPException(400, f"run {run!r} ({the_run.kind}) has no trajectories")
            _, rows, kept = filtered(the_run, outcome, dataset, min_turns, max_turns, q)
            part: list[TrajectoryRow] = kept[max(offset, 0) : max(offset, 0) + min(max(limit, 0), 1000)]
            return JSONResponse(
                {"run": run, "total": len(rows), "matched": len(kept), "rows": [r.to_json() for r in part]}
            )

    @app.get("/api/trajectory")
    def api_trajectory(run: str, i: int, id: str = "", segments: bool = False) -> JSONResponse:  # noqa: A002
        with catalog.lock:
            the_run = get_run(run)
            if not the_run.browsable:
                raise HTTPException(400, f"run {run!r} ({the_run.kind}) has no trajectories")
            i = _resolve(the_run, i, id)
            try:
                record = the_run.open_trajectory(i)
            except DataFormatError as e:
                raise HTTPException(409, str(e)) from None
        if not segments:
            record = _without_token_ids(record)
        return JSONResponse({"run": run, "index": i, "record": record})

    @app.get("/api/eval")
    def api_eval() -> JSONResponse:
        with catalog.lock:
            out = []
            for r in catalog.all():
                if isinstance(r, EvalRun):
                    summary, source = r.summary()
                    out.append({"run": r.id, "name": r.name, "source": source, "summary": summary})
            return JSONResponse({"evals": out})

    @app.get("/api/synth")
    def api_synth(run: str, offset: int = 0, limit: int = 100) -> JSONResponse:
        with catalog.lock:
            the_run = get_run(run, "synth")
            assert isinstance(the_run, SynthRun)
            n = len(the_run.questions)
            lo = max(offset, 0)
            idx = range(lo, min(n, lo + min(max(limit, 0), 1000)))
            return JSONResponse({"run": run, "total": n, "records": [the_run.read(i) for i in idx]})

    return app


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
