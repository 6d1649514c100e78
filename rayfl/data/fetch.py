"""``rayfl data fetch NAME``: download a built-in dataset, check it, and unpack it into the folder
its loader reads (``data.root``); ``data.fetch: true`` does the same for a run whose dataset is
missing, before the partition is built.

The download goes to ``.<folder>.<file>.part`` beside the destination folder and, when the
transfer breaks before the bytes the server announced, continues from there with an HTTP Range
request on the next try. A complete download is checked (size and checksum, see
:mod:`rayfl.data.fetch_sources`) before anything is unpacked; a mismatch removes it. The files
are laid out in a temporary folder beside the destination, which is renamed into place only when
complete, holding ``.rayfl-fetch.json`` (what was fetched from where): a destination is either
absent or whole. Fetches into one folder take turns on ``.<folder>.lock`` beside it, removed when
done. Failures are one :class:`FetchError` line (exit 2), and leave nothing behind but the part
of a broken transfer.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import fcntl
import json
import lzma
import os
import posixpath
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import urllib.parse
import zipfile
from typing import TYPE_CHECKING, Optional

from rayfl import registry
from rayfl.data import fetch_unpack
from rayfl.data.fetch_download import (Expected, FetchError, Resumable, disk_error, download,
                                       expected_of, verify)
from rayfl.data.fetch_sources import (MIRROR_ENV, NOT_FETCHED, SOURCES, File, Source,
                                      default_folder, url_of)
from rayfl.schema import ConfigError
from rayfl.usage import OneLineParser

if TYPE_CHECKING:
    from rayfl.data.config import DataConfig

RECORD = ".rayfl-fetch.json"  # in a fetched folder: what was fetched, from where, its checksum
# what unpacking an archive of an unexpected format raises (besides OSError)
UNPACK_ERRORS = (EOFError, ValueError, KeyError, IndexError, TypeError, tarfile.TarError,
           zipfile.BadZipFile, lzma.LZMAError, sqlite3.DatabaseError, csv.Error)


def source_of(name: str, key: str = "NAME") -> Source:
    """The source of a fetchable dataset, or a ConfigError on ``key`` saying why not."""
    if name in SOURCES:
        return SOURCES[name]
    raise ConfigError(key, name, f"a dataset rayfl can fetch ({', '.join(SOURCES)}); "
                                 f"{not_fetched_reason(name)}")


def not_fetched_reason(name: str) -> str:
    """Why a dataset name is not fetched."""
    if name in NOT_FETCHED:
        return NOT_FETCHED[name]
    if registry.is_builtin("dataset", name):
        return f"{name} has no download source"
    return f"{name!r} is not a built-in dataset, so rayfl knows no source for it"


def folder_for(name: str, root: Optional[str]) -> str:
    """The absolute folder a dataset is fetched into: ``root``, else its default folder."""
    return os.path.abspath(os.path.expanduser(root)) if root else default_folder(name)


def _record(folder: str) -> Optional[dict]:
    try:
        with open(os.path.join(folder, RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def state(name: str, folder: str, key: str) -> str:
    """``missing`` (absent or empty), ``fetched`` (rayfl fetched ``name`` there), ``present``
    (the files the loader reads are there, put by someone else) or ``other`` (other files)."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ConfigError(key, folder, f"a folder to fetch {name} into (it is a file)")
    try:
        if not os.path.isdir(folder) or not os.listdir(folder):
            return "missing"
    except OSError as e:
        raise ConfigError(key, folder, f"a readable folder ({e.strerror})") from None
    record = _record(folder)
    if record is not None and record.get("dataset") == name:
        return "fetched"
    if all(os.path.exists(os.path.join(folder, p)) for p in SOURCES[name].probe):
        return "present"
    return "other"


@contextlib.contextmanager
def _locked(folder: str, key: str):
    """One fetch into ``folder`` at a time: a lock file beside it, removed when the fetch ends. A
    fetch that finds the lock held says, on one line, that it waits for the other."""
    parent, base = os.path.split(folder)
    path = os.path.join(parent, f".{base}.lock")
    said = False
    while True:
        try:
            lock = open(path, "a")
        except OSError as e:
            raise disk_error(e, parent, key) or e from None
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not said:
                    _waiting(folder, path)
                    said = True
                fcntl.flock(lock, fcntl.LOCK_EX)
            if _same_file(lock, path):
                break
        except BaseException:
            lock.close()
            raise
        lock.close()  # its holder removed it meanwhile: lock the one there now
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        lock.close()


def _waiting(folder: str, lock: str) -> None:
    """Say, on one line, that this fetch waits for the one holding ``lock``."""
    print(f"rayfl: another process is fetching into {folder} (it holds {lock}); waiting for it "
          "to finish", file=sys.stderr, flush=True)


