"""One config system: pydantic models loaded from YAML, with `key.sub=value` CLI overrides."""

from asearch.config.base import Config, apply_overrides, dump_config, load_config, load_yaml

__all__ = ["Config", "apply_overrides", "dump_config", "load_config", "load_yaml"]
