"""Records of each job's results: what ``--record FILE`` appends for ``validate``, ``fuzz``,
``drift``, ``bench`` and ``golden``.  Each function turns the numbers a job already reports (its
result objects and dicts) into records of :class:`~replayssm.records.Recorder`; nothing is
measured here.

Case ids name the coordinates a reader compares, ``/``-separated, family first:
``mamba2/triton-replay/s32a16/tiny/exhaustive`` (validate: family/kernel/mode/geometry/schedule),
``mamba2/triton-replay/fuzz-ci`` (fuzz), ``mamba2/literal-replay/s32a32/tiny/long-memory/standard``
(a drift cell; ``drift/sweep/...`` for the sweep's throughput),
``mamba2/triton-replay/s32a16/nano4b/standard-L16/b128`` (bench), ``golden/<trajectory>`` (golden).
The configuration digest tells apart runs of one case at other settings (seed, sizes, options).
"""

from __future__ import annotations

import re

from replayssm.records.record import Recorder


def _key(text: str) -> str:
    """A metric key: lower case words joined by ``_`` (``worst bound_ratio`` -> ``worst_bound_ratio``)."""
    return re.sub(r"[^0-9a-zA-Z_.]+", "_", str(text)).strip("_").lower()


def _geometry_name(geometry) -> str:
    return geometry if isinstance(geometry, str) else "custom"


def validate_record(recorder: Recorder, res, options: dict | None = None) -> dict:
    """One record of a ``validate`` run (a :class:`ValidationResult`): the worst value of each
    summary metric (``worst_bound_ratio``, ``worst_state_bound_ratio``, ...), the failure count
    (total and per check), the margin (worst error / bound of the banded checks) and the marginal
    errors, throughput; verdict pass / marginal / fail, the first failure (or the margin) as the reason."""
    sc = res.scenario
    geo = _geometry_name(sc.get("geometry"))
    metrics = {_key(k): v for k, v in res.summary.items()}
    metrics.update({"failures": sum(res.failure_counts.values()), "tokens_per_s": res.tokens_per_s,
                    "tokens_accepted": res.tokens_accepted, "tokens_verified": res.tokens_verified,
                    "steps_run": res.steps_run, "steps_planned": res.steps_planned, "wall_s": res.wall_s})
    metrics.update({f"failures_{_key(c)}": n for c, n in res.failure_counts.items()})
    verdict = getattr(res, "verdict", "pass" if res.passed else "fail")
    margin = getattr(res, "margin", None)
    if margin:
        metrics.update({"margin_ratio": margin["ratio"], "margin_check": margin["check"],
                        "margin_step": margin["step"]})
    counts = getattr(res, "marginal_counts", {}) or {}
    metrics["marginals"] = sum(counts.values())
    reason = res.margin_line() if verdict == "marginal" else None
    if not res.passed:
        f = res.first_failure
        reason = f.describe() if f is not None else (
            f"exception: {res.exception.get('type')}" if res.exception else "failed")
    return recorder.record(f"{res.family}/{res.kernel}/{res.mode}/{geo}/{sc.get('schedule')}", metrics=metrics,
                           verdict=verdict, reason=reason,
                           config={"scenario": sc, "kernel": res.kernel, **(options or {})},
                           family=res.family, kernel=res.kernel, mode=res.mode, geometry=geo)


def fuzz_records(recorder: Recorder, reports, options: dict | None = None) -> list[dict]:
    """One record per fuzzed kernel (a :class:`FuzzReport`): scenarios tried, whether a failing one
    was found, time and scenarios to it, the shrunk reproducer's size, the marginal scenarios and the
    worst error / bound seen; verdict fail when caught, marginal when only marginals were found."""
    out = []
    for r in reports:
        metrics = {"examples": r.examples, "caught": r.caught, "wall_s": r.wall_s,
                   "scenarios_per_s": r.examples / r.wall_s if r.wall_s > 0 else None,
                   "time_to_first_failure_s": r.time_to_first_failure_s,
                   "examples_to_first_failure": r.examples_to_first_failure,
                   "reproducer_rows": r.reproducer_rows, "reproducer_steps": r.reproducer_steps,
                   "marginals": getattr(r, "marginals", 0), "worst_ratio": getattr(r, "worst_ratio", None)}
        reason = None
        if r.caught and r.record is not None:
            reason = f"[{r.record.check}] at step {r.record.first_bad_step}" + (
                f"; reproducer {r.artifact}" if r.artifact else "")
        elif getattr(r, "marginals", 0):
            best = r.marginal_examples[0]
            reason = (f"{r.marginals} marginal scenario(s), the worst {best['ratio']:.3f} x the bound at "
                      f"[{best['margin']['check']}] step {best['margin']['step']}")
        sc = r.scenario
        verdict = "fail" if r.caught else ("marginal" if getattr(r, "marginals", 0) else "pass")
        out.append(recorder.record(
            f"{r.family}/{r.kernel}/fuzz-{r.profile}", metrics=metrics, verdict=verdict,
            reason=reason, config={"profile": r.profile, "seeds": list(getattr(r, "seeds", []) or []),
                                   **(options or {})},
            family=r.family, kernel=r.kernel, mode=None if sc is None else sc.mode))
    return out


