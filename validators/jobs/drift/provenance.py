"""Provenance of a drift cell: its configuration digest, the kernel's code digest, versions and
device, its status and stop reason, and whether a stored result can be reused for a
configuration.

Oracle: a result is reused only under the same provenance (tests/jobs/test_drift_provenance.py).
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

import torch

from replayssm import __version__
from replayssm.registry import get
from replayssm.validators.jobs.drift.cells import CellSpec, SweepConfig

CELL_SCHEMA = 2  # 2: provenance (cell config digest, kernel code digest, versions, device) and history
def kernel_code_digest(cls) -> str:
    """sha256 (16 hex digits) of the source of the module defining ``cls`` and of the modules of
    its bases in the replayssm package: a fixed kernel gets a new digest, so its old cells rerun."""
    h = hashlib.sha256()
    seen = []
    for k in cls.__mro__:
        name = k.__module__
        if name in seen or not (k is cls or name == "replayssm" or name.startswith("replayssm.")):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path:
            continue
        seen.append(name)
        h.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def device_name(device) -> str:
    d = torch.device(device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else d.type


def cell_config(spec: CellSpec, cfg: SweepConfig) -> dict:
    """What one cell's numbers depend on in the sweep configuration (its own slice of it)."""
    return {**spec.to_dict(), "geometry": dict(cfg.geometry)[spec.family],
            **{k: getattr(cfg, k) for k in ("rows", "tokens", "buffer", "window", "history", "seed", "state_samples",
                                            "local_every", "nbins", "blocks")}}


def cell_provenance(spec: CellSpec, cfg: SweepConfig, device="cpu") -> dict:
    """The record a cell result must match exactly to be reused: a digest of the cell's
    configuration, the kernel's name and code digest, the versions and the device."""
    conf = json.dumps(cell_config(spec, cfg), sort_keys=True).encode()
    return {"cell_config": hashlib.sha256(conf).hexdigest()[:16], "kernel": spec.kernel,
            "kernel_code": kernel_code_digest(get(spec.kernel, spec.family)),
            "versions": {"replayssm": __version__, "torch": torch.__version__, "triton": _version("triton")},
            "device": device_name(device)}


def cell_status(res: dict) -> str:
    """``complete``, ``raised`` (the kernel raised) or ``stopped`` (cut short before every row
    reached its tokens, e.g. by ``--deadline``)."""
    if res.get("exception"):
        return "raised"
    if res.get("truncated") or res.get("tokens_run", res.get("tokens")) < res.get("tokens", 0):
        return "stopped"
    return "complete"


def stop_reason(res: dict) -> str | None:
    """``None`` for a complete cell, else why it stopped (one line)."""
    st = cell_status(res)
    if st == "raised":
        return "the kernel raised: " + res["exception"].strip().splitlines()[0]
    if st == "stopped":
        return "the --deadline passed" if res.get("truncated") else "stopped early"
    return None


def reusable(res: dict | None, prov: dict, cfg: SweepConfig) -> bool:
    """A cell result is reused only when complete and its provenance matches exactly."""
    return (res is not None and res.get("schema") == CELL_SCHEMA and res.get("config") == cfg.digest
            and res.get("provenance") == prov and cell_status(res) == "complete")


def _history(old: dict | None, prov: dict) -> list:
    """The earlier runs of a cell kept when it reruns: failures, and results of other provenance."""
    if old is None:
        return []
    hist = list(old.get("history") or [])
    st = cell_status(old) if "tokens" in old else "unreadable"
    if st == "raised" or old.get("provenance") != prov:
        hist.append({"status": st, "tokens_run": old.get("tokens_run"), "exception": old.get("exception"),
                     "provenance": old.get("provenance")})
    return hist


# ---- running cells ------------------------------------------------------------------------------------------

