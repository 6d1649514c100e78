"""``rayfl data fetch NAME``: download a built-in dataset, check it, and unpack it into the folder
its loader reads (``data.root``); ``data.fetch: true`` does the same for a run whose dataset is
missing, before the partition is built.

The download goes to ``.<folder>.<file>.part`` beside the destination folder and, interrupted,
continues from there with an HTTP Range request on the next try. It is checked (size and
checksum, see :mod:`rayfl.data.fetch_sources`) before anything is unpacked; a mismatch removes
it. The files are laid out in a temporary folder beside the destination, which is renamed into
place only when complete, holding ``.rayfl-fetch.json`` (what was fetched from where): a
destination is either absent or whole. Failures are one :class:`FetchError` line (exit 2).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import dataclasses
import datetime
import fcntl
import hashlib
import http.client
import json
import lzma
import os
import shutil
import sqlite3
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from typing import TYPE_CHECKING, Optional

from rayfl.data import fetch_unpack
from rayfl.data.fetch_sources import (MIRROR_ENV, NOT_FETCHED, SOURCES, Source, default_folder,
                                      url_of)
from rayfl.schema import ConfigError

if TYPE_CHECKING:
    from rayfl.data.config import DataConfig

RECORD = ".rayfl-fetch.json"  # in a fetched folder: what was fetched, from where, its checksum
TIMEOUT_S = 60  # per connection attempt and per read
CHUNK = 1 << 20
# what unpacking an archive of an unexpected format raises (besides OSError)
UNPACK_ERRORS = (EOFError, ValueError, KeyError, IndexError, TypeError, tarfile.TarError,
           zipfile.BadZipFile, lzma.LZMAError, sqlite3.DatabaseError, csv.Error)


class FetchError(ConfigError):
    """A dataset could not be fetched: names the URL or file and what was expected. A
    ConfigError, so every command prints it as one line and exits with status 2."""

    def __init__(self, where: str, problem: str):
        self.key, self.value, self.expected = "data.fetch", where, problem
        ValueError.__init__(self, f"{where}: {' '.join(problem.split())}")


@dataclasses.dataclass(frozen=True)
class Expected:
    """What the download must be: its size (None: unknown) and checksum."""

    size: Optional[int]
    algorithm: str
    digest: str


def source_of(name: str, key: str = "NAME") -> Source:
    """The source of a fetchable dataset, or a ConfigError on ``key`` saying why not."""
    if name in SOURCES:
        return SOURCES[name]
    raise ConfigError(key, name, f"a dataset rayfl can fetch ({', '.join(SOURCES)}); "
                                 f"{not_fetched_reason(name)}")


def not_fetched_reason(name: str) -> str:
    """Why a dataset name is not fetched."""
    from rayfl import registry

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
def _locked(folder: str):
    """One fetch into ``folder`` at a time (a lock file beside it)."""
    parent, base = os.path.split(folder)
    with open(os.path.join(parent, f".{base}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fetch(name: str, root: Optional[str] = None, quiet: Optional[bool] = False,
          mirror: Optional[str] = None, key: str = "--root") -> str:
    """Fetch dataset ``name`` into ``root`` (default: its default folder) unless it is there;
    returns the line that says what happened. ``quiet``: no progress bar (None: one only on a
    terminal); ``mirror``: fetch from ``<mirror>/<file name>`` (default ``$RAYFL_DATA_MIRROR``);
    ``key``: what a refusal of the folder names."""
    source = source_of(name)
    folder = folder_for(name, root)
    url = url_of(source, mirror)
    found = state(name, folder, key)
    if found == "missing":
        try:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
        except OSError as e:
            raise ConfigError(key, folder, f"a folder that can be created ({e.strerror})") \
                from None
        with _locked(folder):
            found = state(name, folder, key)  # another process may have fetched it meanwhile
            if found == "missing":
                expected = _expected(source, url)
                part = _part_path(folder, source)
                _download(url, part, expected.size, quiet)
                _verify(url, part, expected)
                _install(name, source, url, part, folder, expected)
                return f"{name}: fetched {url} into {folder} ({expected.algorithm} checked)"
    if found == "fetched":
        record = _record(folder)
        return (f"{name}: already in {folder} (fetched from {record.get('url')}, "
                f"{record.get('algorithm')} checked); nothing to do")
    if found == "present":
        return (f"{name}: {folder} already holds its files (not fetched by rayfl, so not "
                f"checked); nothing to do")
    raise ConfigError(key, folder, f"a missing or empty folder to fetch {name} into (it holds "
                                   "other files, and not the ones the loader reads)")


def ensure(cfg: "DataConfig") -> "DataConfig":
    """The data config to load: with ``data.fetch``, its dataset fetched first when its folder
    (``data.root``, else the default folder, which becomes ``data.root``) is missing or empty;
    a dataset rayfl cannot fetch is refused with the reason. Without it, ``cfg`` as is."""
    if not getattr(cfg, "fetch", False):
        return cfg
    if cfg.dataset not in SOURCES:
        raise ConfigError("data.fetch", True, f"a dataset rayfl can fetch ({', '.join(SOURCES)})"
                          f", not data.dataset = {cfg.dataset!r}: "
                          f"{not_fetched_reason(cfg.dataset)}; or data.fetch: false")
    folder = folder_for(cfg.dataset, cfg.root)
    if state(cfg.dataset, folder, "data.root") == "missing":
        print(fetch(cfg.dataset, folder, quiet=None, key="data.root"), file=sys.stderr,
              flush=True)
    return cfg if cfg.root else dataclasses.replace(cfg, root=folder)


# ----- the download ------------------------------------------------------------------------------

def _part_path(folder: str, source: Source) -> str:
    parent, base = os.path.split(folder)
    return os.path.join(parent, f".{base}.{source.filename}.part")


def _request(url: str, method: str = "GET", start: int = 0):
    """The server's response (None: nothing after ``start``, HTTP 416); a FetchError when there
    is none."""
    from rayfl import __version__

    headers = {"User-Agent": f"rayfl/{__version__}"}
    if start:
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and start:
            return None
        raise FetchError(url, f"could not download it (HTTP {e.code} {e.reason})") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise FetchError(url, f"could not download it ({reason}); check the network and proxy "
                              f"(https_proxy), or set {MIRROR_ENV} to a mirror") from None


def _expected(source: Source, url: str) -> Expected:
    """The published size and sha256, or (none published) the size and MD5 the server states
    (Google Cloud Storage's x-goog-hash header, asked with HEAD)."""
    if source.sha256:
        return Expected(source.size, "sha256", source.sha256)
    with _request(url, "HEAD") as response:
        length = response.headers.get("Content-Length")
        hashes = ",".join(response.headers.get_all("x-goog-hash") or [])
    md5 = next((base64.b64decode(h.strip()[4:]).hex() for h in hashes.split(",")
                if h.strip().startswith("md5=")), None)
    if md5 is None:
        raise FetchError(url, f"expected the server to state an MD5 (x-goog-hash header) to "
                              f"check {source.filename} against: none is published for it, and "
                              "this server states none")
    return Expected(int(length) if length else source.size, "md5", md5)


def _download(url: str, part: str, size: Optional[int], quiet: Optional[bool]) -> None:
    """``url`` into ``part``, continuing a partial one with a Range request; an interrupted
    transfer keeps what arrived (a FetchError saying so)."""
    from tqdm import tqdm

    have = os.path.getsize(part) if os.path.isfile(part) else 0
    if size is not None and have > size:
        os.remove(part)
        have = 0
    if size is not None and have == size:
        return  # whole from an earlier try; checked next
    response = _request(url, start=have)
    if response is None:
        return  # the server has nothing after what is here: checked next
    with response:
        if have and not (response.status == 206 and response.headers.get(
                "Content-Range", "").startswith(f"bytes {have}-")):
            have = 0  # the server sends the whole file: start over
        length = response.headers.get("Content-Length")
        total = size if size is not None else (have + int(length) if length else None)
        done = have
        with open(part, "ab" if have else "wb") as out, \
                tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                     desc=url.rsplit("/", 1)[-1],
                     file=sys.stderr, disable=quiet) as bar:
            try:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as e:
                raise _broken(url, part, done, total, f"{type(e).__name__}: {e}") from None
            except KeyboardInterrupt:
                print(f"rayfl: interrupted; the {done:,} bytes that arrived are kept in {part}: "
                      "the same command continues from there", file=sys.stderr)
                raise
    if total is not None and done < total:
        raise _broken(url, part, done, total, "the connection closed early")


