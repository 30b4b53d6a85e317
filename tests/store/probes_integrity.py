"""Damaged files, every query shape: no silent wrong answer and no dead kernel (a row of
RELIABILITY.md; see ``tests/reliability/registry.py``).

For each file kind a store publishes (an SST, its columnar twin, a version record
``chain/<N>.json``, the manifest), a damage is one of: a random single-bit flip, a
truncation to a random length, a zeroed 4 KiB page (page-aligned, the file's size kept).
Each damage is made to a fresh copy of two stores with history (``integrity_child.py``:
a 4-partition key-value store of JSON values with 5 versions, a window store), and every
query shape is run over the copy in a child process: key, multi-key, range, prefix,
window, versions (versioned and multi-versioned key queries over every retained version,
old versions read whole), changes, SQL (``iqkit.sql``), ``%iq`` lines in a real IPython
shell, the widget panel driven from code (and, in ``test_integrity_faults.py``, Spark's
``format("iqkit")`` on some of the copies). Each shape's answer must be the undamaged one
or a clean failure (``integrity_child.classify``), and the child must not be killed by a
signal (an abort, a segfault) nor take more than ``SHAPE_TIMEOUT`` seconds for a shape.

A second probe does the same to Spark Structured Streaming checkpoints read as stores
(``CheckpointLayout``: delta, changelog, zip and shared SST state files, operator
metadata, offsets and commits logs), through the checkpoint shapes; it needs Spark to
make the checkpoints, so its short run is in ``test_integrity_faults.py``.

Children are forked from a forkserver that imported iqkit, pandas, DuckDB, pyarrow,
IPython and ipywidgets (``integrity_child``), so a damage costs its queries, not a
Python start; each child reads one damaged copy with a fresh ``IQKIT_CACHE`` and a fresh
engine. When a child dies or hangs, the shapes it had not run yet run in a new child.

``IQKIT_FAULT_SEED`` replays a run's damages (the plan is drawn from it before anything
runs; each damage's own seed, file, offset and the shape are printed with every bad
outcome); ``python tests/store/probes_integrity.py --seed S --per-kind N --heavy-every H
--index I`` makes one damage again and runs its shapes in-process (``replay``; the
stores are built anew, so an offset may land a few bytes apart).
``IQKIT_INTEGRITY_KEEP=<folder>`` keeps there an exact copy of every damaged root that
gave a bad outcome. ``IQKIT_INTEGRITY_WORKERS`` sets how many children run at once
(default: the number of CPUs, at most 4). ``IQKIT_INTEGRITY_REPORT=<file>`` writes the
long run's full report (table, bad verdicts, examples) there.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver as forkserver_module
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

# integrity_child (and the forkserver's copy of this path); registry when run as a script
sys.path[:0] = [
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1] / "reliability"),
]

import integrity_child as ic  # noqa: E402  (the path above)
from registry import Outcome, probe  # noqa: E402

KINDS = ("SST", "twin", "record", "manifest")
HOWS = ("bit flip", "truncation", "zeroed 4 KiB page")
PAGE = 4096
#: Seconds one shape may take in a child (the whole child: this per shape it runs).
SHAPE_TIMEOUT = 60.0
#: The shapes that cost most per damage (a DuckDB connection, an IPython shell, widgets).
HEAVY = ("sql", "iq", "panel")
OUTCOMES = ("same", "clean", "WRONG", "killed", "hang")
CKPT_KINDS = (
    "HDFS delta",
    "RocksDB changelog",
    "RocksDB zip",
    "RocksDB SST",
    "operator metadata",
    "offsets log",
    "commits log",
)
#: (folder, query kind, state store provider) of the checkpoints made (make_checkpoints).
CHECKPOINTS = (
    ("hdfs-agg", "agg", "hdfs"),
    ("rocksdb-agg", "agg", "rocksdb"),
    ("changelog-window", "window", "rocksdb-changelog"),
)


# -- damages -------------------------------------------------------------------------------
@dataclass
class Damage:
    index: int
    kind: str
    how: str
    seed: int
    shapes: tuple[str, ...]
    #: Filled in when made: the file (relative to the copy), what was done, the root the
    #: shapes read (relative to the copy: "" for the stores, a checkpoint's folder), its
    #: store, the store's partitions, those the damage touches, the names a failure
    #: message may name the file by.
    file: str = ""
    where: str = ""
    root: str = ""
    store: str = ""
    partitions: int = 0
    touched: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    #: False for a damage that left the file's bytes as they were (a page already zero).
    changed: bool = True

    def label(self) -> str:
        return f"damage {self.index} (seed {self.seed}): {self.kind} {self.file}: {self.where}"

    def facts(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "partitions": self.partitions,
            "touched": self.touched,
            "names": self.names,
            "kind": self.kind,
            "file": self.file,
            "changed": self.changed,
        }


class Layout:
    """What a run damages: the pristine root it builds, the file kinds in it, what a
    damaged file touches, and the shapes that read it."""

    kinds: tuple[str, ...] = KINDS
    #: Glob patterns of each kind's files, relative to the pristine copy.
    patterns: ClassVar[dict[str, tuple[str, ...]]] = {
        "SST": ("*/sst/*/*.sst",),
        "twin": ("*/sst/*/*.parquet",),
        "record": ("*/chain/*.json",),
        "manifest": ("*/manifest.json",),
    }

    def build(self, pristine: Path) -> None:
        ic.build_stores(pristine)

    def roots(self) -> list[str]:
        """The roots (relative to the copy) the shapes read, each with its own answers."""
        return [""]

    def shapes(self, heavy: bool) -> tuple[str, ...]:
        return (*ic.ENGINE_SHAPES, "verify", *(HEAVY if heavy else ()))

    def all_shapes(self) -> tuple[str, ...]:
        return tuple(s for s in ic.SHAPES if not s.startswith("ckpt"))

    def job(self, root: str) -> dict[str, Any]:
        """What a child needs besides the root (``Reader.stores``)."""
        return {}

    def files(self, copy: Path, kind: str) -> list[Path]:
        return sorted({p for pattern in self.patterns[kind] for p in copy.glob(pattern)})

    def describe(self, d: Damage, rel: Path) -> None:
        """Fill in ``d``'s root, store, partitions, touched partitions and names."""
        d.root, d.store = "", rel.parts[0]
        d.partitions = ic.PARTITIONS[d.store]
        if d.kind in ("SST", "twin"):
            d.touched = [int(rel.parts[2])]
            d.names = [rel.stem]  # the SST and its twin share it: either may be named
        else:
            d.touched = list(range(d.partitions))
            d.names = [rel.as_posix()]


