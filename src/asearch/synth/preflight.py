"""Fail fast: every server a synthesis run will call must accept a connection before any seed starts.

Without this check a run against a server that is not up retried every request of every seed, logged each
seed as an error and ended with nothing written. A server counts as up when it answers anything at its
url (a 404 too): the check is about the address, not the API, which the first real call tests.
"""

from __future__ import annotations

import httpx

from asearch.errors import RemoteError
from asearch.synth.backend import backend_kind
from asearch.synth.config import SynthConfig


def endpoints_to_check(
    cfg: SynthConfig, *, backend: bool = True, solver: bool = True, agent: bool = True
) -> dict[str, str]:
    """{config key: url} of the servers the parts built from `cfg` call (a flag False: that part is given)."""
    found: dict[str, str] = {}
    kind = backend_kind(cfg.backend)
    if backend and kind.uses_generator:
        for key, endpoint in (("llm.generator", cfg.llm.generator), ("llm.judge", cfg.llm.judge)):
            if endpoint is not None:
                found[f"{key}.engine.base_url"] = str(endpoint.engine.base_url)
    if solver and cfg.solver.engine.base_url:
        found["solver.engine.base_url"] = cfg.solver.engine.base_url
    if agent and kind.agentic:
        engine = cfg.agent_engine()
        if engine.base_url:
            key = "agent.engine.base_url" if cfg.agent.engine is not None else "llm.generator.engine.base_url"
            found.setdefault(key, engine.base_url)
    return found


async def check_endpoints(endpoints: dict[str, str], *, timeout_s: float = 10.0) -> None:
    """Raise RemoteError naming every {config key: url} that refuses a connection or does not answer."""
    failures = []
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for key, url in endpoints.items():
            try:
                await client.get(url)
            except httpx.HTTPError as e:
                failures.append(f"{key}={url}: {type(e).__name__}: {e or 'no answer'}")
    if failures:
        raise RemoteError(
            "cannot reach the server(s) this synthesis calls, so no seed was started:\n  "
            + "\n  ".join(failures)
            + "\nStart the server first (e.g. `asearch engine serve MODEL --port 8000`, or vLLM) or fix the url."
        )
