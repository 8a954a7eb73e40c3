"""specdec: lossless tree-based speculative decoding for causal LMs."""

from specdec.errors import (
    ContextOverflowError,
    InvalidConfigError,
    InvalidDistributionError,
    MalformedTreeError,
    RegistryConflictError,
    SpecDecError,
    UnknownNameError,
    UnsupportedTreeError,
    VocabMismatchError,
)
from specdec.registry import get, list_registered, register
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig, check_distribution, process_logits
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler

__version__ = "0.1.0"

__all__ = [
    "ContextOverflowError",
    "DraftTree",
    "InvalidConfigError",
    "InvalidDistributionError",
    "MalformedTreeError",
    "NodeKind",
    "RandomSource",
    "RegistryConflictError",
    "SampleMode",
    "SamplingConfig",
    "SparseLaw",
    "SpecDecError",
    "TorchRandom",
    "TreeAssembler",
    "UnknownNameError",
    "UnsupportedTreeError",
    "VocabMismatchError",
    "check_distribution",
    "get",
    "list_registered",
    "process_logits",
    "register",
]
