"""specdec: lossless tree-based speculative decoding for causal LMs."""

from specdec._version import __version__
from specdec.errors import (
    ContextOverflowError,
    InvalidConfigError,
    InvalidDistributionError,
    MalformedTreeError,
    MeasurementError,
    MissingExtraError,
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

__all__ = [
    "ContextOverflowError",
    "DraftTree",
    "GenerationOutput",
    "GenerationStats",
    "InvalidConfigError",
    "InvalidDistributionError",
    "MalformedTreeError",
    "MeasurementError",
    "MissingExtraError",
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
