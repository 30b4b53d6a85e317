"""The reliability probes: every fault and input class iqkit is tried against, one
registered function each, and the table in ``RELIABILITY.md`` they produce.

A probe is a function ``fn(workdir, iterations, rng) -> Outcome`` registered with
``@probe(...)`` in any ``tests/**/probes_*.py`` module (so another area adds a row by
adding one decorated function). It does ``iterations`` rounds of its fault, raises
``AssertionError`` on any broken invariant, and reports in its ``Outcome`` how much it
checked and what was lost (the target is nothing).

* ``make test`` runs each probe's *fast* variant (``tests/reliability/test_probes.py``).
* ``make reliability`` runs each probe's *long* variant and rewrites the table
  (``tests/reliability/run.py``).
* ``IQKIT_RELIABILITY=long`` makes pytest run the long variants too; a number in
  ``IQKIT_FAULT_ITERATIONS`` sets every probe's iterations; ``IQKIT_FAULT_SEED`` fixes
  the random choices (the seed is printed with every failure).
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    """What one probe run checked and found."""

    #: e.g. "412 commits, 61 versions" (what was checked for loss)
    checked: str
    #: Units of data or state lost, or invariants broken beyond the asserted ones; 0 is
    #: the target. Describe them in ``lost_detail``.
    lost: int = 0
    lost_detail: str = ""
    #: Anything the table should say about the run (where kills landed, ...).
    notes: list[str] = field(default_factory=list)


ProbeFn = Callable[[Path, int, random.Random], Outcome]


@dataclass(frozen=True)
class Probe:
    name: str
    #: What is done to iqkit (the fault or the input class).
    fault: str
    #: What one iteration is ("kill", "commit", "name", ...).
    unit: str
    fast: int
    long: int
    fn: ProbeFn
    module: str


PROBES: dict[str, Probe] = {}


def probe(
    name: str,
    *,
    fault: str,
    unit: str,
    fast: int,
    long: int,
) -> Callable[[ProbeFn], ProbeFn]:
    """Register ``fn`` as the probe ``name`` (one row of the table)."""

    def register(fn: ProbeFn) -> ProbeFn:
        if name in PROBES and PROBES[name].fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"two probes are named {name!r}")
        PROBES[name] = Probe(name, fault, unit, fast, long, fn, fn.__module__)
        return fn

    return register


def load_probes() -> list[Probe]:
    """Import every ``tests/**/probes_*.py`` once; the probes in registration order."""
    for path in [TESTS, *{p.parent for p in TESTS.rglob("probes_*.py")}]:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    for path in sorted(TESTS.rglob("probes_*.py")):
        name = path.stem
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return list(PROBES.values())


def variant() -> str:
    return "long" if os.environ.get("IQKIT_RELIABILITY", "").lower() == "long" else "fast"


def iterations(p: Probe, which: str | None = None) -> int:
    fixed = os.environ.get("IQKIT_FAULT_ITERATIONS")
    if fixed:
        return int(fixed)
    return p.long if (which or variant()) == "long" else p.fast


def seed() -> int:
    return int(os.environ.get("IQKIT_FAULT_SEED", str(time.time_ns() % 1_000_000)))


@dataclass
class Run:
    probe: Probe
    iterations: int
    seed: int
    seconds: float
    outcome: Outcome | None
    error: str | None


def run_probe(p: Probe, workdir: Path, n: int, run_seed: int) -> Run:
    """Run ``p`` once; an exception is recorded (a broken invariant), never raised."""
    started = time.monotonic()
    try:
        outcome = p.fn(workdir, n, random.Random(run_seed))
        error = None
    except Exception as exc:
        outcome, error = None, f"{type(exc).__name__}: {exc}"
    return Run(p, n, run_seed, time.monotonic() - started, outcome, error)
