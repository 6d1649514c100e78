"""Where a run keeps its client state and checkpoints: a local directory or an object-store URI.

A location is a plain path (the default: the run directory, written with ``os`` exactly as a
local file system wants) or a URI that ``pyarrow.fs.FileSystem.from_uri`` understands
(``s3://bucket/prefix?region=...``, ``gs://...``, ``hdfs://...``, ``file:///...``). A Ray
cluster whose nodes share no file system works when the location is an object store: every
actor reads and writes the same objects.

Every write is atomic, so a process killed at any instant leaves either the old content or the
new one: locally a temporary file renamed over the target, on an object store one upload that
becomes visible only when it completes (an interrupted upload leaves nothing).
"""

from __future__ import annotations

import io
import os
import re
import shutil
from typing import IO, Callable
from urllib.parse import quote, unquote, urlparse

from pyarrow import fs as pafs

from rayfl.creatable import check_creatable
from rayfl.schema import ConfigError

# schemes pyarrow.fs.FileSystem.from_uri resolves (checked without touching the network)
SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss", "file")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"://[^/@?]*@")
_TMP = ".tmp"  # suffix of a local write in progress


def redact(text: str) -> str:
    """``text`` with a URI's ``user:password@`` left out (for messages)."""
    return _USERINFO.sub("://", text)


def check_location(key: str, location: str) -> None:
    """Raise :class:`ConfigError` unless ``location`` is a path or a URI of a known scheme."""
    shown = redact(location)
    if not location or "\0" in location:
        raise ConfigError(key, shown, "a non-empty local path or storage URI")
    match = _SCHEME.match(location)
    known = f"a local path or a URI whose scheme is one of {', '.join(SCHEMES)}"
    if match is None:
        if "://" in location:
            raise ConfigError(key, shown, known)
        return
    if match.group(1).lower() not in SCHEMES:
        raise ConfigError(key, shown, known)
    if match.group(1).lower() == "file":
        if urlparse(location).netloc not in ("", "localhost") or "?" in location:
            raise ConfigError(key, shown, "a file URI of an absolute path, file:///PATH")
        return
    rest = location[match.end():].partition("?")[0].strip("/")
    if not rest:
        raise ConfigError(key, shown, "a URI naming a bucket or directory "
                                      "(e.g. s3://bucket/prefix)")


class StorageError(RuntimeError):
    """A write (or read) of the run's files failed mid-run: a full disk, a read-only directory,
    an unreachable object store. Every write is atomic, so the last checkpoint is intact."""

    @classmethod
    def of(cls, e: OSError) -> "StorageError":
        cause = getattr(e, "cause", None) or e  # a client actor's error arrives wrapped by Ray
        where = getattr(cause, "filename", None)
        what = getattr(cause, "strerror", None) or str(cause)
        return cls(redact(f"{what} ({where})" if where else what))


class CheckpointError(ValueError):
    """What a run stored cannot be continued from — a checkpoint or a client-state file that
    is damaged, missing though committed, or of other layers: names the file and what was
    expected of it (``rayfl`` exits 2)."""

    def __init__(self, path: str, expected: str, what: str = "checkpoint"):
        self.path, self.expected, self.what = path, expected, what
        super().__init__(f"{what} {path}: expected {' '.join(expected.split())}")

    def __reduce__(self):
        """Pickled with its fields (raised in a Ray actor, it reaches the driver whole)."""
        return type(self), (self.path, self.expected, self.what)


def local_path(location: str) -> str | None:
    """The local path a location names (a path, or a ``file:///PATH`` URI); None: remote."""
    match = _SCHEME.match(location)
    if match is None:
        return location
    return unquote(urlparse(location).path) if match.group(1).lower() == "file" else None


def join(location: str, *parts: str) -> str:
    """``location`` with path components appended (a URI keeps its ``?query`` at the end;
    characters a URI cannot hold are percent-encoded, which pyarrow decodes)."""
    if _SCHEME.match(location) is None:
        return os.path.join(location, *parts)
    base, q, query = location.partition("?")
    return "/".join([base.rstrip("/"), *(quote(p, safe="/") for p in parts)]) + q + query


