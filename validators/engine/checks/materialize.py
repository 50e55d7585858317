"""Check ``materialize``: a published prefix state is the fp64 state at that token, and its source is untouched.

Oracle: the fp64 token-by-token recurrence (the reference state after each token of every
row's committed history, kept by the Lockstep under ``publish``) and the contract of
``materialize`` (replayssm/interface.py).  On a plan with ``publish`` (a probability), after each
commit every active row publishes with that probability (seeded by the scenario and the step)
into an unused slot: ``upto`` is drawn in turn at the history's edges (0: the checkpoint alone;
write_pos: all of it), at the ring's edge (the first position past the ring's wrap, when the
history crosses it) and at a random position in between.  Then (1) every slot but the
destinations keeps its bits (a materialize that rewrites its source, or any other slot, fails),
(2) each destination's committed state is within ``2 e + 8 u_s |ref|`` of the reference state
after ``upto`` history tokens, where ``e`` is the larger of the source row's own committed-state
error now, the error of the literal models' own publication of the same prefix (the literal
model and the replicas that join the tolerance rule, each publishing into the same destination of
its own slots) and the largest committed-state error the row had since its reset (the state
check's measurements: a prefix's fold can carry more error than the whole history's, which decay
may have shrunk, and a twin that folded more of the stream cannot publish it), one more rounding
to the declared state format (u_s), and ``|ref|`` that state's largest
element.  The destination becomes that slot's new canary.
"""

from __future__ import annotations

import random

import torch

from replayssm.interface import PAD_SLOT
from replayssm.validators.engine import invariants as inv
from replayssm.validators.engine.checks.registry import REPLAY, register_check


