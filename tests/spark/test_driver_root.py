"""``driver_root``: the root Spark jobs hand their tasks, resolved on the driver."""

from __future__ import annotations

import os

import pytest

from iqkit.errors import RootError
from iqkit.spark.roots import driver_root


def test_local_roots_become_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert driver_root("stores") == os.path.join(tmp_path, "stores")
    assert driver_root(f"file://{tmp_path}/x") == f"{tmp_path}/x"


@pytest.mark.parametrize(
    ("root", "url"),
    [
        ("s3://bucket/stores/", "s3://bucket/stores"),
        ("s3a://bucket", "s3://bucket"),
        ("gs://b/x", "gs://b/x"),
    ],
)
def test_object_storage_roots_pass_through_as_urls(root, url, tmp_path, monkeypatch):
    # Every executor opens the same URL itself; nothing becomes a folder here.
    monkeypatch.chdir(tmp_path)
    assert driver_root(root) == url
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("root", ["s3:/bucket/stores", "ftp://host/x"])
def test_broken_urls_are_refused_in_one_line(root, tmp_path, monkeypatch):
    # "s3:/bucket" is what pathlib makes of "s3://bucket": never a folder named "s3:".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RootError) as err:
        driver_root(root)
    assert "\n" not in str(err.value) and os.listdir(tmp_path) == []
