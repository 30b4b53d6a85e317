"""``%iq`` over a root on the real S3 server (issue 13): opened by URL in a real IPython
shell, queried through the same engine, the trace saying what came from the cache."""

from __future__ import annotations

import pytest
from helpers import write_notebook_stores
from IPython.core.error import UsageError

from iqkit.jupyter.testing import IQTestShell, new_shell


@pytest.fixture
def s3_shell(s3_root):
    write_notebook_stores(s3_root)
    sh: IQTestShell = new_shell(progress=False)
    yield sh
    sh.run_line_magic("unload_ext", "iqkit")
    IQTestShell.clear_instance()


def run(shell, line: str):
    return shell.run_cell(line).result


def test_iq_opens_an_s3_root_and_queries_it(s3_shell, s3_root):
    opened = run(s3_shell, f"%iq open {s3_root}")
    assert "3 store(s): clicks, counts, totals" in repr(opened)
    assert run(s3_shell, "%iq get totals alice --trace").rows["total"].tolist() == [42]
    trace = run(s3_shell, "%iq trace")
    fetched = trace[trace["layer"] == "FileCache"]["detail"].tolist()
    assert len(fetched) == 1 and "fetched 1 file" in fetched[0]
    run(s3_shell, "%iq get totals alice")
    again = run(s3_shell, "%iq trace")
    assert "fetched 0 files" in again[again["layer"] == "FileCache"]["detail"].tolist()[0]
    stores = run(s3_shell, "%iq stores")
    assert sorted(stores["name"]) == ["clicks", "counts", "totals"]
    assert run(s3_shell, "%iq scan counts --limit 0").rows.shape[0] > 0


def test_iq_open_without_credentials_is_one_line_and_keeps_the_root(
    s3_shell, s3_root, tmp_path, monkeypatch
):
    local = tmp_path / "local"
    write_notebook_stores(local)
    run(s3_shell, f"%iq open {local}")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(UsageError) as info:
        run(s3_shell, f"%iq open {s3_root}")
    message = str(info.value)
    assert "\n" not in message and message.startswith("%iq open: cannot list")
    assert "no credentials" in message
    assert run(s3_shell, "%iq get totals alice").rows["total"].tolist() == [42]
