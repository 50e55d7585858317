"""tools/ncu_summary.py reads Nsight Compute's text report as it is written.

Oracle: an excerpt of a real report (Mamba-2 `nano4b`, batch 1, H200, 2026-12-06: the replay kernel
and its commit launch) whose values are read off by eye; a report without a launch and a bad
argument are refused or marked, never filled in."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ncu_summary", ROOT / "tools" / "ncu_summary.py")
ncu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu)
EXCERPT = ROOT / "tests" / "fixtures" / "ncu_mamba2_b1_excerpt.txt"


def test_launches_read_in_order_with_their_metrics():
    rows = ncu.launches(EXCERPT.read_text())
    assert [r["kernel"] for r in rows] == ["_replay_kernel", "_commit_kernel"]
    rep, com = rows
    assert rep["grid"] == "480,1,1" and rep["block"] == "128"
    assert (rep["duration µs"], rep["DRAM %"], rep["registers"]) == ("7.04", "12.00", "64")
    assert (rep["occupancy achieved"], rep["theoretical"], rep["waves / SM"]) == ("21.12", "50", "0.45")
    assert rep["first stall named"].startswith("5.5 cycles waiting for a scoreboard dependency")
    assert (com["duration µs"], com["grid"], com["registers"]) == ("2.34", "1,1,1", "16")


def test_table_marks_a_report_without_launches():
    out = ncu.table([("b1", EXCERPT.read_text()), ("empty", "==PROF== Disconnected\n")])
    lines = out.splitlines()
    assert len(lines) == 2 + 2 + 1
    assert lines[2].startswith("| b1 | _replay_kernel | (480,1,1) x 128 | 7.04 |")
    assert "(no profiled launch in the report)" in lines[-1]


@pytest.mark.parametrize("arg", ["no-separator", "label="])
def test_bad_report_argument_names_it(arg, capsys):
    with pytest.raises(SystemExit):
        ncu.main([arg])
    assert "reports: expected LABEL=PATH" in capsys.readouterr().err
