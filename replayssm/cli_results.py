"""``replayssm results``: query the records jobs append (``--record FILE``), on an in-memory SQLite
index of one or more JSON-lines files (default: the committed ledger ``docs/reports/ledger.jsonl``;
``--ledger FILE``, repeatable; a pytest-benchmark JSON of ``nox -s bench`` is read as its records).

- ``latest``: the newest record per case and device.
- ``compare A B --by commit|device``: the newest record of each case on both sides, side by side,
  with the ratio B / A of every numeric metric.
- ``gate A B --by commit|device|source``: the benchmark gate: per timed case in both, the change of
  the median, failing (exit 1) beyond the part's threshold (``--threshold kernels=5``); ``--by
  source`` takes two files or folders of records (``nox -s bench`` gates its run's folder against
  the baseline's so).
- ``page OUT.html``: the static results page (verdicts, state bits, kernel times, suite
  throughput by commit x GPU x kernel, with plots).

Exit codes: :data:`replayssm.cli.EXIT_CONTRACT` (2 for a missing or malformed ledger).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from replayssm.guard import check_writable
from replayssm.records import RecordError, load
from replayssm.records.gate import THRESHOLDS, from_pytest_benchmark, gate
from replayssm.records.index import Index, ratio
from replayssm.validators.jobs.results_page import fmt, page

LEDGER = Path("docs") / "reports" / "ledger.jsonl"
CHECKOUT = Path(__file__).resolve().parents[1]


def add_parser(subparsers):
    p = subparsers.add_parser("results", help="query the records of the jobs (latest, compare, gate, page)",
                              description="Query measurement records (JSON lines of replayssm.record/1) on an "
                                          "in-memory SQLite index.")
    common = {"ledger": dict(action="append", default=None, metavar="FILE",
                             help=f"records to read (repeatable; JSON lines, or a pytest-benchmark JSON; default: "
                                  f"{LEDGER})")}
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = sub.add_parser("latest", help="the newest record per case and device")
    a.add_argument("--job", default=None, help="only this job's records")
    a.add_argument("--json", action="store_true", help="print the records (JSON lines) instead of a table")
    c = sub.add_parser("compare", help="two commits or two devices side by side, with ratios B / A")
    g = sub.add_parser("gate", help="the benchmark gate: B's median times against A's, per part's threshold")
    for q in (c, g):
        q.add_argument("a", metavar="A", help="a commit (prefix) or a device name (part of it)")
        q.add_argument("b", metavar="B")
        q.add_argument("--by", choices=["commit", "device", "source"], default="commit",
                       help="what A and B name: commits, devices, or the files / folders of pytest-benchmark runs "
                            "given with --ledger")
    c.add_argument("--job", default=None, help="only this job's records")
    g.add_argument("--threshold", action="append", default=[], metavar="PART=PCT",
                   help=f"slowdown threshold of a part in percent (default {THRESHOLDS})")
    w = sub.add_parser("page", help="write the static HTML results page")
    w.add_argument("out", metavar="OUT.html")
    w.add_argument("--title", default="replayssm results")
    for q in (a, c, g, w):
        q.add_argument("--ledger", **common["ledger"])
    return p


def ledger_paths(given: list[str] | None) -> list[Path]:
    if given:
        paths = [Path(x) for x in given]
    else:
        paths = [LEDGER if LEDGER.is_file() else CHECKOUT / LEDGER]
    for p in paths:
        if not p.is_file():
            raise ValueError(f"--ledger: {p} is not a file (give the records with --ledger FILE)")
    return paths


def read(paths: list[Path]) -> Index:
    """The index of the records of ``paths`` (ValueError naming a bad file and line)."""
    index = Index()
    for p in paths:
        try:
            with open(p, encoding="utf-8") as fh:
                head = fh.read(4096).lstrip()
            if head.startswith("{") and '"benchmarks"' in head and "\n{" not in head.rstrip():
                recs = from_pytest_benchmark(json.loads(p.read_text()), source=os.path.normpath(p))
            else:
                recs = load(p)
        except RecordError as e:
            raise ValueError(f"--ledger: {e}") from None
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"--ledger: cannot read {p} ({type(e).__name__}: {e})") from None
        index.add(recs)
    return index


def _table(heads: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _headline(index: Index, r: dict) -> str:
    m = index.metrics(r["id"])
    keys = [k for k in ("tokens_per_s", "us", "median_s", "worst_bound_ratio", "state_bits_eff", "output_peak",
                        "failures", "max_rel_difference", "examples") if k in m]
    return ", ".join(f"{k} {fmt(m[k])}" for k in keys[:3])


def latest(index: Index, job: str | None, as_json: bool) -> int:
    rows = index.latest(job)
    if as_json:
        for r in rows:
            print(json.dumps({**r, "metrics": index.metrics(r["id"])}, sort_keys=True))
        return 0
    print(_table(["case", "device", "commit", "verdict", "metrics", "record"],
                 [[r["case_id"], r["device_name"], r["commit_id"] + ("+dirty" if r["dirty"] else ""), r["verdict"],
                   _headline(index, r), r["id"]] for r in rows]))
    print(f"\n{len(rows)} case(s) x device(s) of {len(index)} record(s)")
    return 0


def _sides(index: Index, args) -> tuple[dict, dict]:
    a, b = index.side(args.by, args.a), index.side(args.by, args.b)
    for name, side in ((args.a, a), (args.b, b)):
        if not side:
            column = {"commit": "commit_id", "device": "device_name"}.get(args.by, "source")
            known = ", ".join(index.values(column)[:12])
            raise ValueError(f"{'A' if side is a else 'B'}: no record of {args.by} {name!r} (known: {known})")
    return a, b


def compare(index: Index, args) -> int:
    a, b = _sides(index, args)
    rows = []
    for key in sorted(set(a) & set(b)):
        ra, rb = a[key], b[key]
        if args.job and ra["job"] != args.job:
            continue
        ma, mb = index.metrics(ra["id"]), index.metrics(rb["id"])
        for k in sorted(set(ma) & set(mb)):
            q = ratio(ma[k], mb[k])
            if q is None and ma[k] == mb[k]:
                continue
            rows.append([key[0], key[1], k, fmt(ma[k]), fmt(mb[k]), "-" if q is None else f"{q:.3f}"])
        if ra["verdict"] != rb["verdict"]:
            rows.append([key[0], key[1], "verdict", ra["verdict"], rb["verdict"], "-"])
    other = "commit" if args.by == "device" else "device"
    print(_table(["case", other, "metric", f"A {args.a}", f"B {args.b}", "B / A"], rows))
    only = sorted(set(a) ^ set(b))
    print(f"\n{len(set(a) & set(b))} case(s) on both sides; {len(only)} on one side only")
    return 0


def run_gate(index: Index, args) -> int:
    thresholds = {}
    for item in args.threshold:
        part, _, pct = item.partition("=")
        try:
            thresholds[part] = float(pct)
        except ValueError:
            pct = None
        if part not in THRESHOLDS or pct is None:
            raise ValueError(f"--threshold: expected PART=PCT with PART one of {sorted(THRESHOLDS)}, got {item!r}")
    a, b = _sides(index, args)
    key = lambda side: [dict(r, case=r["case_id"], metrics=index.metrics(r["id"])) for _, r in sorted(side.items())
                        if r["job"] == "bench"]
    text, ok = gate(key(a), key(b), thresholds)
    print(text, end="")
    return 0 if ok else 1


def run(args) -> int:
    if args.action == "page":
        check_writable(args.out, "page OUT.html", is_dir=False)
    paths = ledger_paths(args.ledger)
    index = read(paths)
    if args.action == "latest":
        return latest(index, args.job, args.json)
    if args.action == "compare":
        return compare(index, args)
    if args.action == "gate":
        return run_gate(index, args)
    html = page(index, args.title, [os.path.basename(str(p)) for p in paths])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(html, encoding="utf-8")
    print(f"results: wrote {args.out} ({len(index)} records)")
    return 0


__all__ = ["LEDGER", "add_parser", "read", "run"]
