"""The ledger's Alembic environment, shipped in the wheel as ``campaign.migrations``."""