def run_location(cfg, run_dir: str) -> str:
    """A run's storage: the run directory itself, or ``<runtime.storage>/<run dir's name>``."""
    if cfg.runtime.storage is None:
        return run_dir
    return join(cfg.runtime.storage, os.path.basename(os.path.normpath(run_dir)))


def state_root(cfg, run_dir: str) -> str:
    """Where the run's client-state store lives (``<run location>/state``)."""
    return state_root_of(run_location(cfg, run_dir))


def state_root_of(location: str) -> str:
    """The client-state store of the run stored at ``location`` (:func:`run_location`)."""
    return join(location, "state")


def check_new_run(cfg, run_dir: str) -> None:
    """Before a new run creates anything: its storage must be reachable and hold no files
    (an earlier run of the same name would otherwise be resumed or overwritten)."""
    if cfg.runtime.storage is None:
        return  # the run directory itself: new or empty, checked by the caller
    store = Storage(run_location(cfg, run_dir))
    if store.is_local:  # a file there, /proc, read-only: refused
        check_creatable(store.location, "runtime.storage")
    try:
        taken = bool(store.files())
    except (OSError, ValueError) as e:  # unreachable, refused, or a URI pyarrow cannot parse
        why = redact((str(e).splitlines() or [""])[0])[:200]
        raise ConfigError("runtime.storage", store.path(""),
                          f"a reachable storage location ({why})") from None
    if taken:
        raise ConfigError("runtime.storage", store.path(""), "a location holding no files yet "
                          "(a run of this name already keeps its state there)")