class CheckpointLayout(Layout):
    """Spark Structured Streaming checkpoints read as stores (``iqkit.open(folder)``):
    copies of ``sources`` (checkpoint folders, their ``-input`` folders beside them), the
    files each state store provider writes, the operator metadata, the offsets and commits
    logs; the checkpoint shapes of ``integrity_child``."""

    kinds = CKPT_KINDS
    patterns: ClassVar[dict[str, tuple[str, ...]]] = {
        "HDFS delta": ("*/state/*/*/*.delta", "*/state/*/*/*.snapshot"),
        "RocksDB changelog": ("*/state/*/*/*.changelog",),
        "RocksDB zip": ("*/state/*/*/*.zip",),
        "RocksDB SST": ("*/state/*/*/SSTs/*.sst",),
        "operator metadata": ("*/metadata", "*/state/*/_metadata/*", "*/state/*/*/_metadata/*"),
        "offsets log": ("*/offsets/*",),
        "commits log": ("*/commits/*",),
    }

    def __init__(self, sources: list[Path]) -> None:
        self.sources = sources
        #: checkpoint folder name -> {store: kind}, {store: partitions}
        self.stores: dict[str, dict[str, str]] = {}
        self.partitions: dict[str, dict[str, int]] = {}

    def build(self, pristine: Path) -> None:
        import iqkit

        for source in self.sources:
            shutil.copytree(source, pristine / source.name)
            inputs = source.parent / f"{source.name}-input"
            if inputs.exists():
                shutil.copytree(inputs, pristine / inputs.name)
            with iqkit.open(pristine / source.name) as engine:
                names = engine.store_names()
                self.stores[source.name] = {s: engine.manifest(s).kind for s in names}
                self.partitions[source.name] = {s: engine.manifest(s).partitions for s in names}

    def roots(self) -> list[str]:
        return [source.name for source in self.sources]

    def shapes(self, heavy: bool) -> tuple[str, ...]:
        return ic.CKPT_SHAPES if heavy else ic.CKPT_SHAPES[:-1]

    def all_shapes(self) -> tuple[str, ...]:
        return ic.CKPT_SHAPES

    def job(self, root: str) -> dict[str, Any]:
        return {"stores": self.stores[root]}

    def files(self, copy: Path, kind: str) -> list[Path]:
        return [p for p in super().files(copy, kind) if not p.name.startswith(".")]

    def describe(self, d: Damage, rel: Path) -> None:
        d.root = rel.parts[0]
        (d.store, d.partitions), *more = self.partitions[d.root].items()
        assert not more, f"{d.root}: one store per checkpoint here, not {self.stores[d.root]}"
        inside = rel.relative_to(d.root)
        d.names = [inside.as_posix()]
        parts = inside.parts
        if (
            parts[0] == "state"
            and len(parts) > 3
            and parts[2].isdigit()
            and parts[3] != "_metadata"
        ):
            d.touched = [int(parts[2])]  # a partition's state file
            if parts[3] == "SSTs":
                d.names.append(inside.name)  # a zip lists it by its own name
        else:  # the operator's metadata and schema (kept in partition 0's folder), logs
            d.touched = list(range(d.partitions))


