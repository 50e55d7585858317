"""A model of FlashInfer 0.7.2's ``checkpointing_ssu`` fold, to size its bf16 step against the
``flush-increment`` check (docs/findings.md, "FlashInfer 0.7.2.post1 on the H200").

Oracle: the fp64 fold of the kernel's own previous checkpoint and records (what ``flush-increment``
compares with), at super120b's head shape (P = 64, N = 128, 128 heads a row), 12 records a flush,
the ``mild`` input regime.  Two models of the kernel, both accumulating in fp32 and storing the
checkpoint once with stochastic rounding to fp16 (FlashInfer rounds once per fold,
``replay_state_mma``): (a) the weighted input ``exp(cum_total - cum_k) dt_k B_k`` rounded to bf16
before the tensor-core product, as FlashInfer's ``frag_B(i) = frag_t(toFloat(frag_B(i)) *
coeff[i])`` does (``kernel_checkpointing_ssu_common.cuh``); (b) the same in fp32.  Printed: the
flush's added error in units of the state format's u (fp16: 2^-11) relative to the fold's row
maximum, the quantity the check bounds (by 4.01 u for fp16 here).  Expected with an fp16 state:
(a) ~5 u, (b) ~1-1.5 u.  ``--state fp32`` (the checkpoint the fp32 accumulator, as ``s32a16``
stores it) predicts the size of the failure at ``s32a16``.

Run: python tools/flashinfer_fold_model.py [--rows 8] [--flushes 6] [--state fp16-sr|fp32] [--record FILE]
(``--record``: one ``findings`` record per model, metrics the median and max increment in u.)
"""

from __future__ import annotations

import argparse

import torch

from replayssm.records.ledger import append
from replayssm.records.record import Recorder

U_FP16 = 2.0**-11
STATES = {"fp16-sr": U_FP16, "fp32": 2.0**-24}


def sr_fp16(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """fp64 values stochastically rounded to the fp16 grid (normal range; subnormals as 2^-24 steps)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0**-14)))
    ulp = torch.pow(2.0, e - 10)
    lo = torch.floor(x / ulp) * ulp
    return torch.where(torch.rand(x.shape, generator=gen, dtype=torch.float64) < (x - lo) / ulp, lo + ulp, lo)


def flush_errors(rows: int, flushes: int, heads: int = 128, P: int = 64, N: int = 128, n: int = 12,
                 seed: int = 0, state: str = "fp16-sr") -> dict[str, list[float]]:
    """Per flush (after two warm-up flushes) and row: the added error in units of the state format's u
    (``state``: "fp16-sr", stochastic rounding to fp16, or "fp32", the fp32 accumulator stored)."""
    if state not in STATES:
        raise ValueError(f"state: expected one of {sorted(STATES)}, got {state!r}")
    u = STATES[state]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    out: dict[str, list[float]] = {"bf16 weighted B (FlashInfer)": [], "fp32 weighted B": []}
    for _ in range(rows):
        A = -(1 + torch.rand(heads, dtype=torch.float64))
        bias = torch.rand(heads, dtype=torch.float64) - 4
        h = torch.zeros(heads, P, N, dtype=torch.float64)
        for f in range(flushes):
            x = torch.randn(n, heads, P).to(torch.bfloat16).double()
            B = torch.randn(n, heads, N).to(torch.bfloat16).double()
            dt = torch.nn.functional.softplus(torch.randn(n, heads, dtype=torch.float64) + bias)
            cum = torch.cumsum(A * dt, 0)
            coeff = torch.exp(cum[-1] - cum) * dt
            want = h * torch.exp(cum[-1])[:, None, None] + torch.einsum("kh,khp,khn->hpn", coeff, x, B)
            for name in out:
                wB = coeff.float()[:, :, None] * B.float()
                if name.startswith("bf16"):
                    wB = wB.to(torch.bfloat16).float()
                decayed = h.float() * torch.exp(cum[-1].float())[:, None, None]
                acc = decayed + torch.einsum("khp,khn->hpn", x.float(), wB)
                got = sr_fp16(acc.double(), gen) if state == "fp16-sr" else acc.double()
                if f >= 2:
                    out[name].append(float((got - want).abs().max() / (u * want.abs().max())))
            h = got
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8, help="batch rows (each 128 heads)")
    ap.add_argument("--flushes", type=int, default=6, help="flushes a row (the first two warm the state up)")
    ap.add_argument("--state", choices=sorted(STATES), default="fp16-sr", help="the checkpoint's format")
    ap.add_argument("--record", metavar="FILE", help="append one findings record per model (JSON lines)")
    args = ap.parse_args()
    if args.rows < 1 or args.flushes < 3:
        ap.error("--rows must be >= 1 and --flushes >= 3")
    rec = Recorder("findings", source="tools/flashinfer_fold_model.py") if args.record else None
    records = []
    for name, v in flush_errors(args.rows, args.flushes, state=args.state).items():
        v = sorted(v)
        print(f"{name}: flush-increment {v[len(v) // 2]:.2f} u median, {v[-1]:.2f} u max over {len(v)} flushes")
        if rec is not None:
            model = "bf16-weighted-B" if name.startswith("bf16") else "fp32-weighted-B"
            records.append(rec.record(f"mamba2/flashinfer-fold-model/{model}/{args.state}", family="mamba2",
                                      kernel="flashinfer-replay", geometry="super120b", verdict="none",
                                      config={"rows": args.rows, "flushes": args.flushes, "state": args.state,
                                              "heads": 128, "P": 64, "N": 128, "records_per_flush": 12},
                                      metrics={"increment_u_median": round(v[len(v) // 2], 3),
                                               "increment_u_max": round(v[-1], 3), "flushes": len(v)}))
    if records:
        append(args.record, records)


if __name__ == "__main__":
    main()
