"""Golden fp64 trajectories: the reference still reproduces them (CPU always, CUDA as a gpu test), and
validation that reads its truth from them gives the verdict of the recomputed truth.

Oracle: ``golden/trajectories/`` (``replayssm golden regenerate``): the sampled fp64 reference
outputs and states of the canonical scenarios with a sha256 manifest; recomputing them must agree
to 1e-12 relative (bit for bit on the CPU), and a tampered file or value must be reported.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil

import numpy as np
import pytest
import torch

from replayssm import golden
from replayssm.cli import main
from replayssm.cli_golden import canonical, verify
from replayssm.validators import run_scenario
from replayssm.validators.engine.golden_truth import GoldenTruth

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = golden.path("trajectories")


def test_manifest_covers_every_canonical_scenario_with_provenance():
    m = json.loads((FOLDER / "manifest.json").read_text())
    assert set(m["entries"]) == set(canonical())
    assert {"command", "device", "date", "replayssm", "torch"} <= set(m["provenance"])
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 1 << 20


def test_cpu_reference_reproduces_the_golden_trajectories(capsys):
    assert main(["golden", "verify"]) == 0
    assert f"PASS {len(canonical())} trajectories on cpu" in capsys.readouterr().out


def test_a_tampered_value_or_file_is_reported(tmp_path):
    d = tmp_path / "t"
    shutil.copytree(FOLDER, d)
    m = json.loads((d / "manifest.json").read_text())
    stem = "mamba2-tiny-standard"
    arrays = dict(np.load(d / f"{stem}.npz"))
    arrays["state3"][0, 5] *= 1 + 1e-9
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    (d / f"{stem}.npz").write_bytes(buf.getvalue())
    m["entries"][stem]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "gdn-tiny-standard.npz").write_bytes(b"corrupt")
    bad = verify(d)
    assert len(bad) == 2
    assert bad[0].startswith("gdn-tiny-standard: gdn-tiny-standard.npz does not match its sha256")
    assert bad[1].startswith(f"{stem}.state3: max abs difference")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_reference_reproduces_the_golden_trajectories():
    assert verify(FOLDER, "cuda") == []


TINY = [s for s in canonical() if "-tiny-" in s]
# kernel -> the families it exists for; the mutants fail (state, output) at the stored steps
TRUTH_KERNELS = {"literal-replay": ("mamba2", "gdn", "kda"), "literal-baseline": ("mamba2", "gdn", "kda"),
                 "mutant-exclusive-cumsum": ("mamba2", "gdn"), "mutant-readout-without-skip": ("mamba2",),
                 "mutant-scalar-gate": ("kda",)}
# per family, a mutant the golden truth's stored states catch (measured: state fails at steps 0, 3, 7)
STATE_MUTANT = {"mamba2": "mutant-exclusive-cumsum", "gdn": "mutant-exclusive-cumsum", "kda": "mutant-scalar-gate"}


TRUTH_CASES = [(k, s) for k, fams in TRUTH_KERNELS.items() for s in TINY if s.split("-")[0] in fams]


@pytest.mark.parametrize("kernel,stem", TRUTH_CASES, ids=[f"{k}-{s}" for k, s in TRUTH_CASES])
def test_golden_truth_gives_the_verdict_of_the_recomputed_truth(kernel, stem):
    sc = canonical()[stem]
    ref = run_scenario(sc, kernel, repeat_check=False)
    gold = run_scenario(sc, kernel, repeat_check=False, truth="golden")
    assert gold.passed == ref.passed == kernel.startswith("literal-"), (ref.failure_counts, gold.failure_counts)
    assert set(gold.failure_counts) <= set(ref.failure_counts)
    assert gold.exception is None
    assert any(n.startswith(f"truth: golden {stem}") for n in gold.notes)


def test_golden_truth_refuses_another_scenario_and_tampered_data(tmp_path, capsys):
    sc = canonical()["gdn-tiny-standard"]
    with pytest.raises(ValueError, match=r"^truth: golden: the scenario \(digest [0-9a-f]{16}\) is no golden entry"):
        run_scenario(sc.replace(seed=1), "literal-replay", truth="golden")
    d = tmp_path / "t"
    shutil.copytree(FOLDER, d)
    raw = bytearray((d / "gdn-tiny-standard.npz").read_bytes())
    raw[-40] ^= 1
    (d / "gdn-tiny-standard.npz").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="gdn-tiny-standard.npz does not match its sha256"):
        GoldenTruth.load(sc, d)
    flags = ["validate", "--kernel", "literal-replay", "--family", "gdn", "--decode", "standard", "--precision",
             "s32a32", "--schedule", "random", "--steps", "8", "--batch", "2", "--padding", "0",
             "--out", str(tmp_path / "out")]
    assert main([*flags, "--seed", "0", "--truth", "golden", "--no-repeat"]) == 0
    assert "truth: golden gdn-tiny-standard" in (tmp_path / "out").joinpath(
        next(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".md")).read_text()
    capsys.readouterr()
    assert main([*flags, "--seed", "1", "--truth", "golden"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replayssm: error: --truth: golden: the scenario"), err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stem", [s for s in canonical() if "-tiny-" not in s])
def test_cuda_validation_from_golden_truth_matches_the_recomputed_truth(stem):
    """The Triton kernel at real geometry on the GPU, judged against the golden data (no
    reference recurrence) and against the reference recomputed on CUDA: the same verdict."""
    sc = canonical()[stem]
    gold = run_scenario(sc, "triton-replay", device="cuda", repeat_check=False, truth="golden")
    ref = run_scenario(sc, "triton-replay", device="cuda", repeat_check=False)
    assert gold.passed and ref.passed, (gold.failure_counts, ref.failure_counts)
    bad = run_scenario(sc, STATE_MUTANT[stem.split("-")[0]], device="cuda", repeat_check=False, truth="golden")
    assert not bad.passed and "state" in bad.failure_counts, bad.failure_counts
