"""Reports read only the ledger: the balance sheet, its plots and its exports."""