def make_checkpoints(spark: Any, folder: Path) -> list[Path]:
    """Three checkpoints of real streaming queries (three micro-batches each, 3 shuffle
    partitions): a running aggregate on the HDFS-backed provider (delta files), the same
    on RocksDB (zipped snapshots and shared SSTs), a windowed count on RocksDB with
    changelog checkpointing (changelog files)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "checkpoint"))
    from jobs import run_stream

    def ts(second: int) -> str:
        return f"2026-01-01T00:00:{second:02d}"

    batches = [
        [{"id": i, "user": f"u{i % 7}", "amount": i, "ts": ts(i % 50)} for i in range(b, b + 20)]
        for b in range(0, 60, 20)
    ]
    made = []
    for name, kind, provider in CHECKPOINTS:
        made.append(run_stream(spark, kind, folder / name, batches, provider=provider,
                               partitions=3))  # fmt: skip
    return made


def make_damage(copy: Path, d: Damage, layout: Layout) -> None:
    """Damage one file of kind ``d.kind`` in ``copy`` as ``d.how`` says, chosen and
    placed by ``d.seed``; fill in what was done."""
    import random

    rng = random.Random(d.seed)
    path = rng.choice(layout.files(copy, d.kind))
    data = bytearray(path.read_bytes())
    original = bytes(data)
    size = len(data)
    if d.how == "bit flip":
        at, bit = rng.randrange(size), rng.randrange(8)
        data[at] ^= 1 << bit
        before = data[at] ^ (1 << bit)
        d.where = f"bit {bit} of byte {at} flipped (0x{before:02x} -> 0x{data[at]:02x}) of {size}"
    elif d.how == "truncation":
        keep = rng.randrange(size)
        del data[keep:]
        d.where = f"truncated to {keep} of {size} bytes"
    else:
        page = rng.randrange((size + PAGE - 1) // PAGE)
        end = min(size, (page + 1) * PAGE)
        data[page * PAGE : end] = bytes(end - page * PAGE)
        d.where = f"page {page} zeroed (bytes {page * PAGE}-{end - 1} of {size})"
    d.changed = bytes(data) != original
    path.write_bytes(bytes(data))
    rel = path.relative_to(copy)
    d.file = rel.as_posix()
    layout.describe(d, rel)


def plan(rng: Any, per_kind: int, heavy_every: int, layout: Layout | None = None) -> list[Damage]:
    """``per_kind`` damages of each file kind, the damage types taken in turn; the heavy
    shapes (SQL, ``%iq``, the panel) on every ``heavy_every``-th damage of a kind."""
    layout = layout or Layout()
    out: list[Damage] = []
    for k, kind in enumerate(layout.kinds):
        for j in range(per_kind):
            shapes = layout.shapes(heavy_every > 0 and j % heavy_every == 0)
            how = HOWS[(j + k) % len(HOWS)]
            out.append(Damage(len(out), kind, how, rng.randrange(2**31), shapes))
    return out


# -- running children ----------------------------------------------------------------------
@dataclass
class ShapeOutcome:
    verdict: str  # same, clean, WRONG:<why>, killed by signal N, hang
    details: list[str]
    seconds: float

    @property
    def outcome(self) -> str:
        for name in ("WRONG", "killed", "hang"):
            if self.verdict.startswith(name):
                return name
        return self.verdict


@dataclass
class DamageResult:
    damage: Damage
    shapes: dict[str, ShapeOutcome]
    seconds: float
    children: int


def forkserver() -> Any:
    """The forkserver context whose server has imported ``integrity_child`` (and so
    iqkit, pandas, DuckDB, pyarrow, IPython, ipywidgets)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["integrity_child"])
    # The server is a new Python whose sys.path comes from PYTHONPATH (Python 3.11's
    # forkserver drops the sys.path it is handed): this folder is put there while it starts.
    here = os.fspath(Path(__file__).resolve().parent)
    paths = [here, *filter(None, [os.environ.get("PYTHONPATH")])]
    with mock.patch.dict(os.environ, {"PYTHONPATH": os.pathsep.join(paths)}):
        forkserver_module.ensure_running()
    return ctx


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace")
    except OSError:
        return ""


