"""The pilot before the campaign: data inspection and gates (DESIGN.md §5)."""
