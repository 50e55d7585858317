"""Bitwise helpers of the exact invariant checks on a kernel's outputs and stored state.

Oracle: docs/recurrences.md sections 2-4 and docs/validation.md.  The checks themselves are units of
``validators/engine/checks/``; the helpers here compare raw bits, never values with a tolerance:

* outputs are poisoned before each verify with a NaN of a fixed payload; an element still
  holding that exact bit pattern afterwards was never written;
* padding rows' outputs are pre-filled with a canary pattern and must keep it;
* unused slots are filled with canary data (state and ring rows) before the run and every field
  of theirs in :class:`KernelSnapshot` must stay bit-identical;
* a non-flush verify leaves the checkpoint (and its scales) bit-identical;
* a verify never changes a committed ring row (logical positions 0..write_pos-1);
* cursors after each commit equal the spec's rule (``DecodeConfig.commit_cursor``);
* a repeated run gives bit-identical outputs (chained sha256 over the output bytes).

Snapshots may live on the kernel's device: :func:`any_differ`, :func:`fields_differ` and
:func:`ring_rows_differ` compare whole gathered sets there into one device flag (the checks'
``flag``: read in the hook's one host sync); the per-field helpers below name what changed, and
run only when a flag is raised.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch

from replayssm.interface import KernelSnapshot

# A quiet NaN with a payload no arithmetic produces by itself (bit patterns per dtype).
_POISON_BITS = {
    torch.float64: 0x7FF8DEAD0000BEEF,
    torch.float32: 0x7FC0BEEF,
    torch.bfloat16: 0x7FEF,
    torch.float16: 0x7E5B,
}
_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
# The padding-row canary: a finite, recognisable value.
PAD_CANARY = -1234.5


def int_view(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``t`` as a same-shaped integer tensor (for exact comparison)."""
    t = t.contiguous()
    if not t.is_floating_point():
        return t
    return t.view(_INT_VIEW[t.element_size()])


def bits_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(int_view(a), int_view(b.to(a.device))))


def any_differ(pairs, device) -> torch.Tensor:
    """A 0-d bool tensor on ``device``: whether any ``(a, b)`` pair differs in presence, shape, dtype
    or bits.  Pairs on a GPU are compared there, without a host sync (one sync for the whole set
    when the caller reads the flag); pairs on the CPU on the host."""
    flags, host = [], False
    for a, b in pairs:
        if a is None or b is None:
            host |= (a is None) != (b is None)
        elif a.shape != b.shape or a.dtype != b.dtype:
            host = True
        elif a.device.type == "cpu" and b.device.type == "cpu":
            host |= not torch.equal(int_view(a), int_view(b))
        else:
            flags.append((int_view(a) != int_view(b.to(a.device))).any().to(device))
    if host:
        return torch.ones((), dtype=torch.bool, device=device)
    if not flags:
        return torch.zeros((), dtype=torch.bool, device=device)
    return torch.stack(flags).any()


@lru_cache(maxsize=512)
def _index(items: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(items, dtype=torch.long, device=device)


def gather(t: torch.Tensor, index: list[int] | tuple[int, ...]) -> torch.Tensor:
    """``t[index]`` along the first dimension (a copy; the index tensor cached per device)."""
    return t.index_select(0, _index(tuple(index), t.device))


def poison_bits(dtype: torch.dtype) -> int:
    if dtype not in _POISON_BITS:
        raise ValueError(f"dtype: no NaN poison pattern for {dtype}")
    v = _POISON_BITS[dtype]
    width = torch.finfo(dtype).bits
    return v - (1 << width) if v >= 1 << (width - 1) else v


def poisoned_out(rows: int, window: int, out_shape, dtype, pad_rows, device) -> torch.Tensor:
    """An output buffer: NaN poison in active rows, :data:`PAD_CANARY` in padding rows."""
    out = torch.empty((rows, window, *out_shape), dtype=dtype, device=device)
    out.view(_INT_VIEW[out.element_size()]).fill_(poison_bits(dtype))
    for r in pad_rows:
        out[r].fill_(PAD_CANARY)
    return out


def unwritten_mask(out: torch.Tensor) -> torch.Tensor:
    """True where the output still holds the exact poison pattern."""
    return int_view(out) == poison_bits(out.dtype)


def first_index(mask: torch.Tensor) -> tuple[int, ...] | None:
    """The first (row-major) index where ``mask`` is True, or None."""
    idx = torch.nonzero(mask.reshape(-1), as_tuple=False)
    if idx.numel() == 0:
        return None
    flat = int(idx[0, 0])
    out = []
    for s in reversed(mask.shape):
        out.append(flat % s)
        flat //= s
    return tuple(reversed(out))


# ---- snapshots ---------------------------------------------------------------------------------------
def _slot_fields(snap: KernelSnapshot) -> dict[str, torch.Tensor]:
    """Every per-slot field of a snapshot, whole (first dimension: the slot): checkpoint, scales,
    records, cursors, extras whose first dimension is the slot count."""
    n = snap.checkpoint.shape[0]
    out = {"checkpoint": snap.checkpoint}
    if snap.checkpoint_scale is not None:
        out["checkpoint_scale"] = snap.checkpoint_scale
    for k, v in snap.records.items():
        out[f"records.{k}"] = v
    out.update(write_pos=snap.write_pos, origin=snap.origin, is_flush=snap.is_flush)
    for k, v in snap.extra.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n:
            out[f"extra.{k}"] = v
    return out


def slot_view(snap: KernelSnapshot, slot: int) -> dict[str, torch.Tensor]:
    """Every per-slot field of a snapshot for one slot (views)."""
    return {name: t[slot] for name, t in _slot_fields(snap).items()}


def slots_view(snap: KernelSnapshot, slots: list[int]) -> dict[str, torch.Tensor]:
    """:func:`slot_view` of several slots at once: each field gathered as ``[len(slots), ...]``."""
    return {name: gather(t, slots) for name, t in _slot_fields(snap).items()}


def fields_differ(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], device) -> torch.Tensor:
    """:func:`any_differ` over two field dicts (a field present in one only counts as a difference)."""
    names = sorted(set(before) | set(after))
    return any_differ(((before.get(k), after.get(k)) for k in names), device)