def run_children(
    ctx: Any,
    folder: Path,
    root: Path,
    shapes: tuple[str, ...],
    expected: dict[str, Any] | None,
    damage: dict[str, Any] | None,
    timeout: float = SHAPE_TIMEOUT,
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, ShapeOutcome], dict[str, Any], int]:
    """Run ``shapes`` over ``root`` in children, a new one after one dies or hangs;
    (outcome per shape, answers per shape of an undamaged run, children started)."""
    outcomes: dict[str, ShapeOutcome] = {}
    answers: dict[str, Any] = {}
    children = 0
    while pending := [s for s in shapes if s not in outcomes]:
        children += 1
        log = folder / f"child{children}.log"
        job = {
            "root": os.fspath(root),
            "cache": os.fspath(folder / f"cache{children}"),
            "log": os.fspath(log),
            "shapes": pending,
            "expected": None if expected is None else {s: expected[s] for s in pending},
            "damage": damage,
            **(extra or {}),
        }
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=ic.child_main, args=(send, job), daemon=True)
        proc.start()
        send.close()
        current, started = pending[0], time.monotonic()
        try:
            while True:
                if not receive.poll(timeout):
                    proc.kill()
                    proc.join()
                    outcomes[current] = ShapeOutcome(
                        f"hang (over {timeout:.0f} s)",
                        [f"child log:\n{_tail(log)}"],
                        time.monotonic() - started,
                    )
                    break
                try:
                    message = receive.recv()
                except EOFError:
                    proc.join()
                    rc = proc.exitcode
                    verdict = (
                        f"killed by signal {-rc}" if rc is not None and rc < 0
                        else f"WRONG:child exited with status {rc}"
                    )  # fmt: skip
                    outcomes[current] = ShapeOutcome(
                        verdict, [f"child log:\n{_tail(log)}"], time.monotonic() - started
                    )
                    break
                if message[0] == "start":
                    current, started = message[1], time.monotonic()
                elif message[0] == "done":
                    _, shape, verdict, details, seconds, got = message
                    outcomes[shape] = ShapeOutcome(verdict, details, seconds)
                    if got is not None:
                        answers[shape] = got
                else:  # end
                    proc.join()
                    break
        finally:
            receive.close()
            if proc.is_alive():
                proc.kill()
                proc.join()
    return outcomes, answers, children


