"""Imported by Python at the start of every rank parsearch spawns (this directory leads the
rank's ``PYTHONPATH``): it makes a rank that dies of an uncaught exception leave torch's
elastic *error file*, as if its entry point were wrapped in torch's ``@record``.

torchrun (and parsearch's node agent) can then name the rank's own error -- ``RuntimeError:
...``, ``AssertionError``, "can't open file" -- instead of the launcher's
``ChildFailedError``, also for scripts without a ``main`` to decorate (nanoGPT's style):

* torch's elastic agent gives each worker ``TORCHELASTIC_ERROR_FILE`` (under
  ``--log-dir``) and copies the first failed worker's file to its own
  ``TORCHELASTIC_ERROR_FILE``; parsearch gives each process it starts one of its own;
* the file is torch's format (``{"message": {"message": "Type: text", "extraInfo":
  {"py_callstack": ..., "timestamp": ...}}}``), plus the rank and pid in ``extraInfo``;
* it is created exclusively: a file already there (``@record`` wrote it, or a rank that
  shares the variable failed first, as under the ``deepspeed`` launcher) is left alone;
* a script that cannot be opened ends before any Python code runs, so it is checked here.

It also makes a direct child of a guarded launcher (torchrun's workers) die with the
launcher (``PR_SET_PDEATHSIG``), see :mod:`parsearch.launch.guard`.

Only the interpreter's already-loaded modules are used at start-up (``os``, ``sys``); the
``sitecustomize`` this file hides, if any further along the path, still runs.
"""

import os
import sys

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"
LAUNCHER_PID_VAR = "PARSEARCH_GUARDED_PID"  # parsearch.launch.guard's


def _write_error(message: str, callstack: str) -> None:
    path = os.environ.get(ERROR_FILE_VAR)
    if not path:
        return
    import json
    import time

    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": str(int(time.time())),
                "rank": os.environ.get("RANK", ""),
                "pid": str(os.getpid()),
            },
        }
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:  # already written (first failure wins), or no such directory
        return
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)


def _excepthook(kind, value, tb):  # type: ignore[no-untyped-def]
    try:
        if not issubclass(kind, KeyboardInterrupt):
            import traceback

            stack = "".join(traceback.format_exception(kind, value, tb))
            _write_error(f"{kind.__name__}: {value}", stack)
    except Exception:  # never hide the program's own error behind ours
        pass
    _previous_hook(kind, value, tb)


def _check_script() -> None:
    """``python missing.py`` prints "can't open file" from C and exits 2: no hook runs."""
    script = sys.argv[0] if sys.argv else ""
    if script and script not in ("-c", "-m", "-") and not os.path.exists(script):
        shown = os.path.abspath(script)
        _write_error(
            f"can't open file {shown!r}: [Errno 2] No such file or directory",
            f"{sys.executable}: can't open file {shown!r}: [Errno 2] No such file or directory",
        )


def _run_hidden_sitecustomize() -> None:
    """Run the ``sitecustomize`` a later path entry holds (a distribution's, a venv's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    from importlib.machinery import PathFinder

    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)


def _die_with_launcher() -> None:
    """A worker of a guarded launcher (torchrun) dies with it: the guard's SIGKILL reaches
    the launcher alone (``PR_SET_PDEATHSIG`` is per process), and its workers, in sessions
    of their own, would train on unwatched (see parsearch.launch.guard)."""
    if os.environ.get(LAUNCHER_PID_VAR) != str(os.getppid()) or sys.platform != "linux":
        return
    import ctypes

    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if os.environ.get(LAUNCHER_PID_VAR) != str(os.getppid()):  # it died meanwhile
        os._exit(137)


_previous_hook = sys.excepthook
_die_with_launcher()
if os.environ.get(ERROR_FILE_VAR):
    sys.excepthook = _excepthook
    _check_script()
_run_hidden_sitecustomize()
