"""Markdown tables from the results ledger (docs/reports/ledger.jsonl, replayssm.record/1 records).

    python tools/ledger_tables.py TABLE [ARG]          # print one table
    python tools/ledger_tables.py --update FILE ...    # regenerate every generated block of FILE
    python tools/ledger_tables.py --check FILE ...     # exit 1 when a block differs from the ledger

A generated block in a Markdown file sits between ``<!-- ledger: TABLE [ARG] -->`` and
``<!-- /ledger -->``; every row cites the records it shows as ``rec:ID``.  Tables: side-by-side
FAMILY, kda-side-by-side, bench-gate, drift-full, drift-adapters, drift-speed, validate-speed,
kda-bench, findings-validate, adapters-fuzz, nightly-fuzz,
findings-cpu SECTION.  Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LEDGER = Path(__file__).resolve().parents[1] / "docs" / "reports" / "ledger.jsonl"
BLOCK = re.compile(r"(<!-- ledger: ([^>]+?) -->\n)(.*?)(<!-- /ledger -->)", re.S)


def load(path: Path = LEDGER) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("–" if c is None else str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _g(x, digits=3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _cite(*recs) -> str:
    return " ".join(f"rec:{r['id']}" for r in recs if r)


def _newest_source(recs: list[dict], prefix: str) -> list[dict]:
    picked = [r for r in recs if r["source"].startswith(prefix)]
    newest = max((r["created"], r["source"]) for r in picked)[1] if picked else None
    return [r for r in picked if r["source"] == newest]


def side_by_side(recs, family: str) -> str:
    rs = [r for r in _newest_source(recs, f"docs/reports/against_{family}_") if r["kernel"] != "copy"]
    by = defaultdict(dict)
    for r in rs:
        c = r["config"]
        by[(c["decode"], -c["k"], c["batch"])][r["kernel"]] = r
    kernels = sorted({r["kernel"] for r in rs}, key=lambda k: (not k.startswith("triton"), "baseline" in k, k))
    header = ["decode", "batch", *[f"{k} µs" for k in kernels], "ours / theirs (replay)", "records (replay)"]
    rows = []
    for (dec, negk, batch), ks in sorted(by.items(), key=lambda kv: (kv[0][0] != "standard", kv[0][1], kv[0][2])):
        ours, theirs = (
            ks.get("triton-replay"),
            next((ks[k] for k in kernels if k in ks and not k.startswith("triton") and "baseline" not in k), None),
        )
        cells = []
        for k in kernels:
            r = ks.get(k)
            cells.append(None if r is None else f"{r['metrics']['us']:.1f}{' FAIL' if r['verdict'] == 'fail' else ''}")
        ratio = f"{theirs['metrics']['us'] / ours['metrics']['us']:.2f}x" if ours and theirs else None
        label = "standard L=16" if dec == "standard" else f"spec T'=4 B=16 k={-negk}"
        rows.append([label, batch, *cells, ratio, _cite(ours, theirs)])
    r0 = rs[0]
    return (
        f"{r0['family']} ({'speculative' if 'spec' in family else 'standard' if 'std' in family else 'both decodes'}), "
        f"{r0['geometry']}, commit `{r0['commit'][:12]}`, {r0['device']['name']} "
        f"(FAIL: the engine's verdict on that kernel failed; ratio > 1: ours faster)\n\n" + _table(header, rows)
    )


def kda_side_by_side(recs, _arg=None) -> str:
    return "\n".join(
        side_by_side([r for r in recs if "against_kda_" + part in r["source"]], "kda_" + part)
        for part in ("std", "spec")
    )


def bench_gate(recs, _arg=None) -> str:
    rs = [r for r in recs if r["case"].startswith("bench-gate/")]
    thr = [r for r in rs if r["case"].endswith("/threshold")]
    out = _table(
        ["part", "worst same-commit change", "benchmarks", "threshold", "runs A / B / C exit", "record"],
        [
            [
                r["config"]["part"],
                f"{r['metrics']['worst_same_commit_change_pct']} %",
                r["metrics"]["benchmarks"],
                f"{r['metrics']['threshold_pct']} %",
                f"{r['metrics']['exit_a']} / {r['metrics']['exit_b']} / {r['metrics']['exit_c']}",
                _cite(r),
            ]
            for r in thr
        ],
    )
    noise = {r["config"]["benchmark"]: r for r in rs if "/noise/" in r["case"] and r["config"]["part"] == "kernels"}
    slow = {r["config"]["benchmark"]: r for r in rs if "/slowed/" in r["case"] and r["config"]["part"] == "kernels"}
    rows = []
    for b, r in noise.items():
        s = slow.get(b)
        rows.append(
            [
                b.removeprefix("test_kernel[").rstrip("]"),
                _g(r["metrics"].get("base_median_us")),
                f"{r['metrics']['change_pct']:+} %",
                f"{s['metrics']['change_pct']:+} %{' **over**' if s['metrics'].get('over_threshold') else ''}"
                if s
                else None,
                _cite(r, s),
            ]
        )
    return out + "\n" + _table(["kernel case", "median µs", "A -> B (noise)", "A -> C (slowed)", "records"], rows)


def _drift_cells(recs, prefix):
    rs = [r for r in recs if r["job"] == "drift" and r["source"] == prefix]
    by = defaultdict(dict)
    for r in rs:
        by[(r["family"], r["kernel"], r["mode"])][r["config"]["schedule"]] = r
    return by


def _bits(r, key):
    if r is None or r["metrics"].get(key) is None:
        return None
    return f"{r['metrics'][key]:g}{' ⚠' if r['metrics'].get('bits_warning') else ''}"


def drift_table(recs, source: str) -> str:
    rows = []
    for (fam, kern, mode), s in sorted(_drift_cells(recs, source).items()):
        std, spec = s.get("standard"), s.get("spec-random")
        stopped = [
            f"{k} stopped at {r['metrics']['stopped_at_token']:,}"
            for k, r in s.items()
            if r["metrics"].get("stopped_at_token")
        ]
        rows.append(
            [
                fam,
                kern,
                mode,
                f"{_bits(std, 'eff_bits_output') or '–'} / {_bits(spec, 'eff_bits_output') or '–'}",
                f"{_bits(std, 'eff_bits_state') or '–'} / {_bits(spec, 'eff_bits_state') or '–'}",
                (std or spec)["metrics"]["tokens_to_budget"],
                (spec or {}).get("metrics", {}).get("spec_verdict"),
                "; ".join(stopped) or None,
                _cite(std, spec),
            ]
        )
    r0 = next(iter(next(iter(_drift_cells(recs, source).values())).values()))
    c = r0["config"]
    return (
        f"{c['rows']} rows x {c['tokens_per_row']:,} tokens per cell, commit `{r0['commit']}`, "
        f"{r0['device']['name']}\n\n"
        + _table(
            [
                "family",
                "kernel",
                "mode",
                "eff. bits out std / spec",
                "eff. bits state std / spec",
                "tokens to budget",
                "speculation",
                "stopped",
                "records",
            ],
            rows,
        )
    )


def drift_full(recs, _arg=None) -> str:
    return drift_table(recs, "docs/reports/drift_full_h100_fa523b373387.md")


def drift_adapters(recs, _arg=None) -> str:
    return drift_table(recs, "docs/reports/drift_adapters_h200_3d1cdb4.md")


def drift_speed(recs, _arg=None) -> str:
    rows = []
    for r in sorted((r for r in recs if r["case"].startswith("drift-full/")), key=lambda r: r["created"]):
        m = r["metrics"]
        rows.append(
            [
                "full report, 32 cells x 10^6 tokens",
                r["device"]["name"],
                r["commit"][:12],
                f"{m['sweep_wall_s'] / 60:.1f} min ({m['calls']} call(s), {m['workers']} workers)",
                _g(m["tokens_per_s"]),
                _cite(r),
            ]
        )
    rates = [r for r in recs if r["case"].startswith("drift-rate/") and "run" not in r["metrics"]]
    for r in sorted(rates, key=lambda r: (r["created"], r["case"])):
        if r["device"]["name"].startswith("NVIDIA H100"):
            rows.append(
                [
                    f"one cell: {r['config']['cell']}, {r['config']['rows']} rows",
                    r["device"]["name"],
                    r["commit"],
                    f"{r['metrics']['timed_s']:.0f} s timed",
                    _g(r["metrics"]["tokens_per_s"]),
                    _cite(r),
                ]
            )
    cpu = sorted((r for r in recs if r["case"] == "drift-default/cpu/48-cells"), key=lambda r: r["metrics"]["run"])
    for r in cpu:
        rows.append(
            [
                f"`./dev main` default (48 cells), run {r['metrics']['run']}",
                "2-core CPU",
                r["commit"],
                f"{r['metrics']['wall_s']} s",
                _g(r["metrics"]["tokens_per_s"]),
                _cite(r),
            ]
        )
    # the job's own sweep record of the default CPU run (`./dev main --record FILE`)
    own = [r for r in recs if r["job"] == "drift" and r["case"] == "drift/sweep/gdn=tiny,mamba2=tiny/2x2048"
           and r["device"]["kind"] == "cpu" and r["metrics"].get("cells_run") == 48]
    for r in sorted(own, key=lambda r: r["created"]):
        rows.append(
            [
                f"`./dev main` default (48 cells, {r['metrics']['workers']} workers)",
                "2-core CPU",
                r["commit"][:12],
                f"{r['metrics']['wall_s']:.1f} s",
                _g(r["metrics"]["tokens_per_s"]),
                _cite(r),
            ]
        )
    return _table(["what", "device", "commit", "wall", "validated tokens/s", "record"], rows)


def validate_speed(recs, _arg=None) -> str:
    rows = [
        [
            r["family"],
            r["geometry"],
            r["config"]["decode"],
            r["config"]["batch"],
            r["verdict"],
            _g(r["metrics"]["tokens_per_s"]),
            _g(r["metrics"]["tokens_per_s_with_repeat"]),
            _cite(r),
        ]
        for r in recs
        if r["case"].startswith("validate-speed/")
    ]
    return _table(["family", "geometry", "decode", "batch", "verdict", "tokens/s", "with repeat check", "record"], rows)


def kda_bench(recs, _arg=None) -> str:
    by = defaultdict(dict)
    for r in recs:
        if r["source"].endswith("kda_bench_h200_c2992b8.md"):
            by[r["config"]["batch"]][r["kernel"]] = r
    rows = [
        [
            b,
            _g(k["triton-baseline"]["metrics"]["us"]),
            _g(k["triton-replay"]["metrics"]["us"]),
            _g(k["triton-replay"]["metrics"]["replay_over_baseline"]),
            f"{k['triton-replay']['metrics']['of_copy']:.0%}",
            _g(k["triton-replay"]["metrics"]["model_limit"]),
            _cite(k["triton-baseline"], k["triton-replay"]),
        ]
        for b, k in sorted(by.items(), reverse=True)
    ]
    return _table(["batch", "baseline µs", "replay µs", "speed-up", "replay % of copy", "model limit", "records"], rows)


def findings_validate(recs, _arg=None) -> str:
    rows = [
        [
            r["family"],
            r["kernel"],
            r["config"]["decode"],
            r["mode"],
            r["config"]["schedule"],
            "**FAIL**" if r["verdict"] == "fail" else r["verdict"],
            f"{r['metrics']['first_failure_check']} at step {r['metrics']['first_failure_step']}"
            if r["metrics"].get("first_failure_check")
            else None,
            _g(r["metrics"].get("worst_state_bound_ratio")),
            r["commit"],
            _cite(r),
        ]
        for r in recs
        if r["job"] == "validate" and "findings_h200_validate" in r["source"]
    ]
    return _table(
        [
            "family",
            "kernel",
            "decode",
            "mode",
            "schedule",
            "verdict",
            "first failure",
            "worst state error / bound",
            "commit",
            "record",
        ],
        rows,
    )


def adapters_fuzz(recs, _arg=None) -> str:
    rows = [
        [
            r["family"],
            r["kernel"],
            r["device"]["name"],
            r["mode"] or "fuzzed modes",
            r["metrics"]["examples"],
            "**caught**" if r["verdict"] == "fail" else "pass",
            r["metrics"].get("failure_check"),
            _cite(r),
        ]
        for r in recs
        if r["job"] == "fuzz" and "adapters_fuzz_" in r["source"]
    ]
    return _table(["family", "kernel", "kernel device", "mode", "scenarios", "verdict", "check", "record"], rows)


def nightly_fuzz(recs, _arg=None) -> str:
    rows = [
        [
            r["config"]["run"],
            r["family"],
            r["kernel"],
            r["device"]["kind"],
            _g(r["metrics"]["scenarios"]),
            r["metrics"]["false_alarms"],
            r["verdict"],
            _cite(r),
        ]
        for r in recs
        if r["case"].endswith("/nightly")
    ]
    return _table(["run", "family", "kernel", "device", "scenarios", "false alarms", "verdict", "record"], rows)


def _decode(sc: dict) -> str:
    if sc["decode"] == "standard":
        return f"standard L = {sc['buffer']}"
    return f"speculative T' = {sc['window']}, B = {sc['buffer']}"


def findings_cpu(recs, section: str) -> str:
    """The newest record of each case of the ``findings-cpu`` profile's SECTION, in the profile's order
    (the validate records whose command wrote into ``findings-cpu/SECTION``)."""
    newest: dict[tuple, dict] = {}
    for r in recs:
        if r["job"] == "validate" and f"findings-cpu/{section} " in r["source"] + " ":
            key = (r["kernel"], r["config_digest"])
            if key not in newest or r["created"] >= newest[key]["created"]:
                newest[key] = r
    rows = []
    for r in newest.values():
        sc, m = r["config"]["scenario"], r["metrics"]
        options = ", ".join(f"`{k}={v}`" for k, v in sorted(sc["kernel_options"].items()))
        rows.append([
            r["family"],
            r["kernel"] + (f" ({options})" if options else ""),
            _decode(sc),
            r["mode"],
            f"{sc['schedule']}, {m['steps_run']} steps",
            sc["distribution"],
            "**FAIL**" if r["verdict"] == "fail" else r["verdict"],
            _g(m.get("worst_in_u")),
            _g(m.get("worst_bound_ratio")),
            _g(m.get("worst_state_bound_ratio")),
            _cite(r),
        ])
    return _table(["family", "kernel", "decode", "mode", "schedule", "inputs", "verdict", "output in u",
                   "output / bound", "state / bound", "record"], rows)


def _under(recs, job: str, folder: str | None) -> list[dict]:
    """The newest record of each case of JOB whose command wrote under a folder named FOLDER (a profile's
    ``--out`` layout, e.g. ``.../tf32-state/validate``; None: every record of JOB), oldest case first."""
    newest: dict[tuple, dict] = {}
    for r in recs:
        if r["job"] == job and (folder is None or f"/{folder}/" in r["source"]):
            key = (r["case"], r["config_digest"])
            if key not in newest or r["created"] >= newest[key]["created"]:
                newest[key] = r
    return sorted(newest.values(), key=lambda r: r["created"])


def _verdict(r) -> str:
    return "**FAIL**" if r["verdict"] == "fail" else r["verdict"]


def tf32_state(recs, _arg=None) -> str:
    """The ``tf32-state`` profile (issue 47 on the GPU): each kernel, decode and mode with its verdict."""
    rows = []
    for r in _under(recs, "validate", "tf32-state"):
        sc, m = r["config"]["scenario"], r["metrics"]
        rows.append([r["kernel"], _decode(sc), r["mode"], sc["schedule"], _verdict(r),
                     (r["reason"] or "")[:90] or None, _g(m.get("worst_bound_ratio")),
                     _g(m.get("worst_state_bound_ratio")), _g(m.get("worst_state_err")), r["device"]["name"],
                     _cite(r)])
    return _table(["kernel", "decode", "mode", "schedule", "verdict", "first failure", "output / bound",
                   "state / bound", "state error", "device", "record"], rows)


def model_real(recs, _arg=None) -> str:
    """The ``model-real`` profile (issue 53): the model-level metrics per family and mode."""
    rows = []
    for r in _under(recs, "model", "model-real"):
        m = r["metrics"]
        rows.append([r["family"], r["geometry"].removeprefix("model-"), r["mode"], m["tokens"], _g(m["k3_kl"]),
                     _g(m["p95_abs_dlogprob"]), _g(m["max_abs_dlogprob"]), _g(m["top1_agreement"]),
                     f"{m['flushes']} / {m['wraps']} / {m['rollbacks']}", _verdict(r), r["device"]["name"],
                     _cite(r)])
    return _table(["family", "architecture", "mode", "tokens", "k3-KL", "p95 abs dlogprob", "max abs dlogprob",
                   "top-1 agreement", "flushes / wraps / rollbacks", "verdict", "device", "record"], rows)


def mixer_real(recs, _arg=None) -> str:
    """The ``mixer-real`` profile (issue 52): the mixer kernels validated at real geometry."""
    rows = []
    for r in _under(recs, "mixer", "mixer-real"):
        m = r["metrics"]
        rows.append([r["family"], r["kernel"], r["geometry"], r["mode"], r["config"].get("conv_policy"),
                     m.get("steps_run"), _verdict(r), _g(m.get("worst_mixer-output")), _g(m.get("worst_ssm-state")),
                     (r["reason"] or "")[:90] or None, r["device"]["name"], _cite(r)])
    return _table(["family", "kernel", "geometry", "mode", "conv policy", "steps", "verdict",
                   "worst output / bound", "worst SSM state / bound", "first failure", "device", "record"], rows)


def sanitize(recs, _arg=None) -> str:
    """``tools/sanitize.py`` (issue 50): compute-sanitizer's error count per kernel, decode and tool."""
    rows = [[r["family"], r["kernel"], r["config"]["decode"], r["mode"] or "validate's default", r["config"]["tool"],
             r["metrics"]["errors"], r["metrics"]["exit_code"], _verdict(r),
             (r["reason"] or "").strip().splitlines()[-1][:120] if r["reason"] else None, r["device"]["name"],
             _cite(r)]
            for r in sorted(_under(recs, "sanitize", None),
                            key=lambda r: (r["kernel"], r["family"], r["config"]["decode"], r["config"]["tool"]))]
    return _table(["family", "kernel", "decode", "mode", "tool", "errors", "exit code", "verdict", "why not a pass",
                   "device", "record"], rows)


