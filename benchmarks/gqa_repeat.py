"""What a full 4D tree mask costs grouped-query attention (issue 14, item 7).

transformers' SDPA attention (5.x, ``use_gqa_in_sdpa``) passes ``enable_gqa``
to ``scaled_dot_product_attention`` only when there is *no* mask; with the
4D tree mask of a speculative step it first repeats every key/value head
``num_heads / num_kv_heads`` times (``repeat_kv``). This script measures, for
one attention layer of a tree forward, (a) what transformers does: repeat,
then masked SDPA; (b) masked SDPA with ``enable_gqa=True`` and no repeat; and
the bytes the repeat materialises per layer.

    python benchmarks/gqa_repeat.py --json benchmarks/results/gqa_repeat.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (heads, kv heads, head dim, layers)
    "SmolLM2-135M": (9, 3, 64, 30),
    "Llama-3.2-1B": (32, 8, 64, 16),
    "Llama-3.1-8B": (32, 8, 128, 32),
}


def time_ms(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512, help="committed tokens in the KV cache")
    ap.add_argument("--tree", type=int, default=61, help="tree tokens scored (60 nodes + root)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows = []
    for name, (h, kv, d, layers) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        t, s = args.tree, args.context + args.tree
        q = torch.randn(1, h, t, d, generator=g).to(dtype)
        k = torch.randn(1, kv, s, d, generator=g).to(dtype)
        v = torch.randn(1, kv, s, d, generator=g).to(dtype)
        visible = torch.ones(t, s, dtype=torch.bool)
        visible[:, args.context:] = torch.rand(t, t, generator=g) < 0.2
        visible[:, args.context:] |= torch.eye(t, dtype=torch.bool)
        mask = torch.zeros(1, 1, t, s, dtype=dtype).masked_fill(~visible, float("-inf"))
        group = h // kv

        def repeat_then_sdpa():
            kk = k[:, :, None].expand(1, kv, group, s, d).reshape(1, h, s, d)
            vv = v[:, :, None].expand(1, kv, group, s, d).reshape(1, h, s, d)
            return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)

        def sdpa_gqa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

        same = torch.allclose(repeat_then_sdpa().float(), sdpa_gqa().float(), atol=1e-2 if dtype != torch.float32 else 1e-5)
        a, b = time_ms(repeat_then_sdpa, args.repeats), time_ms(sdpa_gqa, args.repeats)
        repeated = 2 * (h - kv) * s * d * torch.finfo(dtype).bits // 8
        rows.append(dict(model=name, heads=h, kv_heads=kv, head_dim=d, layers=layers, context=args.context,
                         tree=t, dtype=args.dtype, ms_repeat=a, ms_gqa=b, equal=bool(same),
                         repeat_bytes_per_layer=repeated, repeat_mib_per_forward=repeated * layers / 2**20))
        print(f"{name:14s} heads {h}/{kv}: repeat+sdpa {a:7.3f} ms, sdpa(enable_gqa) {b:7.3f} ms per layer; "
              f"repeat materialises {repeated / 2**20:.2f} MiB per layer ({repeated * layers / 2**20:.1f} MiB per forward); "
              f"outputs equal: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
