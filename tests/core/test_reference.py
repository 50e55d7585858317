"""The fp64 reference (spec 2, token by token in torch) against independent formulations in
float64 numpy/scipy: the SSD matrix form for Mamba-2 and a whole-sequence WY/UT triangular
solve (scipy.linalg.solve_triangular) for GDN.  Expected agreement: ~1e-12 relative."""

import numpy as np
import pytest
import scipy.linalg
import torch

from replayssm import GDNGeometry, Mamba2Geometry
from replayssm.ops.gdn.naive import gdn_sequence
from replayssm.ops.mamba2.naive import mamba2_sequence


def _softplus(u):
    return np.where(u > 20, u, np.log1p(np.exp(np.minimum(u, 20))))


def mamba2_matrix_form(s0, x, dt, B, C, A, dt_bias, D, z=None):
    """y_t = exp(A c_t) S0 C_t + sum_{s<=t} exp(A (c_t - c_s)) Δ_s (B_s . C_t) x_s + D x_t."""
    T, H, P = x.shape
    G = B.shape[1]
    grp = np.arange(H) // (H // G)
    delta = _softplus(dt + dt_bias)  # [T, H]
    c = np.cumsum(delta, axis=0)
    y = np.zeros((T, H, P))
    for h in range(H):
        Bh, Ch = B[:, grp[h]], C[:, grp[h]]  # [T, N]
        seg = np.exp(A[h] * (c[:, h][:, None] - c[:, h][None, :])) * np.tri(T)  # [t, s]
        M = seg * (Ch @ Bh.T) * delta[:, h][None, :]
        y[:, h] = np.exp(A[h] * c[:, h])[:, None] * (Ch @ s0[h].T) + M @ x[:, h] + D[h] * x[:, h]
    if z is not None:
        y = y * z / (1 + np.exp(-z))
    final = np.stack([
        np.exp(A[h] * c[-1, h]) * s0[h]
        + np.einsum("s,sp,sn->pn", np.exp(A[h] * (c[-1, h] - c[:, h])) * delta[:, h], x[:, h], B[:, grp[h]])
        for h in range(H)])
    return y, final


def gdn_wy_form(s0, q, k, v, a, b, A_log, dt_bias):
    """Whole sequence as one window: (I + A) d = R solved with scipy, o from d."""
    T, H, K = q.shape
    HV = v.shape[1]
    rep = HV // H
    qn = q / np.sqrt((q**2).sum(-1, keepdims=True) + 1e-6) * K**-0.5
    kn = k / np.sqrt((k**2).sum(-1, keepdims=True) + 1e-6)
    g = -np.exp(A_log) * _softplus(a + dt_bias)
    beta = 1 / (1 + np.exp(-b))
    o = np.zeros((T, HV, v.shape[2]))
    final = np.zeros_like(s0)
    for hv in range(HV):
        kh, qh = kn[:, hv // rep], qn[:, hv // rep]
        Gc = np.cumsum(g[:, hv])
        dec = np.exp(Gc[:, None] - Gc[None, :])
        Amat = np.tril(beta[:, hv][:, None] * dec * (kh @ kh.T), -1)
        R = beta[:, hv][:, None] * (v[:, hv] - np.exp(Gc)[:, None] * (kh @ s0[hv].T))
        d = scipy.linalg.solve_triangular(np.eye(T) + Amat, R, lower=True, unit_diagonal=True)
        o[:, hv] = np.exp(Gc)[:, None] * (qh @ s0[hv].T) + (np.tril(dec) * (qh @ kh.T)) @ d
        final[hv] = np.exp(Gc[-1]) * s0[hv] + (np.exp(Gc[-1] - Gc)[:, None] * d).T @ kh
    return o, final


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b))


@pytest.mark.parametrize("T", [1, 7, 40], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("with_z", [False, True], ids=["noz", "z"])
def test_mamba2_reference_matches_matrix_form(T, with_z):
    g = Mamba2Geometry(nheads=6, headdim=5, dstate=7, ngroups=3)
    rng = np.random.default_rng(T)
    s0 = rng.standard_normal((6, 5, 7))
    x, B, C = rng.standard_normal((T, 6, 5)), rng.standard_normal((T, 3, 7)), rng.standard_normal((T, 3, 7))
    dt = rng.standard_normal((T, 6)) - 3 + rng.uniform(size=(T, 6))
    A, dt_bias, D = -1 - rng.uniform(size=6), rng.standard_normal(6) * 0.3, rng.standard_normal(6)
    z = rng.standard_normal((T, 6, 5)) if with_z else None
    y_np, s_np = mamba2_matrix_form(s0, x, dt, B, C, A, dt_bias, D, z)
    t = lambda a: None if a is None else torch.from_numpy(a)
    y, s = mamba2_sequence(t(s0), t(x), t(dt), t(B), t(C), t(A), t(dt_bias), t(D), t(z))
    assert g.state_shape == s.shape
    assert _rel(y.numpy(), y_np) < 1e-12 and _rel(s.numpy(), s_np) < 1e-12


@pytest.mark.parametrize("T", [1, 6, 24], ids=lambda t: f"T{t}")
def test_gdn_reference_matches_wy_form(T):
    g = GDNGeometry(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6)
    rng = np.random.default_rng(T)
    s0 = rng.standard_normal(g.state_shape)
    q, k = rng.standard_normal((T, 2, 8)), rng.standard_normal((T, 2, 8))
    v, a, b = rng.standard_normal((T, 4, 6)), rng.standard_normal((T, 4)), rng.standard_normal((T, 4))
    A_log, dt_bias = rng.standard_normal(4) * 0.5, rng.standard_normal(4) * 0.5
    o_np, s_np = gdn_wy_form(s0, q, k, v, a, b, A_log, dt_bias)
    t = torch.from_numpy
    o, s = gdn_sequence(t(s0), t(q), t(k), t(v), t(a), t(b), t(A_log), t(dt_bias))
    assert _rel(o.numpy(), o_np) < 1e-12 and _rel(s.numpy(), s_np) < 1e-12


def test_reference_runs_in_lower_precision():
    """'In any dtype': the same functions run in fp32 and stay close to fp64."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s) for s in [(4, 3, 5), (9, 4, 3), (9, 4), (9, 2, 5), (9, 2, 5)]]
    params = [-1 - rng.uniform(size=4), rng.standard_normal(4) * 0.3, rng.standard_normal(4)]
    y64, _ = mamba2_sequence(*[torch.from_numpy(a) for a in args + params])
    y32, _ = mamba2_sequence(*[torch.from_numpy(a).float() for a in args + params])
    assert y32.dtype == torch.float32
    assert 0 < _rel(y32.double().numpy(), y64.numpy()) < 1e-5
