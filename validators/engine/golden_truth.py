"""The truth of a validation read from the golden fp64 trajectories instead of recomputed.

Oracle: ``golden/trajectories/`` (written by ``replayssm golden regenerate``, checked by
``replayssm golden verify``): for each canonical scenario, the fp64 reference's window outputs and
committed states at the stored steps (per row, :data:`KEEP` evenly spaced elements of each:
:func:`sample_index`), and the largest readout magnitude of each (row, window position), with a
sha256 manifest.  ``Lockstep(..., truth="golden")`` runs no reference recurrence: on the stored
steps the ``output`` and ``state`` checks judge the stored elements with the same rule (every
other element of the kernel and the literal model is set to the truth's placeholder, so it adds
no error to either); on the other steps, and for checkpoints (the golden data holds no state at
a flush's folded count), no value check has a truth.  The exact invariants, the stored-precision
and flush-increment checks (which need no reference) run as usual.  Expected: the same verdict as
the recomputed truth on the stored steps (tests/engine/test_golden.py).

A scenario that is not a golden entry's (compared as the digest of its JSON), or golden data
that fails its sha256 manifest, is refused with one line (ValueError).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from replayssm import golden
from replayssm.scenarios.scenario import Scenario

KEEP = 512
FOLDER = ("trajectories",)


def sample_index(n: int, keep: int = KEEP) -> np.ndarray:
    """The stored elements of a row of ``n`` elements: at most ``keep``, evenly spaced."""
    return np.unique(np.linspace(0, n - 1, min(keep, n)).round().astype(np.int64))


def sample(x: torch.Tensor, keep: int = KEEP) -> np.ndarray:
    """Per row (first dim), the stored elements of the flattened rest, fp64 on the host."""
    flat = x.detach().to("cpu", torch.float64).reshape(x.shape[0], -1).numpy()
    return np.ascontiguousarray(flat[:, sample_index(flat.shape[1], keep)])


def scenario_digest(sc: Scenario) -> str:
    """The sha256 of a scenario's canonical JSON (what a golden entry is matched by)."""
    return hashlib.sha256(json.dumps(json.loads(sc.to_json()), sort_keys=True).encode()).hexdigest()[:16]


class GoldenTruth:
    """The stored truth of one scenario: ``steps`` (plan step numbers), and per step the stored
    outputs ``out`` [R, n], states ``state`` [R, n] and readout maxima ``mag`` [R, T']."""

    def __init__(self, stem: str, keep: int, arrays: dict[str, np.ndarray]) -> None:
        self.stem, self.keep = stem, keep
        self.steps = sorted(int(k[3:]) for k in arrays if k.startswith("out"))
        self.arrays = arrays

    @classmethod
    def load(cls, sc: Scenario, folder: Path | None = None) -> GoldenTruth:
        folder = Path(folder) if folder is not None else golden.path(*FOLDER)
        mp = folder / "manifest.json"
        try:
            entries = json.loads(mp.read_text())["entries"]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"truth: cannot read the golden manifest {mp} ({e})") from None
        want = scenario_digest(sc)
        stem = next((s for s, e in sorted(entries.items())
                     if scenario_digest(Scenario.from_dict(e["scenario"])) == want), None)
        if stem is None:
            raise ValueError(f"truth: golden: the scenario (digest {want}) is no golden entry's; {mp} holds "
                             f"{', '.join(sorted(entries))} (the canonical scenarios of replayssm/cli_golden.py)")
        e = entries[stem]
        try:
            data = (folder / e["file"]).read_bytes()
        except OSError as err:
            raise ValueError(f"truth: golden: cannot read {folder / e['file']} ({err})") from None
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise ValueError(f"truth: golden: {folder / e['file']} does not match its sha256 in {mp}; "
                             f"run `replayssm golden verify`")
        arrays = dict(np.load(io.BytesIO(data), allow_pickle=False))
        missing = [f"{k}{s}" for s in e["sample_steps"] for k in ("out", "state", "mag") if f"{k}{s}" not in arrays]
        if missing:
            raise ValueError(f"truth: golden: {e['file']} lacks {', '.join(missing)}; "
                             f"run `replayssm golden regenerate`")
        return cls(stem, int(e["keep"]), arrays)

    def _full(self, vals: np.ndarray, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored values in a tensor shaped ``like`` (fp64, zeros elsewhere) and the mask of
        the stored elements."""
        R = like.shape[0]
        n = like[0].numel()
        idx = torch.as_tensor(sample_index(n, self.keep), device=like.device)
        full = torch.zeros(R, n, dtype=torch.float64, device=like.device)
        mask = torch.zeros(R, n, dtype=torch.bool, device=like.device)
        full[:, idx] = torch.as_tensor(vals, device=like.device)
        mask[:, idx] = True
        return full.view(like.shape), mask.view(like.shape)

    def outputs(self, step: int, like: torch.Tensor):
        """(reference outputs, mask of stored elements, readout maxima [R, T', 1]) at ``step``."""
        ref, mask = self._full(self.arrays[f"out{step}"], like)
        mag = torch.as_tensor(self.arrays[f"mag{step}"], device=like.device)[..., None]
        return ref, mask, mag

    def state(self, step: int, like: torch.Tensor):
        """(reference committed state, mask of stored elements) after ``step``."""
        return self._full(self.arrays[f"state{step}"], like)


def masked(x: torch.Tensor, mask: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``x`` on the stored elements and wherever it is not finite (judged everywhere), the truth's
    placeholder (rounded to ``x``'s dtype) elsewhere."""
    return torch.where(mask | ~torch.isfinite(x), x, truth.to(x.dtype))


__all__ = ["KEEP", "GoldenTruth", "masked", "sample", "sample_index", "scenario_digest"]
