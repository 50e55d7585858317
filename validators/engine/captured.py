"""The captured execution's engine parts: the raw launch path of a kernel and the fp64 reference over a block of steps.

Oracle: the eager execution (:meth:`replayssm.validators.engine.runner.Lockstep.step`).  Expected
difference: none -- :class:`ChunkReference` runs the family's own step (``reference_prepare`` for a
whole block, exact elementwise ops, then ``reference_advance`` per token: what ``reference_step``
runs), so every value is rounded as the eager execution rounds it; :func:`raw_path` /
:func:`raw_checkpoint` say when a kernel's ``launch_*`` entry points (no host checks, no sync) are
the interface calls a captured block may take instead (tests/jobs/test_drift_fast.py holds both).
:class:`CapturedExecution` holds the machinery of running blocks of steps on fixed buffers (the device step:
verify, commit, the reference window and the output error; a block's static piece captured as a CUDA graph
and replayed; the fp64 running bound over a block; the output checks deferred to the block's end, through
the orchestrator's hook runner on a flagged step only).  Drift's fast path (``validators/jobs/drift/fast.py``,
``FastCell``) is the execution built on it: it allocates the buffers and keeps the drift-only state (the
shadow, the flush and local errors, the state samples), passed in through ``_piece_static`` and the
shadow it hands the device step.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from replayssm.conventions import conv_kwargs
from replayssm.families import Family
from replayssm.ops.triton.row_copy import can_copy_rows, copy_rows
from replayssm.scenarios.inputs import make_inputs_steps
from replayssm.validators.engine.checks.context import StepContext
from replayssm.validators.engine.checks.fp64_bound_host import window_outputs
from replayssm.validators.engine.metrics import error_metrics, rel_l2_into
from replayssm.validators.engine.runner import readout_magnitude

MAX_INDEX_LISTS = 512  # row lists kept as device tensors (speculative flushes vary by row)
# the checks due at a drift step (no literal model, no sampled invariants or states: qualifies)
EVERY_STEP = frozenset({"every-step"})
MAX_GRAPHS = 48
BOUND_KEYS = ("E", "A", "M", "n", "L")  # the running bound's state, in bound_scan's order


def raw_path(kernel) -> bool:
    """Whether ``kernel`` can be driven through ``launch_verify``/``launch_commit``: they exist and
    its ``verify``/``commit`` are the ones of the class that defines them (a subclass overriding
    ``verify`` -- a mutant -- must keep going through it)."""
    cls = type(kernel)
    owner = next((c for c in cls.__mro__ if "launch_verify" in vars(c)), None)
    if owner is None or "launch_commit" not in vars(owner):
        return False
    names = ("verify", "commit", "launch_verify", "launch_commit") + (
        ("verify_padded",) if hasattr(owner, "verify_padded") else ())  # what a serving-layout kernel's verify calls
    return all(getattr(cls, n) is getattr(owner, n) for n in names)


def raw_checkpoint(kernel) -> bool:
    """Whether ``kernel``'s checkpoint can be read through ``launch_checkpoint`` (no host sync): it
    exists and ``checkpoint_state`` is the one of the class defining it (a mutant overriding the
    read keeps going through it)."""
    cls = type(kernel)
    owner = next((c for c in cls.__mro__ if "launch_checkpoint" in vars(c)), None)
    return owner is not None and all(getattr(cls, n) is getattr(owner, n)
                                     for n in ("checkpoint_state", "launch_checkpoint"))



class ChunkReference:
    """The family's fp64 reference step over a chunk: ``reference_prepare`` (exact, elementwise) of
    every token of the chunk at once into fixed buffers (what a CUDA graph replays over), then
    ``reference_advance`` token by token -- the same two functions ``reference_step`` runs, so the
    same bits."""

    def __init__(self, fam, K: int, params: dict[str, torch.Tensor], conv=None, fused: bool = False,
                 hoist: bool = False) -> None:
        self.fam, self.K, self.params = fam, K, params
        self.kw = conv_kwargs(conv)  # the kernel's declared conventions (as the slow path's reference_step)
        # the fused Triton step and the hoisted terms compute the default conventions only
        if self.kw and (fused or hoist):
            raise ValueError("fused/hoist: the fused fp64 step computes the default conventions only; "
                             f"this kernel declares {conv.changes()}")
        self.hoist = hoist
        self.advance = fam.reference_advance_fused if fused else fam.reference_advance
        self.fused = fused
        # the fused pass's readout products give the readout magnitude (the same bits, a pass fewer)
        self.products = fused and type(fam).reference_advance_magnitude is not Family.reference_advance_magnitude
        self.buf: dict[str, torch.Tensor] | None = None

    def load(self, tok: dict[str, torch.Tensor], n: int) -> None:
        """Tokens ``[n, R, ...]`` (fp64, token-major) into the buffers."""
        prep = self.fam.reference_prepare(tok, self.params, **self.kw)
        if self.hoist:
            prep = self.fam.reference_hoist(prep, self.params)
        if self.buf is None:
            self.buf = {k: torch.empty((self.K, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in prep.items()}
            self.v = {k: b.unbind(0) for k, b in self.buf.items()}
        for k, v in prep.items():
            self.buf[k][:n].copy_(v)

    def step(self, st: torch.Tensor, i: int, y_out: torch.Tensor | None, rows: torch.Tensor | None = None,
             keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Token ``i`` of the chunk on ``st``: the new state; the output into ``y_out`` if given.  ``rows``
        (fused only; a bool ``[R]`` mask): the rows whose new state is needed, the others' undefined.
        ``keep`` (fused only; ``(dst, mask)``): the marked rows of the new state also written into ``dst``."""
        if keep is not None and not self.fused:
            raise ValueError("keep: only the fused reference writes kept rows (the captured execution's kept rows)")
        prep = {k: v[i] for k, v in self.v.items()}
        if (rows is not None or keep is not None) and self.fused:
            y, new = self.advance(st, prep, self.params, rows=rows, keep=keep)
        else:
            y, new = self.advance(st, prep, self.params, **self.kw)
        if y_out is not None:
            y_out.copy_(y)
        return new

    def step_magnitude(self, st: torch.Tensor, i: int, y_out: torch.Tensor, tok: dict, scaled: bool,
                       keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` and ``runner.readout_magnitude`` of the new state (``tok``: the token, fp64;
        ``scaled``: per-row scaled states), from the fused pass's readout products where the family
        writes them (``Family.reference_advance_magnitude``: the same bits)."""
        if not self.products or scaled:
            new = self.step(st, i, y_out, keep=keep)
            return new, readout_magnitude(self.fam, new, tok, self.params, scaled)
        prep = {k: v[i] for k, v in self.v.items()}
        y, new, mag = self.fam.reference_advance_magnitude(st, prep, self.params, keep=keep)
        y_out.copy_(y)
        return new, mag


class CapturedExecution:
    """The engine's side of the captured execution (see the module docstring), for a subclass that
    provides: ``ls`` (the orchestrator: a Lockstep), ``R``, ``T``, ``dev``, the chunk's fixed buffers
    (``inb_v``, ``out``/``out_v``, ``ref_out``/``ref_out_v``, ``rel``/``rel_v``, ``acc``/``acc_v``,
    ``sel_v``, ``sel_rows``, ``y_v``, ``live_v``; with a bound ``tok_v``, ``tok_buf``, ``mag``/``mag_v``,
    ``w_buf``, ``coef_buf``, ``fp_out``, ``walk``, ``flush_mask``, ``bound``, ``bound_buf``), the reference
    (``ref``: a :class:`ChunkReference`), the flags (``raw``, ``graphs``, ``spec``, ``fused``, ``hoist``,
    ``host_bound``, ``live_rows``, ``capture``), the graph cache (``cache``, ``seen``, ``pool``,
    ``max_graphs``, ``replays``, ``capture_error``), ``idx_cache``, ``plans``, ``chunk_at``, ``checked``,
    ``steps_done`` (the steps run) and ``_piece_static`` (a block's static piece)."""

    def __init__(self, ls, chunk: int, spec: bool, *, graphs: bool | None = None, static: bool = False,
                 fused: bool | None = None, hoist: bool | None = None, checked: int = 0) -> None:
        """The fixed buffers of ``chunk`` steps of the orchestrator ``ls`` (``spec``: a speculative
        schedule); ``graphs``, ``static``, ``fused``, ``hoist``: as ``FastCell``'s; ``checked``: the steps
        whose outputs were checked already."""
        sc = ls.sc
        self.spec = spec
        self.ls, self.sc, self.dev = ls, sc, ls.device
        self.K, self.R, self.T = chunk, sc.rows, sc.window
        self.raw = raw_path(ls.kernel)
        can_graph = self.dev.type == "cuda" and self.raw
        if graphs and not can_graph:
            raise ValueError("graphs: CUDA graphs need a CUDA device and a kernel with a raw launch path "
                             "(launch_verify/launch_commit)")
        self.capture = can_graph if graphs is None else bool(graphs)
        self.graphs = self.capture or static  # fixed buffers, several steps per piece
        # a speculative piece is mostly one step (some row flushes at almost every verify): a graph per
        # (chunk step, shadow flag, flush measured, re-seeded), and per (start, length) for the runs of steps
        # without a flush.  The keys of a spec-random cell of 10^6 tokens at 8 rows, chunks of 64
        # (tools/drift_graph_keys.py, the host logic alone): 526 in 50,156 steps; with room for 4 per chunk step
        # (256) 3.7 % of the pieces ran eagerly, with 8 per step (512) 1.2 %, the first occurrences.  (One step
        # a piece, so that every key fits in 4 per step, was tried: 97 % replays, but it ran no faster on an
        # H100.)
        self.max_graphs = max(MAX_GRAPHS, 8 * self.K) if self.spec else MAX_GRAPHS
        g = ls.resolved.geometry
        K, R, T, dev = self.K, self.R, self.T, self.dev
        act = ls.resolved.mode.act_dtype
        self.names = list(g.input_shapes())
        self.inb = {n: torch.empty((K, R, T, *s), dtype=act, device=dev) for n, s in g.input_shapes().items()}
        self.out = torch.empty((K, R, T, *ls.kernel.out_shape), dtype=act, device=dev)
        self.ref_out = torch.empty((K, R, T, *ls.kernel.out_shape), dtype=torch.float64, device=dev)
        self.rel = torch.empty((K, R, T), dtype=torch.float64, device=dev)
        self.acc = torch.empty((K, R), dtype=torch.int64, device=dev)
        self.sel = torch.empty((K, T, R), dtype=torch.bool, device=dev)
        self.inb_v = {n: b.unbind(0) for n, b in self.inb.items()}
        self.out_v, self.ref_out_v, self.rel_v, self.acc_v = (b.unbind(0) for b in (self.out, self.ref_out, self.rel,
                                                                                    self.acc))
        self.y_v = [self.ref_out[j][:, t] for j in range(K) for t in range(T)]
        state_dims = len(g.state_shape)
        self.sel_v = [self.sel[j, t].view(R, *([1] * state_dims)) for j in range(K) for t in range(T)]
        self.sel_rows = [self.sel[j, t] for j in range(K) for t in range(T)]  # [R] each (copy_rows' masks)
        self.arange_T = torch.arange(1, T + 1, device=dev).view(1, T, 1)
        # the fused fp64 step computes the default conventions only (a declared one: the plain step)
        self.fused = (dev.type == "cuda" and ls.conv.is_default) if fused is None else bool(fused)
        self.hoist = self.fused and dev.type == "cuda" if hoist is None else bool(hoist)
        if self.hoist and not self.fused:
            raise ValueError("hoist: the hoisted chunk terms are taken by the fused reference step (fused=True)")
        self.ref = ChunkReference(ls.resolved.family, K * T, ls.ref_params, ls.conv, self.fused, self.hoist)
        self.raw_ck = raw_checkpoint(ls.kernel)
        self.acc_host = np.zeros((K, R), dtype=np.int64)  # the chunk's accepted counts
        self.flush_mask = torch.zeros((K, R), dtype=torch.bool, device=dev)  # rows each step flushes
        self.idx_cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.bound = ls.bound  # the fp64 running-error bound (None: the family gives no error model)
        if self.bound is not None:
            self.tok_buf = {n: torch.empty((K * T, R, *s), dtype=torch.float64, device=dev)
                            for n, s in g.input_shapes().items()}
            self.tok_v = [{n: b[i] for n, b in self.tok_buf.items()} for i in range(K * T)]
            self.mag = torch.empty((K, R, T, 1), dtype=torch.float64, device=dev)  # readout magnitude maxima
            self.mag_v = [self.mag[j, :, t, 0] for j in range(K) for t in range(T)]
            self.w_buf = None  # the bound's output weights per token [K T, R, H] (RunningBound.weights)
            self.fp_out = torch.empty((K, R, T), dtype=torch.float64, device=dev)  # the bound on each output
            self.walk = torch.ones((K, R), dtype=torch.float64, device=dev)  # the rule's sr_walk at the step
            self.coef_buf = None  # the bound's token coefficients [K T, R, H] (RunningBound.coefficients)
            # eagerly on a CPU the window runs on host arrays (checks/fp64_bound_host.py: the same bits), from
            # the coefficients computed at chunk load token by token (the window's shapes)
            self.host_bound = not self.graphs and dev.type == "cpu"
            if self.graphs:  # the bound's running state on fixed buffers (what a graph reads and writes)
                self.bound_state = torch.stack([self.bound.cur[k] for k in BOUND_KEYS])
                self.bound_buf = dict(zip(BOUND_KEYS, self.bound_state.unbind(0)))
                self.bound_consts = self.bound.scan_constants(dev)
        self.chunk_at = None  # first step of the chunk in the buffers
        self.cache: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.seen: Counter = Counter()
        self.pool = None
        self.replays = 0
        self.capture_error: str | None = None
        self.inputs_at = None  # first step of the chunk whose inputs are in the buffers
        self.checked = checked  # steps before this one had their outputs checked
        # A speculative piece's fused shadow steps compute only the rows whose shadow is read: those armed
        # (to measure a flush's error) that still have the token (accepted > t); [0]: the step's rows armed
        # before its flush, [1]: after it (the re-seed's advance).  Filled by the host per piece, like
        # flush_mask; the other rows' shadow is re-seeded from the checkpoint before it is ever read.
        self.live_rows = self.graphs and self.spec and self.fused
        if self.live_rows:
            self.live = torch.zeros((2, K, T, R), dtype=torch.bool, device=dev)
            self.live_v = [[self.live[w, j, t] for j in range(K) for t in range(T)] for w in range(2)]

    def _load_block(self, plans: list, walk=None) -> None:
        """The input side of a block of steps (``plans``, at most ``K``): inputs, accepted counts (host and
        device), the window masks, the reference's and the bound's token terms; ``walk()``: the host's work
        on the accepted counts (``acc_host``), run before the device copies are queued."""
        n, T, R = len(plans), self.T, self.R
        gen = make_inputs_steps(self.ls.resolved.inputs, [p.step for p in plans], self.dev)
        for name, b in self.inb.items():
            b[:n].copy_(gen[name])
        self.acc_host[:n] = np.array([p.accepted for p in plans], dtype=np.int64)
        if walk is not None:
            walk()
        acc = self._pinned(torch.from_numpy(self.acc_host[:n].copy()))
        self.acc[:n].copy_(acc, non_blocking=True)  # asynchronous: no host sync per chunk for it
        torch.eq(self.acc[:n, None, :], self.arange_T, out=self.sel[:n])
        tok = {name: v[:n].transpose(1, 2).reshape(n * T, R, *v.shape[3:]).to(torch.float64)
               for name, v in self.inb.items()}
        self.ref.load(tok, n * T)
        if self.bound is not None:
            for name, b in self.tok_buf.items():
                b[:n * T].copy_(tok[name])
            # the output weights of the whole chunk's tokens in one readout (they depend on the tokens
            # alone): the bound's window reads them instead of two readouts per token
            w = self.bound.weights({k: v[:n * T] for k, v in self.tok_buf.items()}, self.ls.ref, self._readout)
            if self.w_buf is None:
                self.w_buf = torch.empty((self.K * T, *w.shape[1:]), dtype=w.dtype, device=w.device)
            self.w_buf[:n * T].copy_(w)
            if self.graphs or self.host_bound:
                self._load_coefficients(n * T)

    def _load_coefficients(self, nt: int) -> None:
        """The bound's coefficients of the chunk's ``nt`` tokens (they depend on the tokens alone): in one
        call on a GPU with ``hoist`` (whose elementwise math does not depend on the tensor's shape), else
        token by token, on the shapes the slow path's window gives them (so the same bits on a CPU)."""
        R, params = self.R, self.ls.ref_params
        if self.hoist:
            flat = {k: v[:nt].reshape(nt * R, *v.shape[2:]) for k, v in self.tok_buf.items()}
            coef = {k: v.view(nt, R, -1) for k, v in self.bound.coefficients(flat, params).items()}
        else:
            per = [self.bound.coefficients(tok, params) for tok in self.tok_v[:nt]]
            coef = {k: torch.stack([c[k] for c in per]) for k in per[0]}
        if self.coef_buf is None:
            self.coef_buf = {k: torch.empty((self.K * self.T, *v.shape[1:]), dtype=v.dtype, device=v.device)
                             for k, v in coef.items()}
        for k, v in coef.items():
            self.coef_buf[k][:nt].copy_(v)

    def _advance(self, st: torch.Tensor, j: int, k: np.ndarray, static: bool = False, live: int | None = None
                 ) -> torch.Tensor:
        """``CellRun._advance_shadow``: ``st`` over each row's ``k`` accepted tokens of chunk step ``j``
        (``static``: the same values by device masks alone, what a graph captures for any ``k``, written
        into ``st`` itself -- a fixed buffer -- and returned; ``live``: which of ``self.live``'s masks names
        the rows to compute, the others' results undefined)."""
        new = st
        fuse = static and self._fuse_keep(new)
        for t in range(self.T if static else int(k.max())):
            rows = None if live is None else self.live_v[live][j * self.T + t]
            keep = (new, self.sel_rows[j * self.T + t]) if fuse else None
            st = self.ref.step(st, j * self.T + t, None, rows, keep=keep)
            if not fuse:
                new = self._keep(new, st, j, t, k, static)
        return new

    def _fuse_keep(self, new: torch.Tensor) -> bool:
        """Whether the fused reference step writes the kept rows into ``new`` itself (a contiguous fp64 buffer
        of the fixed pieces), where :meth:`_keep` copies them after the step: the same values, a pass fewer."""
        return self.fused and new.dtype == torch.float64 and new.is_contiguous()

    def _keep(self, new: torch.Tensor, st: torch.Tensor, j: int, t: int, k: np.ndarray, static: bool) -> torch.Tensor:
        """``st`` where a row accepted ``t + 1`` tokens at chunk step ``j``, else ``new``: by the host's
        ``k`` (the fewest launches), or (``static``) always by the device mask ``sel``, the selected rows
        copied into ``new`` in place (``new``: the piece's fixed buffer; a row is read and written at the
        one token it keeps, where ``torch.where`` made three state-sized passes per token) -- the same
        values (both move them exactly) with no host decision baked into a captured graph."""
        if static:
            if can_copy_rows(new, st):
                return copy_rows(new, st, self.sel_rows[j * self.T + t])
            return torch.where(self.sel_v[j * self.T + t], st, new)
        hit = k == t + 1
        if hit.all():
            return st
        if hit.any():
            return torch.where(self.sel_v[j * self.T + t], st, new)
        return new

    def _rel(self, out: torch.Tensor, ro: torch.Tensor, dst: torch.Tensor, exact: bool) -> None:
        rel_l2_into(out, ro, dst, exact=exact)

    def _device_step(self, j: int, ref: torch.Tensor, shadow: torch.Tensor | None, k: np.ndarray, s: int):
        """Verify + commit chunk step ``j``, the fp64 reference window, the output error; the shadow
        advanced when given.  Returns (reference state, shadow)."""
        ls, kern, T = self.ls, self.ls.kernel, self.T
        inputs = {n: v[j] for n, v in self.inb_v.items()}
        out = self.out_v[j]
        if self.raw:
            kern.launch_verify(ls.ids, inputs, out)
            kern.launch_commit(ls.ids, self.acc_v[j])
        else:
            ret = kern.verify(ls.ids, inputs, out=out)
            if ret is not out and ret is not None:
                ls.fail(s, "out-param", "verify returned a new tensor instead of writing into out=")
                out.copy_(ret)
            kern.commit(ls.ids, self.acc_v[j])
        st, new = ref, ref
        static = self.graphs and self.spec
        fuse = static and self._fuse_keep(new)
        for t in range(T):
            keep = (new, self.sel_rows[j * T + t]) if fuse else None
            if self.bound is None:
                st = self.ref.step(st, j * T + t, self.y_v[j * T + t], keep=keep)
            else:  # with Lockstep._reference_window's readout magnitude, its maximum
                st, mag = self.ref.step_magnitude(st, j * T + t, self.y_v[j * T + t], self.tok_v[j * T + t],
                                                  self.ls.resolved.mode.scaled_state, keep=keep)
                self.mag_v[j * T + t].copy_(mag.flatten(1).amax(-1))
            if not fuse:
                new = self._keep(new, st, j, t, k, static)
        self._rel(out, self.ref_out_v[j], self.rel_v[j], exact=False)
        if shadow is not None:
            shadow = self._advance(shadow, j, k, static=self.graphs and self.spec, live=0 if self.live_rows else None)
        return new, shadow

    def _run_graphed(self, j0: int, flags: tuple[bool, ...], ks: list[np.ndarray], ss: list[int],
                     reseed: bool = False, measure: bool = False) -> None:
        key = (j0, flags, reseed, measure)
        g = self.cache.get(key)
        if g is None and self.capture and self.seen[key] and len(self.cache) < self.max_graphs:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self._piece_static(j0, flags, ks, ss, reseed, measure)
            except RuntimeError as e:  # nothing ran during the capture: go on eagerly, say why
                self.capture, g = False, None
                self.capture_error = f"{type(e).__name__}: {e}"
            else:
                self.pool = self.pool or g.pool()
                self.cache[key] = g
        self.seen[key] += 1
        if g is None:
            self._piece_static(j0, flags, ks, ss, reseed, measure)
        else:
            g.replay()
            self.replays += 1

    def _bound_step(self, j: int, flush_rows: list[int]) -> None:
        """What ``Lockstep.step`` does for the bound at chunk step ``j`` (before its cursors move):
        count the flushes (the tolerance rule's envelope) and, eagerly, advance the running bound over
        the window (with graphs the piece did)."""
        ls = self.ls
        # (with a bound, the step's flush mask -- what the rows listed are -- in one device op: the same counts)
        ls.count_flushes(flush_rows, None if self.bound is None else self.flush_mask[j])
        if self.bound is None:
            return
        if self.host_bound:
            self._bound_advance_host(j, flush_rows)
        elif not self.graphs:
            self._bound_advance(j, ls.ref)
        if ls.rule.sr_envelope:  # otherwise the walk is 1 (filled once)
            self.walk[j].copy_(ls.rule.sr_walk(ls.active_idx))

    def _bound_advance(self, j: int, like: torch.Tensor) -> None:
        """``Lockstep._bound_window`` for chunk step ``j`` (flush rows in ``flush_mask[j]``, accepted
        counts in ``acc[j]``; ``like``: a state, for its shape), its output bound into ``fp_out[j]``."""
        ls, T, spec = self.ls, self.T, self.ls.dec.speculative
        # no padding rows on the fast path: standard decode keeps every row's one token
        fp = self.bound.window(self.tok_v[j * T:(j + 1) * T], ls.ref_params, self.flush_mask[j], spec,
                               self.acc_v[j] if spec else None, like, self._readout,
                               weights=self.w_buf[j * T:(j + 1) * T], outputs_only=True)
        self.fp_out[j].copy_(fp["output"])

    def _bound_advance_host(self, j: int, flush_rows: list[int]) -> None:
        """:meth:`_bound_advance` on host arrays (a CPU: :func:`window_outputs`, the same bits)."""
        T, spec = self.T, self.ls.dec.speculative
        coef = {k: v[j * T:(j + 1) * T].numpy() for k, v in self.coef_buf.items()}
        flush = np.zeros(self.R, dtype=bool)
        flush[flush_rows] = True
        fp = window_outputs(self.bound, coef, self.w_buf[j * T:(j + 1) * T].numpy(), flush, spec,
                            self.acc_host[j] if spec else None)
        self.fp_out[j].copy_(torch.from_numpy(fp))

    def _readout(self, s_abs: torch.Tensor, tok: dict) -> torch.Tensor:
        """``Lockstep._bound_window``'s readout magnitude (of a state of bound values)."""
        return readout_magnitude(self.ls.resolved.family, s_abs, tok, self.ls.ref_params, False)

    def _keep_bound_static(self) -> None:
        """The bound's running state into its fixed buffers (after a resume replaced it)."""
        for k, v in self.bound.cur.items():
            if v is not self.bound_buf[k]:
                self.bound_buf[k].copy_(v)
        self.bound.cur = self.bound_buf

    def _over_bound(self, a: int, b: int) -> torch.Tensor | None:
        """Chunk steps ``a..b-1`` (offsets from ``a``) where some output error exceeds the fp64
        bound: ``output_tolerance``'s bound, batched over the steps (the same elementwise bits); a device mask
        over the steps, None without a bound."""
        if self.bound is None or b <= a:
            return None
        rule = self.ls.rule
        m = error_metrics(self.out[a:b], self.ref_out[a:b], rule.u_out, lead=3)
        scale = torch.maximum(m["ref_max"], self.mag[a:b].flatten(3).amax(-1)).amax(-1, keepdim=True)
        bnd = self.fp_out[a:b] + rule.tol.floor_u * rule.u_out * scale * self.walk[a:b][:, :, None]
        return (m["max_abs"] > bnd).flatten(1).any(1)

    @staticmethod
    def _all_rows(rows: list[int], t: torch.Tensor) -> bool:
        return len(rows) == t.shape[0] and rows == list(range(t.shape[0]))

    def _take(self, t: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """``t``'s rows ``rows``: ``t`` itself when they are all of its rows in order (the same values, no
        gather of a whole state), else an index_select."""
        return t if self._all_rows(rows, t) else t.index_select(0, self._idx(rows))

    def _idx(self, rows: list[int]) -> torch.Tensor:
        """``rows`` as a device index tensor, made once per distinct list (no host copy per use)."""
        key = tuple(rows)
        t = self.idx_cache.get(key)
        if t is None:
            t = torch.tensor(rows, device=self.dev)
            if len(self.idx_cache) < MAX_INDEX_LISTS:
                self.idx_cache[key] = t
        return t

    def _check_outputs(self) -> None:
        """Lockstep's exact output checks for the steps run since the last call, element by element
        only where a step's output error is not finite (an unwritten or non-finite output)."""
        lo, hi = self.checked, self.steps_done
        if hi <= lo:
            return
        a, b = lo - self.chunk_at, hi - self.chunk_at
        masks = [~torch.isfinite(self.rel[a:b]).flatten(1).all(1)]
        over = self._over_bound(a, b)
        if over is not None:
            masks.append(over)
        flagged = torch.stack(masks).cpu().numpy()  # the host's one wait for the chunk's checks
        nonfinite = set(np.flatnonzero(flagged[0]).tolist())
        for j in sorted(nonfinite | set(np.flatnonzero(flagged[1:].any(0)).tolist())):
            out, ro = self.out_v[a + j], self.ref_out_v[a + j]
            if j in nonfinite:
                self._rel(out, ro, self.rel_v[a + j], exact=True)
            self._output_failures(self.plans[lo + j], out, ro, a + j)
        self.checked = hi

    def _output_failures(self, plan, out: torch.Tensor, ref_out: torch.Tensor, j: int) -> None:
        """The engine's own after-verify checks of every step (unwritten-output, non-finite, output against
        the fp64 bound, ...) on one flagged step, chunk step ``j`` (no literal model, no padding rows on the
        fast path), through the orchestrator's hook runner, as ``Lockstep.step`` runs them."""
        ctx = StepContext(run=self.ls, plan=plan, inputs={}, flush_rows=[], out=out, ref_out=ref_out)
        if self.bound is not None:
            ctx.metrics = error_metrics(ctx.o_act, ref_out.index_select(0, self.ls.active_idx), self.ls.rule.u_out,
                                        lead=2)
            ctx.ref_magnitude, ctx.walk = self.mag[j], self.walk[j]
            ctx.fp64 = {"output": self.fp_out[j]}
        self.ls.run_checks("after-verify", ctx, EVERY_STEP)

    def _pinned(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor for an asynchronous copy: pinned on a CUDA device (the caching host allocator
        keeps the block until the copy has run), where a pageable one would wait for the device."""
        return t.pin_memory() if self.dev.type == "cuda" else t


__all__ = ["CapturedExecution", "EVERY_STEP", "MAX_INDEX_LISTS", "ChunkReference", "raw_checkpoint", "raw_path"]
