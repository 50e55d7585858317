"""The committed results ledger, docs/reports/ledger.jsonl: every line is a replayssm.record/1 record.

Oracle: replayssm/records/record.schema.json (validated with jsonschema where installed; the
required keys, the id and the configuration digest always): ``id`` and ``config_digest`` are the
first 16 hex digits of the SHA-256 of the canonical JSON (sorted keys, separators ``,`` ``:``, UTF-8
not escaped: ``replayssm.records.record.canonical``) of
the record without ``id`` and of ``config``.  The ledger stays within its size budget, and every
record id the docs cite is in it.
"""

import hashlib
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "reports" / "ledger.jsonl"
SCHEMA = ROOT / "replayssm" / "records" / "record.schema.json"
BUDGET_LINES = 2000


def _canonical_digest(obj) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _records():
    return [json.loads(line) for line in LEDGER.read_text().splitlines()]


def test_ledger_within_budget_and_only_file_in_reports():
    assert len(LEDGER.read_text().splitlines()) <= BUDGET_LINES
    assert sorted(p.name for p in LEDGER.parent.iterdir()) == ["ledger.jsonl"]


def test_ledger_records_have_their_ids_and_digests():
    schema = json.loads(SCHEMA.read_text())
    ids = set()
    for rec in _records():
        assert set(schema["required"]) <= set(rec), rec.get("id")
        assert set(rec) <= set(schema["properties"]), rec["id"]
        assert rec["schema"] == "replayssm.record/1"
        body = {k: v for k, v in rec.items() if k != "id"}
        assert _canonical_digest(body) == rec["id"]
        assert _canonical_digest(rec["config"]) == rec["config_digest"], rec["id"]
        # a migrated report, or the command line of a job or a committed tools/ script, from committed code
        assert rec["source"].startswith(("docs/reports/", "replayssm ", "tools/")), rec["id"]
        assert rec["dirty"] is False, f"{rec['id']}: measured on a working tree with uncommitted changes"
        assert rec["id"] not in ids
        ids.add(rec["id"])


def test_ledger_is_valid_against_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()),
                                                format_checker=jsonschema.FormatChecker())
    for rec in _records():
        errors = [e.message for e in validator.iter_errors(rec)]
        assert not errors, (rec["id"], errors)


def test_every_record_id_the_docs_cite_is_in_the_ledger():
    ids = {rec["id"] for rec in _records()}
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {m for path in docs for m in re.findall(r"rec:([0-9a-f]{16})", path.read_text())}
    assert cited <= ids, sorted(cited - ids)


def test_generated_tables_match_the_ledger():
    """The tables between ``<!-- ledger: ... -->`` markers are what tools/ledger_tables.py prints."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ledger_tables", ROOT / "tools" / "ledger_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    recs = tables.load(LEDGER)
    docs = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if "<!-- ledger:" in p.read_text()]
    assert ROOT / "docs" / "benchmarks.md" in docs
    for path in docs:
        text = path.read_text()
        assert tables.regenerate(text, recs) == text, f"{path.name}: run python tools/ledger_tables.py --update {path}"


PACKAGE_DIRS = ("replayssm", "validators", "scenarios", "golden", "tools")
ISO_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
# Comments and docstrings that must keep an ISO date, each with its reason ("path": "why"); none today:
# a measurement is a record (cited as rec:<id>) or a method statement without a date.
DATED_COMMENTS_ALLOWED: dict[str, str] = {}


def _package_sources():
    files = [ROOT / "noxfile.py"]
    for d in PACKAGE_DIRS:
        files += sorted(p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def _prose_tokens(path: Path):
    """The comments and string literals (docstrings among them) of a source file, with their line."""
    with open(path, "rb") as fh:
        for tok in tokenize.tokenize(fh.readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                yield tok.start[0], tok.string


def test_every_record_id_the_package_cites_is_in_the_ledger():
    ids = {rec["id"] for rec in _records()}
    cited = {(m, str(p.relative_to(ROOT))) for p in _package_sources()
             for m in re.findall(r"rec:([0-9a-f]{16})", p.read_text())}
    assert cited, "no rec:<id> citation found in the package: the scan is looking in the wrong place"
    missing = sorted((path, m) for m, path in cited if m not in ids)
    assert not missing, missing


def test_package_comments_carry_no_dates():
    """Dated prose in comments and docstrings is a lab notebook: the measurement is a record (rec:<id>)
    or, without one, a method statement (what was measured and the constant it gave)."""
    dated = [f"{p.relative_to(ROOT)}:{line}: {m.group()}" for p in _package_sources()
             if str(p.relative_to(ROOT)) not in DATED_COMMENTS_ALLOWED
             for line, text in _prose_tokens(p) for m in ISO_DATE.finditer(text)]
    assert not dated, dated
