"""The Triton ReplaySSM kernel for Gated DeltaNet ("triton-replay"): standard decode
(the delta rule's ``replay_decode.py``) and speculative verify/commit (``replay_spec.py``, the delta rule's
``replay_spec.py`` for T' > 4 and the commit) behind the kernel
interface, with the records stored as the literal model stores them; the host side (storage, options,
launch geometry, inspection, snapshot and restore) is the delta rule's (``replayssm.ops.delta_rule.replay``).

Storage: checkpoint ``[slots, HV, V, K]`` in the state dtype (fp8 with fp32 scales
``[slots, HV, V]``); records ``d [slots, rows, HV, V]`` and ``k [slots, rows, H, K]`` in the
activation dtype, ``g [slots, rows, HV]`` fp32; rows = L (standard) or next_pow2(B + T')
(speculative ring).  ``snapshot()`` returns exactly these, the literal model's layout.

Oracle: ``literal-replay`` and ``gdn_sequence`` in fp64.  Expected error: within a small factor
of the literal model's at the same precision mode (tests/ops/gdn/test_gdn_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

from replayssm.ops.delta_rule.replay import DeltaRuleReplay
from replayssm.ops.delta_rule.replay_decode import launch_replay_decode
from replayssm.ops.delta_rule.triton_base import OPTIONS, PREPASS_OPTIONS
from replayssm.ops.gdn.literal import GDNMath
from replayssm.ops.gdn.replay_spec import launch_replay_spec, launch_replay_spec_commit
from replayssm.ops.gdn.replay_split import coef_layout, launch_split
from replayssm.ops.gdn.triton_base import TritonGDNBase
from replayssm.registry import register


@register
class TritonGDNReplay(TritonGDNBase, DeltaRuleReplay):
    name = "triton-replay"
    accepted_options = OPTIONS + PREPASS_OPTIONS
    SPEC_ONE_WARP = True  # the speculative verify's programs default to one warp (KDA's keep launch_shape's)
    SPLIT_READOUT = True
    PDL_DEFAULT = True  # the pdl option's default in standard decode (ops/delta_rule/replay.py)
    description = ("Triton ReplaySSM: records d, normalised k, g; output-only readout; flush at write_pos = L-1; "
                   "speculative verify with the in-window WY/UT solve and device-side commit; coefficient "
                   "pre-pass + checkpoint stream from 16 rows up, one kernel below")

    math_cls = GDNMath
    launch_split = staticmethod(launch_split)
    launch_replay_spec = staticmethod(launch_replay_spec)
    launch_replay_spec_commit = staticmethod(launch_replay_spec_commit)
    launch_replay_decode = staticmethod(launch_replay_decode)

    @classmethod
    def tensor_core_readouts(cls, decode, options) -> bool:
        return options.get("prepass") is not False and options.get("readout", "reduce") in ("reduce", "dot") \
            and int(options.get("kchunks", 1)) == 1

    def split_coef_layout(self) -> dict[str, int]:
        return coef_layout(self.jb, self.tp)


__all__ = ["TritonGDNReplay"]
