"""``iqkit.sql`` over a root on the real S3 server reads through the engine, so it gives
what it gives over a local folder holding the same writes (issue 13)."""

from __future__ import annotations

from helpers import write_notebook_stores

import iqkit

QUERY = "SELECT key, total FROM totals ORDER BY key"


def test_sql_over_an_s3_root_equals_sql_over_a_local_root(s3_root, tmp_path):
    write_notebook_stores(s3_root)
    write_notebook_stores(tmp_path / "local")
    on_s3 = iqkit.sql(QUERY, root=s3_root)
    assert len(on_s3) > 0
    assert on_s3.equals(iqkit.sql(QUERY, root=tmp_path / "local"))
