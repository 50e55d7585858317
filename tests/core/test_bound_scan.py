"""The fp64 bound's recurrence in one launch per piece (``replayssm/ops/triton/bound_scan.py``).

Oracle: ``RunningBound.window(..., outputs_only=True)`` step after step, on the same tokens,
flush masks and accepted counts.  Expected difference: none -- every output bound and the
running state (E, A, M, n, L) after the piece are compared as raw fp64 bits (the Triton
interpreter on a CPU; the GPU case runs the kernel compiled, with the coefficients of a whole
chunk computed at once as drift's fast path computes them there).
"""

from __future__ import annotations

import pytest
import torch

from replayssm.ops.triton.bound_scan import bound_scan
from replayssm.scenarios import Scenario
from replayssm.scenarios.inputs import make_inputs_steps
from replayssm.validators.engine.checks.fp64_bound import RunningBound
from replayssm.validators.engine.runner import Lockstep, readout_magnitude

pytestmark = pytest.mark.usefixtures("one_thread")

KEYS = ("E", "A", "M", "n", "L")


def _setup(family, decode, kernel, steps, device="cpu", mode="s32a16"):
    sc = Scenario.tiny(family, decode, mode=mode, steps=steps, initial_state="random")
    ls = Lockstep(sc, kernel, device=device, literal_every=0, invariants_every=0, state_every=0,
                  record_metrics=False, digest=False)
    ls.start()
    T, R = sc.window, sc.rows
    gen = make_inputs_steps(sc, list(range(steps)), device)
    toks = {k: v.transpose(1, 2).reshape(steps * T, R, *v.shape[3:]).to(torch.float64) for k, v in gen.items()}
    g = torch.Generator().manual_seed(7)
    flush = (torch.rand(steps, R, generator=g) < 0.4).to(device)
    acc = torch.randint(1, T + 1, (steps, R), generator=g).to(device)
    # a running state that is not the reset one (errors and norms of some size, tokens since a store)
    b = ls.bound
    for k in KEYS:
        b.cur[k] = torch.rand(b.cur[k].shape, generator=g, dtype=torch.float64).to(device) * (3.0 if k == "n" else 1e-3)
    b.cur["n"] = b.cur["n"].round()
    return sc, ls, toks, flush, acc


def _readout(sc, ls):
    return lambda s_abs, tok: readout_magnitude(sc.family, s_abs, tok, ls.ref_params, False)


def _oracle(sc, ls, toks, flush, acc, w):
    b, T = ls.bound, sc.window
    spec = ls.dec.speculative
    outs = []
    for j in range(flush.shape[0]):
        tj = [{k: v[j * T + t] for k, v in toks.items()} for t in range(T)]
        fp = b.window(tj, ls.ref_params, flush[j], spec, acc[j] if spec else None, ls.ref, _readout(sc, ls),
                      weights=w[j * T:(j + 1) * T], outputs_only=True)
        outs.append(fp["output"])
    return torch.stack(outs), {k: b.cur[k] for k in KEYS}


def _bits(t):
    return t.contiguous().view(torch.int64)


CASES = [("mamba2", "standard", "literal-replay"), ("mamba2", "speculative", "literal-replay"),
         ("gdn", "standard", "literal-baseline"), ("gdn", "speculative", "literal-replay"),
         ("kda", "speculative", "literal-baseline"), ("kda", "standard", "literal-replay")]


@pytest.mark.parametrize("family,decode,kernel", CASES, ids=lambda v: str(v))
def test_scan_is_the_window_bitwise(family, decode, kernel):
    steps = 6
    sc, ls, toks, flush, acc = _setup(family, decode, kernel, steps)
    b, T, R = ls.bound, sc.window, sc.rows
    w = RunningBound.weights(toks, ls.ref, _readout(sc, ls))
    coef = {k: torch.stack([b.coefficients({n: v[i] for n, v in toks.items()}, ls.ref_params)[k]
                            for i in range(steps * T)]) for k in b.coefficients({n: v[0] for n, v in toks.items()},
                                                                                 ls.ref_params)}
    state = torch.stack([b.cur[k] for k in KEYS]).contiguous()
    out = torch.full((steps, R, T), -1.0, dtype=torch.float64)
    spec = ls.dec.speculative
    # two pieces, as drift's fast path launches them between host events
    bound_scan(state, coef, w, flush, acc if spec else None, out, 0, 2, constants=b.scan_constants("cpu"),
               replay=b.replay)
    bound_scan(state, coef, w, flush, acc if spec else None, out, 2, steps - 2, constants=b.scan_constants("cpu"),
               replay=b.replay)
    want, cur = _oracle(sc, ls, toks, flush, acc, w)
    assert torch.equal(_bits(out), _bits(want)), (out, want)
    for i, k in enumerate(KEYS):
        assert torch.equal(_bits(state[i]), _bits(cur[k])), k
    assert (want > 0).all()


