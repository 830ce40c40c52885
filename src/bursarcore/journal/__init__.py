"""The journal: an append-only record of every decision with the inputs of the rule that
made it (SPEC §9), behind one sink interface: in-memory columnar, SQLite (durable, group
commit) and JSON lines (export/import)."""

from .base import Journal
from .memory import MemoryJournal
from .sqlite import SQLiteJournal
from .jsonl import export_jsonl, import_jsonl
from .records import OPS, RECORD_DTYPE
from .explain import explain

__all__ = ["Journal", "MemoryJournal", "SQLiteJournal", "export_jsonl", "import_jsonl",
           "explain", "OPS", "RECORD_DTYPE"]
