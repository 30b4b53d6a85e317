"""The notebooks run under nbval in ``make test``'s one pytest run, beside tests/ (README
"Notebooks"). Their kernels, and only theirs, see ``IQKIT_STABLE_TIMINGS=1`` (iqkit's
wall-clock figures as a placeholder, so stored outputs compare): set while nbval starts a
notebook's kernel (its first cell's setup), then put back for the tests sharing the
worker process."""

from __future__ import annotations

import os

import pytest

from iqkit.jupyter.render import STABLE_TIMINGS_ENV


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    before = os.environ.get(STABLE_TIMINGS_ENV)
    os.environ[STABLE_TIMINGS_ENV] = "1"
    try:
        return (yield)
    finally:
        if before is None:
            del os.environ[STABLE_TIMINGS_ENV]
        else:
            os.environ[STABLE_TIMINGS_ENV] = before