class IntegrityRun:
    """The pristine root, its undamaged answers, and damages run against copies of it."""

    def __init__(
        self, workdir: Path, layout: Layout | None = None, *, workers: int | None = None
    ) -> None:
        self.workdir = workdir
        self.layout = layout or Layout()
        self.ctx = forkserver()
        self.pristine = workdir / "pristine"
        self.layout.build(self.pristine)
        cpus = os.cpu_count() or 1
        self.workers = workers or int(os.environ.get("IQKIT_INTEGRITY_WORKERS", min(4, cpus)))
        self.keep = os.environ.get("IQKIT_INTEGRITY_KEEP")
        started = time.monotonic()
        self.expected = {root: self._baseline(root) for root in self.layout.roots()}
        self.baseline_seconds = time.monotonic() - started

    def _baseline(self, root: str) -> dict[str, Any]:
        """Every shape's answers on the undamaged ``root``: twice, in two children, and
        the same both times (else a difference after a damage would prove nothing)."""
        runs = []
        for n in (1, 2):
            folder = self.workdir / f"baseline{n}"
            folder.mkdir()
            outcomes, answers, _ = run_children(
                self.ctx, folder, self.pristine / root, self.layout.all_shapes(), None, None,
                extra=self.layout.job(root),
            )  # fmt: skip
            broken = {
                s: o
                for s, o in outcomes.items()
                if o.verdict != "baseline" or any("Traceback" in x for x in o.details)
            }
            assert not broken, f"the undamaged run of {root or 'the stores'} failed: {broken}"
            runs.append(answers)
            shutil.rmtree(folder, ignore_errors=True)
        assert runs[0] == runs[1], "two undamaged runs answered differently: " + ", ".join(
            s for s in runs[0] if runs[0][s] != runs[1].get(s)
        )
        for shape, answers in runs[0].items():
            for label, (_, item) in answers.items():
                parts = item.values() if isinstance(item, dict) else [item]
                bad = [a for a in parts if a[0] != "ok"]
                assert not bad, f"undamaged {shape} {label}: {bad}"
        return runs[0]

    def copy(self, d: Damage) -> tuple[Path, Path]:
        """A damaged copy: (its folder, the root the shapes read)."""
        folder = self.workdir / f"d{d.index}"
        copy = folder / "copy"
        shutil.copytree(self.pristine, copy)
        make_damage(copy, d, self.layout)
        return folder, copy / d.root

    def run_one(self, d: Damage, *, keep_root: bool = False) -> tuple[DamageResult, Path]:
        started = time.monotonic()
        folder, root = self.copy(d)
        outcomes, _, children = run_children(
            self.ctx, folder, root, d.shapes, self.expected[d.root], d.facts(),
            extra=self.layout.job(d.root),
        )  # fmt: skip
        for o in outcomes.values():  # only a bad outcome's details are kept (memory)
            if o.outcome in ("same", "clean"):
                o.details = []
        result = DamageResult(d, outcomes, time.monotonic() - started, children)
        bad = any(o.outcome not in ("same", "clean") for o in outcomes.values())
        if bad and self.keep:
            where = Path(self.keep) / f"damage-{d.index}-{d.seed}"
            shutil.copytree(folder / "copy", where, symlinks=True)
        if not keep_root:
            shutil.rmtree(folder, ignore_errors=True)
        return result, root

    def run(
        self, damages: list[Damage], progress: Callable[[int, int], None] | None = None
    ) -> Report:
        report = Report(baseline_seconds=self.baseline_seconds, workers=self.workers)
        report.kinds = self.layout.kinds
        started = time.monotonic()
        with ThreadPoolExecutor(self.workers) as pool:
            for n, (result, _) in enumerate(pool.map(self.run_one, damages), 1):
                report.add(result)
                if progress is not None:
                    progress(n, len(damages))
        report.seconds = time.monotonic() - started
        return report


