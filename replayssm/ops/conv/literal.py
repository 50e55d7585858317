"""Literal models of the four conv-state designs (``policies.py``), at a precision mode.

Each store keeps the raw conv inputs (activation dtype) of every slot in its design's layout.
``verify`` reads the window the design says, computes window position s's conv output from that
window and positions 0..s (``naive.conv_step`` in the compute dtype, fp32 from j = 0 upwards like
vLLM; then SiLU, then one rounding to the activation dtype) and stores the window inputs the
design's way; ``commit(k)`` rolls the design's books to k accepted tokens.  Expected error: one
activation-dtype rounding of the activated conv output; the stored window itself is exact.

:class:`ReversedOrderStore` is the same design with the other legitimate arithmetic: the taps summed
from the newest input back, the bias added last, SiLU as ``x * sigmoid(x)``.  Any correct kernel is
free to choose its order (FLA sums pairwise), so the mixer's tolerance rule takes the larger error of
the two literal orders (``validators/engine/mixer/runner.py``).
"""

from __future__ import annotations

import torch

from replayssm.ops.conv.naive import conv_sequence, silu
from replayssm.ops.conv.policies import conv_policy


class ConvStore:
    """Base: storage allocation by the design's shapes, the literal conv arithmetic, copies."""

    implements = ""  # the design (policies.CONV_POLICIES) this code follows

    def __init__(self, num_slots: int, channels: int, width: int, window: int, act_dtype: torch.dtype,
                 compute_dtype: torch.dtype, device: torch.device) -> None:
        self.S, self.C, self.w, self.W, self.T = num_slots, channels, width, width - 1, window
        self.act, self.ct, self.device = act_dtype, compute_dtype, device
        shapes = conv_policy(self.implements).storage_shapes(channels, width, window)
        self.tensors = {name: (torch.zeros((num_slots,), dtype=torch.int64) if shape == ()
                               else torch.zeros((num_slots, *shape), dtype=act_dtype, device=device))
                        for name, shape in shapes.items()}

    # ---- design hooks -------------------------------------------------------------------------------
    def reset_slot(self, slot: int, window: torch.Tensor) -> None:
        raise NotImplementedError

    def read_window(self, slot: int) -> torch.Tensor:
        """The ``[C, W]`` window a verify of ``slot`` starts from."""
        raise NotImplementedError

    def write_window(self, slot: int, window: torch.Tensor, x: torch.Tensor) -> None:
        """Store a verify's inputs ``x [n, C]`` (``window``: what it read)."""
        raise NotImplementedError

    def commit_slot(self, slot: int, k: int) -> None:
        raise NotImplementedError

    # ---- the calls a mixer kernel makes -------------------------------------------------------------
    def reset(self, slot: int, window: torch.Tensor | None) -> None:
        for t in self.tensors.values():
            t[slot] = 0
        self.reset_slot(slot, torch.zeros((self.C, self.W), dtype=self.act, device=self.device)
                        if window is None else window.to(self.act))

    def verify(self, rows: list[tuple[int, int]], x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
        """``rows``: (row, slot) of the active rows; ``x [R, T, C]`` activation dtype; ``weight [C, w]``,
        ``bias [C]`` in the compute dtype.  Returns SiLU(conv) ``[R, T, C]`` in the activation dtype
        (padding rows zero)."""
        out = torch.zeros_like(x)
        for r, s in rows:
            win = self.read_window(s).clone()
            out[r] = self.activated_conv(win.to(self.ct), x[r].to(self.ct), weight, bias).to(self.act)
            self.write_window(s, win, x[r])
        return out

    def activated_conv(self, window: torch.Tensor, u: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
        """SiLU(conv) ``[T, C]`` in the compute dtype: taps from the oldest input up, then the SiLU."""
        y, _ = conv_sequence(window, u, weight, bias)
        return silu(y)

    def commit(self, rows: list[tuple[int, int]], ks: list[int]) -> None:
        for (_, s), k in zip(rows, ks):
            self.commit_slot(s, k)

    def storage(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.tensors.items()}

    def _extended(self, window: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([window, x.transpose(0, 1)], dim=-1)  # [C, W + n]


class LazyOffsetStore(ConvStore):
    implements = "lazy-offset"

    def reset_slot(self, slot, window):
        self.tensors["state"][slot, :, :self.W] = window
        self.tensors["accepted"][slot] = 1

    def read_window(self, slot):
        a = int(self.tensors["accepted"][slot])
        return self.tensors["state"][slot, :, a - 1:a - 1 + self.W]

    def write_window(self, slot, window, x):
        full = self._extended(window, x)[:, 1:]
        self.tensors["state"][slot, :, :full.shape[-1]] = full

    def commit_slot(self, slot, k):
        self.tensors["accepted"][slot] = k


class CompactAtCommitStore(ConvStore):
    implements = "compact-at-commit"

    def reset_slot(self, slot, window):
        self.tensors["state"][slot, :, :self.W] = window

    def read_window(self, slot):
        return self.tensors["state"][slot, :, :self.W]

    def write_window(self, slot, window, x):
        full = self._extended(window, x)[:, 1:]
        self.tensors["state"][slot, :, :full.shape[-1]] = full

    def commit_slot(self, slot, k):
        st = self.tensors["state"][slot]
        st[:, :self.W] = st[:, k - 1:k - 1 + self.W].clone()


class DraftSnapshotsStore(ConvStore):
    implements = "draft-snapshots"

    def reset_slot(self, slot, window):
        self.tensors["state"][slot] = window

    def read_window(self, slot):
        return self.tensors["state"][slot]

    def write_window(self, slot, window, x):
        full = self._extended(window, x)
        for s in range(x.shape[0]):
            self.tensors["snapshots"][slot, s] = full[:, s + 1:s + 1 + self.W]

    def commit_slot(self, slot, k):
        self.tensors["state"][slot] = self.tensors["snapshots"][slot, k - 1]


class CircularStore(ConvStore):
    implements = "circular"

    @property
    def ring(self) -> int:
        return self.tensors["state"].shape[-1]

    def reset_slot(self, slot, window):
        self.tensors["state"][slot, :, :self.W] = window
        self.tensors["cursor"][slot] = self.W % self.ring

    def _cols(self, slot, start, n):
        cur = int(self.tensors["cursor"][slot])
        return [(cur + start + j) % self.ring for j in range(n)]

    def read_window(self, slot):
        return self.tensors["state"][slot][:, self._cols(slot, -self.W, self.W)]

    def write_window(self, slot, window, x):
        for s, col in enumerate(self._cols(slot, 0, x.shape[0])):
            self.tensors["state"][slot, :, col] = x[s]

    def commit_slot(self, slot, k):
        self.tensors["cursor"][slot] = (int(self.tensors["cursor"][slot]) + k) % self.ring


class ReversedOrderStore(CompactAtCommitStore):
    """The compact-at-commit design in the other legitimate order: taps from the newest input back,
    the bias last, SiLU as ``x * sigmoid(x)``."""

    def activated_conv(self, window, u, weight, bias):
        full = torch.cat([window, u.transpose(0, 1)], dim=-1)  # [C, W + T]
        W, outs = window.shape[-1], []
        for t in range(u.shape[0]):
            acc = torch.zeros_like(u[t])
            for j in reversed(range(W + 1)):
                acc = acc + full[:, t + j] * weight[:, j]
            if bias is not None:
                acc = acc + bias
            outs.append(acc * torch.sigmoid(acc))
        return torch.stack(outs)


STORES: dict[str, type[ConvStore]] = {c.implements: c for c in (LazyOffsetStore, CompactAtCommitStore,
                                                                 DraftSnapshotsStore, CircularStore)}
