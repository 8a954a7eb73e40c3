"""Kernel tests run on the CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before Triton decorates the kernels (at the
import of ``specdec.kernels.verify_triton`` / ``kv_compact_triton``), so it is
set here, before any test module of this folder is imported. Modules that need
Triton skip cleanly when it is not installed (``pip install
'specdec-trees[kernels]'``); the counter-RNG and reference-path tests run
without it.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
