"""Rules about the repository's own text, checked over every file they cover.

- No citation of a document the repository does not hold ("SPEC §2", "the SPEC"): a
  reader cannot follow it, so the rule it stood for is written out where it applies.
- Every ``iqkit`` module stays within ``MAX_MODULE_LINES``: past it a module holds more
  than one concept and is split along its seam (docs/ARCHITECTURE.md's tree).
- docs/ARCHITECTURE.md cites only files that exist, and a name it writes as a call
  (``StateEngine.query()``) after a file is defined in that file: its walks through the
  tree stay true when code is renamed or moved.
- Every module (``iqkit.store.chain.read``) and file (``iqkit/store/chain/read.py``,
  ``store/columnar/twins.py``, ``twins.py``) a docstring or comment under ``iqkit/``
  names exists: a reader follows the name to the code, so a move or a rename updates it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
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


#: docs/ARCHITECTURE.md's citations of code: a backticked file (``iqkit/engine.py``,
#: ``tests/faults.py``), any ``iqkit/...py`` path (code blocks included), and a backticked
#: name called with no arguments (``StateEngine.query()``, ``commit_version()``).
_CITED_FILE = re.compile(r"`([\w./-]+\.py)`")
_PACKAGE_PATH = re.compile(r"(?<![\w/.-])iqkit/[\w/]+\.py\b")
_CITED_NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\(\)`")
#: Where a file cited by its bare name (``make_checkpoints.py``) may live.
_SOURCE_FOLDERS = ("iqkit", "tests", "notebooks", "bench", "pyspark_iqkit")
#: A line that starts a step of a walk (a list item), or a heading: a name cited after
#: it belongs to the file cited after it.
_NEW_STEP = re.compile(r"^\s*(?:\d+\.|[-*]|#+)\s")


def _architecture() -> list[str]:
    """docs/ARCHITECTURE.md's lines."""
    return (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()


def _file_exists(cited: str) -> bool:
    if "/" in cited:  # written from the repository's root
        return (REPO / cited).is_file()
    return any(any((REPO / f).rglob(cited)) for f in _SOURCE_FOLDERS)


def test_every_file_the_architecture_cites_exists():
    lines = _architecture()
    cited: set[str] = set()
    for line in lines:
        cited.update(_CITED_FILE.findall(line))
        cited.update(_PACKAGE_PATH.findall(line))
    assert "iqkit/engine.py" in cited  # the walks were read
    missing = sorted(c for c in cited if not _file_exists(c))
    assert not missing, "docs/ARCHITECTURE.md cites files that do not exist:\n" + "\n".join(missing)


def _defined(path: Path) -> dict[str, set[str]]:
    """What ``path`` defines at its top level: each function's and class's name, a class
    mapped to the names its body defines (methods, properties), a function to nothing."""
    found: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            found[node.name] = {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
    return found


def test_every_name_the_architecture_cites_is_defined_in_the_file_before_it():
    # A walk names each step's file, then what runs there: `iqkit/engine.py`
    # `StateEngine.query()`. The name must be defined in that file (a class's method in
    # that class's own body), so a rename or a move shows here, not in a reader's search.
    problems, checked = [], 0
    parsed: dict[str, dict[str, set[str]]] = {}
    here: str | None = None
    fenced = False
    for number, line in enumerate(_architecture(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or _NEW_STEP.match(line):
            here = None
        for match in re.finditer(r"`[^`]+`", line):
            token = match.group(0)
            path = _CITED_FILE.fullmatch(token)
            if path is not None:
                here = path.group(1)
                continue
            name = _CITED_NAME.fullmatch(token)
            if name is None:
                continue
            checked += 1
            cited = name.group(1)
            if here is None or "/" not in here or not (REPO / here).is_file():
                problems.append(f"line {number}: `{cited}()` follows no file of the repository")
                continue
            if here not in parsed:
                parsed[here] = _defined(REPO / here)
            defined = parsed[here]
            owner, _, member = cited.partition(".")
            if owner not in defined or (member and member not in defined[owner]):
                problems.append(f"line {number}: `{cited}()` is not defined in {here}")
    assert checked > 20  # the walks were read
    assert not problems, "docs/ARCHITECTURE.md:\n" + "\n".join(problems)


#: A module written from the package down, perhaps with an attribute after it:
#: ``iqkit.store.chain.read``, ``iqkit.store.chain.read.plan_twin_scan``, ``iqkit.open``.
_DOTTED_NAME = re.compile(r"(?<![\w.])iqkit(?:\.[A-Za-z_]\w*)+")
#: A file written as a path (``store/columnar/twins.py``) or a bare name (``twins.py``).
_FILE_NAME = re.compile(r"(?<![\w/.-])[\w/]*\w\.py\b")


def _notes(path: Path) -> list[tuple[int, str]]:
    """``path``'s comments and docstrings (module, class, function), with their lines."""
    text = path.read_text(encoding="utf-8")
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def _module_file(parts: list[str]) -> Path | None:
    """The file of module ``parts`` (``["iqkit", "store"]``), a package's ``__init__.py``."""
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(path: Path) -> set[str] | None:
    """What ``path`` defines or imports at its top level; None when it cannot be told (a
    star import, a module ``__getattr__``)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return None if "__getattr__" in names else names


def _dotted_name_exists(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module and a name it defines (what follows
    that name, a class's method say, is not checked)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):  # the longest prefix that is a module
        module = _module_file(parts[:n])
        if module is None:
            continue
        if n == len(parts):
            return True
        names = _top_level_names(module)
        return names is None or parts[n] in names
    return False


def _file_name_exists(cited: str, where: Path, package_files: set[str]) -> bool:
    """A path resolves from the citing file's folder or one above it, up to the
    repository's root (``store/rows.py`` from ``iqkit/engine.py``); a bare name may be any
    file of the package (``rocks.py``)."""
    if "/" not in cited:
        return cited in package_files
    return any((REPO / folder / cited).is_file() for folder in where.relative_to(REPO).parents)


def test_every_module_and_file_the_code_names_exists():
    # Modules were moved into packages (iqkit/store/chain_read.py became
    # iqkit/store/chain/read.py); a docstring naming the old place sends its reader nowhere.
    problems, checked = [], 0
    package_files = {path.name for path in (REPO / "iqkit").rglob("*.py")}
    for path in sorted([*(REPO / "iqkit").rglob("*.py"), *(REPO / "pyspark_iqkit").rglob("*.py")]):
        for number, text in _notes(path):
            where = f"{path.relative_to(REPO).as_posix()}:{number}"
            for dotted in _DOTTED_NAME.findall(text):
                checked += 1
                if not _dotted_name_exists(dotted):
                    problems.append(f"{where}: {dotted}")
            for cited in _FILE_NAME.findall(text):
                checked += 1
                if not _file_name_exists(cited, path, package_files):
                    problems.append(f"{where}: {cited}")
    assert checked > 100  # the docstrings and comments were read
    assert not problems, "names of modules or files that do not exist:\n" + "\n".join(problems)
