"""Reading the input table, planning windows and parts, and packing model batches (pure code)."""
