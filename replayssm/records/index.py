"""An in-memory SQLite index of records (standard library ``sqlite3``; no server): what
``replayssm results`` queries.

Tables: ``records`` (one row per record: its scalar fields, the device's kind/name/driver, the
versions as JSON) and ``metrics`` (record id, key, numeric value or text).  Records read from
several files are indexed once each (by id).

Oracle: the records themselves; a query only selects and divides what they hold.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3

SCALARS = ("id", "job", "case_id", "family", "kernel", "mode", "geometry", "config_digest", "commit_id", "dirty",
           "device_kind", "device_name", "driver", "verdict", "reason", "created", "source", "versions")


class Index:
    """``Index(records)``: the records in an in-memory database (``.db``)."""

    def __init__(self, records=()):
        self.db = sqlite3.connect(":memory:")
        self.db.row_factory = sqlite3.Row
        self.db.executescript("""
            CREATE TABLE records (id TEXT PRIMARY KEY, job TEXT, case_id TEXT, family TEXT, kernel TEXT, mode TEXT,
                                  geometry TEXT, config_digest TEXT, commit_id TEXT, dirty INTEGER,
                                  device_kind TEXT, device_name TEXT, driver TEXT, verdict TEXT, reason TEXT,
                                  created TEXT, source TEXT, versions TEXT);
            CREATE TABLE metrics (id TEXT, key TEXT, num REAL, text TEXT, PRIMARY KEY (id, key));
            CREATE INDEX records_case ON records (case_id, device_name, created);
        """)
        self.add(records)

    def add(self, records) -> int:
        n = 0
        for r in records:
            dev = r["device"]
            row = (r["id"], r["job"], r["case"], r.get("family"), r.get("kernel"), r.get("mode"), r.get("geometry"),
                   r["config_digest"], r["commit"], int(bool(r["dirty"])), dev["kind"], dev["name"],
                   dev.get("driver"), r["verdict"], r.get("reason"), r["created"], r.get("source"),
                   json.dumps(r["versions"], sort_keys=True))
            cur = self.db.execute(f"INSERT OR IGNORE INTO records VALUES ({','.join('?' * len(row))})", row)
            if cur.rowcount:
                n += 1
                self.db.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)",
                                    [(r["id"], k, *_value(v)) for k, v in r["metrics"].items()])
        self.db.commit()
        return n

    def __len__(self) -> int:
        return self.db.execute("SELECT count(*) FROM records").fetchone()[0]

    def metrics(self, record_id: str) -> dict:
        return {row["key"]: (row["num"] if row["num"] is not None else _text(row["text"]))
                for row in self.db.execute("SELECT key, num, text FROM metrics WHERE id = ? ORDER BY key",
                                           (record_id,))}

    def rows(self, where: str = "1", params=()) -> list[dict]:
        return [dict(r) for r in self.db.execute(f"SELECT * FROM records WHERE {where} "
                                                 f"ORDER BY case_id, device_name, created, id", params)]

    def latest(self, job: str | None = None) -> list[dict]:
        """The newest record per (case, device name); ties in ``created`` broken by id."""
        sql = """SELECT * FROM records r WHERE (? IS NULL OR job = ?) AND NOT EXISTS (
                     SELECT 1 FROM records s WHERE s.case_id = r.case_id AND s.device_name = r.device_name
                     AND (? IS NULL OR s.job = ?)
                     AND (s.created > r.created OR (s.created = r.created AND s.id > r.id)))
                 ORDER BY case_id, device_name"""
        return [dict(r) for r in self.db.execute(sql, (job, job, job, job))]

    def side(self, by: str, value: str) -> dict[tuple, dict]:
        """The newest record per key of one side of a comparison: ``by="commit"``: the records of
        commits starting with ``value``, keyed by (case, device); ``by="device"``: the records of
        devices whose name contains ``value``, keyed by (case, commit); ``by="source"``: the records
        read from the file ``value`` or from files under the folder ``value`` (two runs of one commit
        on one device, e.g. the two folders of ``nox -s bench``), keyed by (case, device)."""
        if by == "source":
            value = os.path.normpath(value)
            folder = value.rstrip("/") + "/"
            where, params, key = "(source = ? OR substr(source, 1, ?) = ?)", (value, len(folder), folder), \
                ("case_id", "device_name")
        elif by == "commit":
            where, params, key = "commit_id LIKE ?", (value.lower() + "%",), ("case_id", "device_name")
        elif by == "device":
            where, params, key = "device_name LIKE ?", ("%" + value + "%",), ("case_id", "commit_id")
        else:
            raise ValueError(f"--by: expected commit, device or source, got {by!r}")
        out: dict[tuple, dict] = {}
        for r in self.rows(where, params):
            out[tuple(r[k] for k in key)] = r  # ordered by created: the newest wins
        return out

    def values(self, key: str) -> list[str]:
        return [r[0] for r in self.db.execute(f"SELECT DISTINCT {key} FROM records ORDER BY {key}")]


def _value(v) -> tuple:
    if isinstance(v, bool) or v is None or isinstance(v, (str, list)):
        return None, json.dumps(v)
    return float(v), None


def _text(t: str):
    v = json.loads(t)
    return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(v, v) if isinstance(v, str) else v


def ratio(a, b) -> float | None:
    """``b / a`` of two numbers (None when either is not a finite number or ``a`` is zero)."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (a, b)) or a == 0:
        return None
    return b / a


__all__ = ["Index", "ratio"]
