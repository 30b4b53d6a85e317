"""No silent wrong answer and no dead kernel: the short run of the damaged-files fault
injection (``probes_integrity.py`` has the machinery and the long run, ``make
reliability``; ``integrity_child.py`` the stores, the query shapes and the verdicts).

Per file kind (SST, columnar twin, version record, manifest), ``SHORT_PER_KIND`` damages
(a bit flipped, a truncation, a zeroed 4 KiB page, in turn), each run through every
engine shape and ``iqkit.verify`` (which must name the damaged file) in a child
process; SQL, ``%iq`` and the panel on one damage in ``SHORT_HEAVY_EVERY``; Spark's
``format("iqkit")`` on ``SPARK_PER_KIND`` more damaged copies per kind, on the tests'
one local session. Every answer must be the undamaged one
or a one-line failure naming the file, of the partitions the damage touches; no child
killed by a signal, no hang, no traceback. The table of outcomes is printed (``-s``).
``IQKIT_FAULT_SEED`` replays a run.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))

import integrity_child as ic
import probes_integrity as pi
from registry import seed

SHORT_PER_KIND = 8
SHORT_HEAVY_EVERY = 4
SPARK_PER_KIND = 1
CKPT_PER_KIND = 3
CKPT_HEAVY_EVERY = 3

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def integrity(tmp_path_factory: pytest.TempPathFactory) -> pi.IntegrityRun:
    """The pristine stores and every shape's undamaged answers (two runs, equal)."""
    return pi.IntegrityRun(tmp_path_factory.mktemp("integrity"))


def test_damaged_files_give_the_answer_or_a_clean_failure(integrity: pi.IntegrityRun) -> None:
    run_seed = seed()
    damages = pi.plan(random.Random(run_seed), SHORT_PER_KIND, SHORT_HEAVY_EVERY)
    report = integrity.run(damages)
    text = report.text()
    print(f"\nIQKIT_FAULT_SEED={run_seed}\n{text}")
    assert report.bad == 0, f"IQKIT_FAULT_SEED={run_seed}: {report.bad} bad shape runs\n{text}"


def test_damaged_files_read_by_spark(integrity: pi.IntegrityRun, spark) -> None:
    run_seed = seed()
    rng = random.Random(run_seed + 1)
    expected = ic.spark_answers(spark, str(integrity.pristine))
    for label, (_, answer) in expected.items():
        assert answer[0] == "ok", f"undamaged Spark read {label}: {answer}"
    report = pi.Report(workers=1)
    damages = pi.plan(rng, SPARK_PER_KIND, 0)
    started = time.monotonic()
    lines = []
    for d in damages:
        d.index += 10_000  # folders apart from the other test's
        t = time.monotonic()
        _, root = integrity.copy(d)
        got = ic.spark_answers(spark, str(root))
        verdict, details = ic.classify("spark", expected, got, d.facts())
        report.add_external(d.kind, d.how, "spark", verdict, time.monotonic() - t)
        report.counts[(d.kind, d.how, "damages")] += 1
        if ic.rank(verdict) > 1:
            lines += [f"--- {verdict} in shape spark: {d.label()}", *details[:4]]
    report.seconds = time.monotonic() - started
    text = f"Spark, {len(damages)} damaged copies in {report.seconds:.0f} s\n{report.table()}"
    print(f"\nIQKIT_FAULT_SEED={run_seed}\n{text}")
    assert report.bad == 0, f"IQKIT_FAULT_SEED={run_seed}:\n{text}\n" + "\n".join(lines)


def test_damaged_checkpoint_files_give_the_answer_or_a_clean_failure(spark, tmp_path) -> None:
    run_seed = seed()
    sources = pi.make_checkpoints(spark, tmp_path / "made")
    layout = pi.CheckpointLayout(sources)
    run = pi.IntegrityRun(tmp_path / "damages", layout)
    report = run.run(pi.plan(random.Random(run_seed + 2), CKPT_PER_KIND, CKPT_HEAVY_EVERY, layout))
    text = report.text()
    print(f"\nIQKIT_FAULT_SEED={run_seed}\n{text}")
    assert report.bad == 0, f"IQKIT_FAULT_SEED={run_seed}: {report.bad} bad shape runs\n{text}"
