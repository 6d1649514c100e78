"""The ``privacy`` keys' rules: which key belongs to which mechanism, and what DP-FTRL and banded
MF need from the rest of the run (a ConfigError naming the key and the reason)."""

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


def check_run(cfg) -> None:
    """DP-FTRL's and banded MF's keys against the run's rounds (what they need of the rest of
    the run — uniform selection, independent availability, synchronous rounds — is in
    :mod:`rayfl.compat`)."""
    p = cfg.privacy
    for key in ("bands", "restart"):
        value = getattr(p, key)
        if value is not None and value > cfg.rounds:
            raise ConfigError(f"privacy.{key}", value, f"at most rounds = {cfg.rounds}")
