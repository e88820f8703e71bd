"""Authoring tools for the chapter notebooks.

``python -m helpers.tools.notebooks record notebooks/01_fp32_baseline.ipynb ...`` executes
notebooks in place (each in a fresh kernel of this Python, started in the notebook's folder) and
saves their outputs: the one command to re-record a notebook after changing it. Run it on the GPU
whose outputs should be committed (the course commits H200 outputs).

``python -m helpers.tools.notebooks refresh notebooks/07_vocab_padding.ipynb ...`` executes them on
this machine but replaces only the outputs nbval compares (cells *not* tagged
``nbval-ignore-output``): for when a committed result file changed and the cells that print it must
follow, while the cells that show the committed GPU's own measurements keep them. The compared cells
are device-independent by design (CI compares them on a CPU), so any machine gives the same outputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _execute(nb, path: Path, timeout_s: int) -> None:
    """Run ``nb`` (read from ``path``) top to bottom in a fresh kernel started in its folder.

    The kernel starts without ``$MPLBACKEND``: the kernel inherits this process's environment, and
    ``MPLBACKEND=Agg`` (right for tests and scripts) would replace the notebook's inline backend,
    so the recorded notebook would keep no figure."""
    import os

    from nbclient import NotebookClient

    backend = os.environ.pop("MPLBACKEND", None)
    try:
        NotebookClient(
            nb,
            timeout=timeout_s,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(path.parent.resolve())}},
        ).execute()
    finally:
        if backend is not None:
            os.environ["MPLBACKEND"] = backend


def record(path: str | Path, timeout_s: int = 1800) -> None:
    """Execute the notebook at ``path`` top to bottom and write it back with its new outputs.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised; the file is left unchanged.
    """
    import nbformat

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    _execute(nb, path, timeout_s)
    final_progress_text(nb)
    nbformat.write(nb, path)


IGNORE_TAG = "nbval-ignore-output"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def final_progress_text(nb) -> int:
    """Give every tqdm progress bar in ``nb`` the plain text of its final state.

    ``tqdm.auto`` in a notebook shows a widget (an HBox of HTML, FloatProgress, HTML); the output
    keeps the widget's state in the notebook's metadata, but its ``text/plain`` fallback, which
    GitHub, nbconvert without widgets and a terminal show, is the bar's first text (``0/40``). This
    rewrites that fallback from the saved final state (``fp32: 100%|##########| 40/40 [...]``).
    Returns the number of outputs changed; outputs whose widget state is missing are left as
    they are."""
    import html
    import re

    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})

    def model(ref: str) -> dict:
        return state.get(ref.removeprefix("IPY_MODEL_"), {}).get("state", {})

    changed = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if not view:
                continue
            box = model(view.get("model_id", ""))
            parts = [model(ref) for ref in box.get("children", [])]
            names = [m.get("_model_name") for m in parts]
            if names != ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
                continue
            left, bar, right = parts
            total, value = bar.get("max") or 0, bar.get("value") or 0
            filled = int(10 * value / total) if total else 0
            # the right-hand text is from the last redraw, which can precede the last update
            # (tqdm redraws at most every mininterval): its count is set from the saved value
            count = f"{int(value)}/{int(total)}" if total else None
            right_text = html.unescape(right.get("value", ""))
            if count:
                right_text = re.sub(r"\d+/\d+", count, right_text, count=1)
            text = html.unescape(left.get("value", "")) + "|" + "\u2588" * filled
            text += " " * (10 - filled) + "|" + right_text
            text = text.replace("\u2007", " ").replace("\u200b", "")
            if out["data"].get("text/plain") != text:
                out["data"]["text/plain"] = text
                changed += 1
    return changed


def refresh(path: str | Path, timeout_s: int = 1800) -> list[int]:
    """Execute the notebook at ``path`` and write back new outputs for the compared cells only.

    Cells tagged ``nbval-ignore-output`` keep their committed outputs and execution counts.
    Returns the indices of the cells whose outputs changed.

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised; the file is left unchanged.
    """
    import copy

    import nbformat

    path = Path(path)
    committed = nbformat.read(path, as_version=4)
    nb = copy.deepcopy(committed)
    _execute(nb, path, timeout_s)
    changed = []
    for i, (old, new) in enumerate(zip(committed.cells, nb.cells)):
        if old.cell_type != "code" or IGNORE_TAG in old.metadata.get("tags", []):
            continue
        if old.outputs != new.outputs:
            changed.append(i)
        old.outputs, old.execution_count = new.outputs, new.execution_count
    nbformat.write(committed, path)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.tools.notebooks", description=__doc__.splitlines()[0]
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="execute notebooks in place and keep their outputs")
    r.add_argument("notebooks", nargs="+", type=Path)
    r.add_argument(
        "--timeout", type=int, default=1800, help="seconds per cell (default 1800: compile is slow)"
    )
    f = sub.add_parser(
        "refresh", help=f"execute notebooks, keep the outputs of cells tagged {IGNORE_TAG}"
    )
    f.add_argument("notebooks", nargs="+", type=Path)
    f.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    args = p.parse_args(argv)
    for nb in args.notebooks:
        if args.command == "record":
            print(f"recording {nb} ...", flush=True)
            record(nb, args.timeout)
        else:
            changed = refresh(nb, args.timeout)
            print(f"refreshed {nb}: outputs changed in cells {changed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
