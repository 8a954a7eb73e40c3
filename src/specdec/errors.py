"""Exceptions raised by specdec.

Every error a user can trigger with bad input is a subclass of
:class:`SpecDecError`, so callers can catch the library's errors in one place,
and each also subclasses the matching builtin (``ValueError``/``KeyError``) so
ordinary Python code keeps working.
"""

from __future__ import annotations


class SpecDecError(Exception):
    """Base class of every error raised by specdec on bad input."""


class InvalidConfigError(SpecDecError, ValueError):
    """A configuration value is out of range (temperature, top-k, top-p, budgets...)."""


class InvalidDistributionError(SpecDecError, ValueError):
    """A probability tensor or logits tensor is malformed: NaN/inf, negative,
    not normalised, or of the wrong shape."""


class VocabMismatchError(SpecDecError, ValueError):
    """Two tensors or models that must share a vocabulary do not."""


class MalformedTreeError(SpecDecError, ValueError):
    """A :class:`~specdec.tree.DraftTree` violates one of its invariants."""


class UnsupportedTreeError(SpecDecError, ValueError):
    """A verifier was asked to verify a tree it cannot verify losslessly
    (for example top-K children under a ``p/q`` rejection rule). specdec never
    falls back silently to another rule."""


class UnknownNameError(SpecDecError, KeyError):
    """A registry lookup used a name that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class RegistryConflictError(SpecDecError, ValueError):
    """A name was registered twice without ``override=True``.

    Attributes:
        role: the registry role of the name.
        name: the name.
        owner: the module that registered the name first (:func:`specdec.registry.origin`).
        claimant: the module whose registration was refused.
    """

    def __init__(self, message: str, *, role: str = "", name: str = "", owner: str = "", claimant: str = "") -> None:
        super().__init__(message)
        self.role, self.name, self.owner, self.claimant = role, name, owner, claimant


class ModelBusyError(SpecDecError, RuntimeError):
    """A model is already in use by another generation (an open stream, or
    another thread). A target's and a draft's caches hold one sequence at a
    time, so specdec refuses the second call rather than let the two corrupt
    each other (finish or ``close()`` the stream first, or decode the requests
    together with ``generate_batch``)."""


class PluginError(InvalidConfigError):
    """A plug-in module (:mod:`specdec.plugins`) cannot be used: it fails to
    import, registers nothing, registers a name that is taken, or declares a
    capability it does not implement. The message names the module and, where
    one is at fault, the registered name."""


class ContextOverflowError(InvalidConfigError):
    """Prompt, new tokens and draft tree do not fit in the model's context (a bad
    configuration: raised before any forward)."""


class MeasurementError(SpecDecError, RuntimeError):
    """A cost that a choice depends on could not be measured (for example a target forward
    that fails at one tree size while a forward-cost curve is timed); nothing is guessed in its place."""


class MissingExtraError(SpecDecError, ImportError):
    """A feature needs an optional extra of ``specdec-trees`` that is not installed
    (Hugging Face models, GGUF conversion, the bench, training, plots, Ray, the shipped
    heads). The one-line message names the feature, the missing modules and the command
    that installs them, ``pip install 'specdec-trees[EXTRA]'``.

    Attributes:
        extra: the extra to install.
        missing: the modules that could not be imported.
    """

    def __init__(self, message: str, *, extra: str = "", missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.extra, self.missing = extra, missing