def _same_file(f, path: str) -> bool:
    """Whether the open file ``f`` is still the one at ``path``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(f.fileno())
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def fetch(name: str, root: Optional[str] = None, quiet: Optional[bool] = False,
          mirror: Optional[str] = None, key: str = "--root") -> str:
    """Fetch dataset ``name`` into ``root`` (default: its default folder) unless it is there;
    returns the line that says what happened. ``quiet``: no progress bar (None: one only on a
    terminal); ``mirror``: fetch from ``<mirror>/<file name>`` (default ``$RAYFL_DATA_MIRROR``);
    ``key``: what a refusal of the folder names."""
    source = source_of(name)
    folder = folder_for(name, root)
    mirror = _mirror(mirror)
    if root is None and installed(source):
        return (f"{name}: {source.system} already holds its files (a system package's, read by "
                "default; not fetched by rayfl, so not checked); nothing to do")
    found = state(name, folder, key)
    if found == "missing":
        made = _absent_folders(os.path.dirname(folder))
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
        except OSError as e:
            raise ConfigError(key, folder, f"a folder that can be created ({e.strerror})") \
                from None
        try:
            with _locked(folder, key):
                found = state(name, folder, key)  # another process may have fetched it meanwhile
                if found == "missing":
                    return _fetch_into(name, source, folder, mirror, quiet, key)
        except BaseException:
            for path in made:  # the folders made for it, while empty (no part kept there)
                try:
                    os.rmdir(path)
                except OSError:
                    break
            raise
    if found == "fetched":
        record = _record(folder)
        return (f"{name}: already in {folder} (fetched from {record.get('url')}, "
                f"{record.get('algorithm')} checked); nothing to do")
    if found == "present":
        return (f"{name}: {folder} already holds its files (not fetched by rayfl, so not "
                f"checked); nothing to do")
    raise ConfigError(key, folder, f"a missing or empty folder to fetch {name} into (it holds "
                                   "other files, and not the ones the loader reads)")


def installed(source: Source) -> bool:
    """Whether a system package installed the source's files (read when data.root is unset)."""
    return bool(source.system) and all(os.path.isfile(os.path.join(source.system, p))
                                       for p in source.probe)


def _absent_folders(path: str) -> list[str]:
    """The folders that ``os.makedirs(path)`` would create, deepest first."""
    absent = []
    while not os.path.exists(path) and os.path.dirname(path) != path:
        absent.append(path)
        path = os.path.dirname(path)
    return absent


def _mirror(mirror: Optional[str]) -> Optional[str]:
    """The mirror to fetch from (``mirror``, else ``$RAYFL_DATA_MIRROR``; None: the origins),
    refused unless an http(s) URL."""
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    if mirror is not None:
        try:
            parsed = urllib.parse.urlsplit(mirror)
            ok = parsed.scheme in ("http", "https") and bool(parsed.hostname)
        except ValueError:
            ok = False
        if not ok or any(c.isspace() for c in mirror):
            raise ConfigError(MIRROR_ENV, mirror, "the http:// or https:// URL of a mirror, "
                                                  "serving each file as URL/<file name>")
    return mirror


@dataclasses.dataclass(frozen=True)
class Download:
    """A checked download of one file of a source."""

    file: File
    url: str
    part: str
    expected: Expected
    size: int


def _fetch_into(name: str, source: Source, folder: str, mirror: Optional[str],
                quiet: Optional[bool], key: str) -> str:
    """Download, check and install every file of ``source`` into the missing ``folder``. A
    refusal removes what was downloaded, except after a transfer that broke (kept, to continue
    from on the next try)."""
    who = "mirror" if mirror else "server"
    downloads = []
    try:
        for file in source.files:
            url = url_of(file, mirror)
            part = _part_path(folder, file)
            expected = expected_of(file, url)
            download(url, part, expected.size, quiet, who, key)
            verify(url, part, expected)
            downloads.append(Download(file, url, part, expected, os.path.getsize(part)))
        _install(name, source, downloads, folder, key)
    except (Resumable, KeyboardInterrupt):
        raise
    except BaseException:
        for file in source.files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(_part_path(folder, file))
        raise
    first = downloads[0]
    what = first.url if len(downloads) == 1 else \
        f"{len(downloads)} files from {posixpath.dirname(first.url)}/"
    return f"{name}: fetched {what} into {folder} ({first.expected.algorithm} checked)"


def ensure(cfg: "DataConfig") -> "DataConfig":
    """The data config to load: with ``data.fetch``, its dataset fetched first when its folder
    (``data.root``, else the default folder, which becomes ``data.root``) is missing or empty;
    a dataset rayfl cannot fetch is refused with the reason; one a system package installed
    (Fashion-MNIST's Debian package) is left to it when data.root is unset. Without data.fetch,
    ``cfg`` as is."""
    if not getattr(cfg, "fetch", False):
        return cfg
    if cfg.dataset not in SOURCES:
        raise ConfigError("data.fetch", True, f"a dataset rayfl can fetch ({', '.join(SOURCES)})"
                          f", not data.dataset = {cfg.dataset!r}: "
                          f"{not_fetched_reason(cfg.dataset)}; or data.fetch: false")
    if not cfg.root and installed(SOURCES[cfg.dataset]):
        return cfg  # the system package's files, which the loader reads by default
    folder = folder_for(cfg.dataset, cfg.root)
    if state(cfg.dataset, folder, "data.root") == "missing":
        print(fetch(cfg.dataset, folder, quiet=None, key="data.root"), file=sys.stderr,
              flush=True)
    return cfg if cfg.root else dataclasses.replace(cfg, root=folder)