# -- the report ----------------------------------------------------------------------------
@dataclass
class Report:
    baseline_seconds: float = 0.0
    workers: int = 1
    seconds: float = 0.0
    results: list[DamageResult] = field(default_factory=list)
    #: (kind, how, outcome) -> shape runs
    counts: Counter = field(default_factory=Counter)
    #: (kind, shape, verdict) -> shape runs, for every bad verdict
    bad_verdicts: Counter = field(default_factory=Counter)
    #: shape -> runs, seconds
    shape_runs: Counter = field(default_factory=Counter)
    shape_seconds: Counter = field(default_factory=Counter)
    extra_lines: list[str] = field(default_factory=list)
    kinds: tuple[str, ...] = KINDS
    #: (kind, "found" | "missed" | "unchanged") -> damages, from the verify shape
    verify: Counter = field(default_factory=Counter)

    def add(self, result: DamageResult) -> None:
        self.results.append(result)
        d = result.damage
        self.counts[(d.kind, d.how, "damages")] += 1
        worst = "same"
        for shape, o in result.shapes.items():
            self.counts[(d.kind, d.how, o.outcome)] += 1
            self.shape_runs[shape] += 1
            self.shape_seconds[shape] += o.seconds
            if o.outcome not in ("same", "clean"):
                self.bad_verdicts[(d.kind, shape, o.verdict.split("\n")[0])] += 1
            worst = max(worst, o.outcome, key=OUTCOMES.index)
        self.counts[(d.kind, d.how, f"damage {worst}")] += 1
        v = result.shapes.get("verify")
        if v is not None:
            found = "unchanged" if not d.changed else "found" if v.outcome == "clean" else "missed"
            self.verify[(d.kind, found)] += 1

    def verify_line(self) -> str:
        """What ``iqkit.verify`` found of the damages, per file kind."""
        per_kind = []
        for kind in self.kinds:
            found, missed, same = (self.verify[(kind, w)] for w in ("found", "missed", "unchanged"))
            if found + missed + same:
                unchanged = f" ({same} left the bytes as they were)" if same else ""
                per_kind.append(f"{kind} {found} of {found + missed}{unchanged}")
        return "iqkit.verify named the damaged file: " + "; ".join(per_kind) if per_kind else ""

    def add_external(self, kind: str, how: str, shape: str, verdict: str, seconds: float) -> None:
        """A shape run outside the children (Spark's reads, in the test)."""
        o = ShapeOutcome(verdict, [], seconds)
        self.counts[(kind, how, o.outcome)] += 1
        self.shape_runs[shape] += 1
        self.shape_seconds[shape] += seconds
        if o.outcome not in ("same", "clean"):
            self.bad_verdicts[(kind, shape, verdict)] += 1

    @property
    def bad(self) -> int:
        return sum(self.counts[k] for k in self.counts if k[2] in ("WRONG", "killed", "hang"))

    def damages(self, kind: str | None = None) -> int:
        return sum(
            n for (k, _, what), n in self.counts.items() if what == "damages" and kind in (None, k)
        )

    def table(self) -> str:
        head = (
            "| file kind | damage | damages | shape runs | same | clean | WRONG | killed | hang |"
        )
        lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for kind in self.kinds:
            for how in HOWS:
                c = {o: self.counts[(kind, how, o)] for o in OUTCOMES}
                n = self.counts[(kind, how, "damages")]
                if not n and not sum(c.values()):
                    continue
                lines.append(
                    f"| {kind} | {how} | {n} | {sum(c.values())} | "
                    + " | ".join(str(c[o]) for o in OUTCOMES)
                    + " |"
                )
        return "\n".join(lines)

    def text(self, examples: int = 2) -> str:
        n = len(self.results)
        out = [
            f"{n} damages in {self.seconds:.0f} s ({self.workers} children at a time; "
            f"{self.seconds / max(1, n):.2f} s per damage of wall time; undamaged baseline "
            f"{self.baseline_seconds:.1f} s)",
            "",
            self.table(),
            "",
            "shape runs and seconds each (in a child, mean): "
            + ", ".join(
                f"{s} {self.shape_runs[s]}× {self.shape_seconds[s] / self.shape_runs[s]:.2f} s"
                for s in self.shape_runs
            ),
            *filter(None, [self.verify_line()]),
            *self.extra_lines,
        ]
        if self.bad_verdicts:
            out += ["", "bad outcomes by file kind, shape and verdict:"]
            out += [
                f"  {n:5d}  {kind:8s} {shape:9s} {verdict}"
                for (kind, shape, verdict), n in sorted(self.bad_verdicts.items())
            ]
        shown: Counter = Counter()  # examples of each bad verdict, per file kind and shape
        for r in self.results:
            for shape, o in r.shapes.items():
                which = (r.damage.kind, shape, o.verdict.split("\n")[0])
                if o.outcome in ("same", "clean") or shown[which] >= examples:
                    continue
                shown[which] += 1
                out += ["", f"--- {o.verdict} in shape {shape}: {r.damage.label()}"]
                out += [_cut(line) for line in o.details[:4]]
        return "\n".join(out)


