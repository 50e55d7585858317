"""Side-by-side benchmark job (``replayssm bench --against NAME``): our replay and baseline kernels
and an external source's replay and baseline kernels in one process, one run, on the same inputs.

Oracle for the numbers: the same as :mod:`replayssm.validators.jobs.bench.run` -- the bytes model of spec
section 3 (one model per case, the same for every kernel of the case: the kernels move the same
state, records and tokens) and the copy bandwidth measured at the start of the same run.  Every
configuration is validated by the engine first (``run_scenario`` over a whole cursor cycle at the
bench geometry, :func:`~replayssm.validators.jobs.bench.run.check_configuration`); a kernel that fails is
not timed and its cell says why.

Method: :func:`~replayssm.validators.jobs.bench.run.time_kernel` for every kernel (CUDA graph of a whole
cursor cycle over rotated input/state sets, ``do_bench`` median, L2 cleared).  External kernels
are timed through their adapters' ``timed_step`` (their launches alone, on inputs packed once the
way vLLM hands them over; ``replayssm/adapters/_base.py``); ours through the raw launches.  Each
(case, k, batch) row uses the same random inputs and states for all four kernels (one generator
seed per row).  Precision: ours runs the requested mode; theirs the requested mode, or its ``-tf32``
form where that is all it implements (the official Mamba-2 speculative kernel with bf16 activations
reads the checkpoint out with tf32 dots): ours is then held to the stricter mode.  The row records
each kernel's mode.  Validation: ours must pass to be timed; an external kernel that fails is timed
all the same and its first failure is printed beside the table (the speed of a kernel that does not
deliver the declared precision is worth knowing, and so is the fact that it does not).

Expected: ratios ``ours / theirs`` of per-step times; ``< 1`` means ours is faster.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch

from replayssm.families import family, preset
from replayssm.interface import DecodeConfig
from replayssm.precision import parse_mode
from replayssm.registry import get, kernels
from replayssm.validators.jobs.bench.run import (
    check_configuration,
    check_scenario_of,
    copy_bandwidth,
    cursor_cycle,
    device_is_cuda,
    environment,
    markdown_table,
    num_sets,
    time_kernel,
)

OURS = {"replay": "triton-replay", "baseline": "triton-baseline"}


def against_kernels(family_name: str, names: list[str]) -> dict[str, str]:
    """kind -> external kernel name: the named kernels, and for a named replay kernel its source's
    baseline (``<prefix>-baseline``, same family) when registered.  ValueError for an unknown name,
    a kind other than replay / baseline, or two kernels of one kind."""
    out: dict[str, str] = {}
    for n in names:
        cls = get(n, family_name)
        if cls.kind not in OURS:
            raise ValueError(f"--against: {n!r} is a {cls.kind!r} kernel; expected a replay or baseline kernel")
        if cls.kind in out and out[cls.kind] != n:
            raise ValueError(f"--against: two {cls.kind} kernels ({out[cls.kind]!r}, {n!r}); name one of each")
        out[cls.kind] = n
    if "replay" in out and "baseline" not in out:
        partner = out["replay"].split("-")[0] + "-baseline"
        if (family_name, partner) in kernels(family_name):
            out["baseline"] = partner
    return out


def common_mode(mode: str, decode: DecodeConfig, names: list[str], family_name: str) -> tuple[str | None, str]:
    """The first of ``mode`` and its ``-tf32`` form that every kernel of ``names`` implements:
    ``(mode id, "")``, or ``(None, the refusals)``."""
    tried = [mode] + ([f"{mode}-tf32"] if parse_mode(mode).dot == "ieee" and "-" not in mode else [])
    why = []
    for m in tried:
        pm = parse_mode(m)
        reasons = [(n, get(n, family_name).unsupported_reason(pm, decode, {})) for n in names]
        bad = [f"{n}: {r}" for n, r in reasons if r]
        if not bad:
            return m, ""
        why.append(f"{m}: " + "; ".join(bad))
    return None, " | ".join(why)


@dataclass
class AgainstRow:
    case: str
    decode: str
    k: int
    batch: int
    mode: str
    sets: int
    bytes_replay: float
    bytes_baseline: float
    us: dict = field(default_factory=dict)  # kernel name -> µs per step (None: not timed, see notes)
    modes: dict = field(default_factory=dict)  # kernel name -> the precision mode it ran
    options: dict = field(default_factory=dict)  # kernel name -> launch options of the time shown
    sweep: dict = field(default_factory=dict)  # ours, swept: name -> [[options, µs or None, verdict], ...]
    notes: dict = field(default_factory=dict)  # kernel name -> validation verdict or why it was not timed


def _verdict(name, family_name, geometry, mode, decode, k, device, ours: bool, options=None) -> str:
    """The engine's verdict on one configuration.  Ours must pass to be timed ("ours fails ..."
    otherwise); an external kernel is timed either way, its failure recorded beside its time
    ("FAILS: ..."): the comparison says what the faster kernel delivers."""
    try:
        return check_configuration(name, check_scenario_of(family_name, geometry, mode, decode, k, options or {}),
                                   device)
    except AssertionError as e:
        first = str(e).splitlines()[0]
        return ("ours fails: " if ours else "FAILS: ") + first.split(": fails validation at ", 1)[-1][:400]


def _cases(L, window, spec_buffer, ks):
    yield f"standard L={L}", DecodeConfig("standard", 1, L), DecodeConfig("standard", 1, 1), 1
    for k in ks:
        yield (f"spec T'={window} B={spec_buffer} k={k}", DecodeConfig("speculative", window, spec_buffer),
               DecodeConfig("speculative", window, spec_buffer), k)


def bench_against(family_name: str, against: list[str], geometry: str | None = None, mode: str = "s32a16",
                  L: int = 16, batches=(1, 8, 32, 128, 256, 512), spec_batches=(1, 8, 32, 128, 256, 512),
                  window: int = 4, spec_buffer: int = 16, ks=(4, 2), device="cuda", rep_ms: float = 100,
                  seed: int = 0, copy=None, max_sets: int = 64, sweep_ours=(), log=print) -> dict:
    """Every case (standard L; speculative T' = ``window``, B = ``spec_buffer`` at each k of ``ks``)
    at every batch: ours (replay, baseline) and theirs (``against``, see :func:`against_kernels`).
    ``sweep_ours``: kinds ("replay", "baseline") whose time is the fastest of the family's launch
    candidates (``bench_launch_candidates``; each validated), else ours' defaults."""
    fam = family(family_name)
    theirs = against_kernels(family_name, against)
    geometry = geometry or fam.bench_geometry
    g = preset(geometry, family_name)
    for k in ks:
        if not 1 <= k <= window:
            raise ValueError(f"ks: expected accepted counts in 1..{window} (the window), got {k}")
    if copy is None:
        copy = copy_bandwidth(device)
        if device_is_cuda(device):
            torch.cuda.empty_cache()
    log(f"copy bandwidth: {copy['tbps']:.3f} TB/s")
    verdicts: dict[tuple, str] = {}
    rows: list[AgainstRow] = []
    for case, dec_r, dec_b, k in _cases(L, window, spec_buffer, ks):
        kinds = {"replay": (dec_r, theirs.get("replay")), "baseline": (dec_b, theirs.get("baseline"))}
        modes, why = {}, []
        for kind, (dec, other) in kinds.items():
            reason = get(OURS[kind], family_name).unsupported_reason(parse_mode(mode), dec, {})
            m, w = common_mode(mode, dec, [other], family_name) if other else (mode, "")
            if reason or m is None:
                why.append(f"{kind}: {reason or w}")
            modes[kind] = {OURS[kind]: mode, **({other: m} if other else {})}
        if why:
            log(f"{case}: skipped ({' | '.join(why)})")
            rows.append(AgainstRow(case, dec_r.decode, k, 0, mode, 0, 0.0, 0.0, notes={"*": " | ".join(why)}))
            continue
        traffic = fam.traffic(g, parse_mode(mode))
        b_replay = traffic.replay_cycle_mean(dec_r, cursor_cycle(dec_r, k)[1])
        b_base = traffic.baseline_step(dec_r.window)
        label = " / ".join(dict.fromkeys(m for kind in modes.values() for m in kind.values()))
        for batch in (spec_batches if dec_r.speculative else batches):
            nsets = num_sets(batch * traffic.state, device, max_sets=max_sets)
            row = AgainstRow(case, dec_r.decode, k, batch, label, nsets, b_replay * batch, b_base * batch)
            for kind, (dec, _) in kinds.items():
                for name, m in modes[kind].items():
                    row.modes[name] = m
                    ours = name == OURS[kind]
                    cands = fam.bench_launch_candidates(kind, dec, batch) if ours and kind in sweep_ours else [{}]
                    for opts in cands:
                        key = (name, m, dec.decode, dec.window, dec.buffer, k, tuple(sorted(opts.items())))
                        try:
                            if key not in verdicts:
                                verdicts[key] = _verdict(name, family_name, geometry, m, dec, k, device, ours, opts)
                            if verdicts[key].startswith("ours fails"):
                                raise AssertionError(verdicts[key])
                            gen = torch.Generator(device=device).manual_seed(seed + batch)  # same inputs for all
                            us, _ = time_kernel(family_name, name, geometry, m, dec, batch, nsets, k, opts, device,
                                                gen, rep_ms, verdict=verdicts[key])
                        except (AssertionError, ValueError, RuntimeError) as e:
                            us, note = None, str(e).splitlines()[0][:300]
                        else:
                            note = verdicts[key]
                        if len(cands) > 1:
                            row.sweep.setdefault(name, []).append([opts, us, note])
                        if name not in row.us or (us is not None and (row.us[name] is None or us < row.us[name])):
                            row.us[name], row.notes[name], row.options[name] = us, note, opts
                        if device_is_cuda(device):
                            torch.cuda.empty_cache()
            rows.append(row)
            log(row_line(row, theirs))
    env = environment()
    env["theirs"] = {kind: f"{n}: {get(n, family_name).source or 'registered in this process'}"
                     for kind, n in theirs.items()}
    return {"family": family_name, "geometry": geometry, "mode": mode, "L": L, "window": window,
            "spec_buffer": spec_buffer, "ks": list(ks), "ours": dict(OURS), "theirs": theirs, "copy": copy,
            "env": env, "rows": [asdict(r) for r in rows]}


def _ratio(a, b):
    return a / b if a and b else None


def row_line(r: AgainstRow, theirs: dict) -> str:
    parts = [f"{r.case:24s} batch {r.batch:4d} {r.mode:12s}"]
    for kind in ("replay", "baseline"):
        o, t = r.us.get(OURS[kind]), r.us.get(theirs.get(kind, ""))
        fmt = (lambda v: f"{v:9.2f}" if v else "        -")
        parts.append(f"{kind}: ours {fmt(o)} theirs {fmt(t)} us (ratio {_ratio(o, t) or 0:.2f})")
    return "  ".join(parts)


def _tb(nbytes: float, us: float | None) -> float | None:
    return nbytes / (us * 1e-6) / 1e12 if us else None


def summary_rows(result: dict) -> list[dict]:
    """Per row: the four times, ours / theirs, replay / baseline and the shares of the copy ceiling."""
    theirs, copy = result["theirs"], result["copy"]["tbps"]
    out = []
    for r in result["rows"]:
        if not r["batch"]:
            continue
        us = {kind: (r["us"].get(OURS[kind]), r["us"].get(theirs.get(kind, ""))) for kind in OURS}
        pct = {kind: tuple(None if _tb(r[f"bytes_{kind}"], u) is None else 100 * _tb(r[f"bytes_{kind}"], u) / copy
                           for u in us[kind]) for kind in OURS}
        out.append({"case": r["case"], "batch": r["batch"], "mode": r["mode"], "us": us, "pct_copy": pct,
                    "options": r.get("options", {}).get(OURS["replay"]) or {},
                    "replay_ratio": _ratio(*us["replay"]), "baseline_ratio": _ratio(*us["baseline"]),
                    "ours_speedup": _ratio(us["baseline"][0], us["replay"][0]),
                    "theirs_speedup": _ratio(us["baseline"][1], us["replay"][1])})
    return out


HEADERS = ["case", "batch", "mode", "ours replay µs (options)", "official replay µs", "**ours / official**",
           "ours baseline µs", "official baseline µs", "ours / official (baseline)", "replay % copy ours / official",
           "replay / baseline ours / official"]


def markdown(result: dict) -> str:
    """The side-by-side section for docs/benchmarks.md: provenance line (date, GPU, versions, both
    commits, copy ceiling) and one table row per (case, batch)."""
    e, fam = result["env"], result["family"]

    def f(v, fmt="{:.3g}"):
        return "–" if v is None else (fmt.format(v) if abs(v) < 100 else f"{v:.0f}")

    rows = []
    for s in summary_rows(result):
        (ro, rt), (bo, bt) = s["us"]["replay"], s["us"]["baseline"]
        po, pt = s["pct_copy"]["replay"]
        opts = s["options"]
        rows.append([s["case"], s["batch"], s["mode"], f(ro) + (f" (`{json.dumps(opts)}`)" if opts else ""), f(rt),
                     f(s["replay_ratio"], "{:.2f}"), f(bo), f(bt), f(s["baseline_ratio"], "{:.2f}"),
                     f"{f(po, '{:.0f}')} / {f(pt, '{:.0f}')} %",
                     f"{f(s['ours_speedup'], '{:.2f}')} / {f(s['theirs_speedup'], '{:.2f}')}"])
    theirs = "; ".join(f"{kind} {v}" for kind, v in e.get("theirs", {}).items())
    head = (f"{fam} at `{result['geometry']}`, measured {e['date']} on {e.get('gpu', 'no GPU')}"
            f"{' (' + str(e['sms']) + ' SMs)' if 'sms' in e else ''}, torch {e['torch']}, Triton {e['triton']}, "
            f"Python {e['python']}; ours: commit `{e.get('commit')}`{' (dirty tree)' if e.get('dirty') else ''} "
            f"({result['ours']['replay']}, {result['ours']['baseline']}); theirs: {theirs}.  Copy ceiling in the same "
            f"run: **{result['copy']['tbps']:.3f} TB/s**.  Times are µs per step (verify + commit), CUDA graphs of "
            f"whole cursor cycles, do_bench median, L2 cleared; ratio < 1: ours faster.")
    skipped = [f"{r['case']}: {r['notes']['*']}" for r in result["rows"] if not r["batch"]]
    notes = [f"{r['case']} batch {r['batch']} {n}: {why}" for r in result["rows"] if r["batch"]
             for n, why in r["notes"].items() if r["us"].get(n) is None]
    fails = dict.fromkeys(f"{r['case']}, {n} ({r.get('modes', {}).get(n, r['mode'])}): {why}" for r in result["rows"]
                          if r["batch"] for n, why in r["notes"].items() if why.startswith("FAILS"))
    tail = ("".join(f"\n\nNot run: {s}" for s in skipped) + "".join(f"\n\nNot timed: {s}" for s in notes)
            + "".join(f"\n\nTimed, but the engine's verdict: {s}" for s in fails))
    return head + "\n\n" + markdown_table(HEADERS, rows) + tail


def write(result: dict, out_dir: str) -> tuple[str, str]:
    """``against_<family>_<commit>.json`` and ``.md`` under ``out_dir``; returns both paths."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"against_{result['family']}_{result['env'].get('commit', 'unknown')}")
    with open(stem + ".json", "w") as fh:
        json.dump(result, fh, indent=1)
    with open(stem + ".md", "w") as fh:
        fh.write(markdown(result) + "\n")
    return stem + ".json", stem + ".md"


__all__ = ["AgainstRow", "against_kernels", "bench_against", "common_mode", "markdown", "summary_rows", "write"]

