"""The books of an adapter whose kernels keep ``fold-every-commit`` bookkeeping (SGLang 0.5.23's KDA
verify + commit fold, ``sglang_kda.py``; vLLM 0.33.0's KDA RecoverSSM, ``vllm033_kda.py``): the verify
reads the frozen checkpoint ``self.state`` (block ``s + 1`` is slot ``s``, ``_base.py``) and writes its
own per-window books, the commit folds the accepted prefix into the checkpoint; no history, no
cursor (``write_pos`` 0 before every verify), so the committed state is the checkpoint.

:class:`FoldEveryCommitAdapter` gives the verify on the active rows packed as one sequence
(:meth:`SlotAdapter.pack_active`), the bench's timed step (the verify and commit launches alone on
tokens packed once, T' per row, every step committing ``accepted``); the inspection and the
snapshot are :class:`CheckpointOnlyAdapter`'s (no records; the kernel's window books, if any, in
``extra``).  An adapter supplies
``_launch_verify(tok, blk, qsl)`` (returns the outputs ``[1, n, ...]``) and
``_launch_commit(blk, accepted, qsl)``.

Oracle: none of its own (bookkeeping); the engine judges what it returns.  Expected error: exact
(data movement).
"""

from __future__ import annotations

import torch

from replayssm.adapters._checkpoint_only import CheckpointOnlyAdapter


class FoldEveryCommitAdapter(CheckpointOnlyAdapter):
    """Verify, timed step and inspection of a fold-every-commit kernel pair (see the module doc)."""

    def _launch_verify(self, tok, blk, qsl):
        raise NotImplementedError

    def _launch_commit(self, blk, accepted, qsl):
        raise NotImplementedError

    def verified(self, ids: list[int], rows: torch.Tensor, qsl: torch.Tensor) -> None:
        """After a verify's launch: the slots ``ids``, the active ``rows`` given to the kernel and their
        offsets ``qsl`` (for a commit that needs the verify's row order)."""

    def verify(self, slot_ids, inputs, out=None, window_lens=None, query_start_loc=None):
        ids, out = self.begin_serving_verify(slot_ids, inputs, out, window_lens, query_start_loc)
        tok, blk, qsl, lens, put, act = self.pack_active(ids, slot_ids, inputs, window_lens, query_start_loc)
        put(self._launch_verify(tok, blk, qsl)[0], out)
        self.verified(ids, act, qsl)
        self.end_verify(ids, lens)
        return out

    def timed_step(self, slot_ids, inputs, out, accepted):
        """The verify and commit launches alone on tokens packed once (``_base.py``); every step
        commits ``accepted`` (the bench's k)."""
        self.no_padding(slot_ids)
        tok = {k: v.flatten(0, 1)[None].contiguous() for k, v in inputs.items()}
        blk, acc = self.blocks(slot_ids), accepted.to(torch.int32).contiguous()
        qsl = self.uniform_offsets(slot_ids.shape[0])

        def step():
            self._launch_verify(tok, blk, qsl)
            self._launch_commit(blk, acc, qsl)
        return step
