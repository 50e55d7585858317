"""The Triton ReplaySSM kernel for KDA ("triton-replay", family kda): standard decode
(``replay_decode.py``, one launch per step by default, and the two-launch path ``replay_split.py``) and
speculative verify/commit (the two-launch ``replay_spec_split.py``; with ``prepass=False`` the single kernel
``replay_spec.py``) behind the kernel interface, with the records stored as the literal model stores them.

Storage: checkpoint ``[slots, HV, V, K]`` in the state dtype (fp8 with fp32 scales
``[slots, HV, V]``); records ``d [slots, rows, HV, V]`` and ``k [slots, rows, H, K]`` in the
activation dtype, the per-channel log gate ``g [slots, rows, HV, K]`` in fp32; rows = L (standard)
or next_pow2(B + T') (speculative ring).  ``snapshot()`` returns exactly these.  Cursors, options,
snapshot and restore are the Gated DeltaNet replay kernel's (``replayssm.ops.gdn.replay``): this
class changes the record layout, the launches and the fp64 fold.

Oracle: ``literal-replay`` (family kda) and the fp64 recurrence.  Expected error: within a small
factor of the literal model's at the same precision mode (tests/test_kda_triton.py).

Ragged windows, the packed ``query_start_loc`` layout and standard steps on speculative slots:
declared, run by the interface wrapper around the padded launch (``replayssm/ops/serving_layouts.py``:
not natively; exact, since window position t depends only on positions <= t).
"""

from __future__ import annotations

import torch

from replayssm.interface import next_pow2
from replayssm.ops.committed import committed_rows_fp64
from replayssm.ops.delta_rule.triton_base import OPTIONS
from replayssm.ops.gdn.replay import TritonGDNReplay
from replayssm.ops.kda.literal import KDAMath
from replayssm.ops.kda.replay_decode import launch_replay_decode
from replayssm.ops.kda.replay_spec import launch_replay_spec, launch_replay_spec_commit
from replayssm.ops.kda.replay_spec_split import spec_coef_layout
from replayssm.ops.kda.replay_split import coef_layout, launch_split
from replayssm.ops.kda.triton_base import TritonKDABase
from replayssm.ops.split_options import int_choice
from replayssm.registry import register

# the GDN replay's two-launch options this kernel implements (no key-dim chunks)
SPLIT_OPTIONS = ("prepass", "coef_warps", "fold_unroll", "tiles")


@register
class TritonKDAReplay(TritonKDABase, TritonGDNReplay):
    name = "triton-replay"
    family = "kda"
    accepted_options = OPTIONS + SPLIT_OPTIONS
    SPEC_ONE_WARP = False  # its verify holds a [history, K] decay tile per program: not measured on one warp
    SPLIT_READOUT = False  # its streams (replay_split.py, replay_spec_split.py) read out with reduce / dot only
    PDL_DEFAULT = False  # its launches take no PDL (the pdl option is Gated DeltaNet's and Mamba-2's)
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

    def __init__(self, config) -> None:
        super().__init__(config)
        g, rows, S = self.geometry, self.decode.ring_rows, self.num_slots
        # the per-channel log gate record (the GDN layout has one g per value head)
        self.records["g"] = torch.zeros((S, rows, g.num_v_heads, g.head_k_dim), dtype=torch.float32,
                                        device=self.device)
        if self.decode.speculative:  # the committed history (<= B records) and the window's T' tokens
            self.jb = next_pow2(self.decode.buffer)
            self.coef_layout = spec_coef_layout(self.jb, self.tp, self.BK)
        else:
            self.jb = next_pow2(max(self.decode.buffer - 1, 1))
            self.coef_layout = coef_layout(self.jb, self.BK)
        # one warp per pre-pass program: its [K] rows reduce inside a warp (measured on one H200 at batch 512:
        # the standard pre-pass 57 us on 1 warp, 74 on 2, 136 on 4; the speculative one 200, 385, 608)
        self.coef_warps = int_choice(config.options, "coef_warps", (1, 2, 4, 8), 1)

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

    def committed_state(self, slot_ids) -> torch.Tensor:
        ids = self._check_slot_ids(slot_ids)
        return committed_rows_fp64(ids, self._host(self.write_pos), self._host(self.origin), self.decode.ring_rows,
                                   self.records, self._checkpoints64,
                                   lambda s0, hist: KDAMath().fold_rows(s0, hist, None, None), self.state_shape,
                                   self.device)


__all__ = ["TritonKDAReplay"]
