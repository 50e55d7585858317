"""The one kernel-under-test interface, and the argument checks every kernel shares.

A kernel under test is a stateful object owning the per-slot state of one layer for
``num_slots`` sequences.  Each decode step is

    out = kernel.verify(slot_ids, inputs)   # outputs for every window position
    kernel.commit(slot_ids, accepted)       # k accepted tokens per row, 1 <= k <= T'

Standard (autoregressive) decode is ``verify`` with T' = 1 followed by ``commit(1)``.
``slot_ids[r] = -1`` marks a padding row: its outputs and every slot not named are untouched, and
its ``accepted[r]`` is garbage (any integer: serving engines leave it so) that commit ignores.
Every tensor handed to ``verify`` and ``commit`` is read-only; an accepted count out of range on
an active row is refused (``ValueError`` naming ``accepted[r]``) before anything changes.

What a kernel declares, as class attributes (the engine tests each declared behaviour):

* ``zero_accept`` ``"refuse"`` (default) | ``"noop"``: what ``commit`` does with k = 0 (every
  draft rejected, bonus token included: constrained decoding).  ``"refuse"``: ``ValueError``
  naming ``accepted[r]`` before anything changes.  ``"noop"`` (speculative decode only): the
  commit changes nothing (checkpoint, ring, cursors; a flush verify's fold is kept, so the
  cursors move by the policy's rule with k = 0).  ``"staged"`` (speculative only): a flush verify
  computes its fold but leaves the checkpoint as it was (the fold is staged); commit(k >= 1)
  applies it and moves the cursors by the policy's rule, commit(0) discards it: checkpoint,
  scales and cursors stay exactly as they were before the verify (the engine judges the
  checkpoint of a flush after the commit, on the rows with k >= 1; the ``staged-fold`` check).
* ``fold_at`` ``"flush"`` (default) | ``"next-verify"``: where the fold a flush needs lands
  (speculative decode; standard decode and the policies with no flushing verify, whose commit
  folds, fold as their rule says and refuse ``"next-verify"``).  ``"flush"``: the flush verify
  folds the committed history into the checkpoint (the spec).  ``"next-verify"`` (ROCm/ATOM): the
  flush verify computes its outputs from checkpoint + history + window and leaves the checkpoint
  as it was; its commit(k) only moves the cursors by the policy's rule (k = 0 too under
  ``"noop"``), so between that commit and the slot's next verify the checkpoint is the unfolded
  one and the ring still holds the history the flush should have folded (the ``n`` = write_pos
  records before the verify, behind the new origin: a caller must not touch them).  The next
  verify of the slot first folds those ``n`` records into the checkpoint (and its scales), then
  runs as its own write_pos says (a flush again defers its own fold).  ``committed_state`` is the
  correct committed state at every moment (the deferred fold included); ``checkpoint_state``
  (and the snapshot) the stored, not yet folded checkpoint.  ``reset`` drops a deferred fold.
  The engine judges a deferred fold's checkpoint after the next verify of the slot against the
  flush's reference (the at-flush checks, with the flush's window and storage), and lets exactly
  that verify rewrite the checkpoint (``checkpoint-unchanged``).  A home of its own, not a
  ``zero_accept`` value: the timing of the fold is orthogonal to what commit(0) does (a
  next-verify kernel may refuse k = 0 or accept it as ``"noop"``), while ``"staged"`` is
  defined by commit(0) discarding the fold and cannot be combined with it (refused).
* ``supports_ragged_windows`` (default False): ``verify(..., window_lens=L)`` with ``L[r]`` in
  1..T' (T' = ``decode.window`` is then T'max) in the padded ``[R, T'max]`` layout: row r's
  positions ``L[r]..T'max-1`` of the inputs are padding (any values) and of the outputs must stay
  untouched; the following ``commit`` accepts ``1 <= k <= L[r]`` (0 with ``zero_accept="noop"``).
  A row with ``L[r] = 1`` is a non-speculative step of that sequence inside the batch.
* ``bookkeeping`` (default ``"spec"``): the cursor policy, a name of :data:`POLICIES`; the
  engine builds the kernel's ``DecodeConfig`` with it and checks every invariant against it.
  Under ``"host-cursors"`` the kernel keeps no cursors: the caller owns a ``[num_slots, 2]``
  table of (write_pos, origin) per slot, advances it by the `spec` policy's rule after each commit, and
  passes it as ``cursors=`` to every ``verify`` and ``committed_state``.
* ``supports_packed_layout`` (default False): ``verify(..., query_start_loc=Q)`` takes the
  packed layout of serving engines: every input ``[N, ...]`` holds the rows' tokens back to back,
  row r's at ``Q[r]..Q[r+1]-1`` (``Q`` ``[R+1]`` integers, ``Q[0] = 0``; ``Q[r+1] - Q[r]`` is T'_r
  in 1..T' for an active row, 0 for a padding row; ``Q[R] <= N``), the outputs ``[N, *out_shape]``
  the same way; tokens ``Q[R]..N-1`` (the spare tail of a buffer padded to a fixed size) are
  padding, their outputs untouched.
* ``supports_strided_views`` (default False): ``verify`` and ``commit`` take their tensors as an
  engine hands them over: each input a strided slice of a wider buffer (vLLM's split of a fused
  projection), ``slot_ids`` a column of a 2-D block table (``block_table[:, 0]``, stride > 1),
  ``accepted`` a column too, ``out`` a view whose gaps belong to someone else (the engine checks
  them unchanged: ``view-gaps``).  A kernel that does not declare it refuses any of them that is
  not contiguous, naming the tensor and its strides.
* ``supports_materialize`` (default False): ``materialize(slot_ids, upto, dst_slot_ids)`` publishes,
  for each active row, the state of its slot after the checkpoint and the first ``upto[r]``
  tokens of its committed history (``0 <= upto[r] <= write_pos``) into slot ``dst_slot_ids[r]`` as
  a freshly admitted sequence (checkpoint in the declared format, write_pos 0, origin 0): what
  prefix caches do (FlashInfer ``replayssm_materialize``, vLLM RecoverSSM
  ``boundary_state_indices``, SGLang ``force_flush``).  The source slots and every slot not named
  stay bit-identical; destinations are distinct, not a source, in range.
* ``supports_mixed_decode`` (default False; speculative kernels that also declare standard
  decode): a slot moves between standard and speculative steps (a request whose drafting is
  switched off and on): a verify whose inputs have one token (``[R, 1, ...]``) is a standard step
  on the speculative kernel object, committed with k = 1; it keeps the slot's ring and its
  bookkeeping policy's rule (the hand-over rule: a standard step is a speculative step of window
  length 1, the flush decided with the kernel's T').

Besides the step calls a kernel exposes, for invariant checks: ``committed_state`` (the state
after the committed prefix, materialised, fp64), ``checkpoint_state`` (the stored checkpoint,
dequantised, fp64) and ``snapshot`` (raw copies of checkpoint, buffer/ring records and cursors).
The bookkeeping rules (docs/recurrences.md sections 2-4) are in :class:`DecodeConfig`.

docs/kernel_interface.md walks through plugging in a kernel.
"""