def _uptos(run, r: int, rng: random.Random, turn: int) -> int:
    wp = run.wp[r]
    edge = (run.dec.ring_rows - run.origin[r]) % run.dec.ring_rows if run.dec.uses_ring else 0
    choices = [0, wp, edge if 0 < edge <= wp else wp // 2, rng.randint(0, wp)]
    return choices[turn % len(choices)]


@register_check("materialize", hooks="after-commit", schedule="invariants", kinds=REPLAY,
                needs=("after-commit",),
                catches="a published prefix (materialize) differs from the fp64 state after upto history tokens, or "
                        "the call changed its source slot or any slot but its destination",
                mutant="mutant-materialize-off-by-one",
                witness={"schedule_params": {"publish": 1.0}})
def materialize(ctx) -> None:
    run = ctx.run
    if not run.publish or not run.canary:
        return
    rng = random.Random(f"publish-{run.sc.seed}-{ctx.step}")
    free = list(run.canary)
    rows = [r for r in run.active if rng.random() < run.publish][:len(free)]
    if not rows:
        return
    turn = run.coverage["prefixes published"]
    ups = [_uptos(run, r, rng, turn + i) for i, r in enumerate(rows)]
    dsts = [free[(turn + i) % len(free)] for i in range(len(rows))]
    src = [run.ids_list[r] if r in rows else PAD_SLOT for r in range(run.sc.rows)]
    up = [ups[rows.index(r)] if r in rows else 0 for r in range(run.sc.rows)]
    dst = [dsts[rows.index(r)] if r in rows else 0 for r in range(run.sc.rows)]
    run.coverage["prefixes published"] += len(rows)
    run.coverage["prefixes published at the history's edges"] += sum(u in (0, run.wp[r]) for u, r in zip(ups, rows))
    dev = run.device
    before = ctx.snapshots["after-commit"]
    run.kernel.materialize(torch.tensor(src, dtype=torch.int64, device=dev), torch.tensor(up, dtype=torch.int64,
                           device=dev), torch.tensor([d if s != PAD_SLOT else 0 for s, d in zip(src, dst)],
                                                     dtype=torch.int64, device=dev))
    after = run.snapshot()
    for slot in range(run.sc.num_slots):
        if slot in dsts:
            continue
        changed = inv.changed_fields(inv.slot_view(before, slot), inv.slot_view(after, slot))
        if changed:
            what = "its source" if slot in src else "a slot it was not given"
            ctx.fail("materialize", f"materialize changed {what}, slot {slot}: {changed}", slot=slot)
            return
    own = run.committed_state(ctx.kernel)
    dst_ids = torch.tensor(dsts, dtype=torch.int64, device=dev)
    published = ctx.kernel.committed_state(dst_ids)
    lit_published = _literal_publications(run, src, up, dst, dst_ids)
    u = ctx.rule.u_state
    for i, r in enumerate(rows):
        want = run.ref_hist[r][len(run.ref_hist[r]) - 1 - (run.wp[r] - ups[i])]
        e_src = float((own[r].to(torch.float64) - ctx.ref_state[r]).abs().max())
        e_lit = max((float((lp[i].to(torch.float64) - want).abs().max()) for lp in lit_published if i in lp),
                    default=0.0)
        e_hist = float(ctx.rule.envelope["state_err"][r])
        err = float((published[i].to(torch.float64) - want).abs().max())
        bound = 2 * max(e_src, e_lit, e_hist) + 8 * u * float(want.abs().max())
        if not err <= bound:
            ctx.fail("materialize", f"materialize(upto = {ups[i]} of write_pos {run.wp[r]}) into slot {dsts[i]}: "
                                    f"max abs error {err:.3e} vs the fp64 state after those tokens > bound {bound:.3e} "
                                    f"(= 2 x max(the source's own state error {e_src:.3e}, the literal models' "
                                    f"publication's {e_lit:.3e}, the row's largest state error since its reset "
                                    f"{e_hist:.3e}) + 8 u x {float(want.abs().max()):.3e})",
                     row=r, slot=dsts[i], value=err, bound=bound)
    snap = {d: {n: t.clone() for n, t in inv.slot_view(after, d).items()} for d in dsts}
    run.published |= set(dsts)
    run.canary = {**run.canary, **snap}  # the published slots are the new canaries (a new dict: the stack is rebuilt)


def _literal_publications(run, src: list[int], up: list[int], dst: list[int], dst_ids) -> list[dict[int, object]]:
    """Each literal model's (and replica's) own publication of the same prefixes into the same
    destinations of its slots, read back as committed states: ``{published row index: state}`` per
    model.  A literal model's history is a suffix of the same committed stream as the kernel's (its
    bookkeeping may have folded more or less of it: a staged kernel's twin folds at the verify), so
    ``upto`` is moved by the difference of the two write positions; a row whose prefix lies outside
    the model's history, and a model that does not declare ``materialize``, give none."""
    dev = run.device
    published_rows = [r for r, s in enumerate(src) if s != PAD_SLOT]
    out = []
    for lit in run.literals:
        wp = getattr(lit, "write_pos", None)
        if not getattr(lit, "supports_materialize", False) or wp is None:
            continue
        lit_src, lit_up, keep = [], [], {}
        for r, (s, n) in enumerate(zip(src, up)):
            m = n - run.wp[r] + wp[s] if s != PAD_SLOT else 0
            ok = s != PAD_SLOT and 0 <= m <= wp[s]
            lit_src.append(s if ok else PAD_SLOT)
            lit_up.append(m if ok else 0)
            if ok:
                keep[published_rows.index(r)] = r
        if not keep:
            continue
        lit.materialize(torch.tensor(lit_src, dtype=torch.int64, device=dev), torch.tensor(lit_up, dtype=torch.int64,
                        device=dev), torch.tensor([d if s != PAD_SLOT else 0 for s, d in zip(lit_src, dst)],
                                                  dtype=torch.int64, device=dev))
        states = lit.committed_state(dst_ids)
        out.append({i: states[i] for i in keep})
    return out


__all__ = ["materialize"]
