"""The report's export formats (a module with no imports: the command line lists them)."""

FORMATS = ("html", "md", "csv", "parquet", "json")
