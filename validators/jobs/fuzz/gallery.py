"""Run the fuzzer against every broken kernel and tabulate how fast it catches each one.

Oracle: :func:`replayssm.validators.jobs.fuzz.run.fuzz_kernel` under the ``ci`` profile (derandomized):
a mutant counts as caught when Hypothesis finds a scenario the validation engine fails (a scenario
where it only raises counts only for a mutant declaring raising as its bug, ``raises=True``); the
table records the scenarios (and seconds) to the first failing scenario, the whole run
(shrinking included), and the shrunk reproducer (active rows x verify steps, check, first bad step).

Targets (issue 6, CPU), bounded by work, never by wall clock (a loaded machine must reach the
same verdict, issue 16): every mutant caught within the first CATCH_LIMIT_EXAMPLES generated
scenarios (the ``ci`` profile's ``max_examples``), shrinking bounded to SHRINK_EXAMPLES further
scenarios; reproducers of bookkeeping mutants of <= 2 rows and <= 8 verify steps.  The run is
deterministic (derandomized, no example database), so its seconds are reported, not judged.
tests/jobs/test_mutation_gallery.py asserts the targets;
``python -m replayssm.validators.jobs.fuzz.gallery --write docs/mutation_gallery.md`` regenerates the
table (run it from committed code: the page records the commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from pathlib import Path

import torch

from replayssm.precision import STANDARD_MODES, parse_mode
from replayssm.records import UNKNOWN, git_state
from replayssm.validators.engine.mutants import all_mutants
from replayssm.validators.engine.resolved import resolve
from replayssm.validators.engine.runner import run_scenario
from replayssm.validators.jobs.fuzz.run import PROFILES, FuzzReport, fuzz_kernel

CATCH_LIMIT_EXAMPLES = PROFILES["ci"]["max_examples"]
# Scenarios run while shrinking, after the first failure.  Measured over the gallery's run of every
# mutant (docs/mutation_gallery.md): every mutant's shrinking ended by itself within 81 scenarios
# (bookkeeping ones within 67); since the ci profile runs without Hypothesis's target phase, mamba2
# mutant-stale-read's takes 263 (to 2 steps; cut at 150 it left 11), so 300 bounds the work without
# cutting it short.
SHRINK_EXAMPLES = 300
BOOKKEEPING_MAX_ROWS = 2
BOOKKEEPING_MAX_STEPS = 8


def failure_class(name: str) -> str:
    """The kind of slip a mutant stands for (its registration's ``klass``; "other" if unknown)."""
    spec = all_mutants().get(name)
    return spec.klass if spec is not None else "other"


def gallery_cases() -> list[tuple[str, str]]:
    """(mutant name, family) for every registered broken kernel the CI gallery fuzzes (``spec.gallery``;
    the others are caught in CI by a direct run of a named scenario, docs/field_bugs.md)."""
    return [(name, fam) for name, spec in all_mutants().items() for fam in spec.classes if spec.fuzzed(fam)]


def run_case(name: str, family: str, failures_dir=None) -> FuzzReport:
    """Fuzz mutant ``name``: a scenario where it only raises counts as a catch only when the mutant
    declares raising as its bug (``register_mutant(raises=True)``)."""
    return fuzz_kernel(name, family, profile="ci", failures_dir=failures_dir, shrink_budget_s=None,
                       shrink_budget_examples=SHRINK_EXAMPLES, exceptions_fail=all_mutants()[name].raises)


# The readout-dot mode families the gallery also judges (issue 47): beside the ieee run, each mutant in
# every mode with a -tf32 and a -tf32x3 readout (a readout precision loosens the output checks only).
DOT_FAMILIES = ("tf32", "tf32x3")


def with_dot(mode: str, dot: str) -> str:
    """Mode id ``mode`` with readout dot ``dot``."""
    return dataclasses.replace(parse_mode(mode), dot=dot).id


def dot_modes(dot: str) -> tuple[str, ...]:
    """The sweep's modes (STANDARD_MODES) with readout dot ``dot`` (the fp64 reference has none)."""
    return tuple(with_dot(m, dot) for m in STANDARD_MODES if not parse_mode(m).is_reference)


@dataclasses.dataclass
class DotVerdict:
    kernel: str
    family: str
    dot: str
    caught: bool | None  # None: the kernel refuses every mode of the family (a baseline reads out in ieee)
    how: str  # "replay <mode>: <check> @ <step>", "fuzz: ...", or why not caught

    def summary(self) -> str:
        verdict = {True: "FAIL", False: "PASS", None: "N/A"}[self.caught]
        return f"{verdict} {self.kernel} [{self.family}] -{self.dot}: {self.how}"


def run_dot_case(report: FuzzReport, dot: str) -> DotVerdict:
    """Mutant ``report.kernel`` judged in the ``dot`` mode family, cheapest first: its ieee reproducer
    replayed at the same mode with readout ``dot``; only where that passes (or the mode cannot carry the
    dot) is it fuzzed with the ``dot`` modes alone under the ``ci`` profile."""
    spec = all_mutants()[report.kernel]
    cls = spec.classes[report.family]
    sc = report.scenario
    reasons = {cls.unsupported_reason(parse_mode(m), sc.decode_config, {}) for m in dot_modes(dot)} if sc else {None}
    if None not in reasons:
        return DotVerdict(report.kernel, report.family, dot, None, f"refuses every -{dot} mode: {sorted(reasons)[0]}")
    if sc is not None and not resolve(sc).mode.is_reference:
        r2 = resolve(dataclasses.replace(sc, mode=with_dot(sc.mode, dot)), cls)
        sc2 = r2.sc
        cfg_reason = cls.unsupported_reason(r2.mode, sc2.decode_config, sc2.kernel_options or {})
        if cfg_reason is None:
            res = run_scenario(r2, cls, repeat_check=False, stop_on_failure=True)
            f = res.first_failure
            if not res.passed and f is not None and (f.check != "exception" or spec.raises):
                return DotVerdict(report.kernel, report.family, dot, True, f"replay {sc2.mode}: {f.check} @ {f.step}")
    r = fuzz_kernel(report.kernel, report.family, profile="ci", shrink_budget_s=None, shrink_budget_examples=0,
                    exceptions_fail=spec.raises, strategy={"modes": dot_modes(dot)})
    if r.caught:
        return DotVerdict(report.kernel, report.family, dot, True,
                          f"fuzz #{r.examples_to_first_failure} {r.scenario.mode}: {r.record.check} @ "
                          f"{r.record.first_bad_step}")
    return DotVerdict(report.kernel, report.family, dot, False, f"not caught in {r.examples} scenarios of -{dot} modes")


def problems(report: FuzzReport) -> list[str]:
    """Which targets a gallery run misses (empty: all met)."""
    out = []
    if not report.caught:  # the ci profile generates at most CATCH_LIMIT_EXAMPLES scenarios
        raised = f" ({report.raised} only raised: not its declared bug)" if report.raised else ""
        out.append(f"not caught in {report.examples} scenarios (limit {CATCH_LIMIT_EXAMPLES}){raised}")
        return out
    if failure_class(report.kernel) == "bookkeeping":
        if report.reproducer_rows > BOOKKEEPING_MAX_ROWS:
            out.append(f"reproducer has {report.reproducer_rows} active rows > {BOOKKEEPING_MAX_ROWS}")
        if report.reproducer_steps > BOOKKEEPING_MAX_STEPS:
            out.append(f"reproducer has {report.reproducer_steps} verify steps > {BOOKKEEPING_MAX_STEPS}")
    return out


def _commit() -> str:
    commit, dirty = git_state()
    return commit + (" (with uncommitted changes)" if dirty and commit != UNKNOWN else "")


def table(reports: list[FuzzReport]) -> str:
    lines = [
        "# Mutation gallery: does the fuzzer catch real bugs?",
        "",
        "Every broken kernel (`replayssm list kernels`, kind `mutant`, all in one registry,",
        "`validators/engine/mutants/`: the field bugs of docs/field_bugs.md and the gallery) fuzzed with the `ci`",
        f"profile (derandomized, at most {CATCH_LIMIT_EXAMPLES} generated scenarios, shrinking bounded to "
        f"{SHRINK_EXAMPLES} more scenarios) by",
        "`python -m replayssm.validators.jobs.fuzz.gallery --write docs/mutation_gallery.md`;",
        "`tests/jobs/test_mutation_gallery.py` asserts the same targets in the default pytest run.",
        "A scenario where a mutant only raises is a catch only for a mutant that declares raising as its",
        "bug (`register_mutant(..., raises=True)`: mutant-ring-index-unwrapped).",
        "",
        f"Run: commit {_commit()}, {platform.processor() or 'cpu'}, "
        f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}, "
        f"{len(reports)} kernels (the seconds below are that run's wall clock: reported, not judged, and not",
        "ledger records).",
        "",
        "Columns: the first failing scenario (its number among the scenarios run, and the seconds to it);",
        "whole run including shrinking (seconds, scenarios run in generation and shrinking);",
        "the shrunk reproducer (active rows x verify steps, mode, decode) and the engine's first failing",
        f"check and step.  Targets (counts, not seconds): caught within the first {CATCH_LIMIT_EXAMPLES} scenarios;",
        f"bookkeeping reproducers <= {BOOKKEEPING_MAX_ROWS} rows and <= {BOOKKEEPING_MAX_STEPS} steps.",
        "",
        "| mutant | family | class | first failure (scenario, s) | total (s) | scenarios | reproducer "
        "| mode, decode | check @ step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        if not r.caught:
            lines.append(f"| {r.kernel} | {r.family} | {failure_class(r.kernel)} | **not caught** | {r.wall_s:.1f} | "
                         f"{r.examples} | | | |")
            continue
        sc, rec = r.scenario, r.record
        dec = f"spec T'={sc.window} B={sc.buffer}" if sc.decode == "speculative" else f"standard L={sc.buffer}"
        lines.append(f"| {r.kernel} | {r.family} | {failure_class(r.kernel)} | #{r.examples_to_first_failure}, "
                     f"{r.time_to_first_failure_s:.1f} | "
                     f"{r.wall_s:.1f} | {r.examples} | {r.reproducer_rows} x {r.reproducer_steps} | {sc.mode}, {dec} | "
                     f"{rec.check} @ {rec.first_bad_step} |")
    missed = [(r, p) for r in reports for p in problems(r)]
    lines += ["", f"Targets missed: {len(missed)}." if missed else "All targets met."]
    for r, p in missed:
        lines.append(f"- {r.kernel} [{r.family}]: {p}")
    descr = {n: s.description for n, s in all_mutants().items()}
    lines += ["", "## The mutants", "", "| mutant | class | bug |", "|---|---|---|"]
    for n in sorted(descr):
        lines.append(f"| {n} | {failure_class(n)} | {descr[n]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="fuzz every mutant under the ci profile and tabulate")
    p.add_argument("--write", metavar="FILE", help="write the Markdown table here")
    p.add_argument("--failures", metavar="DIR", help="also save each shrunk reproducer here")
    p.add_argument("--dots", action="store_true",
                   help="also judge each mutant in the -tf32 and -tf32x3 mode families (run_dot_case)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    reports, dots = [], []
    for name, fam in gallery_cases():
        r = run_case(name, fam, args.failures)
        reports.append(r)
        print(r.summary(), flush=True)
        if args.dots and r.caught:
            for dot in DOT_FAMILIES:
                v = run_dot_case(r, dot)
                dots.append(v)
                print(v.summary(), flush=True)
    md = table(reports)
    print(f"gallery: {len(reports)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    if dots:
        missed = [v for v in dots if v.caught is False]
        md += "\n## Readout-dot mode families\n\n" + "\n".join(f"- {v.summary()}" for v in dots) + "\n"
        verdict = (f"Not caught in a dot family: {len(missed)}" if missed
                   else "Every mutant caught in every dot family it runs in.")
        md += f"\n{verdict}\n"
    if args.write:
        Path(args.write).write_text(md)
    print(md.rsplit("\n\n## The mutants", 1)[0].splitlines()[-1])
    return 0 if not any(problems(r) for r in reports) and all(v.caught is not False for v in dots) else 1


if __name__ == "__main__":
    raise SystemExit(main())
