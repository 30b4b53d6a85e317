"""The README's quick start runs as written (so the README keeps describing the code)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "README has no python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # our own README
    out = capsys.readouterr().out
    assert out.startswith("1\n")  # w.version
    assert "Handled in RocksDBLayer" in out
    assert (tmp_path / "stores" / "totals" / "LATEST").read_text().strip() == "1"
