"""Measure RheoSampling's sampled slot for a target and an EAGLE head: what ``M`` and ``proxy_scale`` to use.

At each context the target's processed law ``p`` and the draft's ``q`` (both
at ``--temperature``, default 1) give, *exactly* (no sampling of the node):

* EAGLE's acceptance at a node with the top-``K`` children, ``p(S_K)``
  (sample-and-match, rule 2);
* Rheo's acceptance with the top-``(K-1)`` set ``S`` plus one sampled child
  from ``q' = norm(q on topM minus S)``, verified by rule 5:
  ``p(S) + sum_x min(p(x), q'(x))``, for every ``M`` in ``--M``;
* the residual mass ``r = 1 - q(S)`` (the reconstruction's first proxy, docs/trees.md) and the slot's
  acceptance ``a = sum_x min(p(x), q'(x))``: the ratio ``E[a] / E[r]`` is the
  draft's *tail calibration*, the ``proxy_scale`` of the ``"scaled"`` proxy
  (1 when ``q = p``).

Contexts: the root of each generation step while the target samples a
continuation of ``--prompts`` first user turns of ShareGPT *training-split*
conversations (seeded; the held-out slice and the bench prompts are not
used), ``--steps`` steps each.

Usage::

    python benchmarks/rheo_calibration.py                   # shipped EAGLE-3 head, 6 prompts x 40 steps
    python benchmarks/rheo_calibration.py --version 2 --M 64,1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch


def slot_acceptance(
    p: torch.Tensor, q: torch.Tensor, K: int, M: int, order: torch.Tensor | None = None
) -> tuple[float, float, float, float]:
    """Exact acceptances at one node (``p``, ``q``: ``[V]`` float64 laws;
    ``order``: ``q``'s ids by decreasing ``q``, computed when not given).

    Returns:
        ``(p(S_K), p(S), sum min(p, q'), 1 - q(S))`` with ``S_K`` the top-``K``
        of ``q``, ``S`` its top-``(K-1)`` and ``q'`` the normalised ``q`` on
        its top-``M`` minus ``S``; Rheo's acceptance is ``p(S) + sum min(p, q')``.

    Example:
        >>> import torch
        >>> p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
        >>> q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
        >>> [round(x, 3) for x in slot_acceptance(p, q, K=2, M=4)]
        [0.7, 0.5, 0.5, 0.6]
    """
    if order is None:
        order = torch.argsort(q, descending=True, stable=True)
    S, cand = order[: K - 1], order[K - 1 : M]
    eagle = float(p[order[:K]].sum())
    mass = q[cand].sum()
    overlap = float(torch.minimum(p[cand], q[cand] / mass).sum()) if mass > 0 else 0.0
    return eagle, float(p[S].sum()), overlap, float(1.0 - q[S].sum())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", type=int, default=3, choices=(2, 3), help="shipped EAGLE head version")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--M", default="64,256,1024,all", help="sparse draft sizes, comma separated")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.temperature > 0:
        ap.error("--temperature must be > 0 (at T = 0 Rheo has no sampled slot)")

    import specdec
    from specdec.bench.prompts import render_prompt
    from specdec.drafts.eagle.checkpoints import load_head, shipped_head_path
    from specdec.drafts.eagle import hf_feature_fn, make_draft
    from specdec.models.smollm2 import load_smollm2
    from specdec.targets.hf import HFTarget
    from specdec.train.data import is_heldout, load_records

    model, tok = load_smollm2()
    recs = [r for r in load_records(None, split="train") if r.messages and r.messages[0][0] == "user"
            and not is_heldout(r.id)]
    random.Random(args.seed).shuffle(recs)
    prompts = [render_prompt(tok, r.messages[0][1][:800]) for r in recs[: args.prompts]]
    head = load_head(shipped_head_path(args.version), model)
    cfg = specdec.SamplingConfig(temperature=args.temperature)
    sizes = [s.strip() for s in args.M.split(",")]
    sums = {"eagle": 0.0, "residual": 0.0, **{f"rheo_M{s}": 0.0 for s in sizes}, **{f"slot_M{s}": 0.0 for s in sizes}}
    n = 0
    t0 = time.time()
    for i, prompt in enumerate(prompts):
        draft = make_draft(head, feature_fn=hf_feature_fn(model, head.config.target_layers))
        target = HFTarget(model, capture_layers=head.config.target_layers)
        target.prefill(prompt)
        draft.begin(prompt, target_hidden=target.hidden_states())
        root = prompt[-1]
        g = torch.Generator().manual_seed(args.seed * 1000 + i)
        for _ in range(args.steps):
            q = draft.root_distribution(cfg).double()
            q = q / q.sum()
            tree = specdec.DraftTree.chain(root, [], [], vocab_size=q.shape[0])
            p = specdec.process_logits(target.score_tree(tree), cfg)[0].double()
            order = torch.argsort(q, descending=True, stable=True)
            for s in sizes:
                M = q.shape[0] if s == "all" else int(s)
                eagle, p_s, slot, residual = slot_acceptance(p, q, args.K, M, order)
                sums[f"rheo_M{s}"] += p_s + slot
                sums[f"slot_M{s}"] += slot
            sums["eagle"] += eagle
            sums["residual"] += residual
            n += 1
            nxt = int(torch.multinomial(p.float(), 1, generator=g))
            target.accept([], nxt)
            draft.commit([nxt], target_hidden=target.hidden_states()[[0]])
            root = nxt
        print(f"prompt {i + 1}/{len(prompts)}: {n} contexts, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    mean = {k: v / n for k, v in sums.items()}
    out = {
        "contexts": n, "K": args.K, "temperature": args.temperature, "version": args.version,
        "acceptance_eagle_topK": mean["eagle"],
        "acceptance_rheo": {s: mean[f"rheo_M{s}"] for s in sizes},
        "slot_acceptance": {s: mean[f"slot_M{s}"] for s in sizes},
        "residual_mass": mean["residual"],
        "proxy_scale": {s: mean[f"slot_M{s}"] / mean["residual"] for s in sizes},
    }
    print(f"{n} contexts, K = {args.K}, T = {args.temperature}: EAGLE top-{args.K} acceptance "
          f"{out['acceptance_eagle_topK']:.3f}; residual mass 1 - q(S) {out['residual_mass']:.3f}")
    print("M      rheo acceptance   slot acceptance   proxy_scale = E[slot] / E[1 - q(S)]")
    for s in sizes:
        print(f"{s:<6} {out['acceptance_rheo'][s]:>15.3f}   {out['slot_acceptance'][s]:>15.3f}   "
              f"{out['proxy_scale'][s]:>10.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
