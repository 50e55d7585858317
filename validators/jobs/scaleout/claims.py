"""Claim mode: many processes, on one host or many, run one drift sweep on a shared ``--out``.

Each cell is claimed through ``<out>/claims/<cell id>.claim``, created with
``os.open(O_CREAT | O_EXCL)`` (one creator wins, on a local disk and on NFSv3+), holding the
claimant's host, pid, a random token and a heartbeat time that a thread refreshes every
``ttl / 4`` seconds.  A claim is expired when its heartbeat is older than ``ttl`` seconds, or
when it names this host and a pid that no longer runs; an expired claim is taken over: renamed
aside (one renamer wins), checked to be the claim judged expired (else put back), and claimed
afresh.  The cell then runs through :func:`replayssm.validators.jobs.drift.sweep.run_cell`, which resumes the
dead claimant's last checkpoint.  A claimant that finds its claim gone or replaced (its heartbeat
was late) stops the cell at the next chunk boundary without writing a result.

Cells are taken longest first (:func:`..shards.longest_first`); a process leaves only when every
cell of the sweep has a result written during this sweep or a reusable one, waiting meanwhile for
live claims to finish or expire, so the last claimant standing finishes a dead host's cell.  Two
claimants computing one cell (a takeover race) write the same bytes, since a cell is a pure
function of its definition; result and checkpoint files are replaced atomically.

Oracle: several processes on one machine reproduce the serial report byte for byte, and a
claimant killed mid-cell leaves a claim that is taken over and resumed from its checkpoint
(tests/jobs/test_scaleout.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from replayssm.guard import LOCK_NAME, EnvironmentProblem, out_path
from replayssm.validators.jobs.drift import sweep as D
from replayssm.validators.jobs.scaleout.shards import longest_first

CLAIMS = "claims"


class ClaimLost(Exception):
    """This process's claim on a cell was taken over (its heartbeat was late): the cell stops."""


def claim_path(out: Path, cell_id: str) -> Path:
    return out_path(Path(out) / CLAIMS, f"{cell_id}.claim", "cell id")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _read(p: Path) -> dict | None:
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def expired(claim: dict | None, ttl: float, now: float | None = None, host: str | None = None) -> str | None:
    """Why ``claim`` is expired (one line), or None while its holder may be alive.  An unreadable
    claim (a holder killed while creating it) counts as expired once its file is older than ``ttl``
    (the caller checks the file's age)."""
    now = time.time() if now is None else now
    host = socket.gethostname() if host is None else host
    if claim is None:
        return "an unreadable claim"
    hb = claim.get("heartbeat")
    if not isinstance(hb, (int, float)) or now - hb > ttl:
        return f"its heartbeat is {now - hb:.0f} s old (--claim-ttl {ttl:g})" if isinstance(hb, (int, float)) \
            else "no heartbeat"
    if claim.get("host") == host and isinstance(claim.get("pid"), int) and not _pid_alive(claim["pid"]):
        return f"pid {claim['pid']} no longer runs on {host}"
    return None