from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch

from replayssm.conventions import DEFAULT, Conventions
from replayssm.precision import PrecisionMode, parse_mode


class Geometry(Protocol):
    """What every family's geometry (a frozen dataclass with a ``family`` field) provides:
    ``state_shape`` per slot, ``out_shape`` per token, per-token ``input_shapes()`` and
    ``param_shapes()``, and ``to_dict()`` (rebuilt by ``replayssm.families.geometry_from_dict``)."""

    family: str

    @property
    def state_shape(self) -> tuple[int, ...]: ...

    @property
    def out_shape(self) -> tuple[int, ...]: ...

    def input_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def param_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def to_dict(self) -> dict: ...


PAD_SLOT = -1
DECODES = ("standard", "speculative")
ZERO_ACCEPT = ("refuse", "noop", "staged")
FOLD_AT = ("flush", "next-verify")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class BookkeepingPolicy(abc.ABC):
    """A cursor policy: when a verify flushes, what the flush folds, where the records go and how
    commit moves the cursors.  Every method takes the :class:`DecodeConfig` it runs under.  The
    engine's invariants (cursor, flush detection, checkpoint unchanged on a non-flush verify,
    committed ring rows, the checkpoint at a flush) ask the policy, never a hard-coded rule."""

    name = ""
    description = ""
    host_owned = False  # the caller owns the cursors and passes them (``cursors=``)

    @abc.abstractmethod
    def uses_ring(self, dec: DecodeConfig) -> bool:
        """Whether record rows are addressed ``(origin + p) mod ring_rows`` (else linear, origin 0)."""

    @abc.abstractmethod
    def lspec(self, dec: DecodeConfig) -> int:
        """The logical threshold (B + T' for a ring, L for a linear buffer)."""

    @abc.abstractmethod
    def ring_rows(self, dec: DecodeConfig) -> int:
        """Physical record rows per slot."""

    @abc.abstractmethod
    def is_flush(self, dec: DecodeConfig, write_pos: int) -> bool:
        """Whether the next verify at ``write_pos`` is a flush."""

    @abc.abstractmethod
    def max_write_pos(self, dec: DecodeConfig) -> int:
        """Largest valid committed history length before a verify."""

    @abc.abstractmethod
    def flush_folds_first(self, dec: DecodeConfig) -> bool:
        """Whether a flush's checkpoint includes window position 0 (else: the history only)."""

    @abc.abstractmethod
    def commit_cursor(self, dec: DecodeConfig, write_pos: int, origin: int, flushed: bool, k: int) -> tuple[int, int]:
        """Cursors ``(write_pos, origin)`` after commit(k)."""

    def checkpoint_moves_at_commit(self, dec: DecodeConfig) -> bool:
        """Whether commit may rewrite the checkpoint (fold-every-commit)."""
        return False


class SpecPolicy(BookkeepingPolicy):
    """Spec sections 3-4: standard decode runs a linear buffer of L records (flush at write_pos
    L-1 folds L-1 records + the current token); speculative decode a ring of next_pow2(B + T')
    rows (flush when write_pos + 2 T' > B + T', folding the history; origin moves)."""

    name = "spec"
    description = ("docs/recurrences.md sections 2-4 (standard: linear buffer, flush at L-1; speculative: ring, "
                   "flush at wp + 2T' > B + T')")

    def uses_ring(self, dec):
        return dec.speculative

    def lspec(self, dec):
        return dec.buffer + dec.window if dec.speculative else dec.buffer

    def ring_rows(self, dec):
        return next_pow2(self.lspec(dec)) if dec.speculative else dec.buffer

    def is_flush(self, dec, write_pos):
        if dec.speculative:
            return write_pos + 2 * dec.window > self.lspec(dec)
        return write_pos == dec.buffer - 1

    def max_write_pos(self, dec):
        return dec.buffer if dec.speculative else dec.buffer - 1

    def flush_folds_first(self, dec):
        return not dec.speculative

    def commit_cursor(self, dec, write_pos, origin, flushed, k):
        if not dec.speculative:
            return (0 if flushed else write_pos + 1), 0
        if flushed:
            return k, (origin + write_pos) % self.ring_rows(dec)
        return write_pos + k, origin


class RingLayout:
    """The record layout of a policy that rings every decode: rows ``(origin + p) mod
    next_pow2(B + T')`` (standard decode with T' = 1 and B = L)."""

    def uses_ring(self, dec):
        return True

    def lspec(self, dec):
        return dec.buffer + dec.window

    def ring_rows(self, dec):
        return next_pow2(self.lspec(dec))


