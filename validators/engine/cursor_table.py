"""A decode's cursor rules as lookup tables, for stepping every row of a batch in a few NumPy ops.

Oracle: :meth:`replayssm.interface.DecodeConfig.is_flush` and ``commit_cursor`` (the bookkeeping
policy's own rules).  Expected difference: none -- the tables are filled by calling them once for
every cursor value a slot can hold (write positions ``0 .. max_write_pos``, ring origins ``0 ..
ring_rows - 1``, both flush flags, accepted counts ``0 .. T'``), so any policy, including one
written elsewhere, is tabulated as it is.  A cursor outside that domain (an invalid schedule) is
refused with the argument named, never looked up out of bounds.

Why: drift's fast path walks the cursors of every row on the host at every step (which rows flush,
where each cursor goes); per row and step that was a few Python calls through the policy, host time
that bounded the step at 64 rows once the device work was graphed (unrecorded).
tests/engine/test_cursor_table.py holds the tables to the policies on random walks.  The one cursor rule
of a step (:func:`commit_cursor`: the policy's, and a staged fold's commit(0) moving none) is what every
walk uses: ``Lockstep``'s per-row commit, ``Lockstep.cursors_before`` (failure messages) and drift's fast
path (:meth:`CursorTable.walk`, over a chunk of steps).  A decode
whose tables would exceed :data:`MAX_ENTRIES` entries (a history of thousands of records) is not
tabulated: the same methods then ask the policy row by row.
"""

from __future__ import annotations

import numpy as np

from replayssm.interface import DecodeConfig

MAX_ENTRIES = 1 << 18  # (write positions x origins x 2 x accepted counts) tabulated at most


def commit_cursor(dec: DecodeConfig, staged: bool, write_pos: int, origin: int, flushed: bool, k: int
                  ) -> tuple[int, int]:
    """The cursors after commit(``k``) under ``dec``'s policy; with ``staged`` (a staged fold,
    ``zero_accept = "staged"``) a commit(0) moves none (it discards the flush's fold)."""
    if staged and k == 0:
        return write_pos, origin
    return dec.commit_cursor(write_pos, origin, flushed, k)


class CursorTable:
    """``is_flush`` and :func:`commit_cursor` of ``dec`` (``staged``: a staged fold's rule) over arrays of rows."""

    def __init__(self, dec: DecodeConfig, staged: bool = False) -> None:
        self.dec, self.staged = dec, staged
        self.W, self.O, self.K = dec.max_write_pos() + 1, dec.ring_rows, dec.window + 1
        self.flush_of = np.array([bool(dec.is_flush(w)) for w in range(self.W)], dtype=bool)
        shape = (self.W, self.O, 2, self.K)
        self.tabulated = self.W * self.O * 2 * self.K <= MAX_ENTRIES
        if not self.tabulated:  # too large: the policy row by row (checked per call)
            self.closed = False
            return
        self.next_wp = np.empty(shape, dtype=np.int64)
        self.next_origin = np.empty(shape, dtype=np.int64)
        for w in range(self.W):
            for o in range(self.O):
                for f in (0, 1):
                    for k in range(self.K):
                        nxt = commit_cursor(dec, staged, w, o, bool(f), k)
                        self.next_wp[w, o, f, k], self.next_origin[w, o, f, k] = nxt
        # closed: every commit after the verify the rule gives (flushed = is_flush(wp)) lands in the domain,
        # so cursors checked once stay valid and the walk (:meth:`step`) needs no per-step check
        f = self.flush_of.astype(np.int64)[:, None, None]
        reach_wp = np.take_along_axis(self.next_wp, f[..., None].repeat(self.O, 1).repeat(self.K, 3), 2)
        reach_o = np.take_along_axis(self.next_origin, f[..., None].repeat(self.O, 1).repeat(self.K, 3), 2)
        self.closed = bool(((reach_wp >= 0) & (reach_wp < self.W) & (reach_o >= 0) & (reach_o < self.O)).all())

    def check(self, wp: np.ndarray, origin: np.ndarray | None = None, k: np.ndarray | None = None) -> None:
        """ValueError naming the first argument with a value outside the tables' domain."""
        self._check(wp, origin, k)

    def _check(self, wp: np.ndarray, origin: np.ndarray | None = None, k: np.ndarray | None = None) -> None:
        for name, v, hi in (("write_pos", wp, self.W), ("origin", origin, self.O), ("accepted", k, self.K)):
            if v is not None and v.size and (v.min() < 0 or v.max() >= hi):
                raise ValueError(f"{name}: expected values in [0, {hi}) for this decode ({self.dec.to_dict()}), "
                                 f"got {v.min()}..{v.max()}")

    def is_flush(self, wp: np.ndarray) -> np.ndarray:
        """Whether each row's next verify at write position ``wp`` flushes (bool array)."""
        self._check(wp)
        return self.flush_of[wp]

    def commit(self, wp: np.ndarray, origin: np.ndarray, flushed: np.ndarray, k: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's cursors ``(write_pos, origin)`` after commit(``k``)."""
        self._check(wp, origin, k)
        if not self.tabulated:
            pairs = [commit_cursor(self.dec, self.staged, int(w), int(o), bool(f), int(kk))
                     for w, o, f, kk in zip(wp, origin, flushed, k)]
            return (np.array([p[0] for p in pairs], dtype=np.int64).reshape(wp.shape),
                    np.array([p[1] for p in pairs], dtype=np.int64).reshape(wp.shape))
        f = flushed.astype(np.int64)
        return self.next_wp[wp, origin, f, k], self.next_origin[wp, origin, f, k]

    def step(self, wp: np.ndarray, origin: np.ndarray, k: np.ndarray, rows: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One verify + commit(``k``) of the rows in the mask ``rows``: (which rows flushed, write_pos,
        origin); the others keep their cursors.  Checked per call unless the tables are :attr:`closed`
        (then the caller checks the cursors it starts from, once)."""
        if not self.closed:
            self._check(wp, origin, k)
        if not self.tabulated:
            fl = self.flush_of[wp] & rows
            nwp, norigin = wp.copy(), origin.copy()
            r = np.flatnonzero(rows)
            nwp[r], norigin[r] = self.commit(wp[r], origin[r], fl[r], k[r])
            return fl, nwp, norigin
        fl = self.flush_of[wp] & rows
        f = fl.astype(np.int64)
        nwp = np.where(rows, self.next_wp[wp, origin, f, k], wp)
        norigin = np.where(rows, self.next_origin[wp, origin, f, k], origin)
        return fl, nwp, norigin

    def walk(self, wp: np.ndarray, origin: np.ndarray, acc: np.ndarray, rows: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`step` over the accepted counts ``acc [n, R]`` from cursors ``wp``, ``origin`` ``[R]``:
        the cursors before each step and after the last (``[n + 1, R]`` each) and which rows each flushes
        (``[n, R]``)."""
        n, R = acc.shape
        wps = np.empty((n + 1, R), dtype=np.int64)
        origins = np.empty((n + 1, R), dtype=np.int64)
        fl = np.empty((n, R), dtype=bool)
        wps[0], origins[0] = wp, origin
        for i in range(n):
            fl[i], wps[i + 1], origins[i + 1] = self.step(wps[i], origins[i], acc[i], rows)
        return wps, origins, fl


__all__ = ["CursorTable", "commit_cursor"]
