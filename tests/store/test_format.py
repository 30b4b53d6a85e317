"""The format seam (``store/format.py``, ``store/formats.py``): one registry, one format
per root, a read-only format refusing writes in one line, and stores of the retired
folder format refused in one line naming ``python -m iqkit migrate``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import kv_rows, request, tree_digest

import iqkit
from iqkit.errors import FolderFormatStoreError, ReadOnlyStoreError
from iqkit.store.chain.format import ChainFormat
from iqkit.store.checkpoint.format import CheckpointFormat
from iqkit.store.format import is_folder_store
from iqkit.store.formats import FORMATS, format_for
from iqkit.store.manifest import StoreManifest
from iqkit.store.roots import parse_root


def folder_store(root: Path, name: str = "old") -> Path:
    """A store as the folder format of earlier iqkits left it: a manifest of format 1,
    ``LATEST``, a version record and a partition folder."""
    folder = root / name
    (folder / "versions").mkdir(parents=True)
    (folder / "partitions" / "0" / "1").mkdir(parents=True)
    manifest = StoreManifest(
        name=name, kind="kv", partitions=1, key_serde="string", value_serde="json",
        partitioner="murmur2", format_version=1,
    )  # fmt: skip
    (folder / "manifest.json").write_text(manifest.to_json())
    (folder / "LATEST").write_text("1\n")
    (folder / "versions" / "1.json").write_text('{"version": 1, "partitions": {"0": 1}}')
    return folder


MIGRATE = re.compile(
    r"^store 'old' is in the folder format of earlier iqkit versions; convert it with: "
    r"python -m iqkit migrate \S+ old$"
)


def test_every_root_gets_the_chain_format_from_one_registry(root, s3_root):
    assert dict(FORMATS) == {"chain": ChainFormat, "spark-checkpoint": CheckpointFormat}
    for where in (root, s3_root):
        fmt = format_for(parse_root(where))
        assert isinstance(fmt, ChainFormat) and not fmt.read_only
    known = r"\(known: chain, spark-checkpoint\)"
    with pytest.raises(ValueError, match=rf"unknown store format 'folder' {known}"):
        format_for(parse_root(root), "folder")
    assert not root.exists()  # choosing a format creates nothing


def test_a_folder_store_is_refused_in_one_line_by_readers_and_writers(root):
    iqkit.create_store(root, "new", partitions=1)
    with iqkit.StoreWriter(root, "new") as w:
        w.put("a", 1)
    folder = folder_store(root)
    before = tree_digest(folder)
    assert is_folder_store(folder) and not is_folder_store(root / "new")
    with iqkit.open(root) as engine:
        assert engine.store_names() == ["new", "old"]
        with pytest.raises(FolderFormatStoreError) as info:
            engine.query(request("old", iqkit.KeyQuery.with_key("a")))
        assert MIGRATE.match(str(info.value)), str(info.value)
        assert f"migrate {root} old" in str(info.value)
        assert [v for _, _, v in kv_rows(engine, "new")] == [1]  # the others still serve
    for write in (
        lambda: iqkit.StoreWriter(root, "old"),
        lambda: iqkit.create_store(root, "old", partitions=1),
        lambda: format_for(parse_root(root)).open_job_commit("old"),
    ):
        with pytest.raises(FolderFormatStoreError) as info:
            write()
        assert MIGRATE.match(str(info.value)), str(info.value)
    with pytest.raises(FolderFormatStoreError):
        iqkit.open(root, as_of={"old": 1})
    assert tree_digest(folder) == before  # nothing read or written changed it


def test_a_folder_store_in_the_notebook_magic_is_one_usage_error(root):
    from IPython.core.error import UsageError

    from iqkit.jupyter.testing import new_shell

    folder_store(root)
    shell = new_shell(root=str(root), progress=False)
    with pytest.raises(UsageError, match="convert it with: python -m iqkit migrate"):
        shell.run_line_magic("iq", "get old a")


def test_what_is_and_is_not_a_folder_store(root):
    folder = folder_store(root)
    assert is_folder_store(folder)
    (folder / "LATEST").unlink()
    assert is_folder_store(folder)  # versions/ and partitions/ still say so
    shutil.rmtree(folder / "versions")
    shutil.rmtree(folder / "partitions")
    assert not is_folder_store(folder)  # a format-1 manifest alone: an empty chain store
    (folder / "chain").mkdir()
    (folder / "sst").mkdir()
    assert not is_folder_store(folder)  # the chain's folders alone: a chain store
    (folder / "LATEST").write_text("0\n")
    # Folder files beside the chain's: a migration not yet switched over (the chain's
    # files come first), so still the folder store, whole.
    assert is_folder_store(folder)
    assert not is_folder_store(root / "nothing-here")


def test_a_chain_store_an_earlier_iqkit_made_with_a_format_1_manifest_still_opens(root):
    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    manifest = root / "s" / "manifest.json"
    data = json.loads(manifest.read_text())
    data.pop("checksum")  # as an earlier iqkit wrote it: no checksum (store/integrity.py)
    manifest.write_text(json.dumps({**data, "format_version": 1}))
    with iqkit.open(root) as engine:
        assert [v for _, _, v in kv_rows(engine, "s")] == [1]
    with iqkit.StoreWriter(root, "s") as w:
        w.put("b", 2)
    assert w.version == 2


class _ReadOnlyChain(ChainFormat):
    """The chain format declared read-only: what a format reading another program's
    files (a Spark checkpoint) is."""

    name = "read-only-chain"
    read_only = True


def test_a_read_only_format_refuses_every_write_in_one_line(root):
    iqkit.create_store(root, "s", partitions=1)
    with iqkit.StoreWriter(root, "s") as w:
        w.put("a", 1)
    before = tree_digest(root)
    fmt = _ReadOnlyChain(parse_root(root))
    assert fmt.read_manifest("s").partitions == 1  # reads work
    assert fmt.latest_published("s").version == 1
    manifest = fmt.read_manifest("s")
    refusals = {
        "commit to": lambda: iqkit.StoreWriter(fmt, "s"),
        "create": lambda: iqkit.create_store(fmt, "s", partitions=1),
        "run a job on": lambda: fmt.open_job_commit("s"),
        "clean up": lambda: fmt.collect_garbage("s", 1),
        "create ": lambda: fmt.ensure_store(manifest),
    }
    for action, write in refusals.items():
        with pytest.raises(ReadOnlyStoreError) as info:
            write()
        assert str(info.value) == (
            f"store 's' is in the read-only-chain format, which iqkit only reads: "
            f"cannot {action.strip()} it"
        )
    assert tree_digest(root) == before
