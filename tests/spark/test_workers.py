"""``iqkit.spark.workers``: Spark's own archives are not re-read on every task (the
CPython 3.11 zipimport quirk), while any other archive still is."""

from __future__ import annotations

import importlib
import sys
import zipfile

import pyarrow as pa
import pytest

from iqkit.spark.workers import keep_spark_archive_indexes

needs_311 = pytest.mark.skipif(
    sys.version_info >= (3, 12), reason="zipimport invalidation is lazy from Python 3.12"
)


def _zip_with(path, modules: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, source in modules.items():
            z.writestr(f"{name}.py", source)


@pytest.fixture
def two_archives(tmp_path, monkeypatch):
    """A fake Spark installation's zip and an unrelated zip, both on sys.path."""
    home = tmp_path / "spark-home"
    (home / "python" / "lib").mkdir(parents=True)
    spark_zip = home / "python" / "lib" / "fake_pyspark.zip"
    other_zip = tmp_path / "user_code.zip"
    _zip_with(spark_zip, {"iqkit_fake_spark_a": "X = 1\n"})
    _zip_with(other_zip, {"iqkit_fake_user_a": "X = 1\n"})
    monkeypatch.setenv("SPARK_HOME", str(home))
    for z in (spark_zip, other_zip):
        monkeypatch.syspath_prepend(str(z))
    importlib.import_module("iqkit_fake_spark_a")
    importlib.import_module("iqkit_fake_user_a")
    yield spark_zip, other_zip
    for name in ("spark_a", "spark_b", "user_a", "user_b"):
        sys.modules.pop(f"iqkit_fake_{name}", None)
    for z in (spark_zip, other_zip):
        sys.path_importer_cache.pop(str(z), None)


@needs_311
def test_spark_archives_keep_their_index_and_others_are_still_refreshed(two_archives):
    spark_zip, other_zip = two_archives
    assert keep_spark_archive_indexes() == 1
    assert keep_spark_archive_indexes() == 0  # already done: nothing left to change
    _zip_with(spark_zip, {"iqkit_fake_spark_a": "X = 1\n", "iqkit_fake_spark_b": "X = 2\n"})
    _zip_with(other_zip, {"iqkit_fake_user_a": "X = 1\n", "iqkit_fake_user_b": "X = 2\n"})
    importlib.invalidate_caches()
    # The user's archive was re-read (its new module imports); Spark's kept its index.
    assert importlib.import_module("iqkit_fake_user_b").X == 2
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("iqkit_fake_spark_b")


def test_nothing_changes_outside_a_spark_worker(two_archives, monkeypatch):
    monkeypatch.delenv("SPARK_HOME")
    assert keep_spark_archive_indexes() == 0


@needs_311
def test_a_real_worker_finds_sparks_archives(spark):
    """The assumption behind the workaround: Spark's Python workers import pyspark from
    archives under $SPARK_HOME, which they see in their environment."""

    def probe(batches):
        import zipimport

        from iqkit.spark.workers import keep_spark_archive_indexes

        keep_spark_archive_indexes()
        kept = [
            f
            for f in sys.path_importer_cache.values()
            if isinstance(f, zipimport.zipimporter) and "invalidate_caches" in vars(f)
        ]
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"kept": len(kept)}])

    rows = spark.range(4, numPartitions=2).mapInArrow(probe, "kept long").collect()
    assert len(rows) == 2
    assert all(r["kept"] > 0 for r in rows)
