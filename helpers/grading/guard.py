"""What the grader restores in a submission's kernel before each check cell (cheap defences, not a
sandbox): the import machinery and the ``helpers`` package's path, the builtins, IPython's input
and AST transformers, its event callbacks and exception handler, the methods of the shell and the
kernel that run a cell, and what makes a cell's reply (``ExecutionResult``, the kernel's
``Session``), as they were when the kernel started, before any of the submission's code ran.

The grader calls :func:`snapshot` first thing in the kernel and :func:`restore` before each check
cell, both through an ``execute_request``'s ``user_expressions`` (evaluated by ``eval``, not by
``run_cell``, so no input transformer or patched ``run_cell`` sees them). A submission runs in the
same interpreter as its checks, so a determined one can still defeat this (replace this module in
``sys.modules``, patch the libraries a check uses): docs/grading.md, "What the grader guarantees".
"""

from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any

_saved: dict[str, Any] = {}

# Attributes of the shell (IPython's InteractiveShell) and the kernel whose replacement changes
# what a cell does: lists are restored in place, callables by deleting an instance's override.
_SHELL_LISTS = ("input_transformers_cleanup", "input_transformers_post", "ast_transformers")
_RUNNERS = (
    "run_cell",
    "run_cell_async",
    "_run_cell",
    "run_ast_nodes",
    "run_code",
    "transform_cell",
    "transform_ast",
    "should_run_async",
    "showtraceback",
    "user_expressions",
    "do_execute",
    "execute_request",
)

# The methods of jupyter_client's Session that build and send a cell's reply to the grader.
_SESSION_METHODS = (
    "send",
    "serialize",
    "sign",
    "msg",
    "msg_header",
    "send_raw",
    "deserialize",
    "feed_identities",
    "recv",
)


# Modules whose functions and classes decide how a module is imported and how a cell's reply is
# made: their ``sys.modules`` entries, their function and class attributes, and the attributes of
# those classes are put back as they were (``SourceFileLoader.exec_module``, ``importlib`` itself,
# the name ``ExecutionResult`` bound to a subclass, ...).
_MODULES = (
    "importlib",
    "importlib._bootstrap",
    "importlib._bootstrap_external",
    "importlib.abc",
    "importlib.machinery",
    "importlib.util",
    "IPython.core.interactiveshell",
    "ipykernel.kernelbase",
    "ipykernel.ipkernel",
    "ipykernel.zmqshell",
    "jupyter_client.session",
)
# Of those, the ones whose classes are plain Python classes: an attribute added to one of their
# classes (an override of an inherited method) is deleted again. The others are traitlets
# classes, which add class attributes of their own as they are used.
_PLAIN = ("importlib",)


def _class_dicts(obj: Any) -> list[tuple[type, dict[str, Any]]]:
    return [(cls, dict(vars(cls))) for cls in type(obj).__mro__ if cls is not object]


def _module_state() -> dict[str, tuple[Any, dict[str, Any], list[tuple[type, dict[str, Any]]]]]:
    """{module name: (the module, its function and class attributes, [(class, its dict)])}."""
    state = {}
    for name in _MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        attrs = {k: v for k, v in vars(module).items() if callable(v)}
        classes = [(v, dict(vars(v))) for v in attrs.values() if isinstance(v, type)]
        state[name] = (module, attrs, classes)
    return state


def _restore_modules(state: dict[str, Any]) -> None:
    for name, (module, attrs, classes) in state.items():
        sys.modules[name] = module
        for key, value in attrs.items():
            if vars(module).get(key) is not value:
                setattr(module, key, value)
        for cls, saved in classes:
            if name.split(".")[0] in _PLAIN:
                for key in set(vars(cls)) - set(saved):
                    _quietly(delattr, cls, key)
            for key, value in saved.items():
                if vars(cls).get(key) is not value and key not in ("__dict__", "__weakref__"):
                    _quietly(setattr, cls, key, value)


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except (AttributeError, TypeError):  # a built-in class's attribute: cannot be changed anyway
        pass


def _instance_state(obj: Any) -> dict[str, Any]:
    """What an object's own attributes hold that runs code: its callable attributes, its
    traitlets' callable values (a Session's ``pack``/``unpack``) and its handler tables (a
    kernel's ``shell_handlers``/``control_handlers``, copied)."""
    own = vars(obj)
    return {
        "names": set(own),
        "callables": {k: v for k, v in own.items() if callable(v)},
        "traits": {k: v for k, v in own.get("_trait_values", {}).items() if callable(v)},
        "tables": {
            k: dict(v) for k, v in own.items() if k.endswith("_handlers") and isinstance(v, dict)
        },
    }


