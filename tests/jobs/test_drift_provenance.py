"""Drift cells are reused only when proven current; incomplete cells fail the run.

Oracle: issue 16 items 1-2: a cell result records its provenance (cell configuration digest, kernel
name and code digest, versions, device) and is reused only on an exact match with complete status;
a cell cut short by the deadline keeps its checkpoint and resumes; a crashed cell reruns with its
failure kept in ``history``; a folder of cells without ``config.json`` is refused; a cell that raised
makes ``replayssm drift`` exit 1 (0 with ``--allow-incomplete``) and the report marks it
"stopped at token N: reason".  One tiny cell (1 row x 128 tokens, standard decode).
"""

from __future__ import annotations

import json
import time

import pytest

from replayssm import registry
from replayssm.cli import main
from replayssm.ops.mamba2.literal import Mamba2LiteralReplay
from replayssm.validators.jobs.drift import sweep as D

pytestmark = pytest.mark.usefixtures("one_thread")


class _Raiser(Mamba2LiteralReplay):
    """literal-replay that raises at its ``raise_at``-th verify (None: never)."""

    name = "test-drift-raiser"
    raise_at: int | None = 20

    def verify(self, *a, **k):
        self.verifies = getattr(self, "verifies", 0) + 1
        if type(self).raise_at is not None and self.verifies == type(self).raise_at:
            raise RuntimeError("boom in verify")
        return super().verify(*a, **k)


@pytest.fixture
def raiser(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, ("mamba2", _Raiser.name), _Raiser)
    monkeypatch.setattr(_Raiser, "raise_at", 20)
    return _Raiser


def _cfg(kernel="literal-replay"):
    return D.SweepConfig(families=("mamba2",), kernels=(kernel,), modes=("s32a32",), schedules=("standard",),
                         geometry=(("mamba2", "tiny"),), rows=1, tokens=128)


def _cell(out, cfg):
    spec = cfg.cells()[0][0]
    return spec, json.loads(D.cell_path(out, spec.id).read_text())


def test_complete_cell_is_reused_only_with_matching_provenance(tmp_path):
    cfg, out = _cfg(), tmp_path / "o"
    assert D.run_sweep(cfg, out, progress=False).ran
    spec, res = _cell(out, cfg)
    prov = res["provenance"]
    assert prov == D.cell_provenance(spec, cfg, "cpu") and res["history"] == []
    assert set(prov) == {"cell_config", "kernel", "kernel_code", "versions", "device"}
    assert prov["kernel"] == "literal-replay" and set(prov["versions"]) == {"replayssm", "torch", "triton"}
    assert D.run_sweep(cfg, out, progress=False).ran == []  # exact match, complete: reused
    # Another kernel code digest (a fixed kernel): the cell reruns, the old provenance kept in history.
    res["provenance"] = {**prov, "kernel_code": "0" * 16}
    D.cell_path(out, spec.id).write_text(json.dumps(res))
    assert D.run_sweep(cfg, out, progress=False).ran == [spec.id]
    _, again = _cell(out, cfg)
    assert again["provenance"] == prov and again["history"][0]["provenance"]["kernel_code"] == "0" * 16


def test_kernel_code_digest_covers_the_kernel_module():
    base = D.kernel_code_digest(Mamba2LiteralReplay)
    assert base == D.kernel_code_digest(Mamba2LiteralReplay)
    assert D.kernel_code_digest(_Raiser) != base  # this module's source is part of it


def test_cut_short_cell_keeps_its_checkpoint_and_resumes(tmp_path):
    cfg, out = _cfg(), tmp_path / "o"
    D.prepare_out(cfg, out)
    spec = cfg.cells()[0][0]
    res = D.run_cell(spec, cfg, out, checkpoint_every_s=0.0, deadline=time.time())  # the deadline has passed
    assert D.cell_status(res) == "stopped" and D.ckpt_path(out, spec.id).exists()
    assert D.run_sweep(cfg, out, progress=False).ran == [spec.id]  # not reused: resumed to the end
    _, done = _cell(out, cfg)
    assert D.cell_status(done) == "complete" and done["tokens_run"] == 128
    assert not D.ckpt_path(out, spec.id).exists()


