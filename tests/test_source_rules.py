"""Rules about the repository's own text, checked over every file they cover.

- No citation of a document the repository does not hold ("SPEC §2", "the SPEC"): a
  reader cannot follow it, so the rule it stood for is written out where it applies.
- Every ``iqkit`` module stays within ``MAX_MODULE_LINES``: past it a module holds more
  than one concept and is split along its seam (docs/ARCHITECTURE.md's tree)."""

from __future__ import annotations

import re
from pathlib import Path

import iqkit

REPO = Path(iqkit.__file__).resolve().parents[1]
MAX_MODULE_LINES = 800

#: "SPEC" as a document's name: "SPEC §2", "the SPEC", "SPEC's" (not FSSPEC_*, SPECIFIC).
_SPEC_CITATION = re.compile(r"(?<![A-Za-z_])SPEC(?![A-Za-z_])")


def _texts() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for folder in ("iqkit", "pyspark_iqkit", "tests", "bench"):
        found += sorted((REPO / folder).rglob("*.py"))
    found += sorted((REPO / "notebooks").glob("*.py"))
    return found


def test_nothing_cites_a_document_outside_the_repository():
    files = _texts()
    assert any(p.name == "DECISIONS.md" for p in files)  # the docs were read
    citing = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        if path.name != "test_source_rules.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _SPEC_CITATION.search(line) or "§" in line
    ]
    assert not citing, "cites a document the repository does not hold:\n" + "\n".join(citing)


#: What a work log writes and a decision does not: test counts, measurements, tables.
_WORK_LOG = re.compile(
    r"\b\d[\d,]* (?:of about [\d,]+ )?(?:tests?|passed|failed|errored)\b"
    r"|\bMeasured\b|^\s*\|\s*-+\s*\|"
)


def _decisions() -> str:
    return (REPO / "docs" / "DECISIONS.md").read_text(encoding="utf-8")


def test_decisions_hold_decisions_not_a_work_log():
    # docs/DECISIONS.md states each decision and its reason; test counts and session
    # stories are not reasons, and figures live in BENCHMARKS.md (faults in RELIABILITY.md).
    lines = _decisions().splitlines()
    assert lines[0] == "# Decisions"  # the file was read
    log = [line.strip() for line in lines if _WORK_LOG.search(line)]
    assert not log, "work log in DECISIONS.md:\n" + "\n".join(log)


#: A heading that names an issue orders decisions by when they were made, not by topic.
_ISSUE_HEADING = re.compile(r"^#+ .*\bissues?\b", re.IGNORECASE)


def test_no_decisions_heading_names_an_issue():
    headings = [line for line in _decisions().splitlines() if line.startswith("#")]
    assert headings[0] == "# Decisions"  # the headings were read
    naming = [line for line in headings if _ISSUE_HEADING.search(line)]
    assert not naming, "DECISIONS.md headings name issues:\n" + "\n".join(naming)


#: DECISIONS.md is read by a newcomer in one sitting: decisions as they stand, no history.
MAX_DECISIONS_LINES = 1000


def test_decisions_stay_within_their_length_bound():
    n = len(_decisions().splitlines())
    assert 0 < n <= MAX_DECISIONS_LINES, f"docs/DECISIONS.md: {n} lines, over {MAX_DECISIONS_LINES}"


#: A pointer into DECISIONS.md by heading text, as in: DECISIONS.md "Integrity".
_DECISIONS_POINTER = re.compile(r'DECISIONS(?:\.md)?\)?,? "([^"]+)"')


def test_every_pointer_into_decisions_names_a_heading():
    lines = _decisions().splitlines()
    headings = [line.lstrip("#").strip().lower() for line in lines if line.startswith("#")]
    texts = [*_texts(), REPO / "BENCHMARKS.md", REPO / "RELIABILITY.md", REPO / "pyproject.toml"]
    texts += sorted((REPO / "notebooks").glob("*.ipynb"))
    pointers = [
        (path.relative_to(REPO).as_posix(), quoted)
        for path in texts
        if path.name != "test_source_rules.py"
        for quoted in _DECISIONS_POINTER.findall(path.read_text(encoding="utf-8"))
    ]
    assert ("RELIABILITY.md", "Integrity") in pointers  # the pointers were found
    dangling = [
        f"{name}: {quoted!r}"
        for name, quoted in pointers
        if not any(heading.startswith(quoted.lower()) for heading in headings)
    ]
    assert not dangling, "pointers into DECISIONS.md naming no heading:\n" + "\n".join(dangling)


def test_every_module_stays_within_the_line_bound():
    lengths = {
        path.relative_to(REPO).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in (REPO / "iqkit").rglob("*.py")
    }
    assert "iqkit/engine.py" in lengths  # the package was read
    over = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split along a seam): {over}"


#: The modules of the storage formats (store/format.py, store/formats.py, the chain
#: format's store/chain/, the checkpoint format's store/checkpoint/): the only ones that
#: may tell formats apart.
_FORMAT_MODULES = re.compile(r"^iqkit/store/((format|formats)\.py|(chain|checkpoint)/\w+\.py)$")
#: Asking which format a store is in, or reaching past the format interface.
_FORMAT_TESTS = re.compile(
    r"\bstore_format\("  # the retired "which format is this store in" function
    r"|\bStoreFormat\.[A-Z]+\b"  # a format enum member (StoreFormat.CHAIN)
    r"|isinstance\([^)]*\b(Chain[A-Z]\w*|VersionRecord|Staged\w*|Folder\w*)\b"
    r"|^\s*from \S*\bchain\b\S* import"  # a format's own package, imported from outside it
)


def test_nothing_outside_the_format_modules_asks_which_format_a_store_is_in():
    # The engine, StoreWriter, the Spark writers and the data source call the format
    # interface (store/format.py's StoreFormat, chosen once per root by formats.py) and
    # never branch on a format: a new format is one class, not an edit in 11 places.
    found = []
    for path in sorted((REPO / "iqkit").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if _FORMAT_MODULES.match(name):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            # The CLI's `migrate` names the one conversion into the chain format.
            if _FORMAT_TESTS.search(line) and ".chain.migrate import" not in line:
                found.append(f"{name}:{number}: {line.strip()}")
    assert (REPO / "iqkit" / "store" / "chain" / "records.py").is_file()  # the skipped exist
    assert not found, "format tests outside the format modules:\n" + "\n".join(found)