def calibration_kernels(recs, _arg=None) -> str:
    """``replayssm calibrate --kernels`` runs (a selection of kernels, e.g. the Triton kernels on a GPU): one
    row per family and run, its first false alarm named."""
    from replayssm.validators.jobs.calibration import is_selection

    rows = []
    for r in recs:
        if r["job"] == "calibration" and r["case"].count("/") == 1 and is_selection(r):
            m, st = r["metrics"], r["config"]["settings"]
            rows.append([r["family"], ", ".join(r["config"]["population"]), st["device"], r["device"]["name"],
                         st["seed"], m["scenarios"], m["false_alarm_scenarios"], _g(m["upper_95"]),
                         (r["reason"] or "")[:160] or None, r["commit"], _cite(r)])
    return _table(["family", "kernels", "device", "card", "seed", "scenarios", "with a false alarm",
                   "95 % upper bound", "first false alarm", "commit", "record"], rows)


TABLES = {
    "side-by-side": side_by_side,
    "kda-side-by-side": kda_side_by_side,
    "bench-gate": bench_gate,
    "drift-full": drift_full,
    "drift-adapters": drift_adapters,
    "drift-speed": drift_speed,
    "validate-speed": validate_speed,
    "kda-bench": kda_bench,
    "findings-validate": findings_validate,
    "adapters-fuzz": adapters_fuzz,
    "nightly-fuzz": nightly_fuzz,
    "findings-cpu": findings_cpu,
    "tf32-state": tf32_state,
    "model-real": model_real,
    "mixer-real": mixer_real,
    "sanitize": sanitize,
    "calibration-kernels": calibration_kernels,
}


def render(spec: str, recs: list[dict]) -> str:
    name, _, arg = spec.strip().partition(" ")
    if name not in TABLES:
        raise SystemExit(f"ledger_tables: unknown table {name!r}; expected one of {sorted(TABLES)}")
    return TABLES[name](recs, arg or None)


def regenerate(text: str, recs: list[dict]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2), recs) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", nargs="*", help="TABLE [ARG], or the Markdown files with --update / --check")
    ap.add_argument("--update", action="store_true", help="rewrite the generated blocks of the files given")
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated block is stale")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    recs = load(a.ledger)
    if a.update or a.check:
        stale = []
        for f in map(Path, a.table):
            text = f.read_text()
            new = regenerate(text, recs)
            if new != text:
                stale.append(str(f))
                if a.update:
                    f.write_text(new)
        if a.check and stale:
            print("ledger_tables: stale generated tables in " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(render(" ".join(a.table), recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
