"""A vLLM worker extension (`--worker-extension-cls asearch_vllm_ext.WeightReload`): in-place reloads that
also refresh weights one module shares with another (a tied LM head), from a directory or from tensors a
trainer broadcasts over a weight group it shares with the servers (`asearch_weight_group.py`).

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
        return {"refreshed": self._asearch_refresh_shared()}

    def asearch_init_weight_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str,
        backend: str = "gloo", timeout_s: float = 600.0,
    ) -> dict[str, Any]:  # fmt: skip
        """Join the trainer's weight-broadcast group as rank `rank_offset` + this worker's rank; returns once
        every member has joined (see asearch_weight_group.py)."""
        wg = _weight_group_module()
        groups = self.__dict__.setdefault("_asearch_groups", {})
        if group_name in groups:
            self.asearch_destroy_weight_group(group_name)
        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        groups[group_name] = wg.open_group(
            master_address, int(master_port), rank, int(world_size), group_name=group_name, backend=backend,
            timeout_s=float(timeout_s),
        )  # fmt: skip
        return {"rank": rank}

    def asearch_receive_weights(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str, load: bool
    ) -> dict[str, Any]:
        """Receive one bucket over the group (one broadcast a tensor); with `load` (the last bucket) reload every
        tensor received since the last load in place, as `asearch_reload_weights` does from a directory."""
        wg = _weight_group_module()
        group = self.__dict__.get("_asearch_groups", {}).get(group_name)
        if group is None:
            raise RuntimeError(f"no weight group {group_name!r}: call asearch_init_weight_group first")
        device = getattr(self, "device", "cpu")
        received = self.__dict__.setdefault("_asearch_received", [])
        received.extend(wg.receive_tensors(group, names, dtypes, shapes, device))
        if not load:
            return {"received": len(names)}
        self._asearch_received: list[Any] = []
        self.reload_weights(weights_iterator=iter(received))  # type: ignore[attr-defined]
        return {"loaded": len(received), "refreshed": self._asearch_refresh_shared()}

    def asearch_destroy_weight_group(self, group_name: str) -> dict[str, Any]:
        group = self.__dict__.get("_asearch_groups", {}).pop(group_name, None)
        self._asearch_received = []
        if group is not None:
            group.close()
        return {"destroyed": group is not None}

    def _asearch_refresh_shared(self) -> list[str]:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        refreshed = []
        for name, module in modules_sharing_parameters(model):
            method = getattr(module, "quant_method", None)
            if method is not None:
                # Idempotent for unquantized layers: re-packs the GEMM weight on CPU, nothing on GPU.
                method.process_weights_after_loading(module)
                refreshed.append(name)
        return refreshed

    def asearch_extension_version(self) -> int:
        """Answers a probe: the server was started with this extension (1: `asearch_reload_weights`; 2: also
        the weight group, `asearch_init_weight_group` / `asearch_receive_weights`)."""
        return 2


def _weight_group_module() -> Any:
    try:
        import asearch_weight_group  # in vLLM's worker: this folder is on PYTHONPATH

        return asearch_weight_group
    except ImportError:  # imported as part of the asearch package: its sibling module
        from . import asearch_weight_group

        return asearch_weight_group