class FlushWhenFullPolicy(RingLayout, SpecPolicy):
    """The speculative rule for every decode: standard decode is the speculative rule with
    T' = 1 and B = L: a ring of next_pow2(L + 1) rows, the flush when the history is full
    (write_pos = L) folds the history only, the window token is written, then write_pos = 1 and
    the origin moves by L.  Speculative decode: the `spec` rule unchanged."""

    name = "flush-when-full"
    description = "standard decode as the speculative rule with T' = 1 (flush when L records are held)"

    def is_flush(self, dec, write_pos):
        return write_pos + 2 * dec.window > self.lspec(dec)

    def max_write_pos(self, dec):
        return dec.buffer

    def flush_folds_first(self, dec):
        return False

    def commit_cursor(self, dec, write_pos, origin, flushed, k):
        if flushed:
            return k, (origin + write_pos) % self.ring_rows(dec)
        return write_pos + k, origin


class FoldEveryCommitPolicy(BookkeepingPolicy):
    """No history: every commit folds the accepted prefix of the window into the checkpoint; the
    window's records go to rows 0..T'-1, write_pos is 0 before every verify, no verify flushes."""

    name = "fold-every-commit"
    description = "the checkpoint absorbs every accepted prefix at commit (write_pos always 0)"

    def uses_ring(self, dec):
        return False

    def lspec(self, dec):
        return dec.window

    def ring_rows(self, dec):
        return dec.window

    def is_flush(self, dec, write_pos):
        return False

    def max_write_pos(self, dec):
        return 0

    def flush_folds_first(self, dec):
        return False

    def commit_cursor(self, dec, write_pos, origin, flushed, k):
        return 0, 0

    def checkpoint_moves_at_commit(self, dec):
        return True


class HostCursorsPolicy(SpecPolicy):
    """The spec's rule (sections 3-4), with the cursors owned by the caller: the kernel keeps no
    write_pos / origin of its own; the caller keeps a ``[num_slots, 2]`` table (write_pos, origin),
    sets it at reset, advances it by the `spec` policy's rule after each commit and passes it as
    ``cursors=`` to ``verify`` and ``committed_state`` (what a serving engine holding the cursors
    in its own metadata does).  A kernel's snapshot reports the caller's cursors."""

    name = "host-cursors"
    description = ("docs/recurrences.md sections 2-4 with the cursors owned by the caller (passed as cursors= to "
                   "verify / committed_state)")
    host_owned = True


class FoldAtCommitPolicy(RingLayout, BookkeepingPolicy):
    """No verify flushes: verify reads the checkpoint + the committed history and writes its
    window's records at logical positions write_pos..write_pos+T'-1 of a ring of next_pow2(B + T')
    rows; commit(k) sets write_pos += k and, when write_pos + 2 T' > B + T', folds the whole
    committed history (the accepted prefix included) into the checkpoint, moves the origin by
    write_pos and sets write_pos = 0 (SGLang's serving path: ``launch_mode="verify"`` +
    ``commit_gdn_replayssm_circular``).  With B = T' the rule folds after every commit with k > 0
    while the ring base keeps moving (SGLang's ``fold_every_commit`` for 16-bit checkpoints)."""

    name = "fold-at-commit"
    description = "verify never flushes; commit folds the committed history when write_pos + 2T' > B + T'"

    def is_flush(self, dec, write_pos):
        return False

    def max_write_pos(self, dec):
        return dec.buffer - dec.window

    def flush_folds_first(self, dec):
        return False

    def commit_cursor(self, dec, write_pos, origin, flushed, k):
        held = write_pos + k
        if held + 2 * dec.window > self.lspec(dec):
            return 0, (origin + held) % self.ring_rows(dec)
        return held, origin

    def checkpoint_moves_at_commit(self, dec):
        return True


POLICIES: dict[str, BookkeepingPolicy] = {p.name: p for p in (SpecPolicy(), FlushWhenFullPolicy(),
                                                              FoldEveryCommitPolicy(), HostCursorsPolicy(),
                                                              FoldAtCommitPolicy())}


def policy(name: str) -> BookkeepingPolicy:
    """The bookkeeping policy called ``name``; ValueError naming the known ones."""
    if not isinstance(name, str) or name not in POLICIES:
        raise ValueError(f"policy: expected one of {sorted(POLICIES)}, got {name!r}")
    return POLICIES[name]