def _broken(url: str, part: str, done: int, total: Optional[int], why: str) -> FetchError:
    of = f" of {total:,}" if total is not None else ""
    return FetchError(url, f"the transfer broke after {done:,}{of} bytes ({why}); they are kept "
                           f"in {part}: run the same command again to continue")


def _verify(url: str, part: str, expected: Expected) -> None:
    """The download's size and checksum, or a FetchError (the download removed)."""
    size = os.path.getsize(part)
    with open(part, "rb") as f:
        digest = hashlib.file_digest(f, expected.algorithm).hexdigest()
    if digest != expected.digest or (expected.size is not None and size != expected.size):
        os.remove(part)
        want = f" ({expected.size:,} bytes)" if expected.size is not None else ""
        raise FetchError(url, f"expected {expected.algorithm} {expected.digest}{want}, got "
                              f"{expected.algorithm} {digest} ({size:,} bytes): not the "
                              "published file, so it was removed")


def _install(name: str, source: Source, url: str, part: str, folder: str,
             expected: Expected) -> None:
    """Unpack the checked download into a temporary folder beside ``folder``, then rename it
    into place and remove the download. A download that cannot be unpacked stays (it matched
    its checksum), and the temporary folder goes."""
    parent, base = os.path.split(folder)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    try:
        try:
            getattr(fetch_unpack, source.unpack)(part, tmp)
        except (OSError, *UNPACK_ERRORS) as e:
            raise FetchError(url, f"could not unpack {source.filename} ({type(e).__name__}: "
                                  f"{e}); the checked download stays in {part}") from None
        missing = [p for p in source.probe if not os.path.exists(os.path.join(tmp, p))]
        if missing:
            raise FetchError(url, f"expected {source.filename} to hold {', '.join(missing)}; "
                                  f"the checked download stays in {part}")
        record = {"dataset": name, "url": url, "file": source.filename,
                  "bytes": os.path.getsize(part), "algorithm": expected.algorithm,
                  "digest": expected.digest,
                  "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        with open(os.path.join(tmp, RECORD), "w") as f:
            json.dump(record, f, indent=1)
        try:
            os.rename(tmp, folder)  # onto an absent or empty folder: atomic
        except OSError as e:
            raise FetchError(folder, f"expected a missing or empty folder to move the files "
                                     f"into ({e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.remove(part)


# ----- the command ------------------------------------------------------------------------------

def listing() -> list[str]:
    """One line per fetchable dataset: name, size, URL and who publishes its checksum."""
    def size(s: Source) -> str:
        if s.size is None:
            return "unpublished"
        mib = s.size / 2**20
        return f"{mib:,.1f} MiB" if mib < 10 else f"{mib:,.0f} MiB"

    width = max(map(len, SOURCES))
    return [f"{name:{width}}  {size(s):>11}  {s.url}  (checksum: {s.checksum_from})"
            for name, s in SOURCES.items()]


def parser() -> argparse.ArgumentParser:
    """The parser of ``rayfl data fetch``."""
    from rayfl.usage import OneLineParser

    p = OneLineParser(
        prog="rayfl data fetch",
        description="Download a built-in dataset from its canonical URL, check its size and "
                    "checksum, and unpack it into the folder its loader reads: set data.root to "
                    "that folder (or use data.fetch: true). An interrupted download continues "
                    "where it stopped; a dataset already there is left as is.",
        epilog=f"{MIRROR_ENV}=URL fetches every archive from URL/<file name> (a mirror), with "
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
