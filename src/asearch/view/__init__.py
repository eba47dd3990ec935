"""The run viewer (`asearch view`): a local web page over train, eval, demo, synth and ask outputs.

`create_app(paths, ViewConfig())` builds the FastAPI app; it only reads run directories.
"""

from asearch.view.runs import Catalog, RunKind, detect
from asearch.view.server import ViewConfig, create_app

__all__ = ["Catalog", "RunKind", "ViewConfig", "create_app", "detect"]
