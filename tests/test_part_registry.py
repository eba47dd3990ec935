"""The Registry behind tools, engine kinds and launchers: self-registration by module, taken names,
suggestions for unknown names, and entries scoped to a block."""

from __future__ import annotations

import sys
import textwrap

import pytest

from asearch.errors import ConfigError
from asearch.registry import Registry


@pytest.fixture
def plugins(tmp_path, monkeypatch) -> Registry:
    """The registry of a package `plugins_pkg` on sys.path: a module that registers, one that does not, and
    a private one."""
    pkg = tmp_path / "plugins_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from asearch.registry import Registry\n"
        "PLUGINS = Registry('plugin', 'plugins_pkg', wants=lambda source: 'PLUGINS.add(' in source)\n"
    )
    (pkg / "_private.py").write_text("raise RuntimeError('modules starting with _ are not imported')\n")
    (pkg / "heavy.py").write_text("IMPORTED = True\n")
    (pkg / "alpha.py").write_text(
        textwrap.dedent(
            """
            from plugins_pkg import PLUGINS


            class Alpha: ...


            PLUGINS.add("alpha", Alpha, origin=Alpha)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("plugins_pkg")]:
        monkeypatch.delitem(sys.modules, name)
    import plugins_pkg

    return plugins_pkg.PLUGINS


def test_modules_register_themselves_on_the_first_lookup(plugins: Registry) -> None:
    assert "plugins_pkg.alpha" not in sys.modules
    assert plugins.names() == ["alpha"]
    assert plugins.get("alpha").__name__ == "Alpha"
    assert "plugins_pkg.heavy" not in sys.modules  # `wants` skipped it: it registers nothing


def test_an_unknown_name_names_the_nearest_and_all(plugins: Registry) -> None:
    with pytest.raises(ConfigError, match=r"unknown plugin 'alpah'; did you mean 'alpha'\? \(registered: alpha\)"):
        plugins.get("alpah")
    assert plugins.find("beta") is None


def test_a_taken_name_is_an_error_but_a_reimport_is_not(plugins: Registry) -> None:
    class Beta: ...

    class Other: ...

    plugins.add("beta", Beta, origin=Beta)
    plugins.add("beta", Beta, origin=Beta)  # the same class again (a module imported twice)
    with pytest.raises(ValueError, match=r"plugin 'beta' is taken by .*Beta"):
        plugins.add("beta", Other, origin=Other)
    with pytest.raises(TypeError, match="needs a non-empty name"):
        plugins.add("", Other, origin=Other)


def test_entries_added_in_a_temporary_block_are_gone_after_it(plugins: Registry) -> None:
    class Gamma: ...

    with plugins.temporary():
        plugins.add("gamma", Gamma, origin=Gamma)
        assert plugins.names() == ["alpha", "gamma"]
    assert plugins.names() == ["alpha"]


def test_config_fields_take_registered_names_and_name_the_nearest() -> None:
    """Every config field that picks a part is a str checked against its registry (not a Literal)."""
    from pydantic import ValidationError

    from asearch.agent.loop import AgentConfig
    from asearch.rl.advantages import AdvantageConfig
    from asearch.rl.loss import LossConfig
    from asearch.synth.config import SynthConfig
    from asearch.tools.build import ToolSourceConfig
    from asearch.web.sources import WebConfig

    for make, near in [
        (lambda: ToolSourceConfig(method="bm2"), "search method 'bm2'; did you mean 'bm25'"),
        (lambda: AdvantageConfig(estimator="rlo"), "advantage estimator 'rlo'; did you mean 'rloo'"),
        (lambda: LossConfig(correction="tiss"), "loss correction 'tiss'; did you mean 'tis'"),
        (lambda: WebConfig(reader="jian"), "web reader 'jian'; did you mean 'jina'"),
        (lambda: SynthConfig(backend="grap"), "synth backend 'grap'; did you mean 'graph'"),
        (lambda: AgentConfig(style="guidd"), "agent style 'guidd'; did you mean 'guided'"),
    ]:
        with pytest.raises((ValidationError, ConfigError), match=near):
            make()
