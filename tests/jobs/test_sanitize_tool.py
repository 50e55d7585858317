"""tools/sanitize.py (``nox -s sanitize``): the compute-sanitizer runs it makes and how it reads their verdict.

Oracle: compute-sanitizer prints ``========= ERROR SUMMARY: N errors`` per process; a run passes
only with every summary at 0 and validate's exit code 0.  The runs themselves need a GPU (the
session skips without one); here only the command lines and the parsing, on the CPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("sanitize", Path(__file__).resolve().parents[2] / "tools" / "sanitize.py")
sanitize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanitize)


def test_the_error_summary_is_summed_over_processes_and_missing_is_none():
    assert sanitize.errors_of("========= ERROR SUMMARY: 0 errors\n") == 0
    assert sanitize.errors_of("========= ERROR SUMMARY: 2 errors\nx\n========= ERROR SUMMARY: 1 error\n") == 3
    assert sanitize.errors_of("Traceback (most recent call last):") is None


def test_each_run_is_one_small_cuda_validate_under_the_named_tool(tmp_path):
    cmd = sanitize.command("initcheck", "gdn", "triton-replay", "standard", tmp_path)
    assert cmd[:3] == ["compute-sanitizer", "--tool", "initcheck"] and "--error-exitcode" in cmd
    tail = cmd[cmd.index("validate"):]
    assert tail[tail.index("--device") + 1] == "cuda" and tail[tail.index("--kernel") + 1] == "triton-replay"
    assert set(sanitize.DEFAULT) >= {"mamba2:triton-replay", "gdn:triton-baseline", "kda:triton-replay"}
