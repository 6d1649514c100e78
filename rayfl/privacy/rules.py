"""The ``privacy`` keys' rules: which key belongs to which mechanism, and the keys a client half
sent (a ConfigError naming the key and the reason); what the mechanisms need of the rest of the
run is in :mod:`rayfl.compat`'s table."""

from __future__ import annotations

from rayfl.schema import ConfigError

#: keys that only some mechanisms read -> those mechanisms
OWN_KEYS = {"min_separation": ("dp_ftrl", "banded_mf"),
            "max_participations": ("dp_ftrl", "banded_mf"),
            "bands": ("banded_mf",), "band_coefficients": ("banded_mf",),
            "restart": ("dp_ftrl",), "honaker": ("dp_ftrl",)}


def check_section(p, prefix: str) -> None:
    """Rules inside the ``privacy`` section."""
    for key, owners in OWN_KEYS.items():
        value = getattr(p, key)
        if p.mechanism not in owners and value not in (None, False):
            raise ConfigError(f"{prefix}.{key}", value,
                              f"{'false' if key == 'honaker' else 'null'} with {prefix}."
                              f"mechanism {p.mechanism} (the key configures "
                              f"{' and '.join(owners)})")
    if p.mechanism == "dp_fedavg":
        if p.accountant == "pld" and p.sampling != "poisson":
            raise ConfigError(f"{prefix}.accountant", p.accountant,
                              "rdp with sampling: fixed (dp-accounting's PLD accountant models "
                              "Poisson sampling only)")
        return
    if p.sampling != "fixed":
        raise ConfigError(f"{prefix}.sampling", p.sampling,
                          f"fixed with {prefix}.mechanism {p.mechanism} (its guarantee takes no "
                          "amplification from sampling: each round takes clients_per_round of "
                          "the eligible online clients)")
    if p.adaptive_clip is not None:
        raise ConfigError(f"{prefix}.adaptive_clip", "(set)",
                          f"null with {prefix}.mechanism {p.mechanism} (its noise is shared "
                          "across rounds and calibrated to one clip norm; a moving clip norm "
                          "changes the sensitivity of releases that share noise)")
    if p.mechanism == "banded_mf":
        if p.bands is None and p.min_separation is None:
            raise ConfigError(f"{prefix}.bands", None,
                              f"an integer ≥ 1 with {prefix}.mechanism banded_mf (or set "
                              f"{prefix}.min_separation)")
        if p.bands is not None and p.min_separation is not None and \
                p.bands > p.min_separation:
            raise ConfigError(f"{prefix}.bands", p.bands,
                              f"at most {prefix}.min_separation = {p.min_separation} "
                              "(participations at least bands rounds apart keep a client's "
                              "columns of C disjoint: the sensitivity ε is computed from)")


#: keys that describe a private run but do not make one
DESCRIBING = ("public_reports", "audit_canaries")


def check_given(raw) -> None:
    """A ``privacy`` section as written that sets only keys describing a private run would
    switch DP on with the default noise and clip norm: refused, saying what makes a run
    private."""
    if isinstance(raw, dict) and raw and set(raw) <= set(DESCRIBING):
        raise ConfigError(f"privacy.{next(iter(raw))}", next(iter(raw.values())),
                          "a privacy section that also sets its noise (privacy.noise_multiplier "
                          "and privacy.clip_norm): public_reports and audit_canaries describe a "
                          "private run, they do not make one")


def check_sent(p, sent: set[str], uploaded=()) -> None:
    """Every key declared public is one a client half sent in the pre-flight's round (a name
    nothing sends would label ε as excluding a report that does not exist), and none is an
    Upload entry (``uploaded``: noised with the update, inside the account)."""
    inside = [key for key in p.public_reports if key in uploaded]
    if inside:
        raise ConfigError("privacy.public_reports", p.public_reports,
                          f"keys a client half sends beside the update; "
                          f"{', '.join(map(repr, inside))} is sent as an Upload entry, clipped "
                          "and noised with the update inside the account")
    unsent = [key for key in p.public_reports if key not in sent]
    if unsent:
        raise ConfigError("privacy.public_reports", p.public_reports,
                          f"keys a client half sends beside the update; nothing sent "
                          f"{', '.join(map(repr, unsent))} (sent: "
                          f"{', '.join(map(repr, sorted(sent))) or 'nothing'})")
