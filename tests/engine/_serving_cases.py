"""Seeded toy cases of :func:`specdec.engine.serving.verify_for_engine` whose outputs are locked
(``tests/engine/data/serving_lock.json``, recorded with the serving executor of commit 9369fe7,
before it decided through the step's decision path): every verifier family on its trees (the
per-node rules, the path-level ``block``, the walks of ``traversal`` and ``kseq``), rows with
eight different sampling settings, a row with bad target logits, a row whose draft was flagged,
``TorchRandom`` and ``CounterRandom`` sources. ``python -m tests.engine._serving_cases`` re-records
(only when a change of the emitted tokens is intended, and said so)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch

from specdec.engine.serving import verify_for_engine
from specdec.registry import get
from specdec.rng import CounterRandom, RandomSource, RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.trees.feed import DraftSpec, TreeFeed
from specdec.verify.base import Verifier
from specdec.verify.rejection import RejectionWORVerifier
from tests.engine._per_row import CONFIGS

V = 12
LOCK = Path(__file__).parent / "data" / "serving_lock.json"
_g = torch.Generator().manual_seed(56)
TARGET = torch.randn(V, V, generator=_g, dtype=torch.float64) * 1.5  # logits after token a: TARGET[a]
DRAFT = TARGET + torch.randn(V, V, generator=_g, dtype=torch.float64)
SAMPLED = [c for c in CONFIGS if not c.greedy]


class WalkingWOR(RejectionWORVerifier):
    """Rule 4 with no declared tensor form (a subclass declares its own): always the walk path."""

    registry_name = "walking-wor"


WALKERS: dict[str, type[Verifier]] = {"walking-wor": WalkingWOR}

# name: (builder, its options, verifier, the rows' configurations)
CASES: dict[str, tuple[str, dict[str, Any], str, list[SamplingConfig]]] = {
    "static-iid/rejection-iid": ("static", {"expansion": (3, 2), "mode": "iid"}, "rejection-iid", CONFIGS),
    "static-wor/rejection-wor": ("static", {"expansion": (3, 2), "mode": "wor"}, "rejection-wor", CONFIGS),
    "eagle/mixed": ("eagle", {}, "mixed", CONFIGS),
    "eagle/match": ("eagle", {}, "match", CONFIGS),
    "rheo/mixed": ("rheo", {"K": 3, "m": 1, "B": 2, "depth": 2, "N": 5, "M": 4}, "mixed", CONFIGS),
    "chain/block": ("chain", {"depth": 3}, "block", CONFIGS),
    "static-iid/kseq": ("static", {"expansion": (3, 1), "mode": "iid"}, "kseq", SAMPLED),
    "static-wor/walking-wor": ("static", {"expansion": (2, 2), "mode": "wor"}, "walking-wor", CONFIGS),
    "eagle/greedy": ("eagle", {}, "greedy", [SamplingConfig(temperature=0.0)] * 4),
}
RANDOMS = ("torch", "counter")
TRIALS = 3


def _source(kind: str, seed: int) -> RandomSource:
    return TorchRandom.seeded(seed) if kind == "torch" else CounterRandom(seed)


def build(case: str, kind: str, trial: int) -> tuple[Any, torch.Tensor, str | Verifier, list[SamplingConfig], RowStreams]:
    """The case's tree batch (drafted through :class:`TreeFeed` from the toy draft table), the
    target's logits (row 1's root NaN, row 2's draft flagged), the verifier and the verify sources."""
    name, options, verifier, configs = CASES[case]
    B = len(configs)
    roots = torch.tensor([(3 * b + trial) % V for b in range(B)])
    seeds = [1000 * trial + 10 * b for b in range(B)]
    feed = TreeFeed(get("tree", name)(**options), roots, configs, RowStreams([_source(kind, s) for s in seeds]),
                    DraftSpec(V))
    while (request := feed.request) is not None:
        feed.give(request.level, DRAFT[roots] if request.level == 0 else DRAFT[request.tokens])
    tree = feed.tree
    logits = TARGET[tree.tokens]  # [B, n, V]
    logits[1, 0] = float("nan")
    flagged = torch.zeros(B, dtype=torch.bool)
    flagged[2] = True
    tree = attrs.evolve(tree, draft_bad=flagged)
    rule = WALKERS[verifier]() if verifier in WALKERS else verifier
    return tree, logits, rule, configs, RowStreams([_source(kind, s + 7) for s in seeds])


def outputs(case: str, kind: str, trial: int) -> dict[str, Any]:
    """What :func:`verify_for_engine` gives on the case, and the verify sources' next draw."""
    tree, logits, verifier, configs, streams = build(case, kind, trial)
    out = verify_for_engine(tree, logits, verifier, configs, streams)
    after = [s.uniforms((1,)).item() for s in streams.sources]
    return {"path": out.path, "accepted": out.accepted.tolist(), "tokens": out.tokens.tolist(),
            "num_accepted": out.num_accepted.tolist(), "num_emitted": out.num_emitted.tolist(),
            "bad": out.bad.tolist(), "after": after}


def case_ids() -> list[str]:
    return [f"{case}/{kind}/{trial}" for case in CASES for kind in RANDOMS for trial in range(TRIALS)]


def run(case_id: str) -> dict[str, Any]:
    *case, kind, trial = case_id.split("/")
    return outputs("/".join(case), kind, int(trial))


if __name__ == "__main__":
    LOCK.write_text(json.dumps({cid: run(cid) for cid in case_ids()}, indent=0, sort_keys=True) + "\n")
    print(f"recorded {len(case_ids())} cases in {LOCK}")
