"""The pilot before the campaign: data inspection and gates (docs/report.md, pilot phases)."""
