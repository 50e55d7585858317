"""The committed state a ReplaySSM kernel's storage represents, folded in fp64 for all rows at once.

Oracle: docs/recurrences.md section 2: the state after a slot's committed prefix is its checkpoint folded with the
records at logical positions 0..write_pos-1 (ring row (origin + p) mod ring_rows).  The rows of
one call that hold the same number of committed records are one batched call of the family's
``fold_rows``; values equal the per-row fold to fp64 rounding (~1e-16 relative: the exact value
the stored data represent, far below any tolerance the checks apply).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from replayssm.interface import PAD_SLOT


def committed_rows_fp64(ids: list[int], write_pos: list[int], origin: list[int], ring_rows: int,
                        records: dict[str, torch.Tensor], checkpoints64: Callable[[torch.Tensor], torch.Tensor],
                        fold_rows: Callable, state_shape, device, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[len(ids), *state_shape]`` fp64: NaN for padding rows; ``checkpoints64(slots)`` gives the
    slots' checkpoints, ``fold_rows(s0, hist)`` folds ``hist`` (``{name: [R, n, ...]}``, records in
    ``dtype``: fp64, or a literal model's compute dtype, whose fold is then widened to fp64)."""
    out = torch.full((len(ids), *state_shape), float("nan"), dtype=torch.float64, device=device)
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for r, s in enumerate(ids):
        if s != PAD_SLOT:
            groups.setdefault(write_pos[s], ([], []))
            groups[write_pos[s]][0].append(r)
            groups[write_pos[s]][1].append(s)
    for n, (rs, ss) in groups.items():
        slots = torch.tensor(ss, dtype=torch.long, device=device)
        ring = torch.tensor([[(origin[s] + p) % ring_rows for p in range(n)] for s in ss], dtype=torch.long,
                            device=device).reshape(len(ss), n)
        hist = {k: v[slots[:, None], ring].to(dtype) for k, v in records.items()}
        out[torch.tensor(rs, dtype=torch.long, device=device)] = fold_rows(checkpoints64(slots), hist).to(torch.float64)
    return out


__all__ = ["committed_rows_fp64"]
