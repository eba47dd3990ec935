"""The network layer under every asearch client and server: one retry policy, one JSON client per event loop,
loopback checks and free ports. It imports nothing of asearch but `config` and `errors` (the bottom layers).

    RetryConfig / RetryPolicy   retries, jittered backoff, Retry-After, the retryable statuses (net.retry)
    JsonClient                  JSON calls to one base URL under that policy (net.client)
    LoopClient                  the httpx client of the running event loop
"""

from asearch.net.client import JsonClient, LoopClient, error_detail
from asearch.net.ports import free_port, is_loopback
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
