"""``replayssm golden verify|regenerate``: fp64 golden trajectories of the reference.

Oracle: the fp64 reference (each family's ``naive.py``, stepped by the engine's ``Lockstep`` exactly
as a validation run steps it) on the canonical scenarios: each family x {tiny, the family's bench
geometry} x {standard, speculative}, 2 rows, mode s32a32, the ``random`` schedule, 8 steps, seed 0.
At steps :data:`SAMPLE_STEPS` the reference window outputs and the committed reference state are
stored (per row, at most :data:`KEEP` evenly spaced elements of each, fp64: ``golden_truth.sample``),
with the largest readout magnitude of each (row, window position) (``mag<step>``, the scale of
the tolerance floor, for ``validate --truth golden``) in
``golden/trajectories/<family>-<geometry>-<decode>.npz``, with ``manifest.json`` holding each file's
sha256, its scenario and the provenance of the data.  ``verify`` checks every sha256 and that the
reference recomputed on ``--device`` reproduces every stored value to :data:`TOLERANCE` x the
largest magnitude of the array (fp64 on the CPU reproduces them bit for bit; a GPU's fp64 reduction
order may differ in the last bits).  Exit 0 all reproduced, 1 a mismatch, 2/3 as the contract.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from replayssm import __version__, golden
from replayssm.cli import check_device
from replayssm.families import family, family_names
from replayssm.guard import check_record_path, check_writable
from replayssm.records import Recorder, add_record_argument, append
from replayssm.records.jobs import golden_records, source
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.golden_truth import KEEP, sample
from replayssm.validators.engine.runner import Lockstep

SAMPLE_STEPS = (0, 3, 7)
TOLERANCE = 1e-12
FOLDER = ("trajectories",)


def canonical() -> dict[str, Scenario]:
    """The canonical scenarios by stem ``<family>-<geometry>-<decode>``."""
    out = {}
    for f in family_names():
        for geo in ("tiny", family(f).bench_geometry):
            for dec in ("standard", "speculative"):
                out[f"{f}-{geo}-{dec}"] = Scenario.build(f, decode=dec, batch=2, padding=0, geometry=geo,
                                                         mode="s32a32", schedule="random",
                                                         steps=max(SAMPLE_STEPS) + 1, seed=0)
    return out


def trajectory(sc: Scenario, device: str = "cpu") -> dict[str, np.ndarray]:
    """The sampled reference outputs (``out<step>``), committed states (``state<step>``) and readout
    maxima per (row, position) (``mag<step>``) of ``sc``."""
    ls = Lockstep(sc, "literal-replay", device=device, literal_every=0, invariants_every=0, state_every=0,
                  record_metrics=False, digest=False)
    ls.start()
    arrays = {}
    for s in range(max(SAMPLE_STEPS) + 1):
        ls.step()
        if s in SAMPLE_STEPS:
            arrays[f"out{s}"] = sample(ls.last_step["ref_out"])
            arrays[f"state{s}"] = sample(ls.ref)
            arrays[f"mag{s}"] = ls.ref_magnitude.flatten(2).amax(-1).to("cpu", torch.float64).numpy()
    return arrays


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def regenerate(folder: Path, device: str = "cpu") -> dict:
    """Recompute every canonical trajectory into ``folder`` and write its manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    for stem, sc in canonical().items():
        data = _npz(trajectory(sc, device))
        (folder / f"{stem}.npz").write_bytes(data)
        entries[stem] = {"file": f"{stem}.npz", "sha256": hashlib.sha256(data).hexdigest(),
                         "scenario": json.loads(sc.to_json()), "sample_steps": list(SAMPLE_STEPS), "keep": KEEP}
    manifest = {"schema": 1, "tolerance": TOLERANCE, "entries": entries,
                "provenance": {"command": "replayssm golden regenerate", "device": device,
                               "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                               "replayssm": __version__, "torch": torch.__version__}}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def verify(folder: Path, device: str = "cpu", worst: dict | None = None) -> list[str]:
    """The mismatches (empty: every file intact and reproduced to TOLERANCE).  ``worst`` (a dict)
    receives, per trajectory stem, the largest difference relative to the stored scale over its
    arrays (None where nothing was recomputed)."""
    worst = {} if worst is None else worst
    mp = folder / "manifest.json"
    try:
        manifest = json.loads(mp.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"golden: cannot read {mp} ({e}); run `replayssm golden regenerate`") from None
    bad = []
    want = canonical()
    for stem in sorted(set(want) - set(manifest["entries"])):
        bad.append(f"{stem}: no golden trajectory in {mp}")
        worst[stem] = None
    for stem, e in sorted(manifest["entries"].items()):
        worst[stem] = None
        data = (folder / e["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            bad.append(f"{stem}: {e['file']} does not match its sha256 in the manifest")
            continue
        sc = Scenario.from_dict(e["scenario"])
        if stem in want and sc != want[stem]:
            bad.append(f"{stem}: the manifest's scenario is not the canonical one")
            continue
        stored = dict(np.load(io.BytesIO(data), allow_pickle=False))
        got = trajectory(sc, device)
        for name in sorted(stored):
            a, b = stored[name], got.get(name)
            if b is None or a.shape != b.shape:
                bad.append(f"{stem}.{name}: shape {a.shape} stored, {None if b is None else b.shape} recomputed")
                continue
            err = float(np.max(np.abs(a - b))) if a.size else 0.0
            scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-300)
            worst[stem] = max(worst[stem] or 0.0, err / scale)
            if not err <= TOLERANCE * scale:
                bad.append(f"{stem}.{name}: max abs difference {err:.3e} > {TOLERANCE:g} x {scale:.3e}")
    return bad


def add_parser(subparsers):
    p = subparsers.add_parser("golden", help="verify or regenerate the fp64 golden trajectories of the reference",
                              description="fp64 golden trajectories (golden/trajectories/): verify that the "
                                          "reference still reproduces them, or regenerate them.")
    p.add_argument("action", choices=["verify", "regenerate"])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (where the reference is recomputed)")
    p.add_argument("--dir", default=None, metavar="PATH",
                   help="trajectory folder (default: the installed golden/trajectories)")
    add_record_argument(p)
    return p


def run(args) -> int:
    dev = check_device(args.device)
    folder = Path(args.dir) if args.dir else golden.path(*FOLDER)
    if dev == "cpu":
        torch.set_num_threads(1)
    if args.record is not None and args.action != "verify":
        raise ValueError("--record: records what `golden verify` judged; `golden regenerate` judges nothing")
    check_record_path(args.record)
    if args.action == "regenerate":
        check_writable(folder, "--dir")
        m = regenerate(folder, dev)
        print(f"golden: wrote {len(m['entries'])} trajectories and manifest.json to {folder}")
        return 0
    worst: dict = {}
    bad = verify(folder, dev, worst)
    if args.record:
        append(args.record, golden_records(Recorder("golden", device=dev, source=source(args)), worst, bad,
                                           TOLERANCE))
    for line in bad:
        print(f"golden: MISMATCH {line}")
    n = len(canonical())
    print(f"golden: {'FAIL' if bad else 'PASS'} {n} trajectories on {dev} ({len(bad)} mismatch(es), "
          f"tolerance {TOLERANCE:g} relative)")
    return 1 if bad else 0


__all__ = ["KEEP", "SAMPLE_STEPS", "TOLERANCE", "add_parser", "canonical", "regenerate", "run", "trajectory",
           "verify"]
