"""report.html: the page (page.py), its figures (plots.py) and tables (tables.py)."""
