"""Training draft heads (EAGLE-2, EAGLE-3) and distilled draft LMs for a target.

Entry points: :func:`train_eagle`, :func:`train_draft_lm` (and the CLI
functions in :mod:`specdec.train.cli`); the loop and its checkpoints live in
:mod:`specdec.train.trainer`, the students and their losses in
:mod:`specdec.train.students`, the fresh heads and draft LMs they start from in
:mod:`specdec.train.models`, data loading in :mod:`specdec.train.data`,
self-distillation data (the target's own answers) in :mod:`specdec.train.regen`;
the recipe of the shipped weights in :mod:`specdec.train.recipes`, with its
export (:mod:`specdec.train.export`) and training curves (:mod:`specdec.train.curves`).
"""

from specdec.train.api import train_draft_lm, train_eagle

__all__ = ["train_eagle", "train_draft_lm"]
