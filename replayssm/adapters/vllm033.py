"""The vLLM 0.33.0 source: the release's own ReplaySSM kernels (``--use-replayssm``).

``load(path)`` imports the release's files (from ``path``, ``$REPLAYSSM_VLLM033_SRC``,
``$REPLAYSSM_VLLM_SRC`` / ``--vllm-src`` when it names a release tree, or an installed vLLM 0.33.x;
see ``_vllm033_source.py``: the fork's ``vllm-*`` adapters can be loaded in the same process) and
registers, family mamba2 (``vllm033_mamba2.py``): ``vllm033-replay`` (the released Triton
output-only kernel, standard decode), ``vllm033-dispatch`` (``ssu_dispatch``'s FlashInfer ReplaySSM
path and ring trackers; GPU), ``vllm033-trackers`` (the same trackers and wrapper around a literal
``checkpointing_ssu``; CPU capable) and the mutant ``vllm033-trackers-padded-ring``; and, family kda
(``vllm033_kda.py``, from ``vllm/models/kimi_k3/nvidia/ops/recoverssm.py``):
``vllm033-kda-recoverssm`` (Kimi-K3's RecoverSSM, bounded gate) and
``vllm033-kda-recoverssm-softplus`` (the same kernels, softplus gate).  A tree without the KDA files
registers the Mamba-2 adapters and says so.
"""

from __future__ import annotations

from replayssm.adapters import _vllm033_source, vllm033_kda, vllm033_mamba2
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
    try:
        kda = _vllm033_source.load_recoverssm(path)
    except _vllm033_source.SourceUnavailable as e:
        return [f"{', '.join(done)} (from {where}; no KDA RecoverSSM: {e})"]
    for cls in vllm033_kda.CLASSES:
        cls.modules = kda
        cls.source = where
        register(cls, replace=True)
        done.append(f"{cls.family}/{cls.name}")
    return [f"{', '.join(done)} (from {where})"]
