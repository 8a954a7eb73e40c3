"""The optional extras of ``specdec-trees`` and the one-line error when one is missing (internal).

``pip install specdec-trees`` installs the core (torch, numpy, attrs): generation, the trees, the
verifiers, sampling, the registry and the conformance tools. Hugging Face models, GGUF conversion,
the bench, training, plots, Ray and the Triton kernels are extras (``pyproject.toml``; a test keeps
:data:`EXTRAS` equal to it). Their modules are imported where they are used, never by
``import specdec``; a feature that needs one calls :func:`require_extra` first or imports it under
:func:`needs_extra`, so that its absence is one :class:`~specdec.errors.MissingExtraError` naming
``pip install 'specdec-trees[EXTRA]'``, not an ``ImportError`` from deep inside.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from specdec.errors import MissingExtraError

__all__ = ["DISTRIBUTION", "EXTRAS", "install_command", "missing_modules", "needs_extra", "require_extra"]

DISTRIBUTION = "specdec-trees"
"""The name to ``pip install``."""

_HF = ("transformers", "safetensors", "packaging")
_GGUF = (*_HF, "gguf", "accelerate")
_PLOTS = ("matplotlib",)
_CPU = ("ninja",)
_BENCH = (*_GGUF, *_PLOTS, *_CPU, "rich")

EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": _HF,
    "gguf": _GGUF,
    "cpu": _CPU,
    "demo": (*_GGUF, *_CPU),
    "plots": _PLOTS,
    "bench": _BENCH,
    "train": (*_GGUF, *_PLOTS, "tqdm"),
    "ray": (*_BENCH, "ray"),
    "kernels": ("triton",),
    "grammar": ("xgrammar",),
    "heads": ("specdec_trees_smollm2",),
}
"""Per extra, the top-level modules it installs (its distributions' import names), extras it
includes expanded."""


def install_command(extra: str) -> str:
    """``pip install 'specdec-trees[EXTRA]'`` (quoted: square brackets are a glob in zsh)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing_modules(extra: str) -> tuple[str, ...]:
    """The modules of ``extra`` that cannot be imported (located with ``find_spec``, not imported;
    a module set to None in ``sys.modules`` counts as missing)."""
    return tuple(m for m in EXTRAS[extra] if _absent(m))


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent that fails to import; a module without __spec__
        return True


def _error(feature: str, extra: str, missing: tuple[str, ...]) -> MissingExtraError:
    return MissingExtraError(
        f"{feature} needs the [{extra}] extra ({', '.join(missing)} not installed): {install_command(extra)}",
        extra=extra, missing=missing,
    )


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`~specdec.errors.MissingExtraError` unless every module of ``extra`` is installed.

    Args:
        extra: a key of :data:`EXTRAS`.
        feature: what needs it, as the user called it (``"specdec bench"``), named in the message.
    """
    missing = missing_modules(extra)
    if missing:
        raise _error(feature, extra, missing)


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Run the imports inside the block; a ``ModuleNotFoundError`` of one of ``extra``'s modules
    becomes :class:`~specdec.errors.MissingExtraError` (any other error passes unchanged):

        with needs_extra("hf", "HFTarget.from_pretrained"):
            from transformers import AutoModelForCausalLM
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS[extra]:
            raise
        raise _error(feature, extra, (top,)) from None
