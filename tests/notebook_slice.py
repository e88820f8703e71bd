"""The cells of a notebook that a blank exercise can change, and the cells those need.

A student version differs from its solution notebook only in the solution cells. A cell that never
reads (directly or through cells that do) a name a solution cell defines runs the same in both, and
nbval already runs the solution notebook. So the student-version test runs only the cells that
matter: solution and check cells, every cell that depends on a learner's name, and, walking back,
the cell that last defined each name those cells read.
"""

from __future__ import annotations

import ast
import builtins


def _python(source: str) -> str:
    """The cell as plain Python (IPython magics and shell escapes turned into calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds at top level, names it reads anywhere, nested functions included)."""
    tree = ast.parse(_python(source))
    defined: set[str] = set()
    for node in tree.body:
        for sub in (
            ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [node]
        ):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(sub.name)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                defined.add(sub.id)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                defined |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return defined, read - set(dir(builtins))


def cells_to_run(sources: list[str], learner: set[int], always: set[int]) -> list[int]:
    """Indices (in order) of the code cells to run.

    Args:
        sources: every code cell's source, in notebook order.
        learner: indices of the solution cells (what a blank changes).
        always: indices that run in any case (check cells).
    """
    parsed = [names(s) for s in sources]
    keep, tainted = set(learner) | set(always), set()
    for i, (defined, read) in enumerate(parsed):  # forward: who depends on a learner's name
        if i in learner or read & tainted:
            keep.add(i)
            tainted |= defined
    todo = sorted(keep)
    while todo:  # backward: the cell that last bound each name a kept cell reads
        i = todo.pop()
        for name in parsed[i][1]:
            j = next((j for j in range(i - 1, -1, -1) if name in parsed[j][0]), None)
            if j is not None and j not in keep:
                keep.add(j)
                todo.append(j)
    return sorted(keep)
