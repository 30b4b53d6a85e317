"""Each reliability probe's fast variant (``IQKIT_RELIABILITY=long`` for the long one):
no invariant broken, nothing lost. The probes and what they do: ``registry.py`` and
``RELIABILITY.md``."""

from __future__ import annotations

import random

import pytest
from registry import iterations, load_probes, seed

PROBES = load_probes()


@pytest.mark.slow
@pytest.mark.parametrize("probe", [pytest.param(p, id=p.name) for p in PROBES])
def test_probe_loses_nothing(probe, tmp_path):
    run_seed = seed()
    where = f"{probe.name} (IQKIT_FAULT_SEED={run_seed})"
    try:
        outcome = probe.fn(tmp_path, iterations(probe), random.Random(run_seed))
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from exc
    assert outcome.lost == 0, f"{where}: lost {outcome.lost}: {outcome.lost_detail}"
