"""Every reserved name iqkit puts on disk or in a RocksDB keyspace, in one place.

Keeping them together (as Quix Streams keeps its state's names) means a change of
layout is one edit, and nothing else in the code spells a file name or key prefix.

Keyspace of one partition's RocksDB (one column family, ``default``):

* ``META_PREFIX`` (``0x00``): iqkit's own records, never user data. The commit record
  lives here, in the same column family as the data, so one atomic ``WriteBatch``
  writes both and a rocksdict ``Snapshot`` (which reads one column family) sees both.
* ``DATA_PREFIX`` (``0x01``): key-value stores' user keys, ``DATA_PREFIX + key_bytes``.
  Every user key gets the prefix because serialized keys can begin with any byte
  (an ``int32`` key ``0`` is ``00 00 00 00``), so no prefix could be reserved otherwise.
* ``WINDOW_PREFIX`` (``0x02``): window stores, ``escaped(key) + start`` (see
  store/encoding/keyspace.py).
* ``WINDOW_TIME_PREFIX`` (``0x03``): window stores' time index, ``start + escaped(key)``,
  so a window-range query reads only the windows in its time range.
"""

from __future__ import annotations

META_PREFIX = b"\x00"
DATA_PREFIX = b"\x01"
WINDOW_PREFIX = b"\x02"
WINDOW_TIME_PREFIX = b"\x03"
#: First byte after every user keyspace: an exclusive upper bound for user scans.
END_OF_USER_KEYSPACE = b"\x04"

#: The partition's commit record (JSON): position, version, counts, writer.
COMMIT_KEY = META_PREFIX + b"commit"

# -- files and folders of a store: <root>/<store>/... -----------------------------------
MANIFEST_FILE = "manifest.json"
#: The writers' commit lock on a local root; its content says who holds it.
LOCK_FILE = "writer.lock"
#: What only a store in the retired folder format of earlier iqkits holds (its latest
#: version's number, its version records, its partition folders): how one is recognised
#: and refused (format.is_folder_store).
LATEST_FILE = "LATEST"
VERSIONS_DIR = "versions"
PARTITIONS_DIR = "partitions"
#: RocksDB writes this file last when it creates a database: its presence means a
#: database exists (rocksdict would otherwise create an empty one on open).
ROCKSDB_CURRENT_FILE = "CURRENT"
#: What RocksDB and rocksdict write beside a database's data (its lock, its info log
#: ``LOG`` and ``LOG.old.*``, rocksdict's config): views and copies leave them out.
ROCKSDB_SIDE_FILES = frozenset({"LOCK", "LOG", "rocksdict-config.json"})
#: Prefix of a reading process's folder of private database views (in the system's
#: temporary folder, never under a store; see rocks.open_for_read).
READ_VIEWS_PREFIX = "iqkit-views-"

# -- the SST-chain format of object roots: <root>/<store>/... (store/chain/records.py) ----------
#: Prefix of a chain writer's working folder in its TMPDIR (or the folder it was given):
#: ``iqkit-chain-<random>/``, flocked while the writer lives, so the next writer can
#: tell a killed writer's folder from a live one's and remove it (store/chain/write.py).
CHAIN_WORK_PREFIX = "iqkit-chain-"
#: One JSON record per published version: ``chain/<zero-padded n>.json``. The padding
#: makes a listing's order numeric order, so the latest version is the last name listed.
CHAIN_RECORDS_DIR = "chain"
#: Digits of a chain record's number (``000000000042.json``). Version numbers run from 1
#: to ``10**CHAIN_RECORD_DIGITS - 1`` (chain.records.MAX_CHAIN_VERSION); a longer name is
#: no record.
CHAIN_RECORD_DIGITS = 12
#: Immutable SST files: ``sst/<p>/<version>-<milliseconds>-<random>.sst``; the writer's
#: clock in the name lets retention judge an object's age without a request per object.
CHAIN_SST_DIR = "sst"

#: A columnar twin's suffix (store/columnar/twins.py): it sits beside its SST, named like it.
TWIN_SUFFIX = ".parquet"
_SST_SUFFIX = ".sst"


def twin_key(sst_key: str) -> str:
    """The key of an SST's columnar twin: the SST's, ``.sst`` replaced by ``.parquet``."""
    base = sst_key[: -len(_SST_SUFFIX)] if sst_key.endswith(_SST_SUFFIX) else sst_key
    return base + TWIN_SUFFIX


#: In the local cache: ``dbs/<root id>/<store>/<p>/<version>-<chain hash>/`` is a
#: partition chain ingested into a RocksDB folder (built once, reused by later opens).
CACHE_DBS_DIR = "dbs"
#: Prefix of a database being built in the cache (renamed into place when complete).
CACHE_BUILDING_PREFIX = ".building-"
#: Prefix a database evicted from the cache is renamed to before it is deleted.
CACHE_EVICTING_PREFIX = ".evicting-"

#: A manifest's ``format_version``: bumped when the on-disk layout changes incompatibly.
#: 1 was the folder format of earlier iqkits (also written by their chain stores on
#: object roots, which stay readable); 2 is the SST-chain format (store/chain/), which an
#: iqkit that knows only folders must refuse rather than misread.
FORMAT_VERSION = 1
CHAIN_FORMAT_VERSION = 2
FORMAT_VERSIONS = (FORMAT_VERSION, CHAIN_FORMAT_VERSION)
