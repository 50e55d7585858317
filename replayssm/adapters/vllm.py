"""The vLLM source: the official ReplaySSM kernels (vLLM fork) and vLLM's baselines.

``load(path)`` imports the kernels (from ``path``, ``$REPLAYSSM_VLLM_SRC`` or an installed vLLM;
see ``_vllm_source.py`` for how a source tree is imported without vLLM) and registers:

* Mamba-2 (``vllm_mamba2.py``, ``vllm_mamba2_spec.py``): ``vllm-replay`` (output_only standard decode; speculative
  verify/commit/reset), ``vllm-replay-state`` (state_and_output standard decode);
* GDN (``vllm_gdn.py``): ``vllm-replay`` (``fused_recurrent_replayssm`` standard decode,
  ``gdn_replayssm_spec_decode`` speculative verify/commit/reset);
* baselines (``vllm_baselines.py``): ``vllm-baseline`` for Mamba-2 (``selective_state_update``)
  and GDN (``fused_recurrent_gated_delta_rule_packed_decode`` standard,
  ``fused_sigmoid_gating_delta_rule_update`` speculative).

Each module's docstring lists the conventions it bridges and the precision modes it declares.
"""

from __future__ import annotations

from replayssm.adapters import _vllm_source, vllm_baselines, vllm_gdn, vllm_mamba2, vllm_mamba2_spec
from replayssm.registry import register

NAME = "vllm"


def load(path: str | None = None) -> list[str]:
    """Import the kernels and register the adapters; returns the registered ``family/name`` list.
    Raises :class:`_vllm_source.SourceUnavailable` (one line) when the source is missing or unusable."""
    mods = _vllm_source.load(path)
    classes = [vllm_mamba2_spec.VllmMamba2Replay, vllm_mamba2.VllmMamba2ReplayState, vllm_gdn.VllmGDNReplay,
               vllm_baselines.VllmMamba2Baseline, vllm_baselines.VllmGDNBaseline]
    done = []
    for cls in classes:
        cls.modules = mods
        cls.source = _vllm_source.provenance()
        register(cls, replace=True)
        done.append(f"{cls.family}/{cls.name}")
    return done
