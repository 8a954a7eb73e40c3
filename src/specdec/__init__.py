"""specdec: lossless tree-based speculative decoding for causal LMs."""

from specdec.errors import (
    ContextOverflowError,
    InvalidConfigError,
    InvalidDistributionError,
    MalformedTreeError,
    ModelBusyError,
    PluginError,
    RegistryConflictError,
    SpecDecError,
    UnknownNameError,
    UnsupportedTreeError,
    VocabMismatchError,
)
from specdec.generate import GenerationOutput, GenerationStats, SpeculativeGenerator, autoregressive_generate
from specdec.registry import get, list_registered, register
from specdec.rng import RandomSource, TorchRandom
from specdec.sampling import SamplingConfig, check_distribution, process_logits
from specdec.tree import DraftTree, NodeKind, SampleMode, SparseLaw, TreeAssembler

__version__ = "0.1.0"

__all__ = [
    "ContextOverflowError",
    "DraftTree",
    "GenerationOutput",
    "GenerationStats",
    "InvalidConfigError",
    "InvalidDistributionError",
    "MalformedTreeError",
    "ModelBusyError",
    "NodeKind",
    "PluginError",
    "RandomSource",
    "RegistryConflictError",
    "SampleMode",
    "SamplingConfig",
    "SparseLaw",
    "SpecDecError",
    "SpeculativeGenerator",
    "TorchRandom",
    "TreeAssembler",
    "UnknownNameError",
    "UnsupportedTreeError",
    "VocabMismatchError",
    "autoregressive_generate",
    "check_distribution",
    "get",
    "list_registered",
    "process_logits",
    "register",
]
