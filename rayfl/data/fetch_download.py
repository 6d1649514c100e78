"""Downloading one file for :mod:`rayfl.data.fetch`: an HTTP GET into a ``.part`` file,
continued with a Range request after a transfer that broke, then checked against its size and
checksum. A transfer is complete when the bytes the server announced have arrived: a complete
file that is not the published one (a short file, an error page) is removed, never continued.
An HTML page served for an archive, a full disk and a folder that may not be written are named
as such. Every failure is one :class:`FetchError` line.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from typing import Optional

from rayfl.data.fetch_sources import MIRROR_ENV, File
from rayfl.deferred import deferred
from rayfl.schema import ConfigError
from rayfl.version import __version__

tqdm = deferred("tqdm")

TIMEOUT_S = 60  # per connection attempt and per read
CHUNK = 1 << 20  # the most bytes one read returns (it returns what has arrived)


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


def disk_error(e: OSError, folder: str, key: str) -> Optional[FetchError]:
    """A full disk or a folder rayfl may not write in, named as such; None for another error."""
    elsewhere = f"or fetch elsewhere with {key} DIR"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return FetchError(folder, f"no space left on the device ({errno.errorcode[e.errno]}: "
                                  f"{e.strerror}); nothing was kept: free some space, "
                                  f"{elsewhere}, and run the same command again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return FetchError(folder, f"a folder rayfl may write in, and it may not "
                                  f"({errno.errorcode[e.errno]}: {e.strerror}); nothing was "
                                  f"kept: make it writable, {elsewhere}")
    return None


class Resumable(FetchError):
    """A transfer that broke, or a server that could not be reached: what arrived is kept."""


def _request(url: str, method: str = "GET", start: int = 0):
    """The server's response (None: nothing after ``start``, HTTP 416); a FetchError when there
    is none."""
    headers = {"User-Agent": f"rayfl/{__version__}"}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        request = urllib.request.Request(url, headers=headers, method=method)
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and start:
            return None
        raise FetchError(url, f"could not download it (HTTP {e.code} {e.reason})") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise Resumable(url, f"could not download it ({reason}); check the network and proxy "
                             f"(https_proxy), or set {MIRROR_ENV} to a mirror") from None
    except ValueError as e:
        raise FetchError(url, f"a URL that can be fetched ({e})") from None


def expected_of(file: File, url: str) -> Expected:
    """The published size and sha256, or (none published) the size and MD5 the server states
    (Google Cloud Storage's x-goog-hash header, asked with HEAD)."""
    if file.sha256:
        return Expected(file.size, "sha256", file.sha256)
    with _request(url, "HEAD") as response:
        length = response.headers.get("Content-Length")
        hashes = ",".join(response.headers.get_all("x-goog-hash") or [])
    md5 = next((base64.b64decode(h.strip()[4:]).hex() for h in hashes.split(",")
                if h.strip().startswith("md5=")), None)
    if md5 is None:
        raise FetchError(url, f"expected the server to state an MD5 (x-goog-hash header) to "
                              f"check {file.filename} against: none is published for it, and "
                              "this server states none")
    return Expected(int(length) if length and length.isdigit() else file.size, "md5", md5)


def _html(url: str, who: str) -> FetchError:
    return FetchError(url, f"the {who} served an HTML page, not the archive (an error or sign-in "
                           "page, most likely); check the URL" +
                           (f" and {MIRROR_ENV}" if who == "mirror" else ""))


def _looks_html(content_type: Optional[str], first: bytes) -> bool:
    """Whether a response is an HTML page: by its Content-Type, or by its first bytes."""
    if (content_type or "").split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml"):
        return True
    return first.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))


def _write(out, chunk: bytes) -> None:
    """All of ``chunk`` into the unbuffered file ``out``."""
    view = memoryview(chunk)
    while view:
        view = view[out.write(view):]


def download(url: str, part: str, size: Optional[int], quiet: Optional[bool], who: str,
              key: str) -> None:
    """``url`` into ``part``, continuing a partial one with a Range request. A transfer that
    ends before the bytes the server announced keeps what arrived (a Resumable saying so); one
    that completes is checked next. An HTML page, a full disk or a folder that may not be
    written is a FetchError naming it."""
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
        if _looks_html(response.headers.get("Content-Type"), b""):
            raise _html(url, who)
        length = response.headers.get("Content-Length")
        end = have + int(length) if length and length.isdigit() else None
        total = size if size is not None else end
        try:
            out = open(part, "ab" if have else "wb", buffering=0)
        except OSError as e:
            raise disk_error(e, os.path.dirname(part), key) or e from None
        with out, tqdm.tqdm(total=total, initial=have, unit="B", unit_scale=True,
                            unit_divisor=1024, desc=url.rsplit("/", 1)[-1], file=sys.stderr,
                            disable=quiet) as bar:
            done = have
            try:
                while True:
                    try:
                        chunk = response.read1(CHUNK)
                    except (OSError, http.client.HTTPException) as e:
                        raise _broken(url, part, total, f"{type(e).__name__}: {e}") from None
                    if not chunk:
                        break
                    if done == 0 and _looks_html(None, chunk):
                        raise _html(url, who)
                    try:
                        _write(out, chunk)
                    except OSError as e:
                        raise disk_error(e, os.path.dirname(part), key) or e from None
                    done += len(chunk)
                    bar.update(len(chunk))
            except KeyboardInterrupt:
                print(f"rayfl: interrupted; the {os.path.getsize(part):,} bytes that arrived are "
                      f"kept in {part}: the same command continues from there", file=sys.stderr)
                raise
    if end is not None and done < end:
        raise _broken(url, part, total, "the connection closed early")


def _broken(url: str, part: str, total: Optional[int], why: str) -> Resumable:
    of = f" of {total:,}" if total is not None else ""
    return Resumable(url, f"the transfer broke after {os.path.getsize(part):,}{of} bytes "
                          f"({why}); they are kept in {part}: run the same command again to "
                          "continue")


def verify(url: str, part: str, expected: Expected) -> None:
    """The complete download's size and checksum, or a FetchError (the download removed)."""
    size = os.path.getsize(part)
    with open(part, "rb") as f:
        digest = hashlib.file_digest(f, expected.algorithm).hexdigest()
    if digest != expected.digest or (expected.size is not None and size != expected.size):
        os.remove(part)
        want = f" ({expected.size:,} bytes)" if expected.size is not None else ""
        raise FetchError(url, f"the transfer completed, but not with the published file: "
                              f"expected {expected.algorithm} {expected.digest}{want}, got "
                              f"{expected.algorithm} {digest} ({size:,} bytes); it was removed")
