"""Regenerate the table in RELIABILITY.md by running every probe (``make reliability``).

    .venv/bin/python tests/reliability/run.py             # long variants (tens of minutes)
    .venv/bin/python tests/reliability/run.py --fast      # the fast variants of make test
    .venv/bin/python tests/reliability/run.py --only "Store names" --iterations 500

Each probe runs once, in its own temporary folder, with ``--seed`` (or a random seed,
printed). The table between the markers in RELIABILITY.md is rewritten; the prose around
it is kept. Exits 1 when a probe broke an invariant or lost anything.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from registry import Run, iterations, load_probes, run_probe, seed

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "RELIABILITY.md"
BEGIN, END = "<!-- probes:begin -->", "<!-- probes:end -->"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(runs: list[Run], *, which: str, run_seed: int, seconds: float) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Generated {when} by `make reliability` ({which} variants, `IQKIT_FAULT_SEED="
        f"{run_seed}`, Python {platform.python_version()}, {platform.system()} "
        f"{platform.machine()}, {seconds:.0f} s in all).",
        "",
        "| Fault or input class | What is done | Iterations | What was checked | Lost | Time |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for run in runs:
        p, o = run.probe, run.outcome
        if o is None:
            checked, lost = "—", f"**BROKEN**: {run.error}"
        else:
            checked = o.checked
            lost = "nothing" if o.lost == 0 else f"**{o.lost}** {o.lost_detail}"
            notes.extend(f"{p.name}: {note}" for note in o.notes)
        lines.append(
            f"| {cell(p.name)} | {cell(p.fault)} | {run.iterations} × {cell(p.unit)} | "
            f"{cell(checked)} | {cell(lost)} | {run.seconds:.0f} s |"
        )
    if notes:
        lines += ["", "Notes from this run:", "", *(f"- {cell(n)}" for n in notes)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the fast variants")
    parser.add_argument("--only", action="append", help="run only this probe (repeatable)")
    parser.add_argument("--iterations", type=int, help="iterations for every probe")
    parser.add_argument("--seed", type=int, help="IQKIT_FAULT_SEED for every probe")
    parser.add_argument("--no-write", action="store_true", help="print, do not rewrite")
    args = parser.parse_args(argv)
    which = "fast" if args.fast else "long"
    run_seed = args.seed if args.seed is not None else seed()
    probes = [p for p in load_probes() if not args.only or p.name in args.only]
    started = time.monotonic()
    runs = []
    for p in probes:
        n = args.iterations or iterations(p, which)
        print(f"{p.name}: {n} × {p.unit} ...", end=" ", flush=True)
        with tempfile.TemporaryDirectory(prefix="iqkit-probe-") as workdir:
            run = run_probe(p, Path(workdir), n, run_seed)
        runs.append(run)
        verdict = run.error or ("lost nothing" if run.outcome and not run.outcome.lost else "LOST")
        print(f"{run.seconds:.0f} s, {verdict}", flush=True)
    text = table(runs, which=which, run_seed=run_seed, seconds=time.monotonic() - started)
    if args.no_write or args.only or args.iterations:
        print(text)
    else:
        doc = DOC.read_text(encoding="utf-8")
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")
        print(f"rewrote the table in {DOC}")
    broken = [r for r in runs if r.error or (r.outcome and r.outcome.lost)]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