def _cut(text: str, limit: int = 2500) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text)} chars)"


def outcome_of(report: Report, what: str) -> Outcome:
    per_kind = "; ".join(
        f"{kind}: {report.damages(kind)} damages, "
        + ", ".join(f"{sum(report.counts[(kind, h, o)] for h in HOWS)} {o}" for o in OUTCOMES)
        for kind in report.kinds
        if report.damages(kind)
    )
    bad = "; ".join(
        f"{n}× {kind} {shape} {verdict}"
        for (kind, shape, verdict), n in sorted(report.bad_verdicts.items())[:12]
    )
    return Outcome(
        checked=f"{report.damages()} damaged copies, {sum(report.shape_runs.values())} "
        f"shape runs ({what}); per file kind, shape runs: {per_kind}",
        lost=report.bad,
        lost_detail=f"shape runs with a wrong answer, a killed child or a hang: {bad}",
        notes=[
            f"{report.seconds / max(1, report.damages()):.2f} s of wall time per damage "
            f"({report.workers} children at a time)",
            "shape runs: " + ", ".join(f"{s} {n}" for s, n in report.shape_runs.items()),
            *filter(None, [report.verify_line()]),
        ],
    )


# -- the probe -----------------------------------------------------------------------------
#: The heavy shapes (SQL, %iq, the panel) run on one damage in this many of each kind.
LONG_HEAVY_EVERY = 10


