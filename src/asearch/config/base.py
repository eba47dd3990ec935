"""Load pydantic config models from YAML plus `a.b=value` overrides, with errors that say where.

Every component config subclasses `Config` (unknown keys are errors). `load_config(Model, path,
overrides)` reads the YAML, applies overrides, validates, and reports the file, line and nearest
valid key for any mistake.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from asearch.errors import ConfigError, DataFormatError
from asearch.files import read_utf8_text

M = TypeVar("M", bound=BaseModel)


class Config(BaseModel):
    """Base for every config model: unknown keys are rejected; values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    # True for a model that is one value rather than a set of knobs (a distribution: kind + parameters):
    # a mapping given for such a field replaces the field's default instead of being merged over it.
    whole_value: ClassVar[bool] = False


# --------------------------------------------------------------------------- YAML with line numbers


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that remembers the line of every mapping key, keyed by dotted path."""


def load_yaml(path: str | Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML mapping; return (data, {dotted.key: 1-based line})."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    try:
        text = read_utf8_text(path)
    except DataFormatError as e:  # a binary file, or text in another encoding
        raise ConfigError(str(e)) from None
    try:
        node = yaml.compose(text, Loader=_LineLoader)
    except yaml.reader.ReaderError as e:  # a character YAML refuses (NUL, other control characters)
        where = f"{path}:{text.count(chr(10), 0, e.position) + 1}"
        raise ConfigError(f"{where}: invalid YAML: {e.reason} (character U+{e.character:04X})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if node is None:
        return {}, {}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: top level must be a mapping of keys")
    lines: dict[str, int] = {}

    def walk(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = f"{prefix}{k.value}"
                lines[key] = k.start_mark.line + 1
                walk(v, key + ".")

    walk(node, "")
    data = yaml.load(text, Loader=yaml.SafeLoader) or {}
    return data, lines


# --------------------------------------------------------------------------- overrides


def _parse_value(raw: str) -> Any:
    """`3` -> 3, `true` -> True, `[a, b]` -> list, `{a: 1}` -> dict, `null` -> None, anything else stays a
    string: `query: ` too, which YAML alone would read as a mapping (a prefix value, not a section)."""
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw
    if isinstance(value, dict) and not raw.lstrip().startswith("{"):
        return raw
    return value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r}: empty key segment")
        node = data
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = _parse_value(raw)
    return data


# --------------------------------------------------------------------------- validation


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the sub-model reached by following `loc` (best effort)."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return []
        field = cur.model_fields.get(str(part))
        if field is None:
            return []
        cur = field.annotation
        # unwrap Optional[Model] / Model | None
        args = getattr(cur, "__args__", None)
        if args:
            subs = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            cur = subs[0] if subs else cur
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return list(cur.model_fields)
    return []


def _explain(model: type[BaseModel], err: ValidationError, source: str, lines: Mapping[str, int]) -> str:
    msgs = []
    for e in err.errors():
        loc = tuple(e["loc"])
        dotted = ".".join(str(p) for p in loc)
        line = lines.get(dotted)
        where = f"{source}:{line}" if line else source
        if e["type"] == "extra_forbidden":
            valid = _fields_at(model, loc[:-1])
            near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"; did you mean {'.'.join([*map(str, loc[:-1]), near[0]])!r}?" if near else ""
            msgs.append(f"{where}: unknown key {dotted!r}{hint} (valid here: {', '.join(valid)})")
        else:
            given = _what_was_given(model, loc, e.get("input"), e["msg"], source, lines)
            msgs.append(f"{where}: {dotted or '<root>'}: {e['msg']}{given}")
    return "\n".join(msgs)


def _what_was_given(
    model: type[BaseModel], loc: tuple[Any, ...], got: Any, msg: str, source: str, lines: Mapping[str, int],
    limit: int = 80,
) -> str:
    """The offending value, short. A mapping (a validator refused a whole section, e.g. for a renamed key) is
    never printed: the keys of it that the message names and that are not fields here are, each with its line
    and the nearest valid key."""
    if not isinstance(got, Mapping):
        shown = repr(got)
        return f" (got {shown if len(shown) <= limit else shown[: limit - 3] + '...'})"
    valid = _fields_at(model, loc)
    named = [k for k in got if str(k) not in valid and re.search(rf"(?<![\w.]){re.escape(str(k))}(?!\w)", msg)]
    parts = []
    for key in named if valid and "unknown key" not in msg else []:
        dotted = ".".join([*map(str, loc), str(key)])
        near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
        line = lines.get(dotted)
        parts.append(
            f"{dotted!r}" + (f" at {source}:{line}" if line else "") + (f", nearest valid key {near[0]!r}" if near else "")
        )
    return f" (key {'; '.join(parts)})" if parts else ""


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    base: Mapping[str, Any] | None = None,
) -> M:
    """Build `model` from optional YAML `path`, then `base` defaults underneath, then `overrides` on top."""
    data: dict[str, Any] = dict(base or {})
    lines: dict[str, int] = {}
    source = "<overrides>"
    if path is not None:
        file_data, lines = load_yaml(path)
        if not isinstance(file_data, dict):
            raise ConfigError(f"{path}: top level must be a mapping of keys")
        data = _deep_merge(data, file_data)
        source = str(path)
    overrides = list(overrides)
    apply_overrides(data, overrides)
    data = _under_field_defaults(model, data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(model, e, source, lines)) from None


def _under_field_defaults(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """Put the values a field's own default sets (e.g. `Field(default_factory=lambda: SFTConfig(steps=1500))`)
    under a partial mapping given for it, recursively: `sft.bf16=false` changes bf16 and keeps steps=1500,
    where validation alone would build SFTConfig(bf16=False) from the class defaults."""
    out = dict(data)
    for name, field in model.model_fields.items():
        sub = out.get(name)
        if not isinstance(sub, dict):
            continue
        default = field.get_default(call_default_factory=True)
        if getattr(default, "whole_value", False):
            continue
        if isinstance(default, BaseModel):
            out[name] = _under_field_defaults(type(default), _deep_merge(default.model_dump(exclude_unset=True), sub))
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out[name] = _under_field_defaults(field.annotation, sub)
    return out


def _deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically) so every run records what it ran with."""
    from asearch.files import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
