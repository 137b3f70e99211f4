"""Report: one record per item, and report.json, report.md and report.html."""