def _block(prefix: str, blk: dict | None) -> dict:
    if not blk:
        return {}
    ep = blk.get("effective_precision") or {}
    cross = blk.get("budget_crossing") or {}
    hz = blk.get("at_horizon") or {}
    return {f"{prefix}_peak": blk.get("peak"), f"{prefix}_rms": blk.get("rms"),
            f"{prefix}_nonfinite": blk.get("nonfinite"), f"{prefix}_law": (blk.get("fit") or {}).get("law"),
            f"{prefix}_bits_eff": ep.get("bits_eff"), f"{prefix}_bits_declared": ep.get("bits_declared"),
            f"{prefix}_at_horizon": hz.get("worst"),
            f"{prefix}_tokens_to_budget": cross.get("observed") if cross.get("observed") is not None
            else cross.get("predicted")}


def drift_records(recorder: Recorder, report: dict, timing: dict | None = None) -> list[dict]:
    """One record per drift cell of a report (``drift_report.json``'s dict): peaks, RMS, growth
    law, effective bits of output and state, tokens to the budget, flush injection; verdict of the
    budget check when it ran (else none), incomplete cells fail.  With ``timing`` (a run, not a
    merge) one more record of the sweep's validated tokens/s."""
    sw = report["sweep"]
    chk = report.get("check") or {}
    out = []
    for c in report["cells"]:
        m = {"tokens": c.get("tokens"), "tokens_run": c.get("tokens_run"), "rows": c.get("rows"),
             "truncated": c.get("truncated"), **_block("output", c.get("output")), **_block("state", c.get("state"))}
        inj = (c.get("flush") or {}).get("injected") or {}
        m["flush_injected"] = inj.get("estimate")
        m["flush_bits_eff"] = (inj.get("effective_precision") or {}).get("bits_eff")
        cc = c.get("check")
        verdict, reason = "none", None
        if chk.get("enabled") and cc is not None:
            verdict = "pass" if cc.get("pass") else "fail"
            reason = "; ".join(cc.get("failures") or []) or None
            m["output_budget"], m["state_budget"] = cc.get("output_budget"), cc.get("state_budget")
        if c.get("exception") or c.get("stopped") or c.get("truncated"):
            verdict = "fail"
            reason = "incomplete: " + str((c.get("exception") or {}).get("type") or c.get("stopped") or "truncated")
        geo = c.get("geometry_name") or "custom"
        out.append(recorder.record(
            f"{c['family']}/{c['kernel']}/{c['mode']}/{geo}/{c['distribution']}/{c['schedule']}", metrics=m,
            verdict=verdict, reason=reason,
            config={"sweep": {k: v for k, v in sw.items() if k != "digest"}, "decode": c.get("decode"),
                    "settings": report.get("settings")},
            family=c["family"], kernel=c["kernel"], mode=c["mode"], geometry=geo))
    if timing:
        geo = ",".join(f"{f}={g}" for f, g in sorted(sw["geometry"].items()))
        out.append(recorder.record(
            f"drift/sweep/{geo}/{sw['rows']}x{sw['tokens']}",
            metrics={k: timing.get(k) for k in ("cells", "cells_run", "wall_s", "tokens", "tokens_per_s", "workers")},
            verdict="none", config={"sweep": {k: v for k, v in sw.items() if k != "digest"}}))
    return out


def bench_records(recorder: Recorder, res: dict) -> list[dict]:
    """Two records (baseline, replay) per row of a ``bench`` result (``validators.bench.bench_family``):
    the kernel's µs per step, TB/s and share of the copy bandwidth, the replay/baseline ratio and
    the bytes model's limit; verdict none (a timing)."""
    fam, geo, mode = res["family"], res.get("geometry") or "default", res["mode"]
    out = []
    for r in res["rows"]:
        case = re.sub(r"[^0-9A-Za-z=.'-]+", "-", r["case"]).replace("'", "").replace("=", "")
        for kind in ("baseline", "replay"):
            kernel = f"triton-{kind}"
            metrics = {"us": r[f"{kind}_us"], "tbps": r[f"{kind}_tbps"], "pct_copy": r[f"{kind}_pct_copy"],
                       "ratio_replay_over_baseline": r["ratio"], "model_limit": r["model_limit"], "sets": r["sets"],
                       "batch": r["batch"], "copy_tbps": (res.get("copy") or {}).get("tbps")}
            out.append(recorder.record(
                f"{fam}/{kernel}/{mode}/{geo}/{case}/b{r['batch']}", metrics=metrics, verdict="none",
                config={"case": r["case"], "batch": r["batch"], "L": res.get("L"),
                        "launch": r.get(f"{kind}_config") or {}, "check": r.get("check")},
                family=fam, kernel=kernel, mode=mode, geometry=geo))
    return out