def ring_rows_differ(before: KernelSnapshot, after: KernelSnapshot, slot_rows: list[tuple[int, int]],
                     device) -> torch.Tensor:
    """Whether any record tensor differs at the given (slot, ring row) pairs (rows past a tensor's
    ring are skipped, as :func:`changed_ring_rows` does)."""
    pairs = []
    for k, b in before.records.items():
        a = after.records.get(k)
        if a is None or not slot_rows:
            continue
        ring = b.shape[1]
        flat = [s * ring + r for s, r in slot_rows if r < ring]
        if not flat:
            continue
        if a.shape != b.shape:
            pairs.append((a, b))
            continue
        pairs.append((gather(b.reshape(-1, *b.shape[2:]), flat), gather(a.reshape(-1, *a.shape[2:]), flat)))
    return any_differ(pairs, device)


def changed_fields(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[str]:
    """Names of the fields whose bits differ (or that appeared/disappeared)."""
    names = sorted(set(before) | set(after))
    return [k for k in names if k not in before or k not in after or not bits_equal(before[k], after[k])]


def checkpoint_changed(before: KernelSnapshot, after: KernelSnapshot, slot: int) -> bool:
    if not bits_equal(before.checkpoint[slot], after.checkpoint[slot]):
        return True
    if before.checkpoint_scale is not None:
        return not bits_equal(before.checkpoint_scale[slot], after.checkpoint_scale[slot])
    return False


def committed_rows(origin: int, write_pos: int, ring_rows: int, speculative: bool) -> list[int]:
    """Physical ring rows holding committed history (logical positions 0..write_pos-1)."""
    if speculative:
        return [(origin + p) % ring_rows for p in range(write_pos)]
    return list(range(write_pos))


def changed_ring_rows(before: KernelSnapshot, after: KernelSnapshot, slot: int, rows: list[int]) -> list[int]:
    """Committed rows of ``slot`` whose bits changed in any record tensor."""
    bad = set()
    for k, b in before.records.items():
        a = after.records.get(k)
        if a is None:
            continue
        for r in rows:
            if r < b.shape[1] and not bits_equal(b[slot, r], a[slot, r]):
                bad.add(r)
    return sorted(bad)


def _on_cpu(t):
    return t.detach().cpu() if isinstance(t, torch.Tensor) else t


def snapshot_to_dict(snap: KernelSnapshot) -> dict:
    """The snapshot's fields as CPU tensors (``torch.save``-able on any machine)."""
    return {"checkpoint": _on_cpu(snap.checkpoint), "checkpoint_scale": _on_cpu(snap.checkpoint_scale),
            "records": {k: _on_cpu(v) for k, v in snap.records.items()}, "write_pos": _on_cpu(snap.write_pos),
            "origin": _on_cpu(snap.origin), "is_flush": _on_cpu(snap.is_flush),
            "extra": {k: _on_cpu(v) for k, v in snap.extra.items()}}


def snapshot_from_dict(d: dict) -> KernelSnapshot:
    return KernelSnapshot(**d)


def snapshot_digest(snap: KernelSnapshot) -> str:
    h = hashlib.sha256()
    d = snapshot_to_dict(snap)
    for k in sorted(d):
        v = d[k]
        items = sorted(v.items()) if isinstance(v, dict) else [(k, v)]
        for name, t in items:
            h.update(name.encode())
            if t is not None:
                h.update(tensor_bytes(t))
    return h.hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    return int_view(t.detach()).cpu().numpy().tobytes()


class RunDigest:
    """Chained sha256 over a run's outputs: equal digests <=> bit-identical runs (per step)."""

    def __init__(self, hexdigest: str = "") -> None:
        self.hex = hexdigest

    def update(self, *tensors: torch.Tensor) -> str:
        h = hashlib.sha256(self.hex.encode())
        for t in tensors:
            h.update(tensor_bytes(t))
        self.hex = h.hexdigest()
        return self.hex


__all__ = ["PAD_CANARY", "RunDigest", "any_differ", "bits_equal", "changed_fields", "changed_ring_rows",
           "checkpoint_changed", "committed_rows", "fields_differ", "first_index", "gather", "int_view", "poison_bits",
           "poisoned_out", "ring_rows_differ", "slot_view", "slots_view", "snapshot_digest", "snapshot_from_dict",
           "snapshot_to_dict", "tensor_bytes", "unwritten_mask"]
