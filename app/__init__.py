"""The Streamlit app (``workbench app``): a thin view over workbench functions, one file per page
under ``views/``, cached loaders and shared widgets in ``state.py``."""