def test_scan_keeps_a_nan():
    sc, ls, toks, flush, acc = _setup("gdn", "standard", "literal-replay", 3)
    b = ls.bound
    w = RunningBound.weights(toks, ls.ref, _readout(sc, ls))
    w[1, 0, 0] = float("nan")
    coef = b.coefficients(toks, ls.ref_params)
    state = torch.stack([b.cur[k] for k in KEYS]).contiguous()
    out = torch.zeros(3, sc.rows, 1, dtype=torch.float64)
    bound_scan(state, {k: v.contiguous() for k, v in coef.items()}, w, flush, None, out, 0, 3,
               constants=b.scan_constants("cpu"), replay=True)
    assert torch.isnan(out[1, 0, 0]) and torch.isfinite(out[1, 1:]).all() and torch.isfinite(out[0]).all()


def test_scan_bad_arguments():
    sc, ls, toks, flush, acc = _setup("mamba2", "standard", "literal-replay", 3)
    b = ls.bound
    w = RunningBound.weights(toks, ls.ref, _readout(sc, ls))
    coef = {k: v.contiguous() for k, v in b.coefficients(toks, ls.ref_params).items()}
    state = torch.stack([b.cur[k] for k in KEYS]).contiguous()
    out = torch.zeros(3, sc.rows, 1, dtype=torch.float64)
    before = state.clone()
    kw = dict(constants=b.scan_constants("cpu"), replay=True)
    with pytest.raises(ValueError, match="state: expected a contiguous fp64"):
        bound_scan(state.float(), coef, w, flush, None, out, 0, 3, **kw)
    with pytest.raises(ValueError, match="rho: expected"):
        bound_scan(state, {**coef, "rho": coef["rho"][:2]}, w, flush, None, out, 0, 3, **kw)
    with pytest.raises(ValueError, match="flush: expected a bool"):
        bound_scan(state, coef, w, flush.long(), None, out, 0, 3, **kw)
    with pytest.raises(ValueError, match="j0, steps"):
        bound_scan(state, coef, w, flush, None, out, 2, 3, **kw)
    with pytest.raises(ValueError, match="constants"):
        bound_scan(state, coef, w, flush, None, out, 0, 3, constants=torch.zeros(6), replay=True)
    assert torch.equal(state, before) and not out.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family,decode,kernel", CASES, ids=lambda v: str(v))
def test_gpu_scan_is_the_window_bitwise(family, decode, kernel):
    """Compiled, with the coefficients of all tokens in one call (what the fast path does on a GPU,
    whose elementwise math does not depend on the tensor's shape) against the window's per-token ones."""
    steps = 8
    sc, ls, toks, flush, acc = _setup(family, decode, kernel, steps, device="cuda")
    b, T, R = ls.bound, sc.window, sc.rows
    w = RunningBound.weights(toks, ls.ref, _readout(sc, ls))
    flat = {k: v.reshape(steps * T * R, *v.shape[2:]) for k, v in toks.items()}
    coef = {k: v.reshape(steps * T, R, -1).contiguous() for k, v in b.coefficients(flat, ls.ref_params).items()}
    state = torch.stack([b.cur[k] for k in KEYS]).contiguous()
    out = torch.full((steps, R, T), -1.0, dtype=torch.float64, device="cuda")
    spec = ls.dec.speculative
    bound_scan(state, coef, w, flush, acc if spec else None, out, 0, steps, constants=b.scan_constants("cuda"),
               replay=b.replay)
    want, cur = _oracle(sc, ls, toks, flush, acc, w)
    assert torch.equal(_bits(out), _bits(want))
    for i, k in enumerate(KEYS):
        assert torch.equal(_bits(state[i]), _bits(cur[k])), k
