"""The public API in `asearch/__init__.py`: every exported name resolves, `__all__` is sorted, and
`import asearch` alone loads none of the package's modules (no torch, no pydantic)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import asearch


def test_all_is_sorted_and_unique():
    assert asearch.__all__ == sorted(set(asearch.__all__))


@pytest.mark.parametrize("name", asearch.__all__)
def test_every_exported_name_resolves_to_its_definition(name):
    value = getattr(asearch, name)
    assert value is not None
    if name != "__version__":
        module = sys.modules[asearch._EXPORTS[name]]
        assert getattr(module, name) is value
        assert name in dir(asearch)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        asearch.not_a_name  # noqa: B018


def test_import_asearch_loads_nothing_heavy():
    code = (
        "import sys, asearch; "
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'asearch', 'torch', 'numpy', 'pydantic', 'transformers', 'httpx', 'yaml'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "asearch", out


def test_the_seams_and_entry_points_are_exported():
    for name in ("Engine", "Tokenizer", "Tool", "register_tool", "Trajectory", "RolloutWorkflow", "TrainConfig",
                 "train", "run_eval", "load_config", "AsearchError"):  # fmt: skip
        assert name in asearch.__all__, name
