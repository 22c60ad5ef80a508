"""Storage: the workbench's errors (``errors``), atomic file writes and JSON (``files``), ownership
of output directories (``outputs``). The bottom wing: it imports nothing else of the workbench."""
