"""The one dispatch: how a generation verifies, chosen once, before any forward.

Each verifier declares its rule (:attr:`~specdec.verify.base.Verifier.fused`: a
:class:`~specdec.verify.base.FusedRule` descriptor, or None for a rule that only walks,
such as a whole-tree rule that overrides :meth:`~specdec.verify.base.Verifier.verify`).
:func:`choose_verification` turns that declaration, the ``kernel`` option and the
target's device into a :class:`Verification`:

- ``"tensor"``: the rule's tensor form (:func:`specdec.verify.fast.decide_from_logits`;
  for a whole-tree rule that declares one, :attr:`~specdec.verify.base.Verifier.path_rule`,
  its path-level form, :func:`specdec.verify.fast_block.decide_block_from_logits`),
  every row at once, on the device, no host read;
- ``"triton"``: the same rule in the fused Triton kernel
  (:func:`specdec.kernels.verify_fused.fused_verify_batch`), its tables built on the
  device from the :class:`~specdec.tree_batch.TreeBatch`, one launch for every row;
- ``"walk"``: the verifier's own :meth:`~specdec.verify.base.Verifier.verify` on each
  row's host view (:meth:`TreeBatch.tree <specdec.tree_batch.TreeBatch.tree>`), with host
  reads; the path of verifiers without a declared parallel rule.

``kernel="auto"`` picks ``"triton"`` when Triton is installed, the target is on CUDA and
the verifier declares a rule; ``"tensor"`` for a declared rule (or path rule) otherwise;
``"walk"`` for the rest. A path rule has no fused kernel: on CUDA ``auto`` runs its tensor
form in torch, and ``kernel="triton"`` raises. ``kernel="triton"`` is never silently replaced: it raises where the kernel
cannot run. The path taken is reported (:attr:`Verification.label`,
``GenerationStats.kernel_path``).
"""

from __future__ import annotations

import attrs
import torch

from specdec.errors import InvalidConfigError
from specdec.kernels.select import interpreter_enabled, triton_available
from specdec.sampling import SamplingConfig
from specdec.verify.base import FusedRule, PathRule, Verifier
from specdec.verify.fast import resolve_rows

__all__ = ["KERNEL_CHOICES", "VERIFY_PATHS", "Verification", "choose_verification"]

KERNEL_CHOICES = ("auto", "torch", "triton")
"""Values of the ``kernel`` option: ``auto`` (the fused kernel on CUDA when possible, the
tensor rule in torch otherwise), ``torch`` (never the kernel), ``triton`` (always the
kernel; an error where it cannot run)."""

VERIFY_PATHS = ("tensor", "triton", "walk")
"""The verification paths of :class:`Verification` (module docstring)."""


@attrs.frozen
class Verification:
    """How every step of one generation verifies (:func:`choose_verification`).

    Attributes:
        path: one of :data:`VERIFY_PATHS`.
        rule: the verifier's declared rule (None on the walk and for a path rule).
        path_rule: ``"tensor"`` only: the whole-tree rule's declared tensor form
            (:attr:`Verifier.path_rule <specdec.verify.base.Verifier.path_rule>`), None otherwise.
        fuse_logits: ``"triton"`` only: the kernel also fuses temperature, top-k and
            the softmax (``T > 0``, ``top_p == 1``, ``min_p == 0``); otherwise it verifies the
            processed ``p``. Rows under their own configurations (a
            :class:`~specdec.sampling.RowSampling`) share one path and one launch; the
            kernel then decides this row by row (:func:`~specdec.kernels.verify_fused.fused_verify_batch`).
        rows: ``"tensor"`` only: ``"all"`` (every node at once) or ``"path"`` (the nodes the
            verification visits, a walk over depths), resolved from
            :attr:`StepOptions.rows <specdec.engine.options.StepOptions.rows>` and the device
            (:func:`~specdec.verify.fast.resolve_rows`).
    """

    path: str
    rule: FusedRule | None = None
    fuse_logits: bool = False
    rows: str = "all"
    path_rule: PathRule | None = None

    @property
    def label(self) -> str:
        """``GenerationStats.kernel_path``: ``"triton"`` for the kernel, ``"torch"`` otherwise."""
        return "triton" if self.path == "triton" else "torch"


def choose_verification(
    verifier: Verifier, sampling: SamplingConfig, kernel: str, device: torch.device, *, draws_tables: bool = True,
    rows: str = "auto",
) -> Verification:
    """The path every step of a generation takes (module docstring).

    ``draws_tables``: the generation's random sources draw uniform tables
    (:attr:`RandomSource.draws_tables <specdec.rng.RandomSource.draws_tables>`); a source
    that does not (the enumerating source of the exact tests) is served by the walk, which
    draws one uniform at a time.

    Raises:
        InvalidConfigError: an unknown ``kernel``; ``kernel="triton"`` with a verifier that
            declares no rule, without Triton, or with a target off CUDA and
            ``TRITON_INTERPRET`` unset.
    """
    if kernel not in KERNEL_CHOICES:
        raise InvalidConfigError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {kernel!r}")
    resolved = resolve_rows(rows, device)
    rule, path_rule = verifier.fused, verifier.path_rule
    fuse = not sampling.greedy and not sampling.reads_mass
    if kernel == "triton":
        if rule is None and path_rule is not None:
            raise InvalidConfigError(
                f"kernel='triton': verifier {verifier.registry_name!r} is a path-level rule ({path_rule.form}) "
                "with a tensor form but no fused kernel; use kernel='torch' or 'auto' (its tensor form)"
            )
        if rule is None:
            raise InvalidConfigError(
                f"kernel='triton': verifier {verifier.registry_name!r} declares no parallel rule (Verifier.fused), "
                "so it has no fused kernel; use kernel='torch' or 'auto' (its walk)"
            )
        if not draws_tables:
            raise InvalidConfigError("kernel='triton' needs random sources that draw uniform tables (RandomSource.draws_tables)")
        if not triton_available():
            raise InvalidConfigError("kernel='triton' needs Triton: pip install 'specdec-trees[kernels]' (triton>=3.0)")
        if device.type != "cuda" and not interpreter_enabled():
            raise InvalidConfigError(
                f"kernel='triton' needs the target on a CUDA device (got {device}); "
                "set TRITON_INTERPRET=1 to run the kernel on CPU tensors (slow, for tests)"
            )
        return Verification("triton", rule, fuse)
    if not draws_tables:
        return Verification("walk")
    if rule is None:
        return Verification("tensor", path_rule=path_rule) if path_rule is not None else Verification("walk")
    if kernel == "auto" and device.type == "cuda" and triton_available():
        return Verification("triton", rule, fuse)
    return Verification("tensor", rule, rows=resolved)
