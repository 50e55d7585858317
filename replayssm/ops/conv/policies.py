"""The four declared designs of a conv state under speculation: where a kernel keeps the conv
window of each slot, and how the validator reads the *committed* window out of its raw storage.

A mixer kernel declares one (``conv_policy``) and returns its raw storage (``conv_storage()``:
name -> ``[num_slots, ...]`` tensor, copies).  The validator never asks the kernel which window it
committed: it reads the window from the raw storage by the declared design's rule
(:meth:`ConvPolicy.committed_window`) and compares it bit for bit with the last ``w - 1`` accepted
conv inputs (``w = d_conv``, ``W = w - 1``, ``T`` = T').  So a kernel passes only under the design
its storage really follows.

1. ``lazy-offset`` (vLLM ``causal_conv1d_update(..., num_accepted_tokens)``): ``state [C, W + T - 1]``;
   a verify reads its window at column ``a - 1`` (``a``: the count of the last commit, 1 after a
   reset) and writes ``[window[1:], x_0..x_{T-1}]`` from column 0; the commit only records ``a``.
   Committed window: ``state[:, a - 1 : a - 1 + W]``; storage ``state``, ``accepted [S]``.
2. ``compact-at-commit`` (vLLM RecoverSSM ``_compact_conv_state_kernel``): the same extended window,
   the commit moving columns ``k - 1 .. k + W - 2`` to ``0 .. W - 1``.  Committed window:
   ``state[:, :W]``; storage ``state``.
3. ``draft-snapshots`` (SGLang ``intermediate_conv_window``, TensorRT-LLM, Megatron):
   ``state [C, W]`` plus ``snapshots [T, C, W]``, snapshot s the window after window position s;
   the commit copies snapshot ``k - 1`` into ``state``.  Committed window: ``state``.
4. ``circular`` (Dao-AILab causal-conv1d ``cache_seqlens``): a ring ``state [C, W + T - 1]`` and a
   ``cursor [S]``; window position s is written at column ``(cursor + s) mod (W + T - 1)``, the
   commit advances the cursor by k.  Committed window: columns ``(cursor - W + j) mod (W + T - 1)``,
   j = 0..W-1.
"""

from __future__ import annotations

import abc

import torch


class ConvPolicy(abc.ABC):
    name = ""
    description = ""
    source = ""  # where the design ships

    @abc.abstractmethod
    def storage_shapes(self, channels: int, width: int, window: int) -> dict[str, tuple[int, ...]]:
        """Per-slot shapes of the stored tensors (``()`` for an integer cursor): conv ``channels``,
        ``width`` = d_conv, ``window`` = T'."""

    @abc.abstractmethod
    def committed_window(self, storage: dict[str, torch.Tensor], slot: int, width: int) -> torch.Tensor:
        """The committed window ``[C, width - 1]`` of ``slot``, read from raw ``storage`` by this design's rule."""


class LazyOffset(ConvPolicy):
    name = "lazy-offset"
    description = "extended window of W + T' - 1 inputs, read at offset num_accepted - 1 by the next step"
    source = "vLLM causal_conv1d_update(..., num_accepted_tokens)"

    def storage_shapes(self, channels, width, window):
        return {"state": (channels, width - 1 + window - 1), "accepted": ()}

    def committed_window(self, storage, slot, width):
        a = int(storage["accepted"][slot])
        return storage["state"][slot, :, a - 1:a - 1 + width - 1]


class CompactAtCommit(ConvPolicy):
    name = "compact-at-commit"
    description = "extended window of W + T' - 1 inputs, compacted to columns 0..W-1 at commit"
    source = "vLLM RecoverSSM _compact_conv_state_kernel"

    def storage_shapes(self, channels, width, window):
        return {"state": (channels, width - 1 + window - 1)}

    def committed_window(self, storage, slot, width):
        return storage["state"][slot, :, :width - 1]


class DraftSnapshots(ConvPolicy):
    name = "draft-snapshots"
    description = "one window per draft position; commit copies snapshot k - 1"
    source = "SGLang intermediate_conv_window, TensorRT-LLM, Megatron"

    def storage_shapes(self, channels, width, window):
        return {"state": (channels, width - 1), "snapshots": (window, channels, width - 1)}

    def committed_window(self, storage, slot, width):
        return storage["state"][slot]


class Circular(ConvPolicy):
    name = "circular"
    description = "ring of W + T' - 1 inputs advanced by a cursor"
    source = "Dao-AILab causal-conv1d cache_seqlens"

    def storage_shapes(self, channels, width, window):
        return {"state": (channels, width - 1 + window - 1), "cursor": ()}

    def committed_window(self, storage, slot, width):
        ring = storage["state"].shape[-1]
        cur = int(storage["cursor"][slot])
        cols = torch.tensor([(cur - (width - 1) + j) % ring for j in range(width - 1)], dtype=torch.long)
        return storage["state"][slot].index_select(-1, cols.to(storage["state"].device))


CONV_POLICIES: dict[str, ConvPolicy] = {p.name: p for p in (LazyOffset(), CompactAtCommit(), DraftSnapshots(),
                                                             Circular())}


def conv_policy(name: str) -> ConvPolicy:
    """The conv policy called ``name``; ValueError naming the known ones."""
    if not isinstance(name, str) or name not in CONV_POLICIES:
        raise ValueError(f"conv_policy: expected one of {sorted(CONV_POLICIES)}, got {name!r}")
    return CONV_POLICIES[name]
