"""The serving-engine layouts of our Triton kernels, run by the kernel-interface wrapper around a
padded launch (the launches themselves take the padded ``[R, T', ...]`` layout only).

Oracle: the contract of ``replayssm/interface.py`` -- ``window_lens`` (``supports_ragged_windows``),
``query_start_loc`` (``supports_packed_layout``) and one-token verifies on a speculative object
(``supports_mixed_decode``) -- judged by the validation engine (window-tail, padding-output,
unwritten-output, the value checks against the fp64 reference).  Expected error: exactly the
padded launch's (the valid positions are bit-identical to a padded verify whose later window
positions hold anything else: tests/core/test_serving_triton.py, under the interpreter).

How a verify in one of these layouts runs (:meth:`ServingLayouts.verify`):

1. the arguments are checked in the caller's layout, always (``checks`` off included: the row
   lengths are needed on the host to build the gather, one synchronisation per call);
2. each active row's T'_r valid tokens (the packed ``query_start_loc[r]..[r+1]-1``, the padded
   ``[r, :window_lens[r]]``, or the one token of a standard step) are scattered into a zero-filled
   ``[R, T', ...]`` buffer (zeros: finite inputs, so a masked dot over the window never meets a
   NaN or an infinity from the caller's padding);
3. the kernel's padded verify (:meth:`verify_padded`) runs once into a scratch output;
4. only positions t < T'_r are copied to the caller's ``out`` (packed: at ``query_start_loc[r] + t``);
   padding rows, the positions past a row's window and the packed buffer's spare tail are never
   written.

Why this is the kernels' ragged verify and not an approximation: every quantity at window position
t (output, record, per-draft state) depends only on the checkpoint, the committed history and
window positions 0..t (the recurrence is causal), and whether a verify flushes depends only on
``write_pos`` and the kernel's T' (T'max), the same in both layouts.  What the padded launch does
beyond a ragged verify stays outside the committed state: the records of positions T'_r..T'-1
(ring rows ``origin + write_pos + t``, past the committed history; a commit accepts k <= T'_r, so
they are never committed and the next verify overwrites them) and a speculative baseline's draft
states past T'_r (never made live).  A standard step on a speculative kernel object is the
hand-over rule of the interface: a window of length 1 in the same ring, the flush decided with T'.

Not declared: host-owned cursors (the ``host-cursors`` policy): the cursors live on the device and
move in the kernels' commit launches; a ``cursors=`` table is refused, naming the kernel's policy.

Cost: the host gather/scatter and a scratch output per call; the raw launches (``launch_*``,
bench and the drift fast path) are the padded ones, unchanged.
"""

from __future__ import annotations

import abc

import torch

from replayssm.interface import PAD_SLOT, KernelUnderTest


class ServingLayouts(KernelUnderTest):
    """Ragged windows, the packed layout and standard steps on speculative slots for a kernel whose
    launches take ``[R, T', ...]`` inputs: subclasses implement :meth:`verify_padded` (the padded
    verify with every row at T') and pass :meth:`window_bound` to ``check_commit_args``."""

    supports_ragged_windows = True
    supports_packed_layout = True
    supports_mixed_decode = True

    checks = True  # the kernels' ``checks`` option: host-side argument checks (their commit reads the bound)

    def __init__(self, config) -> None:
        super().__init__(config)
        self.win_len = [self.decode.window] * self.num_slots  # window length of each slot's last verify

    @abc.abstractmethod
    def verify_padded(self, slot_ids, inputs, out=None):
        """The kernel's verify of ``[R, T', ...]`` inputs, every active row at T' (its launches)."""

    def window_bound(self) -> list[int]:
        """Per slot, the window length of its last verify (the largest k its commit may accept)."""
        return self.win_len

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None, cursors=None):
        """``verify_padded`` for a padded call with every row at T'; else the serving layouts as the
        module docstring says.  The kernels keep their cursors on the device (bookkeeping ``spec``): a
        caller's cursor table (``host-cursors``) is refused with ``check_cursors``' line."""
        if cursors is not None:
            self.check_cursors(self._check_slot_ids(slot_ids), cursors)
        T = self.decode.window
        if window_lens is None and query_start_loc is None and self.call_window(inputs) == T:
            out = self.verify_padded(slot_ids, inputs, out)
            if self.checks:  # only the checked commit reads the bound (no host sync otherwise)
                self._note_windows(slot_ids.tolist(), None)
            return out
        ids = self.check_verify_args(slot_ids, inputs, out, window_lens=window_lens, query_start_loc=query_start_loc)
        R, dev = len(ids), self.device
        first = next(iter(inputs.values()))
        if query_start_loc is not None:
            lens = self.check_query_start_loc(ids, query_start_loc, int(first.shape[0]))
            starts = [int(v) for v in query_start_loc.tolist()[:-1]]
            lead = (int(first.shape[0]),)
        else:
            width = self.call_window(inputs)
            lens = self.check_window_lens(ids, window_lens, width)
            starts = [r * width for r in range(R)]
            lead = (R, width)
        src = torch.tensor([starts[r] + t for r, n in enumerate(lens) for t in range(n)], dtype=torch.long,
                           device=dev)
        dst = torch.tensor([r * T + t for r, n in enumerate(lens) for t in range(n)], dtype=torch.long, device=dev)
        padded = {}
        for name, v in inputs.items():
            buf = torch.zeros((R * T, *v.shape[len(lead):]), dtype=v.dtype, device=dev)
            buf.index_copy_(0, dst, v.reshape(-1, *v.shape[len(lead):]).index_select(0, src))
            padded[name] = buf.view(R, T, *buf.shape[1:])
        scratch = self.verify_padded(slot_ids, padded, None)
        if out is None:
            out = torch.full((*lead, *self.out_shape), float("nan"), dtype=self.mode.act_dtype, device=dev)
        flat = out.view(-1, *self.out_shape)
        flat.index_copy_(0, src, scratch.reshape(R * T, *self.out_shape).index_select(0, dst))
        self._note_windows(ids, lens)
        return out

    def _note_windows(self, ids: list[int], lens: list[int] | None) -> None:
        for r, s in enumerate(ids):
            if s != PAD_SLOT:
                self.win_len[s] = self.decode.window if lens is None else lens[r]


__all__ = ["ServingLayouts"]
