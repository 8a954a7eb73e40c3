"""The verifier interface.

Words (docs/concepts.md, glossary):

- ``p``: the target's processed next-token distribution at a tree node
  (:func:`specdec.sampling.process_logits`), ``[V]``; for a whole tree,
  ``p[i]`` is the law of the token that follows node ``i``'s path.
- ``q``/``q'``: the proposal law a sampled child was drawn from, recorded in
  the tree (:class:`~specdec.tree.SparseLaw`). Verifiers never see the draft
  model, only the laws it recorded.
- *residual* ``P``: what remains of ``p`` at a node after rejected children
  have been tested; starts as ``p``.
- *accepted*: a draft node the verifier kept; verification then continues at it.
- *bonus*: the one token drawn from the residual (or from ``p`` itself) at the
  node where verification stops. Every step emits the accepted tokens plus one
  bonus, so a step always makes progress.

A verifier walks from the root: at each node it tests the children
(:meth:`Verifier.verify_node`); if one is accepted it descends, otherwise the
node's bonus ends the step. Subclasses implement only the per-node rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import attrs
import torch

from specdec.errors import InvalidDistributionError, UnsupportedTreeError, VocabMismatchError
from specdec.rng import RandomSource
from specdec.sampling import SamplingConfig, check_distribution
from specdec.tree import DraftTree, NodeKind, SampleMode

if TYPE_CHECKING:
    from specdec.tree_batch import TreeBatch

__all__ = ["FusedRule", "NodeOutcome", "PathRule", "VerifyResult", "Verifier", "WholeTreeVerifier"]


@attrs.frozen
class FusedRule:
    """How a verifier orders and tests a node's children (docs/verifiers.md, rules 2-5).

    Attributes:
        name: the verifier's registry name.
        rejection: sampled children are tested by recursive rejection against
            ``q'`` (rules 3-5); otherwise they are matched (rule 2).
        without_replacement: rule 4's update of ``q`` after a rejection:
            ``True``/``False`` fixed by the verifier, ``None`` = from the law's
            mode (rule 5).
        match_deterministic: deterministic children are matched after the
            sampled ones (rules 2 and 5).
    """

    name: str
    rejection: bool
    without_replacement: bool | None
    match_deterministic: bool


@attrs.frozen
class PathRule:
    """A path-level rule's tensor form (docs/verifiers.md, "Path-level verification").

    Attributes:
        name: the verifier's registry name.
        form: which tensor form runs it (:mod:`specdec.verify.path_forms`): ``"block"`` (rule 8
            on chains, :func:`specdec.verify.fast_block.decide_block_batch`) or ``"traversal"``
            (rule 7 on trees of sampled children,
            :func:`specdec.verify.traversal_tensor.decide_traversal_batch`).
    """

    name: str
    form: str

    def __attrs_post_init__(self) -> None:
        if self.form not in PATH_FORMS:
            raise ValueError(f"PathRule.form must be one of {', '.join(PATH_FORMS)}, got {self.form!r}")


PATH_FORMS = ("block", "traversal")
"""The path-level tensor forms the engine knows (:class:`PathRule`)."""


@attrs.frozen
class NodeOutcome:
    """Result of the per-node rule: exactly one of the two fields is set.

    Attributes:
        accepted_child: index of the accepted child node, or None.
        bonus_token: the bonus token drawn at this node, or None.
    """

    accepted_child: int | None = None
    bonus_token: int | None = None

    def __attrs_post_init__(self) -> None:
        if (self.accepted_child is None) == (self.bonus_token is None):
            raise ValueError("NodeOutcome needs exactly one of accepted_child / bonus_token")


@attrs.frozen
class VerifyResult:
    """What one verification of a draft tree produced.

    Attributes:
        accepted_nodes: indices of the accepted nodes, root's child first.
        tokens: emitted tokens: the accepted nodes' tokens, then the bonus.
        attempted_depths: number of depths at which the path reached a node
            with children (so a draft token was tested); depth ``d`` (1-based)
            was accepted iff ``d <= len(accepted_nodes)``.
    """

    accepted_nodes: tuple[int, ...]
    tokens: tuple[int, ...]
    attempted_depths: int

    @property
    def num_accepted(self) -> int:
        """Number of accepted draft tokens (the bonus not counted)."""
        return len(self.accepted_nodes)

    @property
    def bonus_token(self) -> int:
        """The bonus token (last emitted token)."""
        return self.tokens[-1]


class Verifier(ABC):
    """Turns a draft tree and the target's ``p`` at every node into emitted tokens.

    Contract:

    - :attr:`supported_kinds` / :attr:`supported_modes` declare which children
      the rule handles losslessly; :meth:`check_tree` raises
      :class:`~specdec.errors.UnsupportedTreeError` for anything else, before
      any randomness is used. A verifier never falls back to another rule.
    - All randomness comes from the ``rng`` argument.
    - :attr:`lossless` is True iff the emitted tokens follow the target's law
      exactly whenever the tree is supported (proved by the exact tests).
    - :attr:`requires_greedy`: the rule is only valid for one-hot ``p``
      (temperature 0); non one-hot rows raise an error.
    """

    registry_name: ClassVar[str] = "?"
    supported_kinds: ClassVar[frozenset[NodeKind]] = frozenset()
    supported_modes: ClassVar[frozenset[SampleMode]] = frozenset()
    lossless: ClassVar[bool] = True
    requires_greedy: ClassVar[bool] = False
    host_checks: ClassVar[bool] = False
    """The rule restricts how kinds mix at one node (a class that overrides :meth:`check_node_mix`
    has it set at definition): :meth:`check_batch` then checks each tree's host view."""
    fused: ClassVar[FusedRule | None] = None
    """The rule in the parallel form (every node decided on its own uniforms,
    :mod:`specdec.verify.fast` and the Triton kernel), or None. Declared by
    each class for itself: a subclass that changes the rule does not inherit it."""

    path_rule: ClassVar[PathRule | None] = None
    """A whole-tree rule's tensor form (:class:`PathRule`), or None: the engine then runs
    its walk. Declared by each class for itself, like :attr:`fused`."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        """:attr:`fused` and :attr:`path_rule` are declared by each class for itself: a
        subclass whose body does not declare them has none (it may change the rule, as the
        tests' mutants do), so the engine runs its walk rather than its parent's tensor form."""
        super().__init_subclass__(**kwargs)
        if "fused" not in cls.__dict__:
            cls.fused = None
        if "path_rule" not in cls.__dict__:
            cls.path_rule = None
        if "check_node_mix" in cls.__dict__:  # the batch check then reads the host trees
            cls.host_checks = True

    # ------------------------------------------------------------ checking
    def check_sampling(self, sampling: SamplingConfig) -> None:
        """Raise before any forward when the rule cannot serve ``sampling``
        (:attr:`requires_greedy` at a temperature above 0)."""
        if self.requires_greedy and not sampling.greedy:
            raise InvalidDistributionError(
                f"verifier {self.registry_name!r} needs one-hot p (temperature 0); got temperature {sampling.temperature}"
            )

    def check_tree(self, tree: DraftTree) -> None:
        """Raise :class:`UnsupportedTreeError` unless every node's children are supported."""
        kinds = set(int(k) for k in tree.kinds[1:].tolist())
        bad = kinds - {int(k) for k in self.supported_kinds}
        if bad:
            names = ", ".join(NodeKind(k).name.lower() for k in sorted(bad))
            raise UnsupportedTreeError(
                f"verifier {self.registry_name!r} cannot verify {names} children losslessly; "
                f"it supports {sorted(k.name.lower() for k in self.supported_kinds)}"
            )
        for node in range(tree.num_nodes):
            kids = tree.sampled_children(node)
            if len(kids) > 1:
                mode = tree.law_of(kids[0]).mode
                if mode not in self.supported_modes:
                    raise UnsupportedTreeError(
                        f"verifier {self.registry_name!r} cannot verify several children drawn "
                        f"{mode.value!r} at node {node}; it supports modes "
                        f"{sorted(m.value for m in self.supported_modes)}"
                    )
        self.check_node_mix(tree)

    def check_batch(self, tree: "TreeBatch") -> None:
        """:meth:`check_tree` for every tree of a batch, from one host read of a
        summary (the child kinds present; whether some node has several sampled
        children drawn i.i.d. / without replacement). A verifier that overrides
        :meth:`check_node_mix` is checked on the host trees instead."""
        if self.host_checks:
            for b in range(tree.batch_size):
                self.check_tree(tree.tree(b))
            return
        kinds = tree.kinds
        sampled = kinds == int(NodeKind.SAMPLED)
        per_parent = torch.zeros_like(kinds).scatter_add_(1, tree.parents.clamp_min(0), sampled.long())  # [B, n]
        several = per_parent > 1
        summary = torch.stack([
            (kinds == int(NodeKind.DETERMINISTIC)).any(), sampled.any(),
            (several & ~tree.law_wor).any(), (several & tree.law_wor).any(),
        ]).tolist()
        present = {k for k, hit in zip((NodeKind.DETERMINISTIC, NodeKind.SAMPLED), summary[:2]) if hit}
        bad = present - set(self.supported_kinds)
        if bad:
            names = ", ".join(k.name.lower() for k in sorted(bad))
            raise UnsupportedTreeError(
                f"verifier {self.registry_name!r} cannot verify {names} children losslessly; "
                f"it supports {sorted(k.name.lower() for k in self.supported_kinds)}"
            )
        for mode, hit in zip((SampleMode.IID, SampleMode.WITHOUT_REPLACEMENT), summary[2:]):
            if hit and mode not in self.supported_modes:
                raise UnsupportedTreeError(
                    f"verifier {self.registry_name!r} cannot verify several children drawn {mode.value!r}; "
                    f"it supports modes {sorted(m.value for m in self.supported_modes)}"
                )

    def check_node_mix(self, tree: DraftTree) -> None:
        """Hook for rules that restrict how kinds mix at one node (default: any mix)."""

    def check_inputs(self, tree: DraftTree, p: torch.Tensor) -> None:
        """Check ``p``'s shape against ``tree`` (``[n, V]``) and the tree itself (:meth:`check_tree`):
        the first thing :meth:`verify` does, before any draw.

        Raises:
            InvalidDistributionError: ``p`` is not ``[n, V]`` for the tree's ``n``.
            VocabMismatchError: ``p``'s vocabulary differs from the tree's.
            UnsupportedTreeError: the tree has children this rule cannot verify.
        """
        if not isinstance(p, torch.Tensor) or p.dim() != 2:
            raise InvalidDistributionError(f"p must be a [n, V] tensor, got {getattr(p, 'shape', type(p))}")
        if p.shape[0] != tree.num_nodes:
            raise InvalidDistributionError(f"p has {p.shape[0]} rows but the tree has {tree.num_nodes} nodes")
        if p.shape[1] != tree.vocab_size:
            raise VocabMismatchError(f"p has vocabulary {p.shape[1]} but the tree's is {tree.vocab_size}")
        self.check_tree(tree)

    # ------------------------------------------------------------ the walk
    def verify(self, tree: DraftTree, p: torch.Tensor, rng: RandomSource) -> VerifyResult:
        """Verify ``tree`` against the target distributions ``p``.

        Args:
            tree: the draft tree (``n`` nodes).
            p: ``[n, V]`` target probabilities; row ``i`` is the processed law
                of the token after node ``i``'s path.
            rng: the source of every random draw.

        Returns:
            The accepted path, the emitted tokens and per-depth bookkeeping.

        Raises:
            UnsupportedTreeError: the tree has children this rule cannot verify.
            VocabMismatchError: ``p``'s vocabulary differs from the tree's.
            InvalidDistributionError: a visited row of ``p`` is not a distribution.
        """
        self.check_inputs(tree, p)
        accepted: list[int] = []
        attempted = 0
        node = 0
        while True:
            p_node = p[node]
            check_distribution(p_node, f"p[{node}]")
            if self.requires_greedy and not bool((p_node.max() == 1.0)):
                raise InvalidDistributionError(
                    f"verifier {self.registry_name!r} needs one-hot p (temperature 0); row {node} is not one-hot"
                )
            if tree.children(node):
                attempted += 1
            rng.begin_node(node)  # no-op except for counter-based sources (specdec.kernels)
            outcome = self.verify_node(tree, node, p_node, rng)
            if outcome.accepted_child is None:
                assert outcome.bonus_token is not None  # NodeOutcome holds exactly one of the two
                tokens = [int(tree.tokens[i]) for i in accepted] + [int(outcome.bonus_token)]
                return VerifyResult(tuple(accepted), tuple(tokens), attempted)
            accepted.append(outcome.accepted_child)
            node = outcome.accepted_child

    @abstractmethod
    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        """Apply the rule at ``node``.

        Args:
            tree: the (already checked) tree.
            node: index of the current node.
            p_node: ``[V]`` target distribution at ``node``.
            rng: source of random draws.

        Returns:
            The accepted child, or the bonus token if no child is accepted
            (a leaf always yields a bonus drawn from ``p_node``).
        """


class WholeTreeVerifier(Verifier):
    """A verifier that decides a whole tree at once (docs/extending.md, "Whole-tree verifiers").

    A path-level rule, or one that reads several nodes before it accepts any,
    implements :meth:`verify` itself instead of the per-node rule. The contract:
    call :meth:`check_inputs` first and check each row of ``p`` it reads
    (:func:`~specdec.sampling.check_distribution`); draw only through ``rng``,
    calling ``rng.begin_node(node)`` before the draws made for ``node``; return a
    :class:`VerifyResult` whose accepted nodes form a path from a root child
    down, whose tokens are theirs plus exactly one bonus, and whose
    ``attempted_depths`` counts the nodes of the path (the last included) that
    have children. The engine runs it on each row's tree, single and batched
    (the walk; a whole-tree rule declares no :attr:`~Verifier.fused` rule), unless it
    declares a tensor form (:attr:`~Verifier.path_rule`).
    """

    @abstractmethod
    def verify(self, tree: DraftTree, p: torch.Tensor, rng: RandomSource) -> VerifyResult:
        """Verify the whole ``tree`` against ``p`` (``[n, V]``); see the class contract."""

    def verify_node(self, tree: DraftTree, node: int, p_node: torch.Tensor, rng: RandomSource) -> NodeOutcome:
        """Not a per-node rule: a whole-tree verifier decides in :meth:`verify`."""
        raise TypeError(f"{type(self).__name__} is a whole-tree verifier: call verify(tree, p, rng)")
