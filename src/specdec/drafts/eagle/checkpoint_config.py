"""Reading an EAGLE checkpoint's ``config.json``, and the checks every format shares.

:class:`CheckpointError` (every bad checkpoint raises it, naming the file
and the field); :func:`_field` reads one field of a JSON object checked to be
of a kind; the feature layers a head reads are checked against the target's
depth, and a head's position limit below the target's context is raised to
it (with a logged warning). The formats themselves:
:mod:`~specdec.drafts.eagle.checkpoint_own`,
:mod:`~specdec.drafts.eagle.checkpoint_reference` and
:mod:`~specdec.drafts.eagle.checkpoint_speculators`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs

from specdec.drafts.eagle.head import EagleConfig
from specdec.errors import InvalidConfigError, SpecDecError

__all__ = ["CheckpointError"]

# checkpoint loading logs under the name of the module that gathers it (specdec.drafts.eagle.checkpoints)
logger = logging.getLogger("specdec.drafts.eagle.checkpoints")


class CheckpointError(SpecDecError, ValueError):
    """A checkpoint is missing, malformed, or does not match its model."""


def _read_config(path: Path) -> dict[str, Any]:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"no config.json in {path}")
    try:
        doc = json.loads(cfg_file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not UTF-8 text (corrupt?): {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"{cfg_file} must hold a JSON object, got a JSON {_json_type(doc)}")
    return doc


_MISSING: Any = object()


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _field(doc: dict[str, Any], key: str, kind: str, cfg_file: Path, *, default: Any = _MISSING,
           minimum: float | None = None, nullable: bool = False, where: str = "") -> Any:
    """``doc[key]`` checked to be of ``kind`` ("int", "float", "bool", "dict",
    "int_list"), or ``default`` when absent (required when no default); a
    :class:`CheckpointError` naming ``cfg_file`` and the field otherwise."""
    name = where + key
    if key not in doc:
        if default is _MISSING:
            raise CheckpointError(f"{cfg_file}: required field {name!r} is missing")
        return default
    value = doc[key]
    if value is None and nullable:
        return None
    if kind == "int_list":
        if (not isinstance(value, list) or not value
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            raise CheckpointError(f"{cfg_file}: field {name!r} must be a non-empty array of integers, got {value!r}")
        if minimum is not None and min(value) < minimum:
            raise CheckpointError(f"{cfg_file}: field {name!r} must hold integers >= {minimum:g}, got {value!r}")
        return tuple(value)
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "dict": isinstance(value, dict),
    }[kind]
    if not ok:
        what = {"int": "an integer", "float": "a number", "bool": "true or false", "dict": "a JSON object"}[kind]
        raise CheckpointError(f"{cfg_file}: field {name!r} must be {what}, got {_json_type(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise CheckpointError(f"{cfg_file}: field {name!r} must be >= {minimum:g}, got {value!r}")
    return float(value) if kind == "float" else value


def _depth(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidConfigError(f"{what} must be a positive integer, got {n!r}")
    return n


def _target_depth(target: Any, target_num_layers: int | None) -> int | None:
    """The target's layer count: ``target_num_layers``, else ``target.config.num_hidden_layers``; None if unknown."""
    if target_num_layers is not None:
        return _depth(target_num_layers, "target_num_layers")
    n = getattr(getattr(target, "config", None), "num_hidden_layers", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _check_layers(layers: tuple[int, ...], n: int, source: Any, error: type[Exception] = CheckpointError) -> None:
    """Features are ``hidden_states[l]``, ``0 <= l <= n`` for a target of ``n`` layers."""
    bad = [l for l in layers if not 0 <= l <= n]
    if bad:
        raise error(f"{source}: feature layer(s) {bad} of the head do not exist in a target with {n} layers "
                    f"(its features are hidden_states[0..{n}]); the head was made for another target")


def _target_context(target: Any, target_max_positions: int | None) -> int | None:
    """The target's context (``target_max_positions``, else its config's ``max_position_embeddings``); None if unknown."""
    if target_max_positions is not None:
        return _depth(target_max_positions, "target_max_positions")
    cfg = getattr(target, "config", None)
    getter = getattr(cfg, "get_text_config", None)
    cfg = getter() if getter is not None else cfg
    n = getattr(cfg, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _raise_position_limit(config: EagleConfig, target: Any, target_max_positions: int | None, source: Any) -> EagleConfig:
    """``config`` with a position limit below the target's context raised to it, with a logged note."""
    limit, context = config.max_position_embeddings, _target_context(target, target_max_positions)
    if limit is None or context is None or context <= limit:
        return config
    logger.warning(
        "%s: the head's max_position_embeddings (%d) is below the target's context (%d); raised to %d. RoPE "
        "needs no new weights, but the head was trained on shorter contexts: acceptance may be lower beyond %d "
        "positions (the output law is unchanged)", source, limit, context, context, limit)
    return attrs.evolve(config, max_position_embeddings=context)
