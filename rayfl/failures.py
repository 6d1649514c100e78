"""What a run that failed inside Ray tells the user: the user's own error, or one line whose
advice can succeed.

Ray hands an exception raised in an actor back wrapped in ``RayTaskError`` — a client actor's
inside the server's, the server's inside the driver's call — whose text is the actors' whole
traceback. :func:`unwrapped` takes a user's :class:`~rayfl.contract.ComponentError`, a
:class:`~rayfl.schema.ConfigError` or a :class:`~rayfl.runtime.storage.CheckpointError` out of
the wrapping, so the command line prints it as one line with the user's own frames (their paths
as the user knows them, not Ray's copies of the modules). Any other failure becomes one line
saying where it happened, and ``continue with: rayfl resume`` is said only when a checkpoint
exists to continue from and the failure was not the code's own (which would repeat): a process
that died, a hang.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

import ray

from rayfl import config as config_mod
from rayfl.contract import ComponentError, _is_user_frame
from rayfl.runtime import checkpoint, storage
from rayfl.runtime.storage import CheckpointError
from rayfl.schema import ConfigError

# errors that already say what is wrong, in one line
CLEAR = (ComponentError, ConfigError, CheckpointError)
_RAY_COPY = re.compile(r'File "[^"]*/runtime_resources/py_modules_files/_ray_pkg_[0-9a-f]+/'
                       r'([^"]+)"')
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in .*$')


class RunStopped(RuntimeError):
    """The run could not go on (a dead server, lost client actors, an error in the server);
    the message says whether a checkpoint is there for ``rayfl resume`` to continue from, and
    ``frames`` holds the user's own frames of an error, if any."""

    frames: str = ""


def remote_cause(e: BaseException) -> BaseException:
    """The exception an actor raised, through every ``RayTaskError`` around it."""
    while isinstance(e, ray.exceptions.RayTaskError) and getattr(e, "cause", None) is not None:
        e = e.cause
    return e


def unwrapped(e: BaseException) -> BaseException:
    """The ComponentError, ConfigError or CheckpointError inside a Ray error (its frames' paths
    made the user's own), or ``e`` itself when it holds none."""
    cause = remote_cause(e)
    if isinstance(cause, ComponentError):
        return ComponentError(cause.component, cause.problem, cause.round, cause.client,
                              local_paths(cause.frames))
    return cause if isinstance(cause, (ConfigError, CheckpointError)) else e


def local_paths(frames: str) -> str:
    """``frames`` with Ray's copies of the user's modules (``runtime_env.py_modules``) named by
    the files the user wrote."""
    def origin(match: re.Match) -> str:
        relative = match.group(1)
        top = sys.modules.get(relative.split("/")[0].removesuffix(".py"))
        where = getattr(top, "__path__", None)
        base = os.path.dirname(list(where)[0] if where else getattr(top, "__file__", "") or "")
        return f'File "{os.path.join(base, relative)}"' if base else match.group(0)

    return _RAY_COPY.sub(origin, frames)


def user_frames_of(text: str) -> str:
    """The frames in the user's own files of a traceback given as text (Ray's)."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m and os.path.isabs(m.group(1)) and _is_user_frame(m.group(1)):  # not Ray's .pyx
            out.append(line)
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) and \
                    lines[i + 1].startswith("    ") and lines[i + 1].strip(" ^~"):
                out.append(lines[i + 1])
    return local_paths("\n".join(out))


def checkpointed(run_dir: str) -> bool:
    """Whether the run in ``run_dir`` has a checkpoint to continue from."""
    try:
        cfg = config_mod.load(os.path.join(run_dir, "config.yaml"))
        return checkpoint.exists(storage.run_location(cfg, run_dir))
    except (ConfigError, OSError):
        return False


def continue_hint(run_dir: str) -> str:
    """``the last checkpoint is intact; continue with: rayfl resume DIR`` when there is one to
    continue from; otherwise that nothing was checkpointed (a resume would start over)."""
    if checkpointed(run_dir):
        return f"the last checkpoint is intact; continue with: rayfl resume {run_dir}"
    return "no round was checkpointed yet (rayfl resume would start the run over)"


def _user_frames(e: BaseException) -> str:
    """The user's frames of a remote error's traceback (or a local one's)."""
    return user_frames_of(getattr(e, "traceback_str", "") or "".join(
        traceback.format_exception(e)))


def server_failed(e: BaseException, run_dir: str, rounds_seen: int) -> Exception:
    """What to raise for the server actor's call ending in ``e`` (a ``RayTaskError``, the
    server's or a client actor's): the user's ComponentError, a ConfigError or a
    CheckpointError, else a one-line ``RunStopped`` naming the exception and the round, with
    the user's frames (code that failed fails again: no resume advice)."""
    clear = unwrapped(e)
    if isinstance(clear, CLEAR):
        return clear
    cause = remote_cause(e)
    text = " ".join(str(cause).split())[:300]
    stopped = RunStopped(f"{type(cause).__name__} in round {rounds_seen + 1}" +
                         (f": {text}" if text else "") + f"; see {run_dir}")
    stopped.frames = _user_frames(e)
    return stopped


def server_not_started(e: BaseException) -> RunStopped:
    """What to raise when the server could not start (its ``start`` call ended in ``e``, a
    ``RayTaskError``): one line naming what failed, with the user's frames."""
    clear = unwrapped(e)
    cause = remote_cause(e)
    what = str(clear) if isinstance(clear, CLEAR) else f"{type(cause).__name__}: {cause}"
    stopped = RunStopped(f"the server actor could not start: {what}")
    stopped.frames = _user_frames(e)
    return stopped


def server_died(e: BaseException, run_dir: str, rounds_seen: int) -> Exception:
    """What to raise when the server actor is gone (``RayActorError``): its process ended
    (resumable only from a checkpoint)."""
    return RunStopped(f"the server actor died in round {rounds_seen + 1} (its process ended: "
                      f"killed, out of memory, or a crash in native code); "
                      f"{continue_hint(run_dir)}")
