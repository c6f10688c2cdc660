"""The read-only live dashboard (`campaign serve`): it reads the ledger and the report's tables
and starts nothing (docs/report.md, docs/architecture.md)."""
