"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from kvpool.client.data_path import DataPath


@pytest.fixture
def data_path():
    """A client's data path over UCX alone (TCP: no mapping, no checked stream)."""
    path = DataPath({"TLS": "tcp"}, same_host_mapping=False, checked_stream=False)
    yield path
    path.close()
