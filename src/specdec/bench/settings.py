"""The settings of one ``specdec bench`` run: presets and flags, validated before any model loads.

:func:`resolve_settings` merges a ``--preset`` (:data:`PRESETS`) with the
flags into :class:`BenchSettings`; :func:`available_kinds` says which draft
kinds the flags make loadable; :func:`run_identity` is what a ``runs.jsonl``
must match to be resumed (docs/bench.md, "Resuming"). Bad input raises
:class:`~specdec.errors.InvalidConfigError`.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from specdec.bench.budget import Budget, parse_budget
from specdec.bench.hashes import HASH_KEY, draft_hashes, plugin_identity
from specdec.bench.kinds import draft_kinds
from specdec.bench.models import NAMED_TARGETS, auto_head_path, resolve_device
from specdec.bench.prompts import BenchPrompt
from specdec.bench.rows import RowSpec
from specdec.bench.runlog import prompts_digest
from specdec.bench.sweep import OPTIMUM_BATCH_REFUSAL
from specdec.errors import InvalidConfigError

__all__ = ["PRESETS", "Preset", "BenchSettings", "resolve_settings", "available_kinds", "model_source",
           "run_identity"]

_T = TypeVar("_T")


@attrs.frozen
class Preset:
    """Defaults of a ``--preset`` (every field can be overridden by its flag).

    Attributes:
        prompts: prompts taken from the prompt set, spread over its categories
            (None: all).
        max_new_tokens, temperatures, seeds, methods, budget: as the flags.
        profile_prompts, profile_steps: prompts and steps per prompt of the
            acceptance profiles (``--budget auto`` and Sequoia).
        pilot_tokens: tokens of each pilot generation with which ``--budget
            auto`` chooses rheo's sampled slots ``m`` at ``T > 0`` (one per
            profile prompt and candidate ``m``).
    """

    name: str
    prompts: int | None
    max_new_tokens: int
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]
    methods: str
    budget: str
    profile_prompts: int
    profile_steps: int
    pilot_tokens: int = 32


PRESETS: dict[str, Preset] = {
    "quick": Preset("quick", prompts=6, max_new_tokens=40, temperatures=(0.0, 1.0), seeds=(0,),
                    methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,hf-assisted", budget="auto",
                    profile_prompts=4, profile_steps=12),
    "full": Preset("full", prompts=None, max_new_tokens=128, temperatures=(0.0, 1.0), seeds=(0, 1),
                   methods="sd,specinfer,sequoia,eagle2,eagle3,rheo,rheo@eagle2,hf-assisted", budget="auto",
                   profile_prompts=8, profile_steps=16, pilot_tokens=64),
}
"""``quick`` (the default) finishes in under 10 minutes on a 2-core CPU; ``full``
runs the whole prompt set (hours on a CPU)."""


@attrs.frozen
class BenchSettings:
    """The validated settings of one run (preset defaults + flags; ``optimum``: ``--optimum``)."""

    preset: str
    methods: str
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]
    max_new_tokens: int
    budget: Budget | str  # a Budget, or "auto" (parse_budget)
    num_prompts: int | None
    profile_prompts: int
    profile_steps: int
    batch_size: int = 1
    pilot_tokens: int = 32
    optimum: bool = False


def _list(text: str, flag: str, parse: Callable[[str], _T]) -> tuple[_T, ...]:
    """The comma-separated values of a list flag (``--temperatures``, ``--seeds``): each parsed, none twice.

    Raises:
        InvalidConfigError: the list is empty or lists a value twice (``parse`` raises for a bad item).
    """
    out = [parse(item.strip()) for item in text.split(",") if item.strip()]
    if not out:
        raise InvalidConfigError(f"{flag} is empty")
    if len(set(out)) != len(out):
        raise InvalidConfigError(f"{flag} lists a value twice: {text!r}")
    return tuple(out)


def _floats(text: str, flag: str) -> tuple[float, ...]:
    def temperature(item: str) -> float:
        try:
            v = float(item)
        except ValueError:
            raise InvalidConfigError(f"{flag}: {item!r} is not a number") from None
        if not math.isfinite(v) or v < 0:
            raise InvalidConfigError(f"{flag}: temperatures must be finite and >= 0, got {item!r}")
        return v

    return _list(text, flag, temperature)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    def integer(item: str) -> int:
        try:
            return int(item)
        except ValueError:
            raise InvalidConfigError(f"{flag}: {item!r} is not an integer") from None

    return _list(text, flag, integer)


def resolve_settings(args: argparse.Namespace) -> BenchSettings:
    """Preset defaults overridden by the flags, validated.

    Raises:
        InvalidConfigError: unknown preset, malformed list, non-positive sizes.
    """
    if args.preset not in PRESETS:
        raise InvalidConfigError(f"unknown preset {args.preset!r}; choose one of: {', '.join(sorted(PRESETS))}")
    pre = PRESETS[args.preset]
    temps = _floats(args.temperatures, "--temperatures") if args.temperatures else pre.temperatures
    seeds = _ints(args.seeds, "--seeds") if args.seeds else pre.seeds
    max_new = pre.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise InvalidConfigError(f"--max-new-tokens must be >= 1, got {max_new}")
    if args.depth is not None and args.depth < 1:
        raise InvalidConfigError(f"--depth must be >= 1, got {args.depth}")
    budget = parse_budget(args.budget if args.budget is not None else pre.budget, args.depth)
    num = pre.prompts if args.num_prompts is None else (None if args.num_prompts == 0 else args.num_prompts)
    if num is not None and num < 1:
        raise InvalidConfigError(f"--num-prompts must be >= 0 (0 = all), got {args.num_prompts}")
    if args.threads is not None and args.threads < 1:
        raise InvalidConfigError(f"--threads must be >= 1, got {args.threads}")
    _check_device_flags(args)
    if args.max_prompt_tokens < 1:
        raise InvalidConfigError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    batch = getattr(args, "batch_size", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidConfigError(f"--batch-size must be an int >= 1, got {batch!r}")
    optimum = bool(getattr(args, "optimum", False))
    if optimum and batch > 1:
        raise InvalidConfigError(OPTIMUM_BATCH_REFUSAL)
    # `--methods ''` is an error (parse_rows), not "the preset's methods": only an absent flag means those
    methods = pre.methods if args.methods is None else args.methods
    return BenchSettings(args.preset, methods, temps, seeds, max_new, budget, num,
                         pre.profile_prompts, pre.profile_steps, batch, pre.pilot_tokens, optimum)


def available_kinds(args: argparse.Namespace) -> list[str]:
    """Draft kinds that will be loadable, decided from the flags alone (no loading): every kind of
    :func:`~specdec.bench.kinds.draft_kinds` (the draft LM, ``lm-full`` the same draft LM, the
    model-free ``ngram``, the registered drafts with a factory), the EAGLE heads when a head is found."""
    heads = ("eagle2", "eagle3")  # loadable when --eagleV-head finds a head
    kinds = [k for k in draft_kinds() if k not in heads]
    for v in (2, 3):
        spec = getattr(args, f"eagle{v}_head")
        if spec == "none":
            continue
        if spec == "auto":
            # SmolLM2: the shipped head; Gemma-3: a head its user exported to the cache (none shipped)
            if auto_head_path(args.target, v) is not None:
                kinds.append(f"eagle{v}")
        else:
            if not os.path.exists(os.path.expanduser(spec)):
                raise InvalidConfigError(f"--eagle{v}-head: {spec} does not exist")
            kinds.append(f"eagle{v}")
    return kinds


def model_source(spec: str) -> str:
    """A model/head flag as the run identity records it: an existing path made absolute, else the text."""
    if spec in ("auto", "none") or spec in NAMED_TARGETS:  # names win over paths
        return spec
    p = os.path.expanduser(spec)
    return os.path.abspath(p) if os.path.exists(p) else spec


def _check_device_flags(args: argparse.Namespace) -> None:
    """``--device`` against ``--workers`` / ``--ray-address``, before any model loads.

    One process checks the device here; with Ray, each worker checks its own
    (the driver of a cluster may have no GPU).
    """
    device = getattr(args, "device", "cpu") or "cpu"
    ray = getattr(args, "workers", 1) > 1 or getattr(args, "ray_address", None)
    args.device = resolve_device(device, check=not ray)
    if ray and args.device.startswith("cuda:"):
        raise InvalidConfigError(f"--device {args.device} with --workers: give --device cuda (Ray gives each "
                                 "worker its own GPU, which it sees as cuda:0)")


def run_identity(args: argparse.Namespace, settings: BenchSettings, rows: Sequence[RowSpec],
                 prompts: Sequence[BenchPrompt]) -> dict[str, Any]:
    """What a ``runs.jsonl`` must match to be resumed by this command (docs/bench.md, "Resuming").

    Threads, workers, plots and the Ray address are not part of it: they change
    how fast the records come, not what they mean. The device is (its timings
    and float rounding are not a CPU's); it is written only when it is not the
    CPU, so logs written before ``--device`` existed still resume. So is ``--optimum``
    (its timings include the measurement's host work), written only when given. The drafts'
    content hashes (``draft_sha256``, :func:`~specdec.bench.hashes.draft_hashes`: one per draft
    kind the rows use) are part of it: a retrained head is another run. A log written before
    they were recorded resumes without them (:func:`~specdec.bench.report.open_out_dir`). So are the
    plug-ins (:func:`~specdec.bench.hashes.plugin_identity`: each module's source hash, each override),
    written only when there are any. ``--budget auto`` is recorded as the request (``"auto"``): its choices
    per temperature and draft kind are made after the models load, and are checked on resume against their
    digest in the header (:func:`~specdec.bench.hashes.check_budget_choices`).
    """
    budget = settings.budget
    device = getattr(args, "device", "cpu") or "cpu"
    return ({"device": "cuda" if device.startswith("cuda") else device} if device != "cpu" else {}) | {
        "target": model_source(args.target), "draft": model_source(args.draft),
        "eagle2_head": model_source(args.eagle2_head), "eagle3_head": model_source(args.eagle3_head),
        "preset": settings.preset,
        "rows": [r.name for r in rows],
        "row_drafts": {r.name: r.draft for r in rows},  # "rheo" runs on the draft LM when no EAGLE-3 head is found
        "temperatures": [float(t) for t in settings.temperatures],
        "seeds": list(settings.seeds),
        "max_new_tokens": settings.max_new_tokens,
        "budget": {"nodes": budget.nodes, "depth": budget.depth} if isinstance(budget, Budget) else "auto",
        "ignore_eos": bool(args.ignore_eos),
        "batch_size": settings.batch_size,
        "max_prompt_tokens": args.max_prompt_tokens,
        "prompts": {"count": len(prompts), "sha256": prompts_digest(prompts)},
        HASH_KEY: draft_hashes(model_source(args.target), model_source(args.draft),
                               {2: model_source(args.eagle2_head), 3: model_source(args.eagle3_head)},
                               {r.draft for r in rows if r.draft}),
    } | ({"optimum": True} if settings.optimum else {}) | plugin_identity()


