"""The network layer under every asearch client and server: one retry policy, one JSON client per event loop,
loopback checks and free ports. It imports nothing of asearch but `config` and `errors` (the bottom layers).

    RetryConfig / RetryPolicy   retries, jittered backoff, Retry-After, the retryable statuses (net.retry)
    JsonClient                  JSON calls to one base URL under that policy (net.client)
    LoopClient                  the httpx client of the running event loop

The clients load on first use, so `from asearch.net import free_port` (servers, CLIs) imports no httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from asearch.net.ports import free_port, is_loopback

if TYPE_CHECKING:
    from asearch.net.client import JsonClient, LoopClient, error_detail
    from asearch.net.retry import (
        DEPRECATED_KEYS,
        RETRYABLE_STATUS,
        GaveUp,
        RemoteHTTPError,
        RetryConfig,
        RetryPolicy,
        RetryStats,
        TransientError,
        parse_retry_after,
    )

_LAZY = {
    **dict.fromkeys(("JsonClient", "LoopClient", "error_detail"), "asearch.net.client"),
    **dict.fromkeys(
        ("DEPRECATED_KEYS", "RETRYABLE_STATUS", "GaveUp", "RemoteHTTPError", "RetryConfig", "RetryPolicy",
         "RetryStats", "TransientError", "parse_retry_after"),
        "asearch.net.retry",
    ),
}  # fmt: skip

__all__ = [
    "DEPRECATED_KEYS",
    "RETRYABLE_STATUS",
    "GaveUp",
    "JsonClient",
    "LoopClient",
    "RemoteHTTPError",
    "RetryConfig",
    "RetryPolicy",
    "RetryStats",
    "TransientError",
    "error_detail",
    "free_port",
    "is_loopback",
    "parse_retry_after",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asearch.net' has no attribute {name!r}")