def golden_records(recorder: Recorder, worst: dict, bad: list[str], tolerance: float) -> list[dict]:
    """One record per golden trajectory (``worst``: stem -> the largest difference relative to the
    stored scale over its arrays, None when not recomputed), failing when a ``bad`` line names it."""
    out = []
    for stem in sorted(worst):
        mine = [b for b in bad if b.startswith((f"{stem}:", f"{stem}."))]
        out.append(recorder.record(f"golden/{stem}", metrics={"max_rel_difference": worst[stem],
                                                              "tolerance": tolerance, "mismatches": len(mine)},
                                   verdict="fail" if mine else "pass", reason="; ".join(mine) or None,
                                   config={"trajectory": stem, "tolerance": tolerance}))
    return out


def calibration_records(recorder: Recorder, report: dict, options: dict | None = None) -> list[dict]:
    """Records of a ``calibrate`` population run (``validators.calibration.calibrate``'s dict): per family
    one of the scenarios (``calibration/<family>``: scenarios, those with a false alarm, the 95 % upper
    bound on that rate) and one per check (``calibration/<family>/<check>``: runs, false alarms, rate,
    upper bound, worst error / bound ratio); verdict fail where a correct kernel failed."""
    st = report["settings"]
    out = []
    for fam, r in report["families"].items():
        config = {"settings": st, "population": r["population"], **(options or {})}
        first = next((c["first_false_alarm"] for c in r["checks"].values() if c["first_false_alarm"]), None)
        out.append(recorder.record(
            f"calibration/{fam}", metrics={"scenarios": r["scenarios"], "skipped": r["skipped"],
                                           "false_alarm_scenarios": r["false_alarm_scenarios"],
                                           "upper_95": r["upper_95"], "wall_s": r["wall_s"],
                                           "kernels": len(r["population"])},
            verdict="fail" if r["false_alarm_scenarios"] else "pass", reason=first, config=config, family=fam,
            geometry=st.get("geometry")))
        for check, c in r["checks"].items():
            out.append(recorder.record(
                f"calibration/{fam}/{check}", metrics={k: c[k] for k in ("runs", "false_alarms", "rate", "upper_95",
                                                                         "worst_ratio")},
                verdict="fail" if c["false_alarms"] else "pass", reason=c["first_false_alarm"], config=config,
                family=fam, geometry=st.get("geometry")))
    return out


def resolving_records(recorder: Recorder, report: dict, options: dict | None = None) -> list[dict]:
    """One record per case of a resolving-power run (``validators.calibration.resolving_power``'s dict):
    ``resolving/<family>/<loss>/<mode>``, the checks that caught the loss (``caught_by``), per check the
    scenarios, fewest steps and error / bound ratio at the catch, and the checks that saw the loss only
    within the marginal band (``marginal_by``: no catch); verdict pass when some check resolves
    the loss, fail (reason ``unresolved``) when none does."""
    st = report["settings"]
    out = []
    for c in report["cases"]:
        m = {"resolved": c["verdict"] == "resolved", "caught_by": c["caught_by"], "scenarios": c["scenarios"],
             "scenarios_caught": c["scenarios_caught"], "raised": c["raised"], "lost_u": c["lost_u"],
             "declared_u": c["declared_u"]}
        for check, p in c["checks"].items():
            k = _key(check)
            m.update({f"scenarios_{k}": p["scenarios"], f"steps_{k}": p["steps"], f"ratio_{k}": p["ratio"]})
        m["marginal_by"] = sorted(c.get("marginal", {}))
        for check, p in c.get("marginal", {}).items():
            k = _key(check)
            m.update({f"marginal_scenarios_{k}": p["scenarios"], f"marginal_ratio_{k}": p["ratio"]})
        reason = ("unresolved: no check failed in "
                  f"{c['scenarios']} scenarios of {st['steps']} steps") if c["verdict"] != "resolved" else None
        out.append(recorder.record(
            f"resolving/{c['family']}/{c['loss']}/{c['mode']}", metrics=m,
            verdict="pass" if c["verdict"] == "resolved" else "fail", reason=reason,
            config={"settings": st, "loss": c["loss"], "what": c["what"], **(options or {})},
            family=c["family"], kernel=c["kernel"], mode=c["mode"], geometry=st.get("geometry")))
    return out


def source(args) -> str:
    """The command line that wrote the records (``replayssm <argv>``), for the record's ``source``."""
    import shlex
    argv = getattr(args, "_argv", None)
    return "replayssm " + (shlex.join(argv) if argv else getattr(args, "command", "") or "")


__all__ = ["bench_records", "calibration_records", "drift_records", "fuzz_records", "golden_records",
           "resolving_records", "source", "validate_record"]
