"""The notebooks' stored outputs are fit for strict nbval (``make test`` runs them there).

nbval compares only cells that were run when the notebook was saved, so a cell stored
without running would be silently unchecked; these tests hold the stored files to what
README "Notebooks" promises: executed top to bottom in one run, a mistake per notebook
that fails with one line, a last cell that removes the work folder, and outputs with
nothing machine-specific in them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = [
    "01_quickstart",
    "02_spark_batch",
    "03_streaming_positions_lag",
    "04_sql_joins",
    "05_panel",
    "06_spark_reads",
    "07_python_api",
    "08_spark_checkpoints",
    "09_versions",
]
#: What must never be in a stored output: temporary or absolute paths of this machine,
#: Spark/log4j log lines (they carry timestamps), a kernel's ANSI-coloured traceback.
MACHINE_SPECIFIC = re.compile(
    r"/tmp/|" + re.escape(str(NOTEBOOKS.parent)) + r"|\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO)"
)


def code_cells(name: str) -> list[dict]:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text("utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def texts(output: dict) -> list[str]:
    found = []
    if "text" in output:
        found.append("".join(output["text"]))
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            found.append("".join(value))
    if output.get("output_type") == "error":
        found += [output["ename"], output["evalue"]]
    return found


def test_the_notebooks_are_the_documented_set():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_every_cell_ran_once_top_to_bottom(name):
    counts = [c["execution_count"] for c in code_cells(name)]
    assert counts == list(range(1, len(counts) + 1)), "run `make notebooks`"


@pytest.mark.parametrize("name", EXPECTED)
def test_a_tagged_mistake_fails_with_one_line(name):
    mistakes = [c for c in code_cells(name) if "raises-exception" in c["metadata"].get("tags", [])]
    assert mistakes, "each notebook shows a realistic mistake"
    for cell in mistakes:
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        usage = [
            o
            for o in cell["outputs"]
            if o.get("name") == "stderr" and "".join(o["text"]).startswith("UsageError: ")
        ]
        assert len(errors) + len(usage) == 1, cell["source"]
        line = errors[0]["evalue"] if errors else "".join(usage[0]["text"])
        # one line (Spark appends its SQLSTATE on a line of its own)
        assert len(re.sub(r"\n SQLSTATE: \w+$", "", line.strip()).splitlines()) == 1, line


@pytest.mark.parametrize("name", EXPECTED)
def test_the_last_cell_removes_the_work_folder(name):
    cells = code_cells(name)
    assert "clean_up(work" in "".join(cells[-1]["source"])
    assert "workspace(" in "".join(cells[0]["source"])


@pytest.mark.parametrize("name", EXPECTED)
def test_outputs_hold_nothing_machine_specific(name):
    for cell in code_cells(name):
        for output in cell["outputs"]:
            for text in texts(output):
                assert not MACHINE_SPECIFIC.search(text), (cell["source"], text[:500])
            assert "application/vnd.jupyter.stderr" not in output.get("data", {})
        # only a mistake's UsageError may reach stderr (Spark's log goes to spark.log)
        for output in cell["outputs"]:
            if output.get("name") == "stderr":
                assert "".join(output["text"]).startswith("UsageError: "), cell["source"]


def test_plots_store_their_pictures():
    """At least the lag per partition and a window series are drawn (README)."""
    drawn = {
        name: sum("image/png" in o.get("data", {}) for c in code_cells(name) for o in c["outputs"])
        for name in EXPECTED
    }
    assert drawn["03_streaming_positions_lag"] >= 1  # lag per partition
    assert drawn["01_quickstart"] >= 1 and drawn["02_spark_batch"] >= 1  # window series


def test_the_checkpoint_notebook_reads_a_join_sessions_and_transform_with_state():
    """Issue 35: notebook 08 lists the stores of a stream-stream join, a session window
    and a transformWithState job, and shows a key lookup, a scan and a history of each,
    every one with rows."""
    cells = code_cells("08_spark_checkpoints")
    shown = "\n".join(text for cell in cells for o in cell["outputs"] for text in texts(o))
    stores = ["join.left", "join.right", "sessions"]
    stores += [f"transform.{name}" for name in ("views", "recent", "pages", "$timers")]
    for store in stores:
        assert re.search(rf"^\d+\s+{re.escape(store)}\s", shown, re.M), f"%iq stores: {store}"
    for line in [
        "get join.left ad-1",
        "scan join.right",
        "history join.left ad-1",
        "get sessions bob",
        "range sessions --from ann --to bob",
        "history sessions ann",
        "get transform.views bob",
        'prefix transform.pages ["bob"]',
        "history transform.views ann",
    ]:
        running = [
            c
            for c in cells
            if f"%iq {line}" in "".join(c["source"]).splitlines()
            or f"r = %iq {line}" in "".join(c["source"]).splitlines()
        ]
        assert running, f"no cell runs %iq {line}"
        for cell in running:
            results = [o for o in cell["outputs"] if o["output_type"] == "execute_result"]
            assert results, line
            table = "".join(results[-1]["data"]["text/plain"])
            assert "rows=0" not in table and len(table.splitlines()) >= 2, (line, table)
