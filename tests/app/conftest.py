"""Fixtures of the app's tests."""

import pytest


@pytest.fixture(autouse=True)
def loopback():
    """AppTest has no server: bind the app where ``workbench app`` does by default, so the sidebar's
    warning for a non-loopback address is off unless a test sets another address."""
    try:
        from streamlit import config
    except ImportError:  # tests that need streamlit skip themselves
        yield None
        return

    previous = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield config
    config.set_option("server.address", previous)