@dataclass(frozen=True)
class DecodeConfig:
    """How a kernel's buffer is run: decode kind, window T' (T'max with ragged windows), buffer,
    and the bookkeeping ``policy`` (a name of :data:`POLICIES`, default the spec's rule).

    Under ``spec``:

    * ``standard``: window 1, linear buffer of ``buffer`` = L records; ``write_pos = step mod L``;
      the step with ``write_pos == L - 1`` is the flush (folds L-1 records + the current token).
    * ``speculative``: window T' = ``window``; history block B = ``buffer`` >= T'; logical
      threshold ``Lspec = B + T'``; ring of ``next_pow2(Lspec)`` rows; row of logical position p
      is ``(origin + p) mod ring``; ``is_flush = write_pos + 2 T' > Lspec``.

    Every rule below asks the policy object.
    """

    decode: str = "standard"
    window: int = 1
    buffer: int = 16
    policy: str = "spec"

    def __post_init__(self) -> None:
        if self.decode not in DECODES:
            raise ValueError(f"decode: expected one of {DECODES}, got {self.decode!r}")
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window: expected an integer T' >= 1, got {self.window!r}")
        if not isinstance(self.buffer, int) or self.buffer < 1:
            raise ValueError(f"buffer: expected an integer >= 1, got {self.buffer!r}")
        if self.decode == "standard" and self.window != 1:
            raise ValueError(f"window: standard decode has T' = 1, got {self.window}")
        if self.decode == "speculative" and self.buffer < self.window:
            raise ValueError(f"buffer: the history block B must be >= T' = {self.window}, got {self.buffer}")
        policy(self.policy)

    @property
    def rule(self) -> BookkeepingPolicy:
        return POLICIES[self.policy]

    def with_policy(self, name: str) -> DecodeConfig:
        return DecodeConfig(self.decode, self.window, self.buffer, policy(name).name)

    @property
    def speculative(self) -> bool:
        return self.decode == "speculative"

    @property
    def host_owned(self) -> bool:
        """Whether the caller owns the cursors (``host-cursors``) and passes them to the kernel."""
        return self.rule.host_owned

    @property
    def uses_ring(self) -> bool:
        """Record rows addressed from a moving origin (else a linear buffer, origin always 0)."""
        return self.rule.uses_ring(self)

    @property
    def lspec(self) -> int:
        """The logical threshold B + T' (speculative); L for standard decode (spec policy)."""
        return self.rule.lspec(self)

    @property
    def ring_rows(self) -> int:
        """Physical buffer rows: next_pow2(B + T') for speculative, L for standard (spec policy)."""
        return self.rule.ring_rows(self)

    def is_flush(self, write_pos: int) -> bool:
        """Whether the next verify at ``write_pos`` is a flush."""
        return self.rule.is_flush(self, write_pos)

    def max_write_pos(self) -> int:
        """Largest valid committed history length before a verify."""
        return self.rule.max_write_pos(self)

    @property
    def flush_folds_first(self) -> bool:
        """Whether a flush's checkpoint includes window position 0 (else the history only)."""
        return self.rule.flush_folds_first(self)

    def commit_cursor(self, write_pos: int, origin: int, flushed: bool, k: int) -> tuple[int, int]:
        """Cursor update after commit(k) (docs/recurrences.md sections 2-4 under the default policy): returns
        (write_pos, origin)."""
        return self.rule.commit_cursor(self, write_pos, origin, flushed, k)

    def committed_rows(self, origin: int, write_pos: int) -> list[int]:
        """Physical record rows holding committed history (logical positions 0..write_pos-1)."""
        if self.uses_ring:
            return [(origin + p) % self.ring_rows for p in range(write_pos)]
        return list(range(write_pos))

    def to_dict(self) -> dict:
        d = {"decode": self.decode, "window": self.window, "buffer": self.buffer}
        if self.policy != "spec":
            d["policy"] = self.policy
        return d


@dataclass
class KernelConfig:
    """Everything a kernel is built from."""

    geometry: Geometry
    params: dict[str, torch.Tensor]
    mode: PrecisionMode
    decode: DecodeConfig
    num_slots: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    options: dict = field(default_factory=dict)
    # The conventions of the recurrence it is measured against: the kernel's declared ones (a
    # literal model computes with them; replayssm/conventions.py).
    conventions: Conventions = DEFAULT

    def __post_init__(self) -> None:
        self.mode = parse_mode(self.mode)
        self.device = torch.device(self.device)
        if self.device.type == "cuda" and self.device.index is None and torch.cuda.is_available():
            # tensors made on "cuda" report "cuda:<n>"; without an index every device check would fail
            self.device = torch.device("cuda", torch.cuda.current_device())
        if not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(f"num_slots: expected a positive integer, got {self.num_slots!r}")
        shapes = self.geometry.param_shapes()
        missing = set(shapes) - set(self.params)
        unknown = set(self.params) - set(shapes)
        if missing or unknown:
            raise ValueError(f"params: expected exactly {sorted(shapes)}, missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")
        for name, shape in shapes.items():
            p = self.params[name]
            if not isinstance(p, torch.Tensor) or tuple(p.shape) != shape or not p.is_floating_point():
                raise ValueError(f"params[{name!r}]: expected a float tensor of shape {shape}, got "
                                 f"{getattr(p, 'shape', type(p).__name__)}")


@dataclass
class KernelSnapshot:
    """Raw copies of a kernel's stored state, for exact invariant checks.

    ``checkpoint`` is ``[num_slots, *state_shape]`` in the storage dtype; ``checkpoint_scale``
    ``[num_slots, *state_shape[:-1]]`` fp32 for fp8/int8 states; ``records`` maps each record
    name to ``[num_slots, ring_rows, ...]`` (empty for baselines); cursors are ``[num_slots]``.
    Each tensor may live on the CPU or on the kernel's device: the engine compares bits where they
    are (the suite's own kernels keep their storage copies on the device, so a step at real shapes
    moves no state to the host; their cursors on the CPU).  Copies, never views of live storage.
    """

    checkpoint: torch.Tensor
    checkpoint_scale: torch.Tensor | None
    records: dict[str, torch.Tensor]
    write_pos: torch.Tensor
    origin: torch.Tensor
    is_flush: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


