"""`asearch serve`: the retrieval HTTP server."""


def serve() -> None:
    """Serve an index over HTTP."""
    raise NotImplementedError
