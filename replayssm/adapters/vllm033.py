"""The vLLM 0.33.0 source: the release's own ReplaySSM kernels (``--use-replayssm``).

``load(path)`` imports the release's files (from ``path``, ``$REPLAYSSM_VLLM033_SRC``,
``$REPLAYSSM_VLLM_SRC`` / ``--vllm-src`` when it names a release tree, or an installed vLLM 0.33.x;
see ``_vllm033_source.py``: the fork's ``vllm-*`` adapters can be loaded in the same process) and
registers, family mamba2 (``vllm033_mamba2.py``): ``vllm033-replay`` (the released Triton
output-only kernel, standard decode), ``vllm033-dispatch`` (``ssu_dispatch``'s FlashInfer ReplaySSM
path and ring trackers; GPU), ``vllm033-trackers`` (the same trackers and wrapper around a literal
``checkpointing_ssu``; CPU capable) and the mutant ``vllm033-trackers-padded-ring``.
"""

from __future__ import annotations

from replayssm.adapters import _vllm033_source, vllm033_mamba2
from replayssm.registry import register

NAME = "vllm033"
CLASSES = (vllm033_mamba2.Vllm033Replay, vllm033_mamba2.Vllm033Dispatch, vllm033_mamba2.Vllm033Trackers,
           vllm033_mamba2.Vllm033TrackersPaddedRing)


def load(path: str | None = None) -> list[str]:
    """Import the release's kernels and register the adapters; returns ``family/name (source)`` lines.
    Raises :class:`_vllm033_source.SourceUnavailable` (one line) when the source is missing or unusable."""
    mods = _vllm033_source.load(path)
    where = _vllm033_source.provenance()
    done = []
    for cls in CLASSES:
        cls.modules = mods
        cls.source = where
        register(cls, replace=True)
        done.append(f"{cls.family}/{cls.name}")
    return [f"{', '.join(done)} (from {where})"]
