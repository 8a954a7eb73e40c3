"""Tree builders, registered under role ``"tree"``.

========== ===================================== ==================
name       builder                               verifier
========== ===================================== ==================
chain      :class:`ChainTreeBuilder`             rejection-iid
static     :class:`StaticTreeBuilder`            rejection-iid/-wor
sequoia    :class:`SequoiaTreeBuilder`           rejection-wor
eagle      :class:`EagleTreeBuilder`             match (greedy at T=0)
rheo       :class:`RheoTreeBuilder`              mixed (greedy at T=0)
sampled-   :class:`SampledDynamicTreeBuilder`    mixed (greedy at T=0)
dynamic
ddtree     :class:`DDTreeBuilder`                mixed (greedy at T=0)
========== ===================================== ==================

:func:`normalised_law` (a draft law in float64, divided by its sum: the law a
builder draws its sampled children from and records) is public for builders
written outside specdec. A builder is written either as the batch contract,
:class:`TreeBuilder` (one build, :meth:`TreeBuilder.feed_build`, over ``B`` rows), or one
tree at a time, :class:`OneTreeBuilder` (a host ``build``); :func:`build_trees` and
:func:`build_tree` drive either with a draft.
"""

from specdec.trees._common import normalised_law
from specdec.trees.base import OneTreeBuilder, TreeBuilder, build_tree, build_trees
from specdec.trees.chain import ChainTreeBuilder
from specdec.trees.ddtree import DDTreeBuilder
from specdec.trees.dynamic import DynamicTreeBuilder, EagleTreeBuilder, grow_dynamic_tree
from specdec.trees.rheo import RheoTreeBuilder
from specdec.trees.sampled_dynamic import SampledDynamicTreeBuilder
from specdec.trees.sequoia import (
    SequoiaChoice,
    SequoiaTreeBuilder,
    choose_size,
    measure_draft_level_time,
    measure_forward_times,
    sequoia_tree,
)
from specdec.trees.static import StaticTreeBuilder

__all__ = [
    "ChainTreeBuilder",
    "DDTreeBuilder",
    "DynamicTreeBuilder",
    "EagleTreeBuilder",
    "OneTreeBuilder",
    "RheoTreeBuilder",
    "SampledDynamicTreeBuilder",
    "SequoiaChoice",
    "SequoiaTreeBuilder",
    "StaticTreeBuilder",
    "TreeBuilder",
    "build_tree",
    "build_trees",
    "choose_size",
    "grow_dynamic_tree",
    "measure_draft_level_time",
    "measure_forward_times",
    "normalised_law",
    "sequoia_tree",
]