class Storage:
    """Atomic whole-file reads and writes under one location (picklable: only the location
    travels; each process opens its own file system on first use)."""

    def __init__(self, location: str):
        path = local_path(location)
        self.is_local = path is not None
        self.location = path if self.is_local else location
        self._fs = None
        self._root = self.location

    def __getstate__(self) -> dict:
        return {"location": self.location}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["location"])

    def _remote(self):
        if self._fs is None:
            self._fs, self._root = pafs.FileSystem.from_uri(self.location)
        return self._fs

    def path(self, name: str) -> str:
        """The full path (or URI) of ``name``, for messages (credentials and options left out)."""
        if self.is_local:
            return os.path.join(self.location, name)
        return redact(join(self.location, name)).partition("?")[0]

    def _key(self, name: str) -> str:
        self._remote()
        return f"{self._root.rstrip('/')}/{name}"

    # ----- writes ------------------------------------------------------------------------
    def write_with(self, name: str, writer: Callable[[IO[bytes]], None],
                   durable: bool = False) -> None:
        """Replace ``name`` with what ``writer(file)`` writes, atomically.

        Locally the bytes go straight to a temporary file (``durable`` fsyncs it) that is then
        renamed; on an object store they are collected and uploaded in one request.
        """
        if self.is_local:
            path = os.path.join(self.location, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + _TMP
            try:
                with open(tmp, "wb") as f:
                    writer(f)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException as e:  # a full disk or a kill: give the partial file's space back
                if os.path.exists(tmp):
                    os.remove(tmp)
                if isinstance(e, OSError) and e.filename is None:
                    e.filename = path  # say which file
                raise
            return
        buf = io.BytesIO()
        writer(buf)
        self.write(name, buf.getvalue())

    def write(self, name: str, data: bytes, durable: bool = False) -> None:
        """Replace ``name`` with ``data``, atomically."""
        if self.is_local:
            self.write_with(name, lambda f: f.write(data), durable)
            return
        # one buffered stream, closed only after every byte is in: an upload cut short
        # (a killed process) never completes, so the object is either old or new
        with self._remote().open_output_stream(self._key(name)) as out:
            out.write(data)

    # ----- reads -------------------------------------------------------------------------
    def read(self, name: str) -> bytes:
        """The content of ``name`` (FileNotFoundError when there is none)."""
        if self.is_local:
            with open(os.path.join(self.location, name), "rb") as f:
                return f.read()
        with self._remote().open_input_stream(self._key(name)) as f:
            return f.read()

    def open(self, name: str) -> IO[bytes]:
        """A seekable binary file of ``name``'s content (FileNotFoundError when missing)."""
        if self.is_local:
            return open(os.path.join(self.location, name), "rb")
        return io.BytesIO(self.read(name))

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists."""
        if self.is_local:
            return os.path.isfile(os.path.join(self.location, name))
        return self._remote().get_file_info(self._key(name)).type == pafs.FileType.File

    def files(self) -> list[str]:
        """Every file under the location, as names relative to it (empty when it is missing)."""
        if self.is_local:
            out = []
            for top, _, names in os.walk(self.location):
                rel = os.path.relpath(top, self.location)
                out += [n if rel == "." else os.path.join(rel, n) for n in names]
            return out
        root = self._key("").rstrip("/")
        infos = self._remote().get_file_info(
            pafs.FileSelector(root, recursive=True, allow_not_found=True))
        return [i.path[len(root) + 1:] for i in infos if i.type == pafs.FileType.File]

    # ----- deletes -----------------------------------------------------------------------
    def delete(self, name: str) -> None:
        """Remove ``name``; a missing one is fine."""
        try:
            if self.is_local:
                os.remove(os.path.join(self.location, name))
            else:
                self._remote().delete_file(self._key(name))
        except FileNotFoundError:
            pass

    def directories(self) -> set[str]:
        """The directories that exist now: the location and its parents (below an object
        store's bucket), and every one under the location. :meth:`remove_new` keeps them."""
        found = {path for path in self._lineage() if self._is_dir(path)}
        if self.is_local and os.path.isdir(self.location):
            found |= {os.path.abspath(root) for root, _, _ in os.walk(self.location)}
        elif not self.is_local:
            found |= {i.path for i in self._under() if i.type == pafs.FileType.Directory}
        return found

    def remove_new(self, existed: set[str]) -> None:
        """Remove every file under the location (it held none before), then each directory at,
        under or above it that is not in ``existed`` (:meth:`directories` before) and holds no
        file: an object store, which keeps a marker where a directory's last file went, is left
        as it was."""
        if self.is_local:
            for root, _, files in os.walk(self.location, topdown=False):
                for name in files:
                    os.remove(os.path.join(root, name))
                if os.path.abspath(root) not in existed:
                    os.rmdir(root)
        else:
            fs, under = self._remote(), self._under()
            for info in under:
                if info.type == pafs.FileType.File:
                    fs.delete_file(info.path)
            new = [i.path for i in under if i.type == pafs.FileType.Directory] + \
                [self._key("").rstrip("/")]
            for path in sorted(set(new) - existed, key=lambda p: -p.count("/")):  # deepest first
                if self._is_dir(path):
                    fs.delete_dir(path)
        for path in self._lineage()[1:]:  # the parents, innermost first
            if path in existed or not self._is_dir(path) or self._holds_files(path):
                return
            if self.is_local:
                os.rmdir(path)
            else:
                self._remote().delete_dir(path)

    def _lineage(self) -> list[str]:
        """The location, then its parents (locally up to the root; an object store's up to,
        not including, the bucket)."""
        path = os.path.abspath(self.location) if self.is_local else self._key("").rstrip("/")
        out = [path]
        while os.path.dirname(path) not in ("", path) and (self.is_local or "/" in
                                                            os.path.dirname(path)):
            path = os.path.dirname(path)
            out.append(path)
        return out

    def _under(self) -> list:
        """An object store's entries under the location (FileInfo: files and directories)."""
        return self._remote().get_file_info(pafs.FileSelector(
            self._key("").rstrip("/"), recursive=True, allow_not_found=True))

    def _is_dir(self, path: str) -> bool:
        if self.is_local:
            return os.path.isdir(path)
        return self._remote().get_file_info(path).type == pafs.FileType.Directory

    def _holds_files(self, path: str) -> bool:
        if self.is_local:
            return any(files for _, _, files in os.walk(path))
        infos = self._remote().get_file_info(pafs.FileSelector(path, recursive=True,
                                                               allow_not_found=True))
        return any(i.type == pafs.FileType.File for i in infos)

    def clear(self) -> None:
        """Remove everything under the location (a missing location is fine)."""
        if self.is_local:
            shutil.rmtree(self.location, ignore_errors=True)
            return
        try:  # the location's own directory marker too
            self._remote().delete_dir(self._key("").rstrip("/"))
        except FileNotFoundError:
            pass

