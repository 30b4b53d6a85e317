"""A headless IPython shell for testing ``%iq`` (shipped so users can test their own
notebook helpers the same way).

``IQTestShell.run_cell`` re-raises the cell's error (IPython's own ``run_cell`` only
records it), so a test can ``pytest.raises(UsageError)``; history is kept in memory
only. The approach is JupySQL's ``TestingShell``.
"""

from __future__ import annotations

from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

__all__ = ["IQTestShell", "new_shell"]


class IQTestShell(InteractiveShell):
    def run_cell(self, raw_cell: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        result = super().run_cell(raw_cell, *args, **kwargs)
        result.raise_error()
        return result


def new_shell(**config: Any) -> IQTestShell:
    """A fresh shell with ``iqkit`` loaded; ``config`` sets ``IQMagics`` traits."""
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    for name, value in config.items():
        setattr(cfg.IQMagics, name, value)
    IQTestShell.clear_instance()
    shell = IQTestShell.instance(config=cfg)
    shell.run_line_magic("load_ext", "iqkit")
    return shell
