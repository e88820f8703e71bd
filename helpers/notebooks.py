"""Authoring tools for the chapter notebooks.

``python -m helpers.notebooks record notebooks/01_fp32_baseline.ipynb ...`` executes notebooks in
place (each in a fresh kernel of this Python, started in the notebook's folder) and saves their
outputs: the one command to re-record a notebook after changing it. Run it on the GPU whose
outputs should be committed (the course commits H200 outputs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def record(path: str | Path, timeout_s: int = 1800) -> None:
    """Execute the notebook at ``path`` top to bottom and write it back with its new outputs.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised; the file is left unchanged.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout_s, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    client.execute()
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m helpers.notebooks", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="execute notebooks in place and keep their outputs")
    r.add_argument("notebooks", nargs="+", type=Path)
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800: compile is slow)")
    args = p.parse_args(argv)
    for nb in args.notebooks:
        print(f"recording {nb} ...", flush=True)
        record(nb, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
