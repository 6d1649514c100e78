"""A user's server optimiser registers like any component: an optax-shaped init/update pair,
named by ``server_opt.name`` (a package.module:Name reference or a registered name)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import rayfl
from rayfl import cli
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.schema import field
from tests.conftest import TINY

RUN = ["rounds=3", "runtime.executor=inprocess", "algorithm.name=scaffold"]


def my_adam(section, lr):
    """Adam as Reddi et al. write it (u = −D, no bias correction), from the section's keys."""
    b1, b2, tau = section.beta1, section.beta2, section.tau
    v0 = tau**2 if section.v_init is None else section.v_init

    def init(x):
        return {"m": torch.zeros_like(x), "v": torch.full_like(x, v0)}

    def update(d, state):
        u = -d
        u2 = u * u  # u², then the paper's convex combination
        m = b1 * state["m"] + (1 - b1) * u
        v = b2 * state["v"] + (1 - b2) * u2
        return -(lr * m / (v.sqrt() + tau)), {"m": m, "v": v}, {}

    return ServerOpt(init, update, adaptive=True)


@dataclass(frozen=True)
class SignParams:
    gain: float = field(1.0, doc="multiplies the sign step", lo=0.0)


def sign_sgd(section, lr):
    """x ← x − lr · gain · sign(D): a key of its own (``server_opt.gain``)."""
    gain = section.params.gain
    return ServerOpt(lambda x: {}, lambda d, s: (lr * gain * torch.sign(d), {}, {}))


sign_sgd.Params = SignParams


def not_an_optimiser(section, lr):
    return "adam"


def _sha(tiny, *overrides):
    return rayfl.run(TINY, tiny + RUN + list(overrides), quiet=True).summary["model_sha256"]


def test_a_user_adam_written_from_the_paper_gives_the_built_in_adams_bytes(tiny):
    builtin = _sha(tiny, "server_opt.name=adam", "server_opt.lr=0.05")
    mine = _sha(tiny, "server_opt.name=tests.test_server_opt_component:my_adam",
                "server_opt.lr=0.05")
    assert mine == builtin
    assert mine != _sha(tiny)  # and it is not plain SGD


def test_a_registered_optimiser_with_keys_of_its_own(tiny):
    rayfl.register_server_opt(sign_sgd, name="sign_sgd")
    try:
        one = _sha(tiny, "server_opt.name=sign_sgd", "server_opt.gain=1.0")
        two = _sha(tiny, "server_opt.name=sign_sgd", "server_opt.gain=2.0")
        assert one != two != _sha(tiny)
    finally:
        rayfl.registry.unregister("server_opt", "sign_sgd")


def test_an_optimiser_breaking_its_contract_is_one_line_and_nothing_is_written(tmp_path,
                                                                                capsys):
    code = cli.main(["run", TINY, *RUN, f"output_dir={tmp_path / 'runs'}",
                     "server_opt.name=tests.test_server_opt_component:not_an_optimiser"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "not_an_optimiser" in err[0] and "not a ServerOpt" in err[0]
    assert not (tmp_path / "runs").exists()


def test_an_unknown_key_for_the_chosen_optimiser_is_refused(tiny):
    with pytest.raises(rayfl.ConfigError) as e:
        rayfl.load_config(TINY, ["algorithm.name=scaffold",
                                 "server_opt.name=tests.test_server_opt_component:my_adam",
                                 "server_opt.gain=2.0"])
    assert e.value.key == "server_opt.gain"