@probe(
    "Damaged files, every query shape",
    fault="per file kind (SST, columnar twin, version record, manifest), damages to a "
    "copy of a key-value store with 5 versions and a window store: a random bit flipped, a "
    "truncation, a zeroed 4 KiB page; each runs every query shape (key, multi-key, range, "
    "prefix, window, versions, changes; SQL, %iq in an IPython shell and the panel on one "
    f"damage in {LONG_HEAVY_EVERY}; iqkit.verify) in a child process with a fresh cache; each "
    "answer must be the undamaged one or a one-line failure naming the file of the partitions it "
    f"touches, with no child killed by a signal and no shape over {SHAPE_TIMEOUT:.0f} s",
    unit="damages per file kind",
    fast=2,
    long=2000,
)
def damaged_files_every_shape(workdir: Path, iterations: int, rng: Any) -> Outcome:
    run = IntegrityRun(workdir)
    damages = plan(rng, iterations, LONG_HEAVY_EVERY, run.layout)
    every = max(1, len(damages) // 20)

    def progress(n: int, total: int) -> None:
        if n % every == 0 and iterations > 50:
            print(f"  {n}/{total} damages, {time.monotonic() - t0:.0f} s", flush=True)

    t0 = time.monotonic()
    report = run.run(damages, progress)
    text = report.text()
    print(text, flush=True)
    if os.environ.get("IQKIT_INTEGRITY_REPORT"):
        Path(os.environ["IQKIT_INTEGRITY_REPORT"]).write_text(text + "\n", encoding="utf-8")
    return outcome_of(report, f"the heavy shapes on one damage in {LONG_HEAVY_EVERY}")


CKPT_HEAVY_EVERY = 4


@probe(
    "Damaged checkpoint files, every query shape",
    fault="per file kind of a Spark Structured Streaming checkpoint (HDFS-provider delta, "
    "RocksDB-provider changelog, zip and shared SST, operator metadata, offsets and commits "
    "logs; three checkpoints: an aggregate on each provider, a windowed count with changelog "
    "checkpointing), the same damages to a copy, each read through iqkit.open(checkpoint) "
    "by every shape (scans, key lookups, versions listed and read as of older versions; SQL "
    f"on one damage in {CKPT_HEAVY_EVERY}) in a child process with a fresh cache",
    unit="damages per file kind",
    fast=0,  # the short run needs Spark: tests/store/test_integrity_faults.py has one
    long=300,
)
def damaged_checkpoint_files(workdir: Path, iterations: int, rng: Any) -> Outcome:
    if iterations == 0:
        return Outcome(checked="nothing: the short run is tests/store/test_integrity_faults.py")
    spark = local_spark()
    try:
        sources = make_checkpoints(spark, workdir / "made")
    finally:
        spark.stop()
    layout = CheckpointLayout(sources)
    run = IntegrityRun(workdir / "damages", layout)
    report = run.run(plan(rng, iterations, CKPT_HEAVY_EVERY, layout))
    text = report.text()
    print(text, flush=True)
    return outcome_of(report, f"SQL on one damage in {CKPT_HEAVY_EVERY}")


def local_spark() -> Any:
    """A local Spark session for the long run (the tests' own comes from conftest)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("iqkit-integrity")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- replaying one damage by hand -----------------------------------------------------------
def replay(argv: list[str] | None = None) -> int:
    """``python tests/store/probes_integrity.py --seed S --per-kind N --heavy-every H
    --index I``: make damage I of that run's plan again (on freshly built stores: the
    same file and, file sizes allowing, the same offset) and run its shapes in this
    process, printing each verdict and what differed. ``--keep DIR`` leaves the damaged
    copy there."""
    import argparse
    import random
    import tempfile

    parser = argparse.ArgumentParser(description=replay.__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--per-kind", type=int, required=True)
    parser.add_argument("--heavy-every", type=int, default=LONG_HEAVY_EVERY)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    d = plan(random.Random(args.seed), args.per_kind, args.heavy_every)[args.index]
    work = Path(tempfile.mkdtemp(prefix="iqkit-replay-"))
    layout = Layout()
    layout.build(work / "pristine")
    os.environ["IQKIT_CACHE"] = os.fspath(work / "cache-undamaged")
    expected = {s: ic.SHAPES[s](ic.Reader(os.fspath(work / "pristine"))) for s in d.shapes}
    copy = args.keep or work / "copy"
    shutil.copytree(work / "pristine", copy)
    make_damage(copy, d, layout)
    print(d.label())
    os.environ["IQKIT_CACHE"] = os.fspath(work / "cache")
    reader = ic.Reader(os.fspath(copy / d.root))
    for shape in d.shapes:
        verdict, details = ic.classify(shape, expected[shape], ic.SHAPES[shape](reader), d.facts())
        print(f"{shape}: {verdict}")
        for line in details:
            print("   ", _cut(line, 1500))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def summary_json(report: Report) -> str:
    """The counts as JSON (for a run's record)."""
    return json.dumps({"|".join(k): n for k, n in sorted(report.counts.items())}, indent=1)


if __name__ == "__main__":
    sys.exit(replay())