@dataclass
class Claim:
    """A claim this process holds on one cell (see the module docstring)."""
    path: Path
    token: str
    ttl: float
    took_over: str | None = None  # who held it before and why it expired

    def record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "token": self.token, "heartbeat": time.time(),
                "ttl": self.ttl}

    def held(self) -> bool:
        d = _read(self.path)
        return d is not None and d.get("token") == self.token

    def beat(self) -> bool:
        """Refresh the heartbeat; False (and nothing written) when the claim is no longer ours."""
        if not self.held():
            return False
        D.atomic_write(self.path, json.dumps(self.record(), sort_keys=True) + "\n")
        return True

    def release(self) -> None:
        if self.held():
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def _create(p: Path, claim: Claim) -> bool:
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(claim.record(), sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


def try_claim(out: Path, cell_id: str, ttl: float) -> Claim | None:
    """A fresh claim on ``cell_id``, a taken-over expired one, or None while another holder lives."""
    p = claim_path(out, cell_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    claim = Claim(p, uuid.uuid4().hex, ttl)
    if _create(p, claim):
        return claim
    old = _read(p)
    why = expired(old, ttl)
    if why is None:
        return None
    if old is None:  # unreadable: a holder killed between create and write, or a write in flight
        try:
            if time.time() - p.stat().st_mtime <= ttl:
                return None
        except FileNotFoundError:
            return try_claim(out, cell_id, ttl) if _create(p, claim) else None
    aside = p.with_name(f".{p.name}.stale-{claim.token}")
    try:
        os.rename(p, aside)
    except FileNotFoundError:  # another process took it over first
        return None
    if _read(aside) != old:  # what we moved is not the claim judged expired: put it back
        try:
            os.link(aside, p)
        except FileExistsError:
            pass
        os.unlink(aside)
        return None
    os.unlink(aside)
    if not _create(p, claim):
        return None
    claim.took_over = f"{old.get('host', '?')} pid {old.get('pid', '?')}: {why}" if old else why
    return claim


class _Heartbeat(threading.Thread):
    def __init__(self, claim: Claim) -> None:
        super().__init__(daemon=True)
        self.claim, self.stop, self.lost = claim, threading.Event(), False

    def run(self) -> None:
        while not self.stop.wait(self.claim.ttl / 4):
            if not self.claim.beat():
                self.lost = True
                return


@dataclass
class ClaimOutcome(D.SweepOutcome):
    """A :class:`drift.SweepOutcome` plus the claims this process took over (cell id -> from whom)."""
    taken_over: dict | None = None


def run_claimed(cfg: D.SweepConfig, out: str | Path, *, device: str = "cpu", ttl: float = 60.0, poll_s: float = 1.0,
                progress: bool = True, checkpoint_every_s: float = 30.0, chunk: int | None = None,
                deadline_s: float | None = None, fast: bool = True) -> ClaimOutcome:
    """Claim and run cells of ``cfg`` in ``out`` until every cell has a result (module docstring)."""
    if not (isinstance(ttl, (int, float)) and ttl > 0):
        raise ValueError(f"claim_ttl: expected a number of seconds > 0, got {ttl!r}")
    out = Path(out)
    D.prepare_out(cfg, out)
    cells = cfg.cells()[0]
    provs = {c.id: D.cell_provenance(c, cfg, device) for c in cells}
    before = {c.id: _text(D.cell_path(out, c.id)) for c in cells}
    todo = {c.id for c in cells if not D.reusable(_json(before[c.id]), provs[c.id], cfg)}
    per_cell = cfg.rows * cfg.tokens
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=per_cell * len(cells), initial=per_cell * (len(cells) - len(todo)), unit="tok",
                   unit_scale=True, desc="drift claim", dynamic_ncols=True, smoothing=0.05)
    t0, counted, ran, taken, oom = time.perf_counter(), 0, [], {}, {}
    deadline = None if deadline_s is None else time.time() + deadline_s
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def finished(cid: str) -> bool:
        now = _text(D.cell_path(out, cid))
        return cid not in todo or (now is not None and now != before[cid]) or \
            D.reusable(_json(now), provs[cid], cfg)

    try:
        order = [c for c in longest_first(cells, cfg) if c.id in todo]
        while True:
            left = [c for c in order if not finished(c.id) and c.id not in oom]
            if not left:
                break
            if deadline is not None and time.time() >= deadline:
                break
            got = False
            for c in left:
                if finished(c.id):
                    continue
                claim = try_claim(out, c.id, ttl)
                if claim is None:
                    continue
                got = True
                if claim.took_over:
                    taken[c.id] = claim.took_over
                    print(f"replayssm: drift: claim on {c.id} taken over from {claim.took_over}", file=sys.stderr,
                          flush=True)
                hb = _Heartbeat(claim)

                def tick(n: int, resumed: bool = False, hb=hb, cid=c.id) -> None:
                    nonlocal counted
                    if hb.lost:
                        raise ClaimLost
                    if not resumed:
                        counted += n
                    elif n:
                        print(f"replayssm: drift: cell {cid} resumed from its checkpoint at {n:,} tokens",
                              file=sys.stderr, flush=True)
                    if bar is not None:
                        bar.update(n)

                hb.start()
                try:
                    if finished(c.id):  # a result landed between the scan and the claim
                        continue
                    D.run_cell(c, cfg, out, device, checkpoint_every_s, chunk, tick, deadline, fast)
                    ran.append(c.id)
                except ClaimLost:
                    print(f"replayssm: drift: claim on {c.id} lost (heartbeat late); left to its new holder",
                          file=sys.stderr, flush=True)
                except torch.OutOfMemoryError as e:
                    oom[c.id] = D._first_line(e)
                finally:
                    hb.stop.set()
                    hb.join()
                    claim.release()
                if c.id in oom:
                    D._release_device_memory(device)
            if not got:
                time.sleep(poll_s)
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    return ClaimOutcome([c.id for c in cells], ran, wall, counted, oom, taken)


def _text(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _json(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None




@contextlib.contextmanager
def report_lock(out: str | Path, timeout_s: float = 600.0):
    """The one-writer lock of ``out`` (``guard.output_lock``'s file), waited for up to
    ``timeout_s``: claimants finishing together write the report one after the other."""
    lock = FileLock(str(Path(out) / LOCK_NAME), timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise EnvironmentProblem(f"--out {out}: another replayssm process held {Path(out) / LOCK_NAME} for "
                                 f"{timeout_s:g} s; wait for it to finish or give another --out") from None
    try:
        yield lock
    finally:
        lock.release()

__all__ = ["CLAIMS", "Claim", "ClaimLost", "ClaimOutcome", "claim_path", "expired", "report_lock", "run_claimed",
           "try_claim"]
