"""Golden fp64 trajectories: the reference still reproduces them (CPU always, CUDA as a gpu test).

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
