"""The literal ReplaySSM and baseline models against the fp64 recurrence (spec 3-4).

At s64a64 every window output, every committed state and every flushed checkpoint equals the
fp64 token-by-token reference to ~1e-12, for standard decode (L in 1, 2, 4, 16, both Mamba-2
routes and GDN) and for speculative decode with every k in 1..T' at every ring phase,
origin != 0 included.  Exact invariants: a non-flush verify leaves the checkpoint bit-identical,
padding rows and unused slots are untouched.  A broken model (commit advancing k+1) fails.
"""

import pytest
import torch
from core_drive import drive, make_inputs, make_params

from replayssm import registry
from replayssm.families import preset
from replayssm.interface import DecodeConfig, KernelConfig
from replayssm.ops.literal import LiteralReplayKernel

TOL = 1e-12
FAMILY_KERNELS = [("mamba2", "literal-replay"), ("mamba2", "literal-replay-state"), ("gdn", "literal-replay"),
                  ("mamba2", "literal-baseline"), ("gdn", "literal-baseline")]
IDS = [f"{f}-{n}" for f, n in FAMILY_KERNELS]


@pytest.mark.parametrize("L", [1, 2, 4, 16], ids=lambda L: f"s64a64-L{L}-T1-tiny")
@pytest.mark.parametrize("family,name", FAMILY_KERNELS, ids=IDS)
def test_standard_decode_matches_reference(family, name, L):
    res = drive(registry.get(name, family), preset("tiny", family), "s64a64", DecodeConfig("standard", 1, L),
                steps=3 * L + 2)
    assert res.violations == []
    assert res.max_out_err < TOL and res.max_state_err < TOL and res.max_ckpt_err < TOL
    assert res.flushes >= 3  # several flush cycles


def _least_covered(cov_counts):
    def choose(wp, T):
        k = min(range(1, T + 1), key=lambda k: cov_counts.get((wp, k), 0))
        cov_counts[(wp, k)] = cov_counts.get((wp, k), 0) + 1
        return k
    return choose


@pytest.mark.parametrize("T,B", [(3, 4), (4, 16), (1, 1)], ids=lambda v: str(v))
@pytest.mark.parametrize("family,name", FAMILY_KERNELS, ids=IDS)
def test_speculative_every_k_every_phase(family, name, T, B):
    decode = DecodeConfig("speculative", T, B)
    for origin in (0, decode.ring_rows - 2):
        counts = {}
        res = drive(registry.get(name, family), preset("tiny", family), "s64a64", decode,
                    slots=(1, -1, 3), origins=(origin, 0, origin + 1 if origin else 0), steps=6 * B + 10,
                    choose_k=_least_covered(counts))
        assert res.violations == []
        assert res.max_out_err < TOL and res.max_state_err < TOL and res.max_ckpt_err < TOL
        if name != "literal-baseline":
            # every ring phase: empty, last non-flush, flush verify; every k at flush and non-flush
            seen_wp = {wp for wp, _, _ in res.coverage}
            assert 0 in seen_wp and (B - T) in seen_wp
            for k in range(1, T + 1):
                assert (k, True) in {(kk, f) for _, kk, f in res.coverage}
                if B > T:
                    assert (k, False) in {(kk, f) for _, kk, f in res.coverage}


@pytest.mark.parametrize("mode", ["s32a32", "s32a16", "s16a16", "sfp8a16-sr", "si8a16"])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_lower_precision_close_and_invariants_hold(family, mode):
    res = drive(registry.get("literal-replay", family), preset("tiny", family), mode,
                DecodeConfig("speculative", 3, 6), steps=25)
    assert res.violations == []
    assert res.max_out_err < 0.2  # a loose sanity bound; the engine's tolerance rule is the real judge


class _CommitsOneTooMany(LiteralReplayKernel):
    """Broken on purpose: commit advances the cursor by k + 1 when there is room."""

    name = "broken-commit-k-plus-1"
    family = "gdn"
    math = registry.get("literal-replay", "gdn").math

    def commit(self, slot_ids, accepted):
        bumped = torch.where(accepted < self.decode.window, accepted + 1, accepted)
        super().commit(slot_ids, bumped)


def test_broken_commit_is_caught():
    res = drive(_CommitsOneTooMany, preset("tiny", "gdn"), "s64a64", DecodeConfig("speculative", 3, 8),
                steps=12, seed=3)
    assert res.max_out_err > 1e-3 or res.max_state_err > 1e-3


