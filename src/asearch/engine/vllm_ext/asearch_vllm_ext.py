"""A vLLM worker extension (`--worker-extension-cls asearch_vllm_ext.WeightReload`): in-place reloads that
also refresh weights one module shares with another (a tied LM head).

vLLM's `reload_weights` loads a checkpoint layer by layer and runs each loaded layer's
`quant_method.process_weights_after_loading`. A tied checkpoint holds the embedding only, so the LM head
(whose `weight` is the embedding's Parameter) is never loaded: its Parameter gets the new values, but what
the head *computes with* is whatever processing made of the old ones. On CPU that is a prepacked copy
(oneDNN / sgl-kernel GEMM), so logits kept coming from the old head. Re-running the processing of every
module that shares a Parameter makes them derive from the new values again.

Imported only by vLLM (its torch, not asearch's); method names carry the `asearch_` prefix because vLLM
refuses an extension whose attribute names clash with the worker's.
"""

from __future__ import annotations

from typing import Any


def modules_sharing_parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every module that holds a Parameter another module holds too, each once, grouped by
    the Parameter they share (for a tied model: the embedding, then the LM head)."""
    owners: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append((name, module))
    shared = {name: module for group in owners.values() if len(group) > 1 for name, module in group}
    return list(shared.items())


class WeightReload:
    """Mixed into vLLM's worker class; its methods are called through `POST /collective_rpc`."""

    def asearch_reload_weights(self, weights_path: str) -> dict[str, Any]:
        """`reload_weights(weights_path=...)`, then re-process the modules that share Parameters.

        Returns {"refreshed": [module names]} (empty for an untied model)."""
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        refreshed = []
        for name, module in modules_sharing_parameters(model):
            method = getattr(module, "quant_method", None)
            if method is not None:
                # Idempotent for unquantized layers: re-packs the GEMM weight on CPU, nothing on GPU.
                method.process_weights_after_loading(module)
                refreshed.append(name)
        return {"refreshed": refreshed}

    def asearch_extension_version(self) -> int:
        """Answers a probe: the server was started with this extension (1: `asearch_reload_weights`)."""
        return 1
