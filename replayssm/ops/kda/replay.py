"""The Triton ReplaySSM kernel for KDA ("triton-replay", family kda): standard decode
(the delta rule's ``replay_decode.py``, one launch per step by default, and the two-launch path
``replay_split.py``) and speculative verify/commit (the two-launch ``replay_spec_split.py``; with ``prepass=False``
the delta rule's single kernel ``replay_spec.py``, which holds the commit too) behind the kernel interface, with
the records stored as the literal model stores them.

Storage: checkpoint ``[slots, HV, V, K]`` in the state dtype (fp8 with fp32 scales
``[slots, HV, V]``); records ``d [slots, rows, HV, V]`` and ``k [slots, rows, H, K]`` in the
activation dtype, the per-channel log gate ``g [slots, rows, HV, K]`` in fp32; rows = L (standard)
or next_pow2(B + T') (speculative ring).  ``snapshot()`` returns exactly these.  Cursors, options,
snapshot and restore are the delta rule's (``replayssm.ops.delta_rule.replay``): this class sets the
launches, the two-launch coefficient layout and the literal math of the fp64 fold.

Oracle: ``literal-replay`` (family kda) and the fp64 recurrence.  Expected error: within a small
factor of the literal model's at the same precision mode (tests/ops/kda/test_kda_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

from replayssm.ops.delta_rule.replay import DeltaRuleReplay
from replayssm.ops.delta_rule.replay_decode import launch_replay_decode
from replayssm.ops.delta_rule.replay_spec import launch_replay_spec, launch_replay_spec_commit
from replayssm.ops.delta_rule.triton_base import OPTIONS
from replayssm.ops.kda.literal import KDAMath
from replayssm.ops.kda.replay_spec_split import spec_coef_layout
from replayssm.ops.kda.replay_split import coef_layout, launch_split
from replayssm.ops.kda.triton_base import TritonKDABase
from replayssm.registry import register

# the delta-rule replay's two-launch options this kernel implements (no key-dim chunks)
SPLIT_OPTIONS = ("prepass", "coef_warps", "fold_unroll", "tiles")


@register
class TritonKDAReplay(TritonKDABase, DeltaRuleReplay):
    name = "triton-replay"
    family = "kda"
    accepted_options = OPTIONS + SPLIT_OPTIONS
    SPEC_ONE_WARP = False  # its verify holds a [history, K] decay tile per program: not measured on one warp
    SPLIT_READOUT = False  # its streams (replay_split.py, replay_spec_split.py) read out with reduce / dot only
    PDL_DEFAULT = False  # its launches take no PDL (the pdl option is Gated DeltaNet's and Mamba-2's)
    math_cls = KDAMath
    launch_split = staticmethod(launch_split)
    launch_replay_spec = staticmethod(launch_replay_spec)
    launch_replay_spec_commit = staticmethod(launch_replay_spec_commit)
    launch_replay_decode = staticmethod(launch_replay_decode)
    description = ("Triton ReplaySSM (per-channel gates): records d, normalised k, per-channel g (fp32); "
                   "output-only readout; flush at write_pos = L-1; speculative verify with the in-window "
                   "WY/UT solve and device-side commit; standard decode in one kernel per step (the coefficient "
                   "pre-pass + checkpoint stream with prepass=True, and for the tf32 readouts); the speculative "
                   "verify as pre-pass + stream (the single kernel with prepass=False)")

    @classmethod
    def tensor_core_readouts(cls, decode, options) -> bool:
        """tf32 / tf32x3 readouts: on the pre-pass path (standard decode) only."""
        return not decode.speculative and options.get("prepass") is not False \
            and options.get("readout", "reduce") == "reduce"

    # coef_warps defaults to one warp per pre-pass program (DeltaRuleReplay): its [K] rows reduce inside a warp
    # (measured on one H200 at batch 512: the standard and the speculative pre-pass each fastest on 1
    # warp, slower on 2 and slowest on 4; unrecorded)
    def split_coef_layout(self) -> dict[str, int]:
        # the committed history (<= B records) and the window's T' tokens in speculative decode
        if self.decode.speculative:
            return spec_coef_layout(self.jb, self.tp, self.BK)
        return coef_layout(self.jb, self.BK)

    def use_split(self, rows: int) -> bool:
        if self.readout != "reduce":
            return False
        if self.decode.speculative:  # the two launches unless asked (one H200: 40.3 us, rec:aa8c304a6d7f6efe,
            # against the single kernel's 85.8 at batch 8; 1836, rec:c40240587ab591d1, against 5118 at 512)
            return self.prepass is not False
        if self.mode.dot != "ieee":
            return True  # only the pre-pass path reads out with tensor-core dots
        if self.prepass is not None:
            return self.prepass
        # one launch at every batch size (one H200, validated and timed by tools/kda_bench.py: 368 us against
        # the pair's 390 at batch 512, 95 / 104 at 128, 31.2 / 35.8 at 32, 12.4 / 14.7 at 8; the one launch's
        # records rec:f2b24f5109af56c7, rec:207cf36941659863, rec:7aa6fff439b7a2dd, rec:fce7b84315fe9147)
        return False

    def split_tiles(self, rows: int, nvb: int) -> int:
        """Value blocks per program: the ``tiles`` option, else in standard decode (both paths) a whole value
        head from 128 rows up and 4 blocks below (one H200, one launch: 4 blocks 31.2 us, rec:7aa6fff439b7a2dd,
        against 44.4 for 1 or whole heads at batch 32; 12.4, rec:fce7b84315fe9147, against 14.7 at batch 8; whole
        heads 368, rec:f2b24f5109af56c7, against 464 for 4 blocks at batch 512); the speculative stream keeps the
        Gated DeltaNet rule (one block below 128 rows)."""
        if self.decode.speculative or self.tiles_per_program is not None:
            return super().split_tiles(rows, nvb)
        return nvb if rows >= 128 or self.interpret else min(4, nvb)

    def decode_tiles(self, rows: int, nvb: int) -> int:
        """Value blocks per program of the one-launch standard decode: :meth:`split_tiles` (per-channel
        coefficients are not cheap: a whole value head from 128 rows up)."""
        return self.split_tiles(rows, nvb)


__all__ = ["TritonKDAReplay"]