class KernelUnderTest(abc.ABC):
    """Base class of every kernel under test.  Subclasses set the class attributes and
    implement the abstract methods; they call :meth:`check_verify_args` /
    :meth:`check_commit_args` / :meth:`check_reset_args` before mutating anything."""

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    kind: ClassVar[str] = "replay"  # "replay" or "baseline"
    decodes: ClassVar[tuple[str, ...]] = ("speculative", "standard")  # what it implements (scenarios draw these)
    description: ClassVar[str] = ""
    zero_accept: ClassVar[str] = "refuse"  # what commit does with k = 0: "refuse" | "noop" (ZERO_ACCEPT)
    fold_at: ClassVar[str] = "flush"  # where a flush's fold lands: "flush" | "next-verify" (FOLD_AT)
    supports_ragged_windows: ClassVar[bool] = False  # verify(..., window_lens=) in the padded layout
    supports_packed_layout: ClassVar[bool] = False  # verify(..., query_start_loc=): tokens packed back to back
    supports_mixed_decode: ClassVar[bool] = False  # one-token verifies (standard steps) on a speculative object
    supports_strided_views: ClassVar[bool] = False  # inputs, out, slot_ids and accepted may be strided views
    supports_materialize: ClassVar[bool] = False  # materialize(slot_ids, upto, dst_slot_ids): prefix-cache publish
    bookkeeping: ClassVar[str] = "spec"  # the cursor policy (POLICIES)
    accepted_options: ClassVar[tuple[str, ...]] = ()  # the KernelConfig.options names it reads; others are refused
    # The conventions it computes with, where they differ from the defaults (replayssm/conventions.py:
    # beta_rounded, softplus_threshold, l2_eps, l2_form): the reference and the literal model follow them.
    conventions: ClassVar[dict] = {}

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Refuse an option the kernel does not declare in :attr:`accepted_options` (no typo is ignored)."""
        unknown = sorted(set(options) - set(cls.accepted_options))
        if unknown:
            accepts = f"accepts {sorted(cls.accepted_options)}" if cls.accepted_options else "accepts no option"
            raise ValueError(f"options: kernel {cls.name!r} {accepts}; got unknown option(s) {unknown} "
                             f"(--kernel-option / scenario kernel_options)")

    def __init__(self, config: KernelConfig) -> None:
        self.check_options(config.options)
        if config.geometry.family != self.family:
            raise ValueError(f"geometry: kernel {self.name!r} is for family {self.family!r}, "
                             f"got a {config.geometry.family!r} geometry")
        if self.zero_accept not in ZERO_ACCEPT:
            raise ValueError(f"zero_accept: kernel {self.name!r} declares {self.zero_accept!r}, expected one of "
                             f"{ZERO_ACCEPT}")
        if self.fold_at not in FOLD_AT:
            raise ValueError(f"fold_at: kernel {self.name!r} declares {self.fold_at!r}, expected one of {FOLD_AT}")
        if self.fold_at == "next-verify" and self.zero_accept == "staged":
            raise ValueError(f"fold_at: kernel {self.name!r} declares 'next-verify' with zero_accept = 'staged' (a "
                             f"staged fold lands at commit); declare one of them")
        if self.fold_at == "next-verify" and policy(self.bookkeeping).checkpoint_moves_at_commit(config.decode):
            raise ValueError(f"fold_at: kernel {self.name!r} declares 'next-verify' under the {self.bookkeeping!r} "
                             f"bookkeeping, whose commit folds (no verify flushes); declare 'flush'")
        if config.decode.policy != policy(self.bookkeeping).name:
            raise ValueError(f"decode.policy: kernel {self.name!r} keeps its books by {self.bookkeeping!r}, "
                             f"got a decode config for {config.decode.policy!r}")
        reason = self.unsupported_reason(config.mode, config.decode, config.options)
        if reason:
            raise ValueError(f"mode: kernel {self.name!r} does not support {config.mode.id} "
                             f"({config.decode.decode} decode): {reason}")
        reason = geometry_reason(type(self), config.geometry, config.decode)
        if reason:
            raise ValueError(f"geometry: kernel {self.name!r} does not support this geometry: {reason}")
        self.config = config
        self.geometry = config.geometry
        self.mode = config.mode
        self.decode = config.decode
        self.num_slots = config.num_slots
        self.device = config.device
        self.state_shape = tuple(config.geometry.state_shape)
        self.out_shape = tuple(config.geometry.out_shape)

    # ---- capability ------------------------------------------------------------------------------
    @classmethod
    def unsupported_reason(cls, mode: PrecisionMode, decode: DecodeConfig, options: dict) -> str | None:
        """None when the kernel supports ``mode`` under ``decode``, else why not."""
        return None

    @classmethod
    def unsupported_geometry(cls, geometry: Geometry, decode: DecodeConfig | None = None) -> str | None:
        """None when the kernel supports ``geometry`` (under ``decode``, when given), else why not (a
        shape limit the kernel itself enforces, e.g. a minimum head dimension for its tensor-core
        products); the fuzzer draws only supported geometries and a run on another one is refused
        before anything runs.  An override may leave ``decode`` out of its signature (see
        :func:`geometry_reason`)."""
        return None

    # ---- the step calls ----------------------------------------------------------------------------
    @abc.abstractmethod
    def reset(self, slot_ids: torch.Tensor, initial_state: torch.Tensor | None = None,
              origin: torch.Tensor | None = None) -> None:
        """(Re)admit sequences: checkpoint <- initial_state (zeros if None), write_pos = 0,
        origin as given (speculative ring start, default 0)."""

    @abc.abstractmethod
    def verify(self, slot_ids: torch.Tensor, inputs: dict[str, torch.Tensor],
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Outputs ``[R, T', *out_shape]`` (act dtype) for every window position.  Kernels with
        ``supports_ragged_windows`` also take ``window_lens`` (keyword, ``[R]`` integers, 1..T'
        per active row): positions past ``window_lens[r]`` are padding, their outputs untouched;
        with ``supports_packed_layout`` ``query_start_loc`` (keyword: packed ``[N, ...]`` inputs
        and outputs, see the module docstring); under ``host-cursors`` ``cursors`` (keyword: the
        caller's ``[num_slots, 2]`` table)."""

    @abc.abstractmethod
    def commit(self, slot_ids: torch.Tensor, accepted: torch.Tensor) -> None:
        """Accept ``accepted[r]`` (1..T'_r; 0 too with ``zero_accept = "noop"``) tokens of the
        last window of each active row."""

    # ---- inspection ----------------------------------------------------------------------------------
    @abc.abstractmethod
    def committed_state(self, slot_ids: torch.Tensor) -> torch.Tensor:
        """fp64 ``[R, *state_shape]``: the state after the committed prefix (NaN rows for padding);
        under ``host-cursors`` with the caller's table as keyword ``cursors``."""

    @abc.abstractmethod
    def checkpoint_state(self, slot_ids: torch.Tensor) -> torch.Tensor:
        """fp64 ``[R, *state_shape]``: the stored checkpoint, dequantised (NaN rows for padding)."""

    @abc.abstractmethod
    def snapshot(self) -> KernelSnapshot:
        """Raw CPU copies of all stored state (see :class:`KernelSnapshot`)."""

    supports_restore: ClassVar[bool] = False

    def restore(self, snapshot: KernelSnapshot) -> None:
        """Put back exactly the state a :meth:`snapshot` took (used to resume long drift runs).
        Kernels that can set ``supports_restore = True`` and override this."""
        raise ValueError(f"snapshot: kernel {self.name!r} cannot restore a snapshot "
                         f"(supports_restore is False); rerun from the start instead")

    # ---- shared argument checks ------------------------------------------------------------------------
    def _check_slot_ids(self, slot_ids, allow_pad: bool = True) -> list[int]:
        if not isinstance(slot_ids, torch.Tensor) or slot_ids.dim() != 1 or slot_ids.dtype not in (
                torch.int32, torch.int64):
            raise ValueError(f"slot_ids: expected a 1-D int32/int64 tensor, got "
                             f"{getattr(slot_ids, 'dtype', type(slot_ids).__name__)} "
                             f"{tuple(getattr(slot_ids, 'shape', ()))}")
        if slot_ids.device != self.device:
            raise ValueError(f"slot_ids: expected device {self.device}, got {slot_ids.device}")
        self.check_contiguous("slot_ids", slot_ids)
        ids = slot_ids.tolist()
        for r, s in enumerate(ids):
            if s == PAD_SLOT and allow_pad:
                continue
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slot_ids[{r}]: expected a slot in [0, {self.num_slots}) or {PAD_SLOT} "
                                 f"(padding), got {s}")
        active = [s for s in ids if s != PAD_SLOT]
        if len(set(active)) != len(active):
            raise ValueError(f"slot_ids: an active slot appears twice in {ids}")
        return ids

    def materialize(self, slot_ids: torch.Tensor, upto: torch.Tensor, dst_slot_ids: torch.Tensor) -> None:
        """Publish each active row's state after ``upto[r]`` committed history tokens into slot
        ``dst_slot_ids[r]`` (declared by ``supports_materialize``; see the module docstring)."""
        raise ValueError(f"materialize: kernel {self.name!r} does not declare it (supports_materialize is False)")

    def check_materialize_args(self, slot_ids, upto, dst_slot_ids, write_pos: list[int],
                               ready: list[bool] | None = None) -> list[tuple[int, int, int]]:
        """Validate a materialize call; returns (source slot, upto, destination slot) of each active
        row.  ``write_pos``: each slot's committed history length (host list)."""
        ids = self._check_slot_ids(slot_ids)
        R = len(ids)
        for name, t in (("upto", upto), ("dst_slot_ids", dst_slot_ids)):
            if (not isinstance(t, torch.Tensor) or tuple(t.shape) != (R,) or t.is_floating_point()
                    or t.dtype == torch.bool):
                raise ValueError(f"{name}: expected an integer tensor of shape ({R},), got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
            if t.device != self.device:
                raise ValueError(f"{name}: expected device {self.device}, got {t.device}")
        ups, dsts = upto.tolist(), dst_slot_ids.tolist()
        active = {s for s in ids if s != PAD_SLOT}
        out, seen = [], set()
        for r, (s, n, d) in enumerate(zip(ids, ups, dsts)):
            if s == PAD_SLOT:
                continue
            if ready is not None and not ready[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")
            if not 0 <= n <= write_pos[s]:
                raise ValueError(f"upto[{r}]: expected 0 <= upto <= write_pos = {write_pos[s]} (the committed history "
                                 f"of slot {s}), got {n}")
            if not 0 <= d < self.num_slots or d in active or d in seen:
                raise ValueError(f"dst_slot_ids[{r}]: expected a slot in [0, {self.num_slots}) that is no source and "
                                 f"no other destination, got {d}")
            seen.add(d)
            out.append((s, n, d))
        return out

    def check_contiguous(self, name: str, t: torch.Tensor) -> None:
        """Refuse a strided view ``name`` unless the kernel declares ``supports_strided_views``."""
        if not self.supports_strided_views and not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got shape {tuple(t.shape)} with strides "
                             f"{t.stride()} (kernel {self.name!r} does not take strided views: "
                             f"supports_strided_views is False)")

    def check_reset_args(self, slot_ids, initial_state, origin) -> list[int]:
        ids = self._check_slot_ids(slot_ids, allow_pad=True)
        R = len(ids)
        if initial_state is not None:
            want = (R, *self.state_shape)
            if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != want:
                raise ValueError(f"initial_state: expected shape {want}, got "
                                 f"{tuple(getattr(initial_state, 'shape', ()))}")
            if not initial_state.is_floating_point():
                raise ValueError(f"initial_state: expected a float tensor, got {initial_state.dtype}")
            if initial_state.device != self.device:
                raise ValueError(f"initial_state: expected device {self.device}, got {initial_state.device}")
        if origin is not None:
            if not isinstance(origin, torch.Tensor) or tuple(origin.shape) != (R,) or origin.is_floating_point():
                raise ValueError(f"origin: expected an integer tensor of shape ({R},)")
            o = origin.tolist()
            rows = self.decode.ring_rows
            for r, v in enumerate(o):
                if not self.decode.uses_ring and v != 0:
                    raise ValueError(f"origin[{r}]: {self.decode.decode} decode under the {self.decode.policy!r} "
                                     f"bookkeeping uses a linear buffer, expected 0, got {v}")
                if not 0 <= v < rows:
                    raise ValueError(f"origin[{r}]: expected a ring row in [0, {rows}), got {v}")
        return ids

    def call_window(self, inputs) -> int:
        """The window of a verify call: 1 for a standard step on a ``supports_mixed_decode``
        speculative kernel (inputs ``[R, 1, ...]``), else T' (T'max)."""
        T = self.decode.window
        if not (self.supports_mixed_decode and self.decode.speculative and T > 1 and isinstance(inputs, dict)):
            return T
        first = next(iter(inputs.values()), None)
        return 1 if isinstance(first, torch.Tensor) and first.dim() >= 2 and first.shape[1] == 1 else T

    def check_query_start_loc(self, ids: list[int], query_start_loc, n_tokens: int) -> list[int]:
        """Per-row window lengths of a packed verify from its offsets ``query_start_loc`` ``[R+1]``:
        ``Q[0] = 0``, ``Q[r+1] - Q[r]`` in 1..T' for an active row and 0 for a padding row,
        ``Q[R] <= n_tokens`` (the packed inputs' length); ValueError naming the entry and row."""
        R, T = len(ids), self.decode.window
        if not self.supports_packed_layout:
            raise ValueError(f"query_start_loc: kernel {self.name!r} does not support the packed layout "
                             f"(supports_packed_layout is False); pass [R, T'] inputs")
        q = query_start_loc
        if (not isinstance(q, torch.Tensor) or tuple(q.shape) != (R + 1,) or q.is_floating_point()
                or q.dtype == torch.bool):
            raise ValueError(f"query_start_loc: expected an integer tensor of shape ({R + 1},) (R + 1 offsets), got "
                             f"{getattr(q, 'dtype', type(q).__name__)} {tuple(getattr(q, 'shape', ()))}")
        if q.device != self.device:
            raise ValueError(f"query_start_loc: expected device {self.device}, got {q.device}")
        qs = [int(v) for v in q.tolist()]
        if qs[0] != 0:
            raise ValueError(f"query_start_loc[0]: expected 0 (row 0's first token), got {qs[0]}")
        lens = []
        for r, s in enumerate(ids):
            n = qs[r + 1] - qs[r]
            if s == PAD_SLOT and n != 0:
                raise ValueError(f"query_start_loc[{r + 1}]: row {r} is a padding row (slot {PAD_SLOT}), expected no "
                                 f"tokens (query_start_loc[{r + 1}] = query_start_loc[{r}] = {qs[r]}), got {qs[r + 1]}")
            if s != PAD_SLOT and not 1 <= n <= T:
                raise ValueError(f"query_start_loc[{r + 1}]: row {r}'s window length query_start_loc[{r + 1}] - "
                                 f"query_start_loc[{r}] = {n}, expected 1 <= T'_r <= T'max = {T}")
            lens.append(n)
        if qs[R] > n_tokens:
            raise ValueError(f"query_start_loc[{R}]: the offsets hold {qs[R]} tokens, the packed inputs "
                             f"{n_tokens}")
        return lens

    def check_cursors(self, ids: list[int], cursors) -> list[tuple[int, int]] | None:
        """The caller's cursor table under a ``host-cursors`` policy: ``cursors`` an integer
        ``[num_slots, 2]`` tensor of (write_pos, origin) per slot; returns it as host pairs (None
        for a kernel that owns its cursors, which refuses a table)."""
        if not self.decode.host_owned:
            if cursors is not None:
                raise ValueError(f"cursors: kernel {self.name!r} keeps its own cursors (bookkeeping "
                                 f"{self.decode.policy!r}); pass no cursor table")
            return None
        S = self.num_slots
        if (not isinstance(cursors, torch.Tensor) or tuple(cursors.shape) != (S, 2) or cursors.is_floating_point()
                or cursors.dtype == torch.bool):
            raise ValueError(f"cursors: kernel {self.name!r} keeps no cursors (bookkeeping 'host-cursors'): expected "
                             f"the caller's integer table [num_slots = {S}, 2] of (write_pos, origin), got "
                             f"{getattr(cursors, 'dtype', type(cursors).__name__)} "
                             f"{tuple(getattr(cursors, 'shape', ()))}")
        if cursors.device != self.device:
            raise ValueError(f"cursors: expected device {self.device}, got {cursors.device}")
        table = [(int(w), int(o)) for w, o in cursors.tolist()]
        hi, rows = self.decode.max_write_pos(), self.decode.ring_rows
        for r, s in enumerate(ids):
            if s == PAD_SLOT:
                continue
            w, o = table[s]
            if not 0 <= w <= hi:
                raise ValueError(f"cursors[{s}, 0]: write_pos of row {r} (slot {s}): expected 0 <= write_pos <= {hi}, "
                                 f"got {w}")
            if not 0 <= o < rows or (o and not self.decode.uses_ring):
                raise ValueError(f"cursors[{s}, 1]: origin of row {r} (slot {s}): expected a ring row in "
                                 f"[0, {rows if self.decode.uses_ring else 1}), got {o}")
        return table

    def check_window_lens(self, ids: list[int], window_lens, window: int | None = None) -> list[int]:
        """Per-row window lengths of a verify: ``window`` (the call's, default T') for every row
        when ``window_lens`` is None, else ``window_lens[r]`` in 1..T' for each active row
        (padding rows: ignored, reported as 0)."""
        R, T = len(ids), self.decode.window if window is None else window
        if window_lens is None:
            return [0 if s == PAD_SLOT else T for s in ids]
        if not self.supports_ragged_windows:
            raise ValueError(f"window_lens: kernel {self.name!r} does not support ragged windows "
                             f"(supports_ragged_windows is False); every row verifies T' = {T} tokens")
        if (not isinstance(window_lens, torch.Tensor) or tuple(window_lens.shape) != (R,)
                or window_lens.is_floating_point() or window_lens.dtype == torch.bool):
            raise ValueError(f"window_lens: expected an integer tensor of shape ({R},), got "
                             f"{getattr(window_lens, 'dtype', type(window_lens).__name__)} "
                             f"{tuple(getattr(window_lens, 'shape', ()))}")
        if window_lens.device != self.device:
            raise ValueError(f"window_lens: expected device {self.device}, got {window_lens.device}")
        lens = window_lens.tolist()
        for r, (s, n) in enumerate(zip(ids, lens)):
            if s != PAD_SLOT and not 1 <= n <= T:
                raise ValueError(f"window_lens[{r}]: expected a window length 1 <= T'_r <= T'max = {T}, got {n}")
        return [0 if s == PAD_SLOT else int(n) for s, n in zip(ids, lens)]

    def check_verify_args(self, slot_ids, inputs, out, write_pos: list[int] | None = None,
                          ready: list[bool] | None = None, window_lens=None, query_start_loc=None) -> list[int]:
        """Validate a verify call.  ``write_pos``/``ready`` (per slot, host lists) when the kernel
        keeps its cursors on the host: checks each active slot is reset and its cursor valid.
        ``window_lens`` is checked by :meth:`check_window_lens`, ``query_start_loc`` (packed
        layout: inputs ``[N, ...]``, out ``[N, *out_shape]``) by :meth:`check_query_start_loc`
        (call them for the lengths)."""
        ids = self._check_slot_ids(slot_ids)
        R, T = len(ids), self.call_window(inputs)
        lead = (R, T)
        if query_start_loc is not None:
            if window_lens is not None:
                raise ValueError("window_lens: the packed layout takes its window lengths from query_start_loc; "
                                 "pass one of them")
            first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else None
            n_tok = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 0
            self.check_query_start_loc(ids, query_start_loc, n_tok)
            lead = (n_tok,)
        else:
            self.check_window_lens(ids, window_lens, T)
        if not isinstance(inputs, dict):
            raise ValueError(f"inputs: expected a dict of tensors, got {type(inputs).__name__}")
        shapes = self.geometry.input_shapes()
        missing, unknown = set(shapes) - set(inputs), set(inputs) - set(shapes)
        if missing or unknown:
            raise ValueError(f"inputs: expected keys {sorted(shapes)}, missing {sorted(missing)}, "
                             f"unknown {sorted(unknown)}")
        for k, shp in shapes.items():
            t = inputs[k]
            want = (*lead, *shp)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
                raise ValueError(f"inputs[{k!r}]: expected shape {want}, got {tuple(getattr(t, 'shape', ()))}")
            if t.dtype != self.mode.act_dtype:
                raise ValueError(f"inputs[{k!r}]: expected dtype {self.mode.act_dtype} (mode {self.mode.id}), "
                                 f"got {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"inputs[{k!r}]: expected device {self.device}, got {t.device}")
            self.check_contiguous(f"inputs[{k!r}]", t)
        if out is not None:
            want = (*lead, *self.out_shape)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
                raise ValueError(f"out: expected shape {want}, got {tuple(getattr(out, 'shape', ()))}")
            if out.dtype != self.mode.act_dtype:
                raise ValueError(f"out: expected dtype {self.mode.act_dtype}, got {out.dtype}")
            if out.device != self.device:
                raise ValueError(f"out: expected device {self.device}, got {out.device}")
            self.check_contiguous("out", out)
        if write_pos is not None:
            hi = self.decode.max_write_pos()
            for r, s in enumerate(ids):
                if s == PAD_SLOT:
                    continue
                if ready is not None and not ready[s]:
                    raise ValueError(f"slot_ids[{r}]: slot {s} was never reset")
                if not 0 <= write_pos[s] <= hi:
                    raise ValueError(f"write_pos of slot {s}: expected 0 <= write_pos <= {hi} "
                                     f"(write_pos + T' <= B + T'), got {write_pos[s]}")
        return ids

    def check_commit_args(self, slot_ids, accepted, pending: list[bool] | None = None,
                          window_lens: list[int] | None = None) -> tuple[list[int], list[int]]:
        """Validate a commit.  ``window_lens`` (per slot, host list): the window length of each
        slot's last verify, the largest k it may accept.  k = 0 is accepted only when the kernel
        declares ``zero_accept = "noop"`` under speculative decode."""
        ids = self._check_slot_ids(slot_ids)
        R, T = len(ids), self.decode.window
        if (not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (R,) or accepted.is_floating_point()
                or accepted.dtype == torch.bool):
            raise ValueError(f"accepted: expected an integer tensor of shape ({R},), got "
                             f"{getattr(accepted, 'dtype', type(accepted).__name__)} "
                             f"{tuple(getattr(accepted, 'shape', ()))}")
        self.check_contiguous("accepted", accepted)
        ks = accepted.tolist()
        lo = 0 if self.zero_accept in ("noop", "staged") and self.decode.speculative else 1
        for r, (s, k) in enumerate(zip(ids, ks)):
            if s == PAD_SLOT:
                continue
            hi = T if window_lens is None else window_lens[s]
            if not lo <= k <= hi:
                what = f"T'_r = {hi} (the row's window length)" if hi != T else f"T' = {T}"
                why = ("" if lo == 0 else " (the bonus token counts; this kernel refuses k = 0: zero_accept = "
                       f"{self.zero_accept!r}{', standard decode' if self.zero_accept != 'refuse' else ''})")
                raise ValueError(f"accepted[{r}]: expected {lo} <= k <= {what}{why}, got {k}")
            if pending is not None and not pending[s]:
                raise ValueError(f"slot_ids[{r}]: slot {s} has no verify to commit")
        return ids, ks


def geometry_reason(cls, geometry, decode: DecodeConfig | None) -> str | None:
    """``cls.unsupported_geometry(geometry, decode)``, or without ``decode`` for an override whose
    signature takes the geometry alone (kernels written before the decode argument)."""
    try:
        params = inspect.signature(cls.unsupported_geometry).parameters
    except (TypeError, ValueError):
        params = {}
    if "decode" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return cls.unsupported_geometry(geometry, decode=decode)
    return cls.unsupported_geometry(geometry)