# ----- the download's place and installation ---------------------------------------------------

def _part_path(folder: str, file: File) -> str:
    parent, base = os.path.split(folder)
    return os.path.join(parent, f".{base}.{file.filename}.part")


def _install(name: str, source: Source, downloads: list[Download], folder: str,
             key: str) -> None:
    """Unpack the checked downloads (or, for a source without an unpacker, move them) into a
    temporary folder beside ``folder``, then rename it into place and remove the downloads. The
    temporary folder goes in any case."""
    parent, base = os.path.split(folder)
    try:
        tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    except OSError as e:
        raise disk_error(e, parent, key) or e from None
    first = downloads[0]
    try:
        try:
            if source.unpack:
                getattr(fetch_unpack, source.unpack)(first.part, tmp)
            else:
                for d in downloads:
                    os.rename(d.part, os.path.join(tmp, d.file.filename))
        except OSError as e:
            problem = disk_error(e, parent, key)
            if problem:
                raise problem from None
            raise FetchError(first.url, f"could not unpack {first.file.filename} "
                                        f"({type(e).__name__}: {e}); it was removed") from None
        except UNPACK_ERRORS as e:
            raise FetchError(first.url, f"could not unpack {first.file.filename} "
                                        f"({type(e).__name__}: {e}); it was removed") from None
        missing = [p for p in source.probe if not os.path.exists(os.path.join(tmp, p))]
        if missing:
            raise FetchError(first.url, f"expected {first.file.filename} to hold "
                                        f"{', '.join(missing)}; it was removed")
        record = {"dataset": name, **_entry(first),
                  "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        if len(downloads) > 1:
            record["more"] = [_entry(d) for d in downloads[1:]]
        try:
            with open(os.path.join(tmp, RECORD), "w") as f:
                json.dump(record, f, indent=1)
        except OSError as e:
            raise disk_error(e, parent, key) or e from None
        try:
            os.rename(tmp, folder)  # onto an absent or empty folder: atomic
        except OSError as e:
            raise FetchError(folder, f"expected a missing or empty folder to move the files "
                                     f"into ({e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for d in downloads:
        with contextlib.suppress(FileNotFoundError):
            os.remove(d.part)


def _entry(d: Download) -> dict:
    """What the record says of one download."""
    return {"url": d.url, "file": d.file.filename, "bytes": d.size,
            "algorithm": d.expected.algorithm, "digest": d.expected.digest}


# ----- the command ------------------------------------------------------------------------------

def listing() -> list[str]:
    """One line per fetchable dataset: name, size, URL and who publishes its checksum."""
    def size(s: Source) -> str:
        if any(f.size is None for f in s.files):
            return "unpublished"
        mib = sum(f.size for f in s.files) / 2**20
        return f"{mib:,.1f} MiB" if mib < 10 else f"{mib:,.0f} MiB"

    width = max(map(len, SOURCES))
    def where(s: Source) -> str:
        return s.url + (f" and {len(s.more)} more files beside it" if s.more else "")

    return [f"{name:{width}}  {size(s):>11}  {where(s)}  (checksum: {s.checksum_from})"
            for name, s in SOURCES.items()]


def parser() -> argparse.ArgumentParser:
    """The parser of ``rayfl data fetch``."""
    p = OneLineParser(
        prog="rayfl data fetch",
        description="Download a built-in dataset from its canonical URL, check its size and "
                    "checksum, and unpack it into the folder its loader reads: set data.root to "
                    "that folder (or use data.fetch: true). fmnist (Fashion-MNIST, no root "
                    "needed) is read from its default folder without data.root, unless its "
                    "Debian package is installed. An interrupted download continues where it "
                    "stopped; a dataset already there is left as is.",
        epilog=f"{MIRROR_ENV}=URL fetches every file from URL/<file name> (a mirror), with "
               "the same checks; https_proxy and http_proxy are honoured.")
    p.add_argument("name", nargs="?", metavar="NAME", help=f"the dataset: {', '.join(SOURCES)}")
    p.add_argument("--root", metavar="DIR", help="the folder to fetch into, missing or empty "
                                                 "(default: ~/.cache/rayfl-data/NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--list", action="store_true", help="list the fetchable datasets: name, "
                                                       "size, URL, checksum")
    p.set_defaults(fn=command)
    return p


def command(args) -> int:
    """Run ``rayfl data fetch`` with parsed ``args``."""
    if args.list:
        if args.name or args.root:
            raise ConfigError("--list", True, "no NAME or --root with it")
        print("\n".join(listing()))
        return 0
    if not args.name:
        raise ConfigError("NAME", None, f"a dataset to fetch ({', '.join(SOURCES)}), or --list")
    print(fetch(args.name, args.root, args.quiet))
    return 0
