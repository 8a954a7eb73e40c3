"""The RheoSampling confirmation's registered analysis (issue 47; ``benchmarks/preregistration/rheo_confirm.md``).

Reads the ``runs.jsonl`` of the confirmation's folders (one per temperature, written by the
registered ``specdec bench`` commands) and prints, per temperature:

- tau (emitted tokens per target forward, bonus token included) per row, pooled over its generations;
- the paired tau ratios rheo / eagle3, sampled-dynamic / eagle3 and rheo / sequoia@eagle3 (and, as a
  secondary figure, sampled-dynamic / sequoia@eagle3), each the ratio of the two rows' pooled tau
  over the (prompt, seed) units both finished, with a 95% percentile interval from a bootstrap that
  resamples *conversations* (the prompts' ShareGPT base ids) with replacement, 10,000 resamples,
  seed 47 (:data:`BOOTSTRAP`, :data:`SEED`);
- tokens per second of each row over the interleaved autoregressive baseline's on the same units
  (labelled CPU timings: the registered run is on a shared 2-core CPU), with the same bootstrap;
- the registered predictions' verdicts (:func:`verdicts`).

Before any figure it checks that the folders are one registered run: every header records the drafts'
content hashes (``draft_sha256``); the folders agree on every setting of
``benchmarks/rheo_sweep_table.py``'s ``SAME`` (target, drafts, heads' hashes, tokens, budget, prompts)
and on rows and seeds, and each holds one temperature; and, unless ``--unregistered`` is given, the
settings are the registered ones (:data:`REGISTERED`). A mismatch is an error naming the field.

Usage::

    python benchmarks/rheo_confirm_table.py benchmarks/results/rheo_confirm_smollm2_t06 \\
        benchmarks/results/rheo_confirm_smollm2_t1 --markdown confirm.md --json confirm.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rheo_sweep_table import HASHES, config_differences  # noqa: E402

from specdec.bench.runlog import read_runlog  # noqa: E402
from specdec.errors import SpecDecError  # noqa: E402
from specdec.train.data import base_id  # noqa: E402

BOOTSTRAP = 10_000
"""Bootstrap resamples (of conversations) per interval."""

SEED = 47
"""Seed of the bootstrap (``random.Random(SEED)``, one fresh generator per interval)."""

EVERY_SLOT = {0.6: "sampled-dynamic[proxy=calibrated,M=8192]", 1.0: "sampled-dynamic"}
"""The registered sampled-dynamic row per temperature (the default policy's bench settings, docs/trees.md)."""

ROLES: dict[str, str | dict[float, str]] = {"rheo": "rheo", "every-slot": EVERY_SLOT, "eagle3": "eagle3",
                                            "sequoia": "sequoia@eagle3", "baseline": "autoregressive"}
"""The registered rows by role, one row or one per temperature (``--role ROLE=ROW`` overrides one with
``--unregistered``)."""


def row_of(roles: dict[str, str | dict[float, str]], role: str, t: float) -> str:
    """The row that plays ``role`` at temperature ``t``."""
    row = roles[role]
    return row if isinstance(row, str) else row[float(t)]

PAIRS = (("rheo", "eagle3"), ("every-slot", "eagle3"), ("rheo", "sequoia"))
"""The registered paired tau ratios (numerator role, denominator role)."""

SECONDARY = (("every-slot", "sequoia"),)
"""Ratios printed beside the registered ones, marked secondary."""

REGISTERED: dict[str, Any] = {
    "target": "smollm2",
    "eagle3_head": "auto",
    "max_new_tokens": 96,
    "budget": {"nodes": 60, "depth": 6},
    "max_prompt_tokens": 512,
    "ignore_eos": False,
    "batch_size": 1,
    "seeds": [0, 1],
    "temperatures": [0.6, 1.0],
    "rows": {t: ["autoregressive", "eagle3", "rheo", EVERY_SLOT[t], "sequoia@eagle3"] for t in (0.6, 1.0)},
    "prompts": {"count": 40, "sha256": "de600cc02f0fe22a170f53c0d77c4f5949414fc2260449e2c21065c026a61b18"},
    "eagle3_sha256": "c6323e53b9fa07feaa0c1176b01bc3726b32a4413a3c445214d9f9488556aeb7",
}
"""The registered run (``benchmarks/preregistration/rheo_confirm.md``, "Settings")."""

PREDICTION_T = 1.0
PREDICTED_RHEO_OVER_EAGLE3 = 1.15
"""Registered prediction: rheo / eagle3 at T = 1 at least this (point estimate), with the interval above 1."""
LEVEL_BAND = (0.90, 1.10)
"""Registered meaning of "level": the 95% interval contains 1 and lies inside this band."""


class Refused(SystemExit):
    """The logs are not one (registered) run: the message names the field."""


def read_run(dirs: Sequence[Path]) -> tuple[dict[float, dict[str, Any]], dict[float, list[dict[str, Any]]],
                                            dict[float, list[str]]]:
    """``(config per temperature, records per temperature, prompt ids per temperature)`` of the folders, checked
    to be one run (module docstring; the rows may differ by temperature). Raises :class:`Refused` naming what
    differs."""
    logs = []
    for d in dirs:
        try:
            logs.append((d, read_runlog(d)))
        except SpecDecError as exc:
            raise Refused(f"{d}: {exc}") from None
    for d, log in logs:
        if HASHES not in log.config:
            raise Refused(f"{d}: the header records no {HASHES} (a log written before run logs recorded the drafts' "
                          "content hashes): the registered analysis needs them")
        if len(log.config["temperatures"]) != 1:
            raise Refused(f"{d}: temperatures: {log.config['temperatures']}; the registered run has one folder per "
                          "temperature")
    (d0, first), rest = logs[0], logs[1:]
    for d, log in rest:
        diff = config_differences(first.config, log.config, (str(d0), str(d)))
        for key in ("seeds", "eagle3_head", "draft"):
            if first.config.get(key) != log.config.get(key):
                diff.append(f"{key}: {first.config.get(key)} in {d0}, {log.config.get(key)} in {d}")
        if first.resolved["prompts"]["ids"] != log.resolved["prompts"]["ids"]:
            diff.append(f"prompts (ids run): {d0} and {d} ran different prompts")
        if diff:
            raise Refused(f"{d} is not part of the same run as {d0}: " + "; ".join(diff))
    configs: dict[float, dict[str, Any]] = {}
    records: dict[float, list[dict[str, Any]]] = {}
    ids: dict[float, list[str]] = {}
    for d, log in logs:
        t = float(log.config["temperatures"][0])
        if t in records:
            raise Refused(f"{d}: a second folder of T={t:g}")
        configs[t] = log.config
        records[t] = list(log.records)
        ids[t] = [str(i) for i in log.resolved["prompts"]["ids"]]
    return configs, records, ids


def check_registered(configs: dict[float, dict[str, Any]], roles: dict[str, Any]) -> None:
    """Raise :class:`Refused` naming the first setting that is not the registered one (:data:`REGISTERED`)."""
    if sorted(configs) != REGISTERED["temperatures"]:
        raise Refused(f"not the registered run: temperatures {sorted(configs)}, registered "
                      f"{REGISTERED['temperatures']}")
    for t, config in sorted(configs.items()):
        for key in ("target", "eagle3_head", "max_new_tokens", "budget", "max_prompt_tokens", "ignore_eos",
                    "batch_size", "seeds", "rows", "prompts"):
            want = REGISTERED[key][t] if key == "rows" else REGISTERED[key]
            if config.get(key) != want:
                raise Refused(f"not the registered run: {key} is {json.dumps(config.get(key))} at T={t:g}, registered "
                              f"{json.dumps(want)}")
        head = (config.get(HASHES) or {}).get("eagle3", {}).get("sha256")
        if head != REGISTERED["eagle3_sha256"]:
            raise Refused(f"not the registered run: {HASHES}.eagle3 is {head}, registered {REGISTERED['eagle3_sha256']}")
    if roles != ROLES:
        raise Refused("not the registered run: --role changes the registered rows (give --unregistered)")


Units = dict[tuple[int, int], dict[str, Any]]


def units_of(records: Sequence[dict[str, Any]], row: str) -> Units:
    """``{(prompt index, seed): record}`` of one row."""
    return {(r["prompt_index"], r["seed"]): r for r in records if r["row"] == row}


def _pooled(units: Sequence[dict[str, Any]], num: str, den: str) -> float:
    d = sum(float(u[den]) for u in units)
    return sum(float(u[num]) for u in units) / d if d else float("nan")


def paired_ratio(a: Units, b: Units, conversation: dict[int, str], num: str, den: str, *,
                 resamples: int = BOOTSTRAP, seed: int = SEED) -> dict[str, Any]:
    """Ratio of ``a``'s pooled ``num / den`` to ``b``'s over the units both hold, with a 95% percentile
    interval from a bootstrap over conversations (``conversation``: prompt index -> conversation)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "units": 0, "conversations": 0}
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for u in shared:
        groups[conversation[u[0]]].append(u)
    names = sorted(groups)

    def value(keys: list[tuple[int, int]]) -> float:
        return _pooled([a[k] for k in keys], num, den) / _pooled([b[k] for k in keys], num, den)

    rng = random.Random(seed)
    draws = sorted(value([k for c in rng.choices(names, k=len(names)) for k in groups[c]]) for _ in range(resamples))
    return {"ratio": value(shared), "low": draws[int(0.025 * resamples)], "high": draws[int(0.975 * resamples) - 1],
            "units": len(shared), "conversations": len(names)}


def verdicts(ratios: dict[tuple[float, str, str], dict[str, Any]]) -> list[str]:
    """The registered predictions at T = 1 (benchmarks/preregistration/rheo_confirm.md, "Expected result"):
    rheo / eagle3 at least :data:`PREDICTED_RHEO_OVER_EAGLE3` with its interval above 1, and rheo level with
    sequoia@eagle3 (:data:`LEVEL_BAND`)."""
    out = []
    r = ratios.get((PREDICTION_T, "rheo", "eagle3"))
    if r and r["units"]:
        met = r["ratio"] >= PREDICTED_RHEO_OVER_EAGLE3 and r["low"] > 1.0
        out.append(f"P1 (rheo / eagle3 at T={PREDICTION_T:g} >= {PREDICTED_RHEO_OVER_EAGLE3}, interval above 1): "
                   f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]: {'as predicted' if met else 'NOT as predicted'}")
    s = ratios.get((PREDICTION_T, "rheo", "sequoia"))
    if s and s["units"]:
        level = s["low"] <= 1.0 <= s["high"] and LEVEL_BAND[0] <= s["low"] and s["high"] <= LEVEL_BAND[1]
        ahead, behind = s["low"] > 1.0, s["high"] < 1.0
        word = "level, as predicted" if level else ("ahead beyond the noise" if ahead else
                                                    "behind beyond the noise" if behind else "not resolved")
        out.append(f"P2 (rheo level with sequoia@eagle3 at T={PREDICTION_T:g}: interval contains 1, inside "
                   f"[{LEVEL_BAND[0]}, {LEVEL_BAND[1]}]): {s['ratio']:.3f} [{s['low']:.3f}, {s['high']:.3f}]: {word}")
    return out


def analyse(dirs: Sequence[Path], roles: dict[str, Any] | None = None, *, registered: bool = True,
            resamples: int = BOOTSTRAP) -> dict[str, Any]:
    """Everything the registered analysis reports, as plain data (see the module docstring)."""
    roles = dict(ROLES if roles is None else roles)
    configs, records, ids = read_run(dirs)
    if registered:
        check_registered(configs, roles)
    for t, config in sorted(configs.items()):
        try:
            missing = [f"{role}={row_of(roles, role, t)}" for role in roles if row_of(roles, role, t) not in config["rows"]]
        except KeyError:
            raise Refused(f"T={t:g}: no registered row of every role at this temperature") from None
        if missing:
            raise Refused(f"rows: the logs have no row {', '.join(missing)} at T={t:g} (rows {config['rows']})")
    out: dict[str, Any] = {"dirs": [str(d) for d in dirs], "registered": registered,
                           "roles": {role: row if isinstance(row, str) else {f"{t:g}": r for t, r in row.items()}
                                     for role, row in roles.items()},
                           "bootstrap": {"resamples": resamples, "seed": SEED, "unit": "conversation"},
                           "temperatures": []}
    ratios: dict[tuple[float, str, str], dict[str, Any]] = {}
    for t in sorted(records):
        conv = {i: base_id(pid) for i, pid in enumerate(ids[t])}
        recs = records[t]
        names = {role: row_of(roles, role, t) for role in roles}
        by_role = {role: units_of(recs, row) for role, row in names.items()}
        planned = len(ids[t]) * len(configs[t]["seeds"])  # units of each row
        entry: dict[str, Any] = {"temperature": t, "conversations": len(set(conv.values())), "rows": {}, "ratios": [],
                                 "speedups": [], "planned_units": planned,
                                 "complete": all(len(u) >= planned for u in by_role.values())}
        for role, units in by_role.items():
            if role == "baseline":
                continue
            vals = list(units.values())
            entry["rows"][names[role]] = {"tau": _pooled(vals, "emitted", "steps"), "generations": len(vals)}
        for kind, pairs in (("registered", PAIRS), ("secondary", SECONDARY)):
            for num, den in pairs:
                r = paired_ratio(by_role[num], by_role[den], conv, "emitted", "steps", resamples=resamples)
                ratios[(t, num, den)] = r
                entry["ratios"].append({"kind": kind, "num": names[num], "den": names[den], **r})
        for role in ("eagle3", "rheo", "every-slot", "sequoia"):  # tokens/s over the interleaved baseline
            s = paired_ratio(by_role[role], by_role["baseline"], conv, "new_tokens", "time_total", resamples=resamples)
            entry["speedups"].append({"row": names[role], **s})
        out["temperatures"].append(entry)
    out["verdicts"] = verdicts(ratios)
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = []
    if not result["registered"]:
        lines += ["**Not the registered analysis** (`--unregistered`: settings not checked against the registration).", ""]
    boot = result["bootstrap"]
    lines.append(f"Logs: {', '.join(result['dirs'])}. 95% intervals: bootstrap over conversations "
                 f"({boot['resamples']} resamples, seed {boot['seed']}).")
    for e in result["temperatures"]:
        partial = "" if e["complete"] else f"; **partial**: fewer than {e['planned_units']} units in some row"
        lines += ["", f"### T = {e['temperature']:g} ({e['conversations']} conversations{partial})", "",
                  "| row | tau | generations |", "|---|---|---|"]
        lines += [f"| {row} | {v['tau']:.3f} | {v['generations']} |" for row, v in e["rows"].items()]
        lines += ["", "| ratio of tau | paired [95% CI] | units | |", "|---|---|---|---|"]
        for r in e["ratios"]:
            lines.append(f"| {r['num']} / {r['den']} | {r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}] | "
                         f"{r['units']} | {r['kind']} |")
        lines += ["", "| tokens/s over autoregressive (CPU timings) | [95% CI] | units |", "|---|---|---|"]
        lines += [f"| {s['row']} | {s['ratio']:.3f} [{s['low']:.3f}, {s['high']:.3f}] | {s['units']} |"
                  for s in e["speedups"]]
    if result["verdicts"]:
        lines += ["", "Registered predictions:", ""] + [f"- {v}" for v in result["verdicts"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="the confirmation's --out folders (one per temperature)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--unregistered", action="store_true",
                    help="skip the check against the registered settings (any run of these rows; marked as such)")
    ap.add_argument("--role", action="append", default=[], metavar="ROLE=ROW",
                    help=f"with --unregistered, the row of a role ({', '.join(ROLES)})")
    ap.add_argument("--resamples", type=int, default=BOOTSTRAP, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    roles: dict[str, Any] = dict(ROLES)
    for spec in args.role:
        role, sep, row = spec.partition("=")
        if not sep or role not in ROLES or not row:
            ap.error(f"--role {spec!r}: expected ROLE=ROW with ROLE in {', '.join(ROLES)}")
        roles[role] = row
    result = analyse(args.dirs, roles, registered=not args.unregistered, resamples=args.resamples)
    text = markdown(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
