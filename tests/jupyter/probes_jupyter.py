"""Reliability probe for the notebook front end: hostile and careless ``%iq`` input.

Each round builds one ``%iq`` line from random hostile pieces (names that shadow the
kernel's own, paths, NUL and lone surrogates, huge partition ranges, deeply nested and
huge keys, unknown flags, reversed bounds) and runs it in a real IPython shell over real
stores. The line must either work or fail with one short ``UsageError`` line; after every
round the kernel must still work (builtins, imports, the shell's own names) and the stores
must read as before. (``%iq sql`` errors may keep DuckDB's short hint and the ``LINE n:``
excerpt with its caret: at most four short lines.) Anything else — another exception, a
long or multi-line error, a broken kernel — counts as lost.
"""

from __future__ import annotations

import builtins
import random
from pathlib import Path

from helpers import write_notebook_stores
from IPython.core.error import UsageError
from registry import Outcome, probe

_NAMES = ["__builtins__", "print", "get_ipython", "In", "Out", "_", "_i1", "class", "os",
          "fine_name", "1abc", "a-b", "x" * 300]  # fmt: skip
_STORES = ["totals", "counts", "clicks", "../x", "''", ".", "a\x00b", "nope", "t" * 300,
           "\ud800", "totals/x"]  # fmt: skip
_KEYS = ["alice", "42", "-5", "0x0a", "[1, 2]", "[" * 1500 + "]" * 1500, "k" * 200_000,
         '"\ud800"', "'unterminated", "{\"a\": 1}", ":nosuchvar", "null"]  # fmt: skip
_OPTIONS = ["--partitions 0-99999999999", "--partitions 0,1", "--partitions " + "9" * 5000,
            "--partitions -1", "--limit 0", "--limit -3", "--limit 2", "--desc",
            "--from m --to a", "--from 240000 --to 0", "--bound orders:0=5",
            "--bound :nosuch", "--bound garbage", "--trace", "--require-active",
            "--unknown-flag", "--as {name}"]  # fmt: skip
_COMMANDS = ["get", "range", "prefix", "scan", "window", "lag", "stores", "trace", "sql"]


def _line(rng: random.Random) -> str:
    command = rng.choice(_COMMANDS)
    if command == "sql":
        body = rng.choice(["SELECT 1", "SELECT '\ud800'", "SELECT * FROM totals",
                           "SELECT * FROM nosuch", "INSTALL httpfs"])  # fmt: skip
        return f"%iq sql {body}"
    parts = [command]
    if command in ("get", "range", "prefix", "scan", "window", "lag"):
        parts.append(rng.choice(_STORES))
    if command in ("get", "prefix", "window"):
        parts.append(rng.choice(_KEYS))
    for _ in range(rng.randint(0, 2)):
        parts.append(rng.choice(_OPTIONS).format(name=rng.choice(_NAMES)))
    return "%iq " + " ".join(parts)


def _kernel_is_intact(shell) -> bool:
    shell.run_cell("import os as _probe_os\n_probe_ok = _probe_os.sep + print.__name__")
    ns = shell.user_ns
    return (
        ns.get("_probe_ok") == "/print"
        and ns.get("__builtins__") in (builtins, builtins.__dict__)
        and callable(ns.get("get_ipython"))
    )


@probe(
    "Hostile and careless %iq input",
    fault="random %iq lines from hostile pieces: names shadowing the kernel's (--as "
    "__builtins__), paths and NUL as store names, lone surrogates, --partitions "
    "0-99999999999, keys nested 1,500 deep or 200 KB long, unknown flags, reversed bounds, "
    "INSTALL in SQL; each must work or fail in one line, and the kernel must stay usable",
    unit="line",
    fast=60,
    long=3000,
)
def hostile_magic_input(workdir: Path, iterations: int, rng: random.Random) -> Outcome:
    from iqkit.jupyter.testing import new_shell

    root = workdir / "stores"
    write_notebook_stores(root)
    shell = new_shell()
    shell.run_cell(f"%iq open {root}")
    baseline = shell.run_cell("%iq scan totals").result.rows.to_dict("records")
    worked = refused = 0
    lost: list[str] = []
    for _ in range(iterations):
        line = _line(rng)
        try:
            shell.run_cell(line)
            worked += 1
        except UsageError as exc:
            refused += 1
            # SQL errors may add DuckDB's short hint and the LINE excerpt with its caret
            # (iqkit.sqlsession.errors.short_message); everything else is one line.
            most = 4 if line.startswith("%iq sql") else 1
            if len(str(exc).splitlines()) > most or len(str(exc)) > 600:
                lost.append(f"{line[:60]!r}: a UsageError of {len(str(exc))} characters")
        except Exception as exc:  # a traceback where one line was promised
            lost.append(f"{line[:60]!r}: {type(exc).__name__}: {str(exc)[:120]}")
        if not _kernel_is_intact(shell):
            lost.append(f"{line[:60]!r}: the kernel's namespace was broken")
            shell = new_shell()
            shell.run_cell(f"%iq open {root}")
    after = shell.run_cell("%iq scan totals").result.rows.to_dict("records")
    if after != baseline:
        lost.append("the stores read differently after the session")
    return Outcome(
        checked=f"{iterations} lines: {worked} worked, {refused} refused in one line",
        lost=len(lost),
        lost_detail="; ".join(lost[:5]),
    )
