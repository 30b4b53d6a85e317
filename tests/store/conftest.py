"""The object-store tests' roots: each runs once on a local folder and once on the real
S3-compatible server (its fixtures, shared with other tests, are in tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from iqkit.store.objects import ObjectStore, open_objects


@pytest.fixture(params=["local", "s3"])
def root_url(request, tmp_path) -> str:
    """A fresh root, once as a local folder and once on the S3 server: the object-store
    tests run over both."""
    if request.param == "local":
        return os.fspath(tmp_path / "root")
    return request.getfixturevalue("s3_root")


@pytest.fixture
def objects(root_url) -> ObjectStore:
    return open_objects(root_url)
