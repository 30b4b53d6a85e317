"""``make notebooks``: run notebooks top to bottom and store their outputs in place.

The stored outputs are what ``make test`` compares against (nbval, strict), so they are
made the way nbval runs them: a fresh kernel of this interpreter per notebook, started
in the notebooks' folder, with ``IQKIT_STABLE_TIMINGS=1`` (wall-clock figures show as a
placeholder). Cells tagged ``raises-exception`` may fail (they show a mistake); any
other error stops the run and leaves that notebook as it was. Per-cell execution
timestamps are not recorded: they would change the files on every run.

    python notebooks/execute.py [NOTEBOOK ...]    (default: every notebook here)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
#: Seconds one cell may run (the Spark notebooks' slowest cells take well under a minute).
CELL_TIMEOUT = 600


class ThisPython(KernelSpecManager):
    """Every kernel is this interpreter's ipykernel, whatever kernels the machine has
    installed under the notebook's kernel name (nbval's ``--nbval-current-env`` does
    the same)."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (ipykernel)",
            language="python",
        )


def execute(path: Path) -> float:
    """Run ``path`` in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())
    client = NotebookClient(
        nb,
        km=kernel,
        timeout=CELL_TIMEOUT,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    try:
        client.execute()
    finally:
        # A client given its kernel manager leaves the kernel (and its connection file,
        # written to the temporary folder) to the caller.
        if kernel.has_kernel:
            kernel.shutdown_kernel(now=True)
        kernel.cleanup_resources()
    nbformat.write(nb, path)
    return time.monotonic() - started


def main(args: list[str]) -> int:
    os.environ["IQKIT_STABLE_TIMINGS"] = "1"  # the kernels inherit it
    paths = [Path(a).resolve() for a in args] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        print(f"{path.name}: running", flush=True)
        print(f"{path.name}: {execute(path):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
