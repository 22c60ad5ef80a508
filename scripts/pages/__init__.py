"""The results pages of docs/results/ as specs, for scripts/results_pages.py: ``render`` (the cell
formats, the table, the ``Page`` spec and the frame every page has), ``sources`` (the results
folder and where each JSON file's numbers come from), ``drawings`` (the committed figures and
screenshots, their records and their check), and a module per family of pages: ``zoo``,
``studies``, ``stability``, ``probes``, ``dynamics``, ``traces``, ``bench``, ``pretrained`` and
``organisms``.
Standard library only: the pages and the check run without the project's virtual environment."""
