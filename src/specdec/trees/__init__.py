"""Tree builders, registered under role ``"tree"``."""

from specdec.trees.base import TreeBuilder

__all__ = ["TreeBuilder"]
