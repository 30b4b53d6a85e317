"""Store roots: local paths and URLs told apart in one place (iqkit/store/roots.py), a URL
never becoming a folder "s3:" (issue 13, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import iqkit
from iqkit.__main__ import main as cli_main
from iqkit.errors import RootError
from iqkit.store.roots import StoreRoot, parse_root


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in an empty current folder, where the old bug made a folder named ``s3:``."""
    folder = tmp_path / "cwd"  # beside the s3_root fixture's IQKIT_CACHE, not around it
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# -- parsing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "scheme", "bucket", "prefix", "url"),
    [
        ("s3://bkt/a/b", "s3", "bkt", "a/b", "s3://bkt/a/b"),
        ("s3://bkt/a/b/", "s3", "bkt", "a/b", "s3://bkt/a/b"),
        ("s3a://bkt//a", "s3", "bkt", "a", "s3://bkt/a"),
        ("s3://bkt", "s3", "bkt", "", "s3://bkt"),
        ("gs://bkt/x", "gs", "bkt", "x", "gs://bkt/x"),
        ("gcs://bkt/x", "gs", "bkt", "x", "gs://bkt/x"),
        ("abfss://box@acct.dfs.core.windows.net/x", "abfs", "box@acct.dfs.core.windows.net", "x",
         "abfs://box@acct.dfs.core.windows.net/x"),
    ],
)  # fmt: skip
def test_urls_name_a_bucket_and_prefix(text, scheme, bucket, prefix, url):
    root = parse_root(text)
    assert (root.scheme, root.bucket, root.prefix, root.url) == (scheme, bucket, prefix, url)
    assert not root.is_local and root.local is None and root.text == text


@pytest.mark.parametrize("text", ["stores", "./a/b", "/tmp/x", "C:\\stores", "name:with-colon"])
def test_paths_are_local_folders_as_given(text):
    root = parse_root(text)
    assert root.is_local and root.local == Path(text)
    assert root.url == Path(os.path.abspath(text)).as_uri()


@pytest.mark.parametrize(
    ("text", "path"),
    [("file:///tmp/x", "/tmp/x"), ("file://localhost/tmp/x", "/tmp/x"), ("file:/tmp/x", "/tmp/x"),
     ("FILE:rel", "rel")],
)  # fmt: skip
def test_file_urls_are_local_folders(text, path):
    assert parse_root(text).local == Path(path)


def test_path_objects_are_accepted_and_store_roots_pass_through(tmp_path):
    root = parse_root(tmp_path)
    assert root.local == tmp_path
    assert parse_root(root) is root
    merged = parse_root(parse_root("s3://b1/x", storage_options={"a": 1}), storage_options={"b": 2})
    assert isinstance(merged, StoreRoot) and dict(merged.options) == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("hdfs://nn/x", "unknown scheme 'hdfs'"),
        ("s3:/bkt/x", "pathlib.Path collapses"),
        ("s3:bkt", "one slash"),
        ("s3://", "names no bucket"),
        ("s3:///x", "names no bucket"),
        ("s3://b/../x", "'..'"),
        ("s3://b/x?versionId=3", "query"),
        ("file://otherhost/x", "names this machine"),
        ("", "not a usable path"),
        ("a\x00b", "not a usable path"),
    ],
)
def test_bad_roots_are_one_line_root_errors(text, words):
    with pytest.raises(RootError) as info:
        parse_root(text)
    assert words in _one_line(info.value)
    assert isinstance(info.value, ValueError)


def test_a_root_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="path or a URL string, got int"):
        parse_root(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bytes"):
        parse_root(b"/tmp")  # type: ignore[arg-type]


def test_pathlib_mangled_urls_are_refused_not_made_folders():
    """``Path("s3://b/x")`` is ``s3:/b/x``: still recognised as a URL."""
    with pytest.raises(RootError, match="pass the URL as a string"):
        parse_root(Path("s3://b/x"))


# -- filesystems: the missing package names the extra ---------------------------------------
@pytest.mark.parametrize(("url", "pkg", "extra"), [("s3://b/x", "s3fs", "s3"),
                                                   ("gs://b/x", "gcsfs", "gcs"),
                                                   ("abfs://c/x", "adlfs", "azure")])  # fmt: skip
def test_a_missing_filesystem_package_names_the_extra(url, pkg, extra):
    """Run where the package cannot be imported (``sys.modules[name] = None`` is Python's
    own "absent module" marker), as on a machine that installed iqkit without the extra."""
    code = (
        f"import sys\nsys.modules[{pkg!r}] = None\n"
        "from iqkit.store.roots import parse_root\nfrom iqkit.errors import RootError\n"
        f"try:\n    parse_root({url!r}).filesystem()\nexcept RootError as exc:\n    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    expected = f"root {url!r} needs the {pkg} package: pip install 'iqkit[{extra}]'"
    assert out.stdout.strip() == expected


def test_parsing_a_url_imports_no_filesystem_library():
    """``import iqkit`` stays light (tests/test_import_cost.py): fsspec and the SDKs come
    only when a remote root's filesystem is opened."""
    code = (
        "import sys, iqkit\nfrom iqkit.store.roots import parse_root\nparse_root('s3://b/x')\n"
        "print([m for m in ('fsspec', 's3fs', 'botocore') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


# -- a URL root is object storage, never a local folder (the silent "s3:" folder bug) --------
def _assert_nothing_made(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == []


def test_create_store_and_store_writer_with_a_url_root_write_no_local_folder(in_tmp, s3_root):
    iqkit.create_store(s3_root, "totals", partitions=2)
    with iqkit.StoreWriter(s3_root, "totals") as w:
        w.put("a", 1)
    assert w.version == 1
    _assert_nothing_made(in_tmp)


def test_open_with_a_url_root_never_reads_an_s3_folder(in_tmp, s3_root):
    """The old code read ``./s3:/<bucket>/stores`` when it existed (made by the old
    writer); the URL now reads the bucket, whatever folders the current one holds."""
    bucket = s3_root.removeprefix("s3://").split("/")[0]
    iqkit.create_store(in_tmp / "s3:" / bucket / "stores", "local_only", partitions=1)
    iqkit.create_store(s3_root, "on_s3", partitions=1)
    with iqkit.open(s3_root) as engine:
        assert engine.store_names() == ["on_s3"]
    with pytest.raises(RootError, match="pass the URL as a string"):
        iqkit.open(Path(s3_root))


def test_cli_stores_with_a_url_root_lists_the_bucket(in_tmp, s3_root, capsys):
    iqkit.create_store(s3_root, "totals", partitions=2)
    assert cli_main(["stores", s3_root]) == 0
    assert capsys.readouterr().out.startswith("totals\tkv\t2 partitions\t")
    _assert_nothing_made(in_tmp)


def test_file_urls_keep_working_as_local_roots(in_tmp):
    folder = in_tmp / "stores"
    iqkit.create_store(folder.as_uri(), "totals", partitions=1)
    with iqkit.StoreWriter(folder.as_uri(), "totals") as w:
        w.put("a", 1)
    with iqkit.open(folder.as_uri()) as engine:
        assert engine.store_names() == ["totals"]
    assert sorted(p.name for p in in_tmp.iterdir()) == ["stores"]