def _restore_instance(obj: Any, saved: dict[str, Any]) -> None:
    own = vars(obj)
    for name in set(own) - saved["names"]:
        if callable(getattr(type(obj), name, None)):
            del own[name]  # an instance's override of a class's method
    for name, value in saved["callables"].items():
        if own.get(name) is not value:
            own[name] = value
    for name, value in saved["traits"].items():
        if own.get("_trait_values", {}).get(name) is not value:
            setattr(obj, name, value)
    for name, table in saved["tables"].items():
        own[name].clear()
        own[name].update(table)


def snapshot(nonce: str = "") -> str:
    """Save what :func:`restore` puts back; call it before any submission code runs. Returns
    ``"snapshot " + nonce``."""
    from IPython import get_ipython
    from IPython.core.interactiveshell import ExecutionResult

    import helpers

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    session = getattr(kernel, "session", None)
    _saved.update(
        helpers=(helpers, list(helpers.__path__)),
        # what a cell's reply says: ExecutionResult.success, and the Session that sends the reply
        result_class=(ExecutionResult, dict(vars(ExecutionResult))),
        session_classes=_class_dicts(session) if session is not None else [],
        session=session,
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        builtins=dict(vars(builtins)),
        importlib={k: getattr(importlib, k) for k in ("reload", "import_module")},
        shell=shell,
        lists={name: list(getattr(shell, name)) for name in _SHELL_LISTS},
        callbacks={k: list(v) for k, v in shell.events.callbacks.items()},
        classes=_class_dicts(shell) + (_class_dicts(kernel) if kernel is not None else []),
        kernel=kernel,
        custom_exceptions=shell.custom_exceptions,
        custom_tb=getattr(shell, "CustomTB", None),
        trace=(sys.gettrace(), sys.getprofile()),
        sys_path=list(sys.path),
        # where compiled modules are read from: a prefix the submission sets could hold a .pyc
        # of a rewritten check, used without reading the source
        bytecode=(sys.pycache_prefix, sys.dont_write_bytecode),
        modules=_module_state(),
        instances=[(o, _instance_state(o)) for o in (shell, kernel, session) if o is not None],
    )
    return "snapshot " + nonce


def restore(nonce: str = "") -> str:
    """Put back what :func:`snapshot` saved, forget cached importers, and drop every imported
    ``helpers.grading`` module but this one, so the check cell imports the checks afresh from
    disk. Returns ``"restored " + nonce``.

    Raises:
        RuntimeError: when :func:`snapshot` never ran in this interpreter.
    """
    if not _saved:
        raise RuntimeError("the grader's snapshot is missing")
    s = _saved
    sys.settrace(s["trace"][0])
    sys.setprofile(s["trace"][1])
    _restore_modules(s["modules"])
    sys.path[:] = s["sys_path"]
    sys.pycache_prefix, sys.dont_write_bytecode = s["bytecode"]
    sys.meta_path[:] = s["meta_path"]
    sys.path_hooks[:] = s["path_hooks"]
    sys.path_importer_cache.clear()
    vars(builtins).update(s["builtins"])
    for name, fn in s["importlib"].items():
        setattr(importlib, name, fn)
    shell, kernel = s["shell"], s["kernel"]
    for name, items in s["lists"].items():
        getattr(shell, name)[:] = items
    shell.events.callbacks.clear()
    shell.events.callbacks.update({k: list(v) for k, v in s["callbacks"].items()})
    shell.custom_exceptions = s["custom_exceptions"]
    if s["custom_tb"] is not None:
        shell.CustomTB = s["custom_tb"]
    for obj in (shell, kernel):
        for name in _RUNNERS:
            if obj is not None and name in getattr(obj, "__dict__", {}):
                del obj.__dict__[name]  # an instance's override of a class's method
    for cls, attrs in s["classes"]:
        for name, value in attrs.items():
            if name in _RUNNERS and vars(cls).get(name) is not value:
                setattr(cls, name, value)
    package, package_path = s["helpers"]
    sys.modules["helpers"] = package
    package.__path__[:] = package_path  # a folder put first would shadow helpers.grading
    cls, attrs = s["result_class"]  # a plain class: every attribute as it was
    for name in set(vars(cls)) - set(attrs):
        delattr(cls, name)
    for name, value in attrs.items():
        if vars(cls).get(name) is not value and name not in ("__dict__", "__weakref__"):
            setattr(cls, name, value)
    session = s["session"]
    if session is not None:
        for name in _SESSION_METHODS:
            vars(session).pop(name, None)  # an instance's override of a Session method
        for cls, attrs in s["session_classes"]:
            for name, value in attrs.items():
                if name in _SESSION_METHODS and vars(cls).get(name) is not value:
                    setattr(cls, name, value)
    for obj, saved in s["instances"]:
        _restore_instance(obj, saved)
    for name in [m for m in sys.modules if m.startswith("helpers.grading")]:
        if name != __name__:
            del sys.modules[name]
    return "restored " + nonce
