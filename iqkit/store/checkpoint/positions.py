"""Where a checkpoint's batches had read their sources to: positions and end offsets.

Spark's offsets log (``offsets/<batch>``) holds, after the batch's metadata line, one line
per source with the offsets the batch read up to:

* a **Kafka source** writes ``{"<topic>": {"<partition>": <offset>}}`` with the *next*
  offset to read, so the last offset applied is one less (iqkit's positions hold the
  last offset applied, as a sink records them);
* a **file source** writes ``{"logOffset": <n>}``: the files it read are in its own log,
  ``sources/<i>/<batch>`` (``v1`` then one JSON line per file, with ``path``), compacted
  every few batches into ``<batch>.compact`` (every file up to that batch). The local
  stand-in topic (``store/topic_files.py``) names each file after its partition and
  offsets, so a file source over one reads as Kafka positions: per partition, the
  highest offset of a file read.

A stateful operator's input is shuffled by key, so every input partition feeds every
state partition: a batch's position is each of its store partitions' position.

End offsets (for lag) are known only for local stand-in topics, from a listing of their
folders now; a Kafka source's log-end offsets are the broker's, which a checkpoint does
not record: lag then says no end offsets were recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from urllib.parse import unquote, urlparse

from ...query.position import Position
from ..objects import ObjectStore
from ..topic_files import log_end_offsets, parse_data_file_name

__all__ = ["BatchSources", "batch_sources"]

_COMPACT = ".compact"


class BatchSources:
    """What one batch had read: its ``position`` and the local topic folders it read
    (``topic -> folder``), whose current log-end offsets ``end_position`` lists."""

    def __init__(self, position: Position, topic_folders: dict[str, str]) -> None:
        self.position = position
        self.topic_folders = topic_folders

    def end_position(self) -> Position | None:
        """The local topics' log-end offsets now (``None``: some source's are unknown,
        a Kafka broker's, or nothing was read)."""
        if not self.topic_folders:
            return None
        ends: dict[str, dict[int, int]] = {}
        for topic, folder in self.topic_folders.items():
            try:
                names = os.listdir(folder)
            except OSError:
                return None
            ends[topic] = log_end_offsets(names)
        return Position.from_map(ends)


def batch_sources(objects: ObjectStore, batch: int) -> BatchSources:
    """The sources of ``batch`` (module docstring); sources iqkit cannot map to positions
    (a rate source, a file source over other files) add nothing."""
    lines = objects.read_bytes(f"offsets/{batch}").decode("utf-8", "replace").split("\n")
    components: dict[str, dict[int, int]] = {}
    folders: dict[str, str] = {}
    kafka = False
    for index, line in enumerate(lines[2:]):
        try:
            offsets = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if not isinstance(offsets, dict):
            continue
        if "logOffset" in offsets:
            for path in _file_source_paths(objects, index, int(offsets["logOffset"])):
                _add_topic_file(path, components, folders)
            continue
        for topic, partitions in offsets.items():
            if isinstance(partitions, dict):
                kafka = True
                for p, offset in partitions.items():
                    if int(offset) > 0:
                        owned = components.setdefault(topic, {})
                        owned[int(p)] = max(owned.get(int(p), -1), int(offset) - 1)
    position = Position.from_map(components)
    return BatchSources(position, {} if kafka else folders)


def _add_topic_file(
    path: str, components: dict[str, dict[int, int]], folders: dict[str, str]
) -> None:
    """Count one file a file source read, when it is a local topic's data file."""
    local = unquote(urlparse(path).path) if path.startswith("file:") else path
    folder, _, name = local.rstrip("/").rpartition("/")
    parsed = parse_data_file_name(name)
    if parsed is None:
        return
    topic = folder.rpartition("/")[2]
    p, _, last = parsed
    owned = components.setdefault(topic, {})
    owned[p] = max(owned.get(p, -1), last)
    folders[topic] = folder


def _file_source_paths(objects: ObjectStore, source: int, upto: int) -> Iterator[str]:
    """Every file path source ``source``'s log lists for batches up to ``upto``: the
    newest compacted file at or below it, then the plain ones after it."""
    prefix = f"sources/{source}"
    compacts, plain = [], []
    for key in objects.list(prefix):
        name = key.rpartition("/")[2]
        number = name.removesuffix(_COMPACT)
        if not number.isdigit() or int(number) > upto:
            continue
        (compacts if name.endswith(_COMPACT) else plain).append(int(number))
    start = max(compacts, default=-1)
    keys = [f"{prefix}/{start}{_COMPACT}"] if start >= 0 else []
    keys += [f"{prefix}/{n}" for n in sorted(plain) if n > start]
    for key in keys:
        for line in objects.read_bytes(key).decode("utf-8", "replace").split("\n")[1:]:
            try:
                entry = json.loads(line) if line.strip() else None
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                yield entry["path"]
