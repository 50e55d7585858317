"""The vLLM 0.33.0 release adapters (replayssm/adapters/vllm033*.py) through the engine, on CPU under the interpreter.

Oracle: the validation engine (fp64 recurrence on the accepted stream, the literal model at the
same precision mode, exact invariants: checkpoint bit-identical over a non-flush verify, padding
rows and unused slots untouched, every output written, committed ring rows kept, cursors by the
declared ``flush-when-full`` policy, bit-identical repeat).  The release's files are loaded
unchanged from ``../shared/peers/vllm-0.33.0`` (or ``$REPLAYSSM_VLLM033_SRC``; skipped without it).
fp32-activation modes only: bf16 ``tl.dot`` is wrong under the interpreter (spec 9); bf16 modes are GPU-only (profile
``release-adapters``).

Expected: the released output-only kernel passes standard decode; ``ssu_dispatch``'s ring trackers
(the release's own bookkeeping, around a literal ``checkpointing_ssu``) pass standard and
speculative exhaustive schedules; the padded-ring mutant fails at its first checkpoint; FlashInfer's
path is refused on a CPU in one line.
"""

import os
import pathlib

import pytest

from replayssm import adapters
from replayssm.adapters import _vllm033_source, _vllm_source
from replayssm.precision import parse_mode
from replayssm.registry import get
from replayssm.scenarios.scenario import Scenario
from replayssm.validators.engine.runner import run_scenario

ROOT = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "peers"
RELEASE = pathlib.Path(os.environ.get(_vllm033_source.ENV) or ROOT / "vllm-0.33.0").resolve()
FORK = pathlib.Path(os.environ.get(_vllm_source.ENV) or ROOT / "vllm-replayssm").resolve()


@pytest.fixture(scope="module")
def release():
    """The release adapters from the peers' copy of the wheel's files, the fork's beside them when present."""
    if not RELEASE.is_dir():
        pytest.skip(f"no vLLM 0.33.0 release files at {RELEASE} (../shared/peers beside the checkout)")
    saved = {k: os.environ.get(k) for k in (_vllm033_source.ENV, _vllm_source.ENV)}
    os.environ[_vllm033_source.ENV] = str(RELEASE)
    if FORK.is_dir():
        os.environ[_vllm_source.ENV] = str(FORK)
    try:
        status = adapters.load(force=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return status


def _assert_passes(res):
    assert res.passed, "\n".join(f"step {f.step} {f.check}: {f.message}" for f in res.failures[:5])


def test_listed_with_their_source(release):
    ok, line = release["vllm033"]
    assert ok, line
    for name in ("vllm033-replay", "vllm033-dispatch", "vllm033-trackers", "vllm033-trackers-padded-ring"):
        assert f"mamba2/{name}" in line
    assert "vllm 0.33.0 release files at" in line and str(RELEASE) in line


def test_fork_and_release_load_side_by_side(release):
    """Both sources in one process: each adapter runs its own files (same vLLM module names)."""
    if not FORK.is_dir():
        pytest.skip("no fork checkout beside the release")
    assert release["vllm"][0], release["vllm"][1]
    fork = get("vllm-replay", "mamba2").modules["selective_state_update_replayssm_output_only"]
    rel = get("vllm033-replay", "mamba2").modules["selective_state_update_replayssm_output_only"]
    assert fork is not rel
    assert pathlib.Path(fork.__file__).is_relative_to(FORK) and pathlib.Path(rel.__file__).is_relative_to(RELEASE)


def test_released_output_only_standard_decode(release, one_thread):
    """Two flush cycles (L = 4) with a padding row and canary slots, bit-identical repeat."""
    sc = Scenario.tiny("mamba2", decode="standard", mode="s32a32", schedule="always-1", buffer=4, steps=7)
    _assert_passes(run_scenario(sc, "vllm033-replay", repeat_check=True))


@pytest.mark.parametrize("decode,T,B", [("standard", 1, 3), ("speculative", 2, 2), ("speculative", 3, 5)],
                         ids=["std-L3", "spec-T2-B2", "spec-T3-B5"])
def test_ring_trackers(release, one_thread, decode, T, B):
    """vLLM's reset / update / delayed commit trackers keep the books of the flush-when-full policy:
    every k at every ring phase (exhaustive), two standard flush cycles."""
    if decode == "standard":
        sc = Scenario.tiny("mamba2", decode="standard", mode="s32a32", schedule="always-1", buffer=B, steps=8)
    else:
        sc = Scenario.tiny("mamba2", decode="speculative", mode="s32a32", schedule="exhaustive", window=T, buffer=B)
    _assert_passes(run_scenario(sc, "vllm033-trackers", repeat_check=False))


@pytest.mark.parametrize("decode", ["standard", "speculative"])
def test_padded_ring_mutant_is_caught(release, one_thread, decode):
    """A ring padded past B + T' rows: the kernel checkpoints later than the trackers move the ring."""
    if decode == "standard":
        sc = Scenario.tiny("mamba2", decode="standard", mode="s32a32", schedule="always-1", buffer=3, steps=8)
    else:
        sc = Scenario.tiny("mamba2", decode="speculative", mode="s32a32", schedule="exhaustive", window=2, buffer=2)
    res = run_scenario(sc, "vllm033-trackers-padded-ring", repeat_check=False)
    assert not res.passed
    assert {"state", "output"} & {f.check for f in res.failures}, [f.check for f in res.failures]


def test_refusals_are_one_line(release):
    sc = Scenario.tiny("mamba2", decode="speculative", mode="s32a32", window=2, buffer=2, steps=2)
    with pytest.raises(ValueError, match="device: vllm033-dispatch runs FlashInfer's checkpointing_ssu") as e:
        run_scenario(Scenario.tiny("mamba2", decode="speculative", mode="s32a16", window=2, buffer=2, steps=2),
                     "vllm033-dispatch")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="standard decode only"):
        run_scenario(sc, "vllm033-replay")
    with pytest.raises(ValueError, match="B \\+ T' must be a power of two"):
        run_scenario(Scenario.tiny("mamba2", decode="speculative", mode="s32a32", window=2, buffer=3, steps=2),
                     "vllm033-trackers")
    cls = get("vllm033-replay", "mamba2")
    std = Scenario.tiny("mamba2", decode="standard", mode="s16a16-sr", steps=2)
    assert "stochastic" in cls.unsupported_reason(parse_mode(std.mode), std.decode_config, {})


def test_vllm_src_naming_a_release_tree(release, monkeypatch):
    """--vllm-src pointed at the release: the fork source says what it is, the release source loads it."""
    monkeypatch.setenv(_vllm_source.ENV, str(RELEASE))
    monkeypatch.delenv(_vllm033_source.ENV, raising=False)
    with pytest.raises(_vllm_source.SourceUnavailable, match="is a vLLM release tree .* vllm033"):
        _vllm_source.find_tree()
    assert _vllm033_source.find_tree() == RELEASE.resolve()
