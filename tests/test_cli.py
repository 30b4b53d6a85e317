"""``python -m iqkit``: the demo and the small command line."""

from __future__ import annotations

from iqkit.__main__ import main


def test_demo_writes_and_queries_stores(tmp_path, capsys):
    assert main(["demo", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "KeyQuery('alice') -> {'customer': 'alice', 'last': 12}" in out
    assert "NOT_UP_TO_BOUND" in out
    assert main(["stores", str(tmp_path)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listing] == ["clicks", "totals"]


def test_get_parses_the_key_with_the_store_serde(tmp_path, capsys):
    main(["demo", str(tmp_path)])
    capsys.readouterr()
    assert main(["get", str(tmp_path), "totals", "dave"]) == 0
    assert capsys.readouterr().out.strip() == "{'customer': 'dave', 'last': 99}"
    assert main(["scan", str(tmp_path), "totals", "--prefix", "ca"]) == 0
    assert "'carol'" in capsys.readouterr().out


def test_errors_are_one_line_with_a_hint(tmp_path, capsys):
    main(["demo", str(tmp_path)])
    capsys.readouterr()
    assert main(["get", str(tmp_path), "totalz", "x"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown store 'totalz'; did you mean 'totals'?"
    assert main(["stores", str(tmp_path / "missing")]) == 2
    assert "no iqkit root" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