def test_resumed_run_counts_only_the_tokens_it_ran(tmp_path, monkeypatch):
    """A cell cut short mid-run and resumed: the resumed sweep's tokens (and so its validated tokens/s)
    are those it ran, not the checkpoint's (a 2026-12-06 H100 resume reported the cells' whole tokens)."""
    cfg, out = _cfg(), tmp_path / "o"
    D.prepare_out(cfg, out)
    spec = cfg.cells()[0][0]
    calls = {"n": 0}
    real_time = time.time

    def clock():  # the deadline check passes twice (two chunks run), then the deadline is over
        calls["n"] += 1
        return 0.0 if calls["n"] <= 2 else 2.0

    monkeypatch.setattr(D.time, "time", clock)
    cut = D.run_cell(spec, cfg, out, checkpoint_every_s=1e9, chunk=16, deadline=1.0)
    monkeypatch.setattr(D.time, "time", real_time)
    reached = cut["tokens_run"]
    assert D.cell_status(cut) == "stopped" and 0 < reached < 128 and D.ckpt_path(out, spec.id).exists()
    seen = []  # run_cell tells the resumed tokens apart from those it runs
    D.run_cell(spec, cfg, out, chunk=16, on_progress=lambda n, resumed=False: seen.append((n, resumed)))
    assert seen[0] == (reached, True) and sum(n for n, r in seen[1:] if not r) == 128 - reached
    assert not any(r for _, r in seen[1:])
    # the same through the sweep: cut short again, resumed by run_sweep, its outcome counts the rest only
    out2 = tmp_path / "o2"
    D.prepare_out(cfg, out2)
    calls["n"] = 0
    monkeypatch.setattr(D.time, "time", clock)
    D.run_cell(spec, cfg, out2, checkpoint_every_s=1e9, chunk=16, deadline=1.0)
    monkeypatch.setattr(D.time, "time", real_time)
    outcome = D.run_sweep(cfg, out2, progress=False, chunk=16)
    assert outcome.ran == [spec.id] and outcome.tokens == 128 - reached
    assert D.cell_status(_cell(out2, cfg)[1]) == "complete"


def test_folder_of_cells_without_config_is_refused(tmp_path):
    cfg, out = _cfg(), tmp_path / "o"
    (out / "cells").mkdir(parents=True)
    (out / "cells" / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot be proven"):
        D.prepare_out(cfg, out)
    assert sorted(p.name for p in out.rglob("*")) == ["cells", "x.json"]


def test_crashed_cell_fails_the_run_then_reruns_keeping_its_failure(tmp_path, capsys, raiser):
    out = tmp_path / "o"
    argv = ["drift", "--families", "mamba2", "--kernels", raiser.name, "--modes", "s32a32", "--schedules",
            "standard", "--tokens", "128", "--rows", "1", "--workers", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "INCOMPLETE" in err and "stopped at token" in err and "boom in verify" in err
    md = (out / "drift_report.md").read_text()
    assert "stopped at token" in md and "the kernel raised" in md
    assert main([*argv, "--allow-incomplete"]) == 0  # reruns, raises again, allowed
    capsys.readouterr()
    raiser.raise_at = None  # the kernel is fixed
    assert main(argv) == 0
    assert "1 of 1 cell(s) run" in capsys.readouterr().err
    spec_id = f"mamba2.{raiser.name}.s32a32.long-memory.standard"
    res = json.loads(D.cell_path(out, spec_id).read_text())
    assert D.cell_status(res) == "complete"
    assert [h["status"] for h in res["history"]] == ["raised", "raised"]
    assert "boom in verify" in res["history"][0]["exception"]


def test_checkpoint_files_round_trip_bit_for_bit_and_refuse_what_they_cannot_prove():
    import math
    import pickle

    import numpy as np
    import torch

    from replayssm.validators.engine import checkpoint_file as C
    g = torch.Generator().manual_seed(0)
    tree = {"floats": [1.5, math.nan, -math.inf, 0.1], "ints": (3, -(1 << 62)), 7: None, "flag": True,
            "np": np.arange(6, dtype=np.int64).reshape(2, 3), "npscalar": np.float64(0.3), "text": "é",
            "t": {str(d): torch.randn(2, 3, generator=g).to(d) for d in
                  (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                   torch.float8_e5m2)},
            "empty": torch.zeros(0, 4), "scalar": torch.tensor(5), "mask": torch.tensor([True, False])}
    data = C.dumps(tree)
    back = C.loads(data)
    assert back["floats"][:1] + back["floats"][2:] == [1.5, -math.inf, 0.1] and math.isnan(back["floats"][1])
    assert back["ints"] == (3, -(1 << 62)) and back[7] is None and back["flag"] is True and back["text"] == "é"
    assert back["np"].dtype == np.int64 and (back["np"] == tree["np"]).all()
    assert type(back["npscalar"]) is np.float64 and back["npscalar"] == tree["npscalar"]
    for k in ("empty", "scalar", "mask"):
        assert back[k].dtype == tree[k].dtype and torch.equal(back[k], tree[k])
    for k, t in tree["t"].items():
        assert back["t"][k].dtype == t.dtype and torch.equal(back["t"][k].view(torch.uint8), t.view(torch.uint8))
    refusals = {b"": "empty", pickle.dumps(tree["ints"]): "pickle", data[:len(data) // 2]: "truncated",
                data[:-1] + bytes([data[-1] ^ 1]): "SHA-256", b"\x00" * 64: "foreign"}
    for bad, why in refusals.items():
        with pytest.raises(C.CheckpointError, match=why):
            C.loads(bad)
