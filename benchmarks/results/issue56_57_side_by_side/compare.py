import json, sys
def load(p):
    return {(r['method'], r.get('draft'), r['temperature']): r for r in json.load(open(p))}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"| method | T | {sys.argv[3]} tok/s | {sys.argv[4]} tok/s | ratio | speedup {sys.argv[3]} | speedup {sys.argv[4]} | budget {sys.argv[3]} / {sys.argv[4]} |")
print("|---|---|---|---|---|---|---|---|")
for k, r in a.items():
    o = b.get(k)
    if o is None: continue
    print(f"| {k[0]} | {k[2]:g} | {r['tokens_per_s']:.1f} | {o['tokens_per_s']:.1f} | {r['tokens_per_s']/o['tokens_per_s']:.3f} | "
          f"{r['speedup']:.2f}x | {o['speedup']:.2f}x | {r.get('budget_nodes')} / {o.get('budget_nodes')} |")
