"""The store manifest: the settings every reader and writer of a store agrees on.

``<root>/<store>/manifest.json`` is written once, when the store is created, and never changes
afterwards (changing a serde or the partition count would make existing bytes unreadable
or mis-routed, the lesson of Quix Streams' serializer docs and Spark's UnsafeRow).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import StoreCorruptedError, StoreExistsError
from .encoding.partitioners import get_partitioner
from .encoding.serdes import get_serde
from .integrity import seal_json, unseal_json
from .kinds import StoreKind
from .names import FORMAT_VERSION, FORMAT_VERSIONS

DEFAULT_RETENTION = 10

#: The most partitions a store may have, checked when a manifest is made and when one is
#: read: a manifest is a file anyone can write, and readers do per-partition work (a
#: fan-out query, lags), so a count of 10**9 must be damage, not an hour of work. Far
#: above what a stateful job uses: Kafka advises a few thousand partitions per broker and
#: Spark jobs rarely shuffle into more than tens of thousands (docs/DECISIONS.md
#: "Stores and their manifest").
MAX_PARTITIONS = 100_000

#: The settings that make a store's data readable and routable: a store asked for again
#: with any of them different is refused (``StoreExistsError``).
STORE_SETTINGS = (
    "kind",
    "partitions",
    "key_serde",
    "value_serde",
    "partitioner",
    "window_size_ms",
)


@dataclass(frozen=True)
class StoreManifest:
    name: str
    #: A ``StoreKind`` (given as one or as its name, ``"kv"`` / ``"window"``; stored as the
    #: name, so it still equals and prints as the string).
    kind: StoreKind
    partitions: int
    key_serde: str
    value_serde: str
    partitioner: str
    window_size_ms: int | None = None
    #: How many published versions are kept for ``as_of`` reads (the latest included).
    retention: int = DEFAULT_RETENTION
    format_version: int = FORMAT_VERSION
    #: Free-form facts the writer recorded at creation (e.g. the Spark job's key columns).
    properties: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A frozen dataclass: normalising a field in __post_init__ needs object.__setattr__.
        object.__setattr__(self, "kind", StoreKind.of(self.kind, self.name))
        if (
            not isinstance(self.partitions, int)
            or isinstance(self.partitions, bool)
            or not 1 <= self.partitions <= MAX_PARTITIONS
        ):
            raise ValueError(
                f"store {self.name!r}: partitions must be an int from 1 to {MAX_PARTITIONS}, "
                f"got {self.partitions!r}"
            )
        get_serde(self.key_serde)
        get_serde(self.value_serde)
        get_partitioner(self.partitioner)
        if self.kind.windowed:
            if not isinstance(self.window_size_ms, int) or self.window_size_ms <= 0:
                raise ValueError(
                    f"store {self.name!r}: a window store needs window_size_ms > 0, "
                    f"got {self.window_size_ms!r}"
                )
        elif self.window_size_ms is not None:
            raise ValueError(f"store {self.name!r}: window_size_ms is only for window stores")
        if not isinstance(self.retention, int) or self.retention < 1:
            raise ValueError(f"store {self.name!r}: retention must be >= 1, got {self.retention!r}")

    def to_json(self) -> str:
        """The manifest's text, sealed with its checksum (integrity.py)."""
        return seal_json(json.dumps(asdict(self), indent=2, sort_keys=True))

    @classmethod
    def from_json(cls, text: str) -> StoreManifest:
        data = json.loads(text)
        if isinstance(data, dict):
            data.pop("checksum", None)  # checked by ``parse`` (integrity.unseal_json)
        if data.get("format_version") not in FORMAT_VERSIONS:
            known = " and ".join(map(str, FORMAT_VERSIONS))
            raise StoreCorruptedError(
                f"store {data.get('name')!r}: manifest format {data.get('format_version')} "
                f"is not supported (this iqkit reads formats {known})"
            )
        return cls(**data)

    @classmethod
    def parse(cls, text: str, store: str, where: object) -> StoreManifest:
        """``text`` (the manifest of ``store``, read from ``where``) as a manifest;
        ``StoreCorruptedError`` naming ``where`` when it cannot be."""
        try:
            raw = unseal_json(text.encode(), where=str(where))
            return cls.from_json(raw.decode())
        except StoreCorruptedError as exc:
            raise StoreCorruptedError(f"store {store!r}: unreadable manifest: {exc}") from None
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise StoreCorruptedError(
                f"store {store!r}: unreadable manifest {where}: {exc}"
            ) from exc


def check_same_settings(
    existing: StoreManifest,
    wanted: StoreManifest,
    *,
    settings: tuple[str, ...] = STORE_SETTINGS,
    asked: str = "asked",
) -> StoreManifest:
    """``existing`` when its ``settings`` equal ``wanted``'s, else ``StoreExistsError``
    naming each difference (``asked`` says who wanted the other value). The one home of
    this check: ``chain.stores.ensure_chain_store`` and the formats' ``ensure_store``
    call it."""
    diffs = [
        f"{f}={getattr(existing, f)!r} ({asked} {getattr(wanted, f)!r})"
        for f in settings
        if getattr(existing, f) != getattr(wanted, f)
    ]
    if diffs:
        raise StoreExistsError(
            f"store {wanted.name!r} exists with other settings: {', '.join(diffs)}"
        )
    return existing
