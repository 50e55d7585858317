"""The row-batched literal models against their per-row reference, bit for bit.

Oracle: the per-row loops of ``replayssm/ops/literal.py`` (``_verify_rows``, ``_committed_rows``;
``vectorised = False``), the readable literal model.  On the CPU the rows of one call with equal
(write_pos, T'_r) run as one batched call of the family's ``window_rows`` / ``fold_rows``; the
drift reports, the golden data and the tolerance rule depend on the literal model's bits, so the
two must agree exactly: every output, every record, every checkpoint (and fp8 scale) and every
committed state, compared as raw bytes (NaN padding and the sign of zero included), over modes
s32a32, s32a16, s16a16, sfp8a16 and sfp16a16-sr, standard and speculative decode, padding rows,
a mid-run reset, ragged windows and rows whose cursors diverge (several groups per call).

Expected error: none (bit-identical).
"""

import pytest
import torch
from core_drive import make_inputs, make_params

from replayssm import registry
from replayssm.conventions import declared
from replayssm.families import preset
from replayssm.interface import PAD_SLOT, DecodeConfig, KernelConfig
from replayssm.precision import parse_mode

KERNELS = [("mamba2", "literal-replay"), ("mamba2", "literal-replay-state"), ("gdn", "literal-replay"),
           ("kda", "literal-replay")]
# declared conventions other than the defaults (the window's normalisation and gates follow them)
CONVENTIONS = {"mamba2": {"softplus_threshold": 10.0},
               "gdn": {"beta_rounded": True, "l2_form": "reciprocal", "softplus_threshold": 10.0},
               "kda": {"beta_rounded": True, "l2_form": "reciprocal", "softplus_threshold": 10.0}}
MODES = ["s32a32", "s32a16", "s16a16", "sfp8a16", "sfp16a16-sr"]
DECODES = {"standard-L4": DecodeConfig("standard", 1, 4), "spec-T3-B4": DecodeConfig("speculative", 3, 4)}
SLOTS = (2, PAD_SLOT, 0, 3)
STEPS = 14


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().flatten().view(torch.uint8)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                         and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b)))


def _assert_same_storage(batched, rows, where: str) -> None:
    assert _same(batched.ckpt, rows.ckpt), f"{where}: checkpoint"
    assert _same(batched.ckpt_scale, rows.ckpt_scale), f"{where}: checkpoint scale"
    for name in rows.records:
        assert _same(batched.records[name], rows.records[name]), f"{where}: records {name!r}"
    assert (batched.write_pos, batched.origin, batched.flushed) == (rows.write_pos, rows.origin, rows.flushed), where


@pytest.mark.parametrize("decode_id", list(DECODES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family,name", KERNELS, ids=[f"{f}-{n}" for f, n in KERNELS])
def test_batched_rows_equal_per_row_reference(family, name, mode, decode_id):
    _run_both(family, name, mode, DECODES[decode_id], {})


@pytest.mark.parametrize("decode_id", list(DECODES))
@pytest.mark.parametrize("family", list(CONVENTIONS))
def test_batched_rows_follow_declared_conventions(family, decode_id):
    _run_both(family, "literal-replay", "s32a16", DECODES[decode_id], CONVENTIONS[family])


def _run_both(family, name, mode, decode, decl):
    geometry = preset("tiny", family)
    gen = torch.Generator().manual_seed(18)
    conv = declared(decl, tuple(decl), parse_mode(mode).act_dtype)
    cfg = KernelConfig(geometry, make_params(geometry, gen), mode, decode, num_slots=5, conventions=conv)
    cls = registry.get(name, family)
    batched, rows = cls(cfg), cls(cfg)
    rows.vectorised = False
    assert batched._batches_rows() and not rows._batches_rows()
    slot_ids = torch.tensor(SLOTS, dtype=torch.int64)
    init = torch.randn((len(SLOTS), *geometry.state_shape), generator=gen, dtype=torch.float64) * 0.5
    ring = decode.speculative  # standard decode keeps a linear buffer: origin 0
    origins = torch.tensor([1, 0, 0, decode.ring_rows - 1]) if ring else None
    for k in (batched, rows):
        k.reset(slot_ids, init, origins)
    T = decode.window
    for step in range(STEPS):
        if step == 7:  # reset one row mid-run: its cursors leave the others'
            one = torch.tensor([PAD_SLOT, PAD_SLOT, 0, PAD_SLOT], dtype=torch.int64)
            for k in (batched, rows):
                k.reset(one, init * 2, torch.tensor([0, 0, 3, 0]) if ring else None)
        inputs = make_inputs(geometry, len(SLOTS), T, cfg.mode.act_dtype, gen)
        lens = (torch.randint(1, T + 1, (len(SLOTS),), generator=gen) if decode.speculative and step % 3 == 1
                else None)
        outs = [k.verify(slot_ids, inputs, window_lens=lens) for k in (batched, rows)]
        where = f"step {step}"
        assert _same(*outs), f"{where}: outputs"
        _assert_same_storage(batched, rows, where + " (after verify)")
        if decode.speculative:
            top = lens if lens is not None else torch.full((len(SLOTS),), T)
            accepted = torch.stack([torch.randint(0, int(t) + 1, (1,), generator=gen)[0] for t in top])
        else:
            accepted = torch.ones(len(SLOTS), dtype=torch.int64)
        for k in (batched, rows):
            k.commit(slot_ids, accepted)
        _assert_same_storage(batched, rows, where + " (after commit)")
        assert _same(batched.committed_state(slot_ids), rows.committed_state(slot_ids)), f"{where}: committed state"
    assert len(set(batched.write_pos[s] for s in SLOTS if s != PAD_SLOT)) > 1 or not decode.speculative


def test_a_mutant_math_runs_per_row():
    """A math object overriding a per-row method cannot be stood in for by the base's twin."""
    base = registry.get("literal-replay", "gdn").math
    variant = registry.get("literal-replay-cumprod", "gdn").math
    assert base.rows_batchable() and not variant.rows_batchable()