SPEC_T3_B4 = DecodeConfig("speculative", 3, 4)


def _kernel(family="gdn", mode="s32a16", decode=SPEC_T3_B4, name="literal-replay"):
    g = preset("tiny", family)
    return registry.build(name, KernelConfig(g, make_params(g, torch.Generator().manual_seed(0)), mode, decode,
                                             num_slots=3)), g


@pytest.mark.parametrize("call,match", [
    ("verify_bad_shape", r"inputs\['v'\]: expected shape"),
    ("verify_bad_dtype", r"inputs\['q'\]: expected dtype"),
    ("verify_bad_slot", r"slot_ids\[1\]: expected a slot in \[0, 3\)"),
    ("verify_dup_slot", "appears twice"),
    ("verify_strided", "contiguous"),
    ("commit_k_negative", r"accepted\[0\]: expected 0 <= k <= T' = 3"),
    ("commit_k4", r"accepted\[1\]: expected 0 <= k <= T' = 3"),
    ("reset_bad_origin", r"origin\[0\]: expected a ring row"),
    ("reset_bad_state", "initial_state: expected shape"),
    ("verify_never_reset", "never reset"),
])
def test_bad_input_is_refused_without_mutation(call, match):
    k, g = _kernel()
    slots = torch.tensor([0, 1])
    k.reset(slots)
    inp = make_inputs(g, 2, 3, torch.bfloat16, torch.Generator().manual_seed(1))
    k.verify(slots, inp)
    before = k.snapshot()
    bad = dict(inp)
    with pytest.raises(ValueError, match=match):
        if call == "verify_bad_shape":
            bad["v"] = inp["v"][:, :2]
            k.verify(slots, bad)
        elif call == "verify_bad_dtype":
            bad["q"] = inp["q"].float()
            k.verify(slots, bad)
        elif call == "verify_bad_slot":
            k.verify(torch.tensor([0, 3]), inp)
        elif call == "verify_dup_slot":
            k.verify(torch.tensor([1, 1]), inp)
        elif call == "verify_strided":  # the literal models take views; one declaring otherwise refuses them
            k.supports_strided_views = False
            bad["v"] = inp["v"].transpose(-1, -2).contiguous().transpose(-1, -2)
            k.verify(slots, bad)
        elif call == "commit_k_negative":
            k.commit(slots, torch.tensor([-1, 1]))
        elif call == "commit_k4":
            k.commit(slots, torch.tensor([1, 4]))
        elif call == "reset_bad_origin":
            k.reset(slots, origin=torch.tensor([8, 0]))
        elif call == "reset_bad_state":
            k.reset(slots, torch.zeros(2, 1))
        elif call == "verify_never_reset":
            k.verify(torch.tensor([2, 0]), inp)
    after = k.snapshot()
    assert torch.equal(before.checkpoint, after.checkpoint)
    assert all(torch.equal(before.records[n], after.records[n]) for n in before.records)
    assert torch.equal(before.write_pos, after.write_pos) and torch.equal(before.origin, after.origin)


def test_standard_decode_commits_one_token():
    k, g = _kernel(decode=DecodeConfig("standard", 1, 4))
    slots = torch.tensor([0])
    k.reset(slots)
    k.verify(slots, make_inputs(g, 1, 1, torch.bfloat16, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="accepted"):
        k.commit(slots, torch.tensor([2]))


def test_unsupported_mode_is_refused():
    with pytest.raises(ValueError, match="does not support s32a16-tf32"):
        _kernel(mode="s32a16-tf32", name="literal-baseline")


def test_slot_reuse_resets_cursors():
    k, g = _kernel(decode=DecodeConfig("speculative", 2, 4))
    slots = torch.tensor([0])
    k.reset(slots)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        k.verify(slots, make_inputs(g, 1, 2, torch.bfloat16, gen))
        k.commit(slots, torch.tensor([2]))
    assert k.snapshot().write_pos[0] > 0
    k.reset(slots, origin=torch.tensor([5]))
    snap = k.snapshot()
    assert snap.write_pos[0] == 0 and snap.origin[0] == 5
    assert torch.equal(k.committed_state(slots), torch.zeros(1, *g.state_shape, dtype=torch.float64))
