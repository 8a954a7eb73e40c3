"""Training draft heads (EAGLE-2, EAGLE-3) and distilled draft LMs for a target.

Entry points: :func:`train_eagle`, :func:`train_draft_lm` (and the CLI
functions in :mod:`specdec.train.cli`); the loop, losses and students live in
:mod:`specdec.train.trainer`, data loading in :mod:`specdec.train.data`,
self-distillation data (the target's own answers) in :mod:`specdec.train.regen`.
"""

from specdec.train.api import train_draft_lm, train_eagle

__all__ = ["train_eagle", "train_draft_lm"]
