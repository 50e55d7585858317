"""Drift checkpoints on disk in a format that cannot execute code, with a SHA-256 digest checked before use.

A checkpoint is a tree of dicts, lists, tuples, numbers, strings, ``None``, torch tensors and NumPy
arrays (:meth:`replayssm.validators.jobs.drift.sweep.CellRun.state_dict`).  Pickle (``torch.load`` with
``weights_only=False``) would run whatever a planted file names, so the file is instead:

* line 1: ``replayssm-checkpoint/1`` (anything else is a foreign file, an older pickled
  checkpoint included: never parsed further);
* line 2: a JSON header: the tree with every tensor replaced by its index (``{"tensor": i}``,
  ``{"ndarray": i}``; floats as ``float.hex``, so NaN and infinities round-trip exactly), the table
  of tensors (dtype from a fixed list, shape, offset and length in the payload), the payload's
  length and ``sha256``, the digest of the canonical header (without ``sha256``) and the payload;
* the payload: each tensor's raw bytes, in order.

Reading checks the magic line, the header, the payload's length and the digest, in that order,
before any tensor is built; every failure raises :class:`CheckpointError` with one line saying
what was wrong.  Oracle: round trip (``read(write(x)) == x`` bit for bit, every dtype the kernels
store: fp64 to fp8, integers, bool) and the refusals above (tests/jobs/test_drift_provenance.py,
tests/engine/test_red_team.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

MAGIC = b"replayssm-checkpoint/1\n"
SUFFIX = ".ckpt"
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
_NP_KINDS = "biuf"  # NumPy scalars kept: bool, signed and unsigned integers, floats


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used (foreign, truncated, corrupted, digest mismatch)."""


def _encode(obj, tensors: list):
    if isinstance(obj, np.generic):  # before float and int: np.float64 is a float
        if obj.dtype.kind not in _NP_KINDS:
            raise TypeError(f"checkpoint: cannot store a NumPy {obj.dtype} scalar")
        return {"npscalar": obj.dtype.str, "value": _encode(obj.item(), tensors)}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return {"f": obj.hex()}
    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach().cpu().contiguous())
        return {"tensor": len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        tensors.append(torch.from_numpy(np.ascontiguousarray(obj)).clone())
        return {"ndarray": len(tensors) - 1}
    if isinstance(obj, (list, tuple)):
        return {"list" if isinstance(obj, list) else "tuple": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, dict):
        return {"dict": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__}")


def _raw(t: torch.Tensor) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _digest(header: dict, payload: bytes) -> str:
    h = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    h.update(payload)
    return h.hexdigest()


def dumps(obj) -> bytes:
    """The file's bytes for the tree ``obj``."""
    tensors: list[torch.Tensor] = []
    tree = _encode(obj, tensors)
    table, parts, offset = [], [], 0
    for t in tensors:
        raw = _raw(t)
        table.append([str(t.dtype).removeprefix("torch."), list(t.shape), offset, len(raw)])
        parts.append(raw)
        offset += len(raw)
    payload = b"".join(parts)
    header = {"tree": tree, "tensors": table, "payload_bytes": len(payload)}
    header["sha256"] = _digest(header, payload)
    return MAGIC + json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + payload


def write(obj, path: str | Path) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file, fsync, rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(dumps(obj))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)


def _tensor(entry, payload: bytes, i: int) -> torch.Tensor:
    try:
        dtype_name, shape, offset, nbytes = entry
        dtype = _DTYPES[dtype_name]
        shape = [int(s) for s in shape]
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    except (TypeError, ValueError, KeyError):
        raise CheckpointError(f"tensor {i}: malformed entry {entry!r}") from None
    if (not isinstance(offset, int) or not isinstance(nbytes, int) or offset < 0 or min(shape, default=0) < 0
            or nbytes != numel * dtype.itemsize or offset + nbytes > len(payload)):
        raise CheckpointError(f"tensor {i}: entry {entry!r} does not fit the payload")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(payload[offset:offset + nbytes]), dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def _decode(node, tensors: list[torch.Tensor]):
    if node is None or isinstance(node, (bool, int, str)):
        return node
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise CheckpointError(f"tree: unexpected node {str(node)[:80]}")
    ((tag, val), *_) = node.items()
    if tag == "f" and isinstance(val, str):
        return float.fromhex(val)
    if tag in ("tensor", "ndarray") and isinstance(val, int) and 0 <= val < len(tensors):
        return tensors[val] if tag == "tensor" else tensors[val].numpy()
    if tag == "npscalar" and isinstance(val, str) and "value" in node:
        dt = np.dtype(val)
        if dt.kind not in _NP_KINDS:
            raise CheckpointError(f"tree: NumPy scalar of dtype {val!r}")
        return dt.type(_decode(node["value"], tensors))
    if tag in ("list", "tuple") and isinstance(val, list):
        items = [_decode(v, tensors) for v in val]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and isinstance(val, list) and all(isinstance(kv, list) and len(kv) == 2 for kv in val):
        return {_decode(k, tensors): _decode(v, tensors) for k, v in val}
    raise CheckpointError(f"tree: unexpected node {str(node)[:80]}")


def loads(data: bytes):
    """The tree stored in ``data``; :class:`CheckpointError` saying what is wrong otherwise."""
    if not data.startswith(MAGIC):
        what = "empty" if not data else ("a pickle (an older checkpoint format, never loaded)"
                                         if data[:2] in (b"PK", b"\x80\x02", b"\x80\x04", b"\x80\x05")
                                         else "not a replayssm checkpoint")
        raise CheckpointError(f"foreign file: {what}")
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        raise CheckpointError("truncated: the header is cut short")
    try:
        header = json.loads(data[len(MAGIC):end])
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError("corrupted: the header is not JSON") from None
    if not isinstance(header, dict) or not {"tree", "tensors", "payload_bytes", "sha256"} <= set(header):
        raise CheckpointError("corrupted: the header lacks tree, tensors, payload_bytes or sha256")
    payload = data[end + 1:]
    if header["payload_bytes"] != len(payload):
        raise CheckpointError(f"truncated or padded: {len(payload)} payload bytes, the header says "
                              f"{header['payload_bytes']}")
    want = header.pop("sha256")
    if not isinstance(want, str) or _digest(header, payload) != want:
        raise CheckpointError("SHA-256 digest mismatch: the file changed after it was written")
    if not isinstance(header["tensors"], list):
        raise CheckpointError("corrupted: the tensor table is not a list")
    tensors = [_tensor(e, payload, i) for i, e in enumerate(header["tensors"])]
    return _decode(header["tree"], tensors)


def read(path: str | Path):
    """The tree stored at ``path`` (see :func:`loads`); an unreadable file is a :class:`CheckpointError`."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"unreadable: {e.strerror or e}") from None
    return loads(data)


def set_aside(path: str | Path, quarantine: str | Path) -> Path:
    """Move ``path`` into the folder ``quarantine`` (``NAME``, or ``NAME.<n>`` when taken); returns
    where it went."""
    p, q = Path(path), Path(quarantine)
    q.mkdir(parents=True, exist_ok=True)
    dest, n = q / p.name, 1
    while dest.exists():
        dest, n = q / f"{p.name}.{n}", n + 1
    os.replace(p, dest)
    return dest


__all__ = ["MAGIC", "SUFFIX", "CheckpointError", "dumps", "loads", "read", "set_aside", "write"]
