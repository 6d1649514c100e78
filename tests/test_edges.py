"""Option combinations at the edges (issue 12), each against an independent reference.

The local loop against ``torch.optim.SGD`` / ``torch.optim.Adam`` with ``clip_grad_norm_`` (plain
model, then every algorithm's correction added to ``.grad`` by hand from its paper's formula),
the refused combinations (exit 2), fedmsi's degree weighting, IMA around every algorithm it
accepts (a hand-rolled "inner with x replaced by the window mean" loop), the IMA moment reset
and the AdaBest 1 % config.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rayfl import config
import rayfl
from rayfl.algorithms import registry
from rayfl.algorithms.base import PLAIN_SGD, ClientTask
from rayfl.algorithms.feddyn import FedDyn
from rayfl.algorithms.fedmsi import dense_graph, orient
from rayfl.algorithms.ima import IMA, IMAParams
from rayfl.assemble import stack as build
from rayfl.cli import main
from rayfl.compare import variant
from rayfl.layers import Facts, Stack
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec, batch_schedule, train_client
from rayfl.schema import ConfigError
from tests.conftest import ROOT, TINY
from tests.core_helpers import FixedTraining

F64 = torch.float64

# ----- a plain model: softmax regression on a flat parameter vector -----------------------------
FEATURES, CLASSES, SAMPLES, BATCH, STEPS = 4, 3, 30, 8, 20
_gen = torch.Generator().manual_seed(0)
INPUTS = torch.randn(SAMPLES, FEATURES, generator=_gen, dtype=F64)
LABELS = torch.randint(0, CLASSES, (SAMPLES,), generator=_gen)
DIM = CLASSES * FEATURES + CLASSES
Y0 = 0.3 * torch.randn(DIM, generator=_gen, dtype=F64)


def loss_at(vec: torch.Tensor, idx) -> torch.Tensor:
    w, b = vec[:CLASSES * FEATURES].view(CLASSES, FEATURES), vec[CLASSES * FEATURES:]
    idx = torch.as_tensor(np.asarray(idx))
    return torch.nn.functional.cross_entropy(INPUTS[idx] @ w.T + b, LABELS[idx])


def grad_fn(point: torch.Tensor, idx):
    p = point.detach().clone().requires_grad_(True)
    loss = loss_at(p, idx)
    (g,) = torch.autograd.grad(loss, p)
    return loss.detach(), g


def batches(spec: LocalSpec, seed: int = 5) -> list[np.ndarray]:
    return list(batch_schedule(SAMPLES, spec, np.random.default_rng(seed), None))


def rayfl_loop(rule, spec: LocalSpec, lr: float) -> torch.Tensor:
    y, steps, _ = train_client(rule, Y0, grad_fn, SAMPLES, spec, lr, np.random.default_rng(5))
    assert steps == STEPS
    return y


def torch_optimizer(param, spec: LocalSpec, lr: float, wd: float):
    if spec.optimizer == "adam":
        return torch.optim.Adam([param], lr=lr, weight_decay=wd)
    return torch.optim.SGD([param], lr=lr, momentum=spec.momentum, weight_decay=wd)


# ----- 1. the local optimiser is torch's ---------------------------------------------------------
@pytest.mark.parametrize("optimizer, momentum, wd, clip, lr", [
    ("sgd", 0.9, 0.5, 0.5, 0.1), ("sgd", 0.0, 0.5, 0.5, 0.1), ("sgd", 0.9, 0.0, None, 0.1),
    ("adam", 0.0, 0.5, 0.5, 0.05), ("adam", 0.0, 0.0, None, 0.05)])
def test_plain_model_matches_torch_optimizer_with_clip_grad_norm(optimizer, momentum, wd, clip,
                                                                 lr):
    spec = LocalSpec(steps=STEPS, batch_size=BATCH, momentum=momentum, weight_decay=wd,
                     clip_norm=clip, optimizer=optimizer)
    param = torch.nn.Parameter(Y0.clone())
    opt = torch_optimizer(param, spec, lr, wd)
    clipped = []
    for idx in batches(spec):
        opt.zero_grad()
        loss_at(param, idx).backward()
        if clip is not None:
            clipped.append(float(torch.nn.utils.clip_grad_norm_([param], clip)) > clip)
        opt.step()
    assert clip is None or any(clipped)
    y = rayfl_loop(PLAIN_SGD, spec, lr)
    assert torch.allclose(y, param.detach(), rtol=0, atol=1e-9)


def test_clip_epsilon_is_torchs():
    """A gradient of norm exactly clip_norm is scaled by c/(c + 1e-6), as clip_grad_norm_ does."""
    g = torch.tensor([0.6, 0.8], dtype=F64)  # ‖g‖ = 1

    def fixed_grad(point, idx):
        return torch.zeros((), dtype=F64), g.clone()

    spec = LocalSpec(steps=1, batch_size=1, clip_norm=1.0)
    y, _, _ = train_client(PLAIN_SGD, torch.zeros(2, dtype=F64), fixed_grad, 1, spec, 1.0,
                           np.random.default_rng(0))
    param = torch.nn.Parameter(torch.zeros(2, dtype=F64))
    param.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([param], 1.0)
    assert torch.allclose(y, -param.grad, rtol=0, atol=1e-15)
    assert float(y.norm()) == pytest.approx(1 / (1 + 1e-6), abs=1e-15)


# Each algorithm's local step written from its paper (correction added to .grad after clipping):
# returns (algorithm, broadcast, client state, grad point p ↦ q, correction p ↦ c, grad scale)
X_T = 0.1 * torch.arange(DIM, dtype=F64) / DIM
VEC_A = 0.7 * torch.cos(torch.arange(DIM, dtype=F64))
VEC_B = 0.5 * torch.sin(torch.arange(DIM, dtype=F64))


def _case(name: str):
    cls = registry.get(name)
    if name == "scaffold":  # g − c_i + c
        return (cls(), {"x": X_T, "c": VEC_A}, {"c": VEC_B}, None, lambda p: VEC_A - VEC_B, 1.0)
    if name == "feddyn":  # g − ĝ_i + α (y − x_t)
        algo = cls(cls.Params(alpha=0.3))
        return algo, {"x": X_T}, {"g_hat": VEC_A}, None, lambda p: -VEC_A + 0.3 * (p - X_T), 1.0
    if name == "fedspeed":  # ρ = 0: FedDyn's g − ĝ_i + (1/λ)(y − x_t)
        algo = cls(cls.Params(rho=0.0, lam=1 / 0.3))
        return algo, {"x": X_T}, {"g_hat": VEC_A}, None, lambda p: -VEC_A + 0.3 * (p - X_T), 1.0
    if name == "fedprox":  # g + μ (y − x_t)
        return cls(cls.Params(mu=0.4)), {"x": X_T}, None, None, lambda p: 0.4 * (p - X_T), 1.0
    if name == "adabest":  # g − μ h_i
        algo = cls(cls.Params(mu=0.5))
        state = {"h": VEC_A, "t_last": torch.tensor([0.0], dtype=F64)}
        return algo, {"x": X_T}, state, None, lambda p: -0.5 * VEC_A, 1.0
    if name == "fedmim":  # (1 − Σα) g(y − m_β) + m_α/η_l
        algo = cls(cls.Params(alpha=[0.6, 0.3], beta=[0.9, 0.1]))
        bc = {"x": X_T, "mim_ma": 0.01 * VEC_A, "mim_mb": 0.02 * VEC_B}
        return algo, bc, None, lambda p: p - 0.02 * VEC_B, lambda p: 0.01 * VEC_A / LR, 0.1
    if name == "fedmsi":  # g(β y + (1 − β) u_i), u_i = A-weighted mean of last round's models
        algo = cls(cls.Params(beta=0.7))
        prev = torch.stack([VEC_A, VEC_B])
        bc = {"x": X_T, "msi_prev": prev, "msi_row": torch.tensor([3, 3]),
              "msi_col_idx": torch.tensor([0, 1]), "msi_w": torch.tensor([1.0, 3.0], dtype=F64)}
        u = (VEC_A + 3 * VEC_B) / 4
        return algo, bc, None, lambda p: 0.7 * p + 0.3 * u, lambda p: 0.0, 1.0
    algo = cls()  # plain local training
    return algo, algo.broadcast(X_T, algo.server_init(X_T), 0), None, None, lambda p: 0.0, 1.0


def rule_of(algo, task):
    """The local rule an algorithm's client_train trains under (its fast flat-vector path),
    or plain SGD for a client procedure whose local steps add no correction here."""
    if isinstance(algo, FedDyn):  # FedDyn's and FedSpeed's own
        return algo.rule(task)
    if algo.name not in CORRECTED:
        return PLAIN_SGD
    ctx = FixedTraining(task.bc["x"], task.bc["x"], STEPS, task.lr)
    algo.client_train(task, ctx)
    return ctx.rule


#: the algorithms whose local step _case writes a correction for
CORRECTED = {"scaffold", "feddyn", "fedspeed", "fedprox", "adabest", "fedmim", "fedmsi"}


LR = 0.05
SGD_ONLY = {"scaffold", "fednova", "adabest", "fedmim"}
NO_MOMENTUM = {"fedmim"}
PLAIN_STEPS = {"pfedme"}  # its own plain steps: every local optimiser setting is refused
ACCEPTED_LOCAL = [(name, opt, rho) for name in registry.names()
                  for opt, rho in [("sgd", 0.0), ("sgd", 0.9), ("adam", 0.0)]
                  if name not in PLAIN_STEPS
                  and not (opt == "adam" and name in SGD_ONLY)
                  and not (rho and name in NO_MOMENTUM)]


@pytest.mark.parametrize("name, optimizer, momentum", ACCEPTED_LOCAL)
def test_every_accepted_local_optimiser_is_torch_with_the_papers_correction(name, optimizer,
                                                                            momentum):
    """Clip 0.05 is far below every correction here, so clipping it too would fail loudly."""
    algo, bc, cstate, point, correction, scale = _case(name)
    wd, clip = 0.2, 0.05
    spec = LocalSpec(steps=STEPS, batch_size=BATCH, momentum=momentum, weight_decay=wd,
                     clip_norm=clip, optimizer=optimizer)
    param = torch.nn.Parameter(Y0.clone())
    opt = torch_optimizer(param, spec, LR, wd * scale)
    for idx in batches(spec):
        p = param.detach()
        _, g = grad_fn(p if point is None else point(p), idx)
        param.grad = g
        torch.nn.utils.clip_grad_norm_([param], clip)
        param.grad = scale * param.grad + correction(p)
        opt.step()
    y = rayfl_loop(rule_of(algo, ClientTask(3, 1, LR, 1.0, bc, cstate)), spec, LR)
    assert torch.allclose(y, param.detach(), rtol=0, atol=1e-9)
    cfg = config.load(TINY, [f"algorithm.name={name}", f"local.optimizer={optimizer}",
                             f"local.momentum={momentum}", f"local.clip_norm={clip}"])
    assert cfg.local.optimizer == optimizer


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.name=fedmim", "local.optimizer=adam"], "local.optimizer"),
    (["algorithm.name=scaffold", "local.optimizer=adam"], "local.optimizer"),
    (["algorithm.name=fednova", "local.optimizer=adam"], "local.optimizer"),
    (["algorithm.name=adabest", "local.optimizer=adam"], "local.optimizer"),
    (["local.optimizer=adam", "local.momentum=0.9"], "local.momentum"),
    (["algorithm.name=fedmim", "local.momentum=0.5"], "local.momentum"),
    (["algorithm.name=pfedme", "local.momentum=0.5"], "local.momentum"),
    (["algorithm.name=pfedme", "local.optimizer=adam"], "local.optimizer"),
    (["algorithm.name=pfedme", "local.weight_decay=0.001"], "local.weight_decay"),
    (["algorithm.name=pfedme", "local.clip_norm=10"], "local.clip_norm")])
def test_unfaithful_local_optimisers_are_refused(overrides, key):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, overrides)
    assert err.value.key == key


def test_cli_refuses_fedmim_with_adam_with_exit_2_and_writes_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["run", TINY, "algorithm.name=fedmim", "local.optimizer=adam",
                 f"output_dir={runs}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "local.optimizer" in err[0] and "fedmim" in err[0]
    assert not runs.exists()


# ----- 2. degree weighting only where it is defined ----------------------------------------------
@pytest.mark.parametrize("name", registry.names())
def test_degree_weighting_only_for_fedmsi(name):
    overrides = [f"algorithm.name={name}", "aggregation.weighting=degree"]
    if name == "fedmsi":
        assert build(config.load(TINY, overrides), num_clients=20).algorithm.weighting == \
            "degree"
        return
    with pytest.raises(ConfigError) as err:
        config.load(TINY, overrides)
    assert err.value.key == "aggregation.weighting" and "fedmsi" in err.value.expected


def test_cli_refuses_fedavg_with_degree_with_exit_2(tmp_path, capsys):
    code = main(["run", TINY, "aggregation.weighting=degree", f"output_dir={tmp_path / 'r'}"])
    assert code == 2 and "aggregation.weighting" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("weighting", ["auto", "samples", "uniform"])
def test_every_algorithm_weights_as_configured(name, weighting):
    """p_i ∝ n_i (samples), 1 (uniform); auto is the paper's (checked on fedmsi's graph below)."""
    algo = build(config.load(TINY, [f"algorithm.name={name}",
                                    f"aggregation.weighting={weighting}"]), num_clients=3).algorithm
    resolved = registry.get(name).traits.weighting if weighting == "auto" else weighting
    assert algo.weighting == resolved
    if resolved == "degree":
        return
    weights = algo.aggregation_weights(algo.server_init(QX0), [2, 0], [500, 7])
    assert weights == ([500.0, 7.0] if resolved == "samples" else [1.0, 1.0])


# ----- 3. fedmsi's auto weighting is its paper's degree weighting --------------------------------
def test_fedmsi_auto_weights_by_similarity_degree():
    algo = build(config.load(TINY, ["algorithm.name=fedmsi"]), num_clients=3).algorithm
    assert algo.weighting == "degree"
    m = torch.tensor([[1.0, 0.0, 0.2], [0.6, 0.8, 0.0], [0.1, 0.1, 1.0]], dtype=F64)
    state = algo.server_setup(algo.server_init(torch.zeros(2, dtype=F64)), [0, 1, 2], m)
    degree = dense_graph(orient(m)).sum(1)
    weights = algo.aggregation_weights(state, [2, 0], [500, 7])
    assert weights == pytest.approx([float(degree[2]), float(degree[0])], rel=1e-12)


@pytest.mark.parametrize("base_weighting, entry, expected", [
    ("auto", "fedmsi", "degree"), ("auto", "fedavg", "samples"), ("auto", "adabest", "uniform"),
    ("samples", "fedmsi", "samples"), ("degree", "fedmsi", "degree"),
    ("degree", "fedavg", "samples"), ("degree", "fedmim", "uniform")])
def test_compare_gives_fedmsi_its_papers_weighting(base_weighting, entry, expected):
    base = config.to_dict(config.load(TINY, ["algorithm.name=fedmsi",
                                             f"aggregation.weighting={base_weighting}"]))
    cfg = config.from_dict(variant(base, entry))
    assert build(cfg, num_clients=20).algorithm.weighting == expected


# ----- 4. IMA: what it averages and deploys, or a config error -----------------------------------
@pytest.mark.parametrize("name", ["adabest", "fedeve", "fedmim"])
def test_ima_refused_around_algorithms_it_cannot_wrap(name):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, [f"algorithm.name={name}", "wrappers.ima.window=3"])
    assert err.value.key == "wrappers[0].name" and name in err.value.expected


N_CLIENTS, QD = 5, 6
_q = torch.Generator().manual_seed(3)
QUAD = [quadratic_client(0.5 + 2 * torch.rand(QD, generator=_q, dtype=F64),
                         3 * torch.randn(QD, generator=_q, dtype=F64), n=10 + 7 * i)
        for i in range(N_CLIENTS)]
QX0 = torch.linspace(-1.0, 1.0, QD, dtype=F64)
QSPEC = LocalSpec(steps=4, momentum=0.5)
ROUNDS, T_S, P, LR0, AFTER = 8, 3, 3, 0.05, 0.9
SUMMARIES = orient(torch.rand(N_CLIENTS, 4, generator=torch.Generator().manual_seed(1),
                              dtype=F64))


def _sample(t):
    return np.random.default_rng([11, t]).choice(N_CLIENTS, size=3, replace=False).tolist()


def _inner(name):
    cls = registry.get(name)
    weighting = "degree" if name == "fedmsi" else "samples"
    return cls(weighting=weighting, num_clients=N_CLIENTS, local_momentum=QSPEC.momentum)


def _init(algo, wrappers=()):
    """(stack, fresh state) of ``algo`` inside ``wrappers``, its set-up done."""
    stack = Stack(algo, algo.default_server_opt(), list(wrappers))
    state = stack.init(QX0)
    if algo.traits.has("setup"):
        own = algo.server_setup(state.algorithm, list(range(N_CLIENTS)), SUMMARIES)
        state = dataclasses.replace(state, algorithm=own)
    return stack, state


def _round(algo, state, t, lr0, wrappers=()):
    state, _, _ = simulate(algo, QX0, QUAD, QSPEC, rounds=1, lr0=lr0, state=state,
                           sample=_sample, start_round=t, wrappers=wrappers)
    return state


def _lr(t):
    return LR0 if t < T_S else LR0 * AFTER ** (t - T_S)


def _ima(inner):
    return IMA(IMAParams(window=P, start=T_S, decay_after=AFTER),
               Facts(rounds=ROUNDS, adaptive_server_opt=inner.default_server_opt().adaptive))


def _assert_close(a, b, where):
    """Every floating-point tensor of two slots agrees."""
    if isinstance(a, torch.Tensor) and a.is_floating_point():
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_close(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedprox", "scaffold", "feddyn",
                                  "fednova", "fedmsi"])
def test_ima_replaces_the_inners_model_by_the_mean_of_its_last_outputs(name):
    """By hand: the inner algorithm alone, its x replaced by the mean of its last P outputs from
    t_s on (the rest of its server state untouched), clients from that mean."""
    config.load(TINY, [f"algorithm.name={name}", "wrappers.ima.window=3"])  # accepted
    inner, outs = _inner(name), []
    ref_stack, ref = _init(inner)
    algo = _inner(name)
    wrapper = _ima(algo)
    stack, state = _init(algo, [wrapper])
    for t in range(ROUNDS):
        assert torch.allclose(stack.start(state, t), ref_stack.start(ref, t), rtol=1e-12,
                              atol=1e-12)
        ref = _round(inner, ref, t, _lr(t))
        outs.append(ref.x)
        if t >= T_S:
            ref = dataclasses.replace(ref, x=torch.stack(outs[-P:]).mean(0))
        state = _round(algo, state, t, LR0, [wrapper])
        assert torch.allclose(state.x, ref.x, rtol=1e-12, atol=1e-12), t
        _assert_close(state.algorithm, ref.algorithm, f"round {t}")
        _assert_close(state.server_opt, ref.server_opt, f"round {t}")
        assert torch.allclose(stack.deployed(state), ref.x, rtol=1e-12, atol=1e-12)


def _server_step(name, p, x, u, m, v):
    """Reddi et al.'s Algorithm 2 on the ascent direction u (no bias correction)."""
    m = p.beta1 * m + (1 - p.beta1) * u
    if name == "fedadam":
        v = p.beta2 * v + (1 - p.beta2) * u * u
    elif name == "fedyogi":
        v = v - (1 - p.beta2) * u * u * torch.sign(v - u * u)
    else:
        v = v + u * u
    return x + p.server_lr * m / (v.sqrt() + p.tau), m, v


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_ima_around_fedopt_averages_targets_and_restarts_moments_at_zero(name):
    """The authors' code: the window holds the client averages (FedAvg's output from x_t); from
    t_s the server optimiser steps toward their mean with m = v = 0 at t_s (not v = τ²)."""
    inner = _inner(name)
    wrapper = _ima(inner)
    assert wrapper.average == "target"
    p = inner.p
    _, state = _init(inner, [wrapper])
    x, m, v = QX0.clone(), torch.zeros(QD, dtype=F64), torch.full((QD,), p.tau**2, dtype=F64)
    targets = []
    for t in range(ROUNDS):
        fedavg = registry.get("fedavg")(weighting="samples")
        targets.append(simulate(fedavg, x, QUAD, QSPEC, rounds=1, lr0=_lr(t), sample=_sample,
                                start_round=t)[0].x)  # one FedAvg round from x
        if t == T_S:
            m, v = torch.zeros_like(m), torch.zeros_like(v)
        goal = torch.stack(targets[-P:]).mean(0) if t >= T_S else targets[-1]
        x, m, v = _server_step(name, p, x, goal - x, m, v)
        state = _round(inner, state, t, LR0, [wrapper])
        assert torch.allclose(state.x, x, rtol=1e-11, atol=1e-12), t
        assert torch.allclose(state.server_opt["v"], v, rtol=1e-11, atol=1e-15), t


def test_ima_around_adabest_or_fedeve_would_not_deploy_or_send_the_mean():
    """Why those two are refused: AdaBest deploys x̄ (not the averaged x); FedEve's clients start
    from the averaged x moved by −η_g M."""
    for name, probe in [("adabest", lambda st, s: st.deployed(s)),
                        ("fedeve", lambda st, s: st.start(s, ROUNDS))]:
        inner = _inner(name)
        wrapper = _ima(inner)
        stack, state = _init(inner, [wrapper])
        for t in range(ROUNDS):
            state = _round(inner, state, t, LR0, [wrapper])
        assert (probe(stack, state) - state.x).norm() > 1e-3


# ----- 6. the reset itself ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_starts_at_v_init_and_resets_to_zero(name):
    algo = registry.get(name)()
    _, state = _init(algo)
    assert torch.all(state.server_opt["v"] == algo.p.tau**2)
    assert torch.all(state.server_opt["m"] == 0)
    reset = algo.default_server_opt().restart(state.x)
    assert torch.all(reset["v"] == 0) and torch.all(reset["m"] == 0)


# ----- 5. AdaBest at 1 % participation -----------------------------------------------------------
def test_adabest_cifar100_uses_the_papers_one_percent_beta_grid():
    cfg = config.load(f"{ROOT}/configs/papers/adabest_cifar100.yaml")
    train_clients = cfg.data.num_clients - cfg.data.validation_clients
    assert cfg.clients_per_round / train_clients == pytest.approx(0.01)
    assert cfg.algorithm.params.beta in (0.2, 0.4, 0.6)


# ----- 4. privacy and the event-driven modes: run where the math allows, refused otherwise ------
MODES = {"privacy": ["privacy.noise_multiplier=0.5", "aggregation.weighting=uniform"],
         "aggregation.mode": ["aggregation.mode=fedbuff", "aggregation.concurrency=6",
                              "aggregation.buffer_size=3"]}


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_algorithm_runs_privately_or_asynchronously_or_is_refused(name, mode, tiny):
    """The flags the config check reads (dp_post_processing, asynchronous_ok) decide: an
    accepted combination trains two rounds to finite numbers, a refused one names the key."""
    cls = registry.get(name)
    accepted = cls.traits.dp_post_processing if mode == "privacy" else \
        cls.traits.asynchronous is None
    model = {"lgfedavg": ["model.name=mlp"],
             "fedbn": ["model.name=examples.bn_model:BNNet", "data.partition=iid"]}
    overrides = [f"algorithm.name={name}", *model.get(name, []), *MODES[mode]]
    run_it = tiny + overrides + ["rounds=2", "runtime.executor=inprocess"]
    if name == "fedbn" and accepted:  # BatchNorm statistics are client data: no DP release
        with pytest.raises(ConfigError, match="with a privacy section"):
            rayfl.run(TINY, run_it, quiet=True)
        return
    if not accepted:
        with pytest.raises(ConfigError) as err:
            config.load(TINY, overrides)
        assert err.value.key in (mode, "algorithm.name")
        return
    result = rayfl.run(TINY, run_it, quiet=True)
    assert np.isfinite(result.params).all() and result.metrics.num_rows == 2


def test_a_clients_minibatch_indices_reach_its_device_in_one_copy():
    """Off the CPU the schedule is uploaded once per client: the same indices, in the same
    order, as views of one tensor (no host-to-device copy a step); on the CPU it is the arrays
    themselves, today's path."""
    from rayfl.runtime.local import device_schedule, uploaded

    spec = LocalSpec(epochs=2, batch_size=7)
    arrays = batches(spec)
    tensors = uploaded(arrays, torch.device("cpu"))
    assert [t.tolist() for t in tensors] == [a.tolist() for a in arrays]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert uploaded([], torch.device("cpu")) == ()
    on_cpu = device_schedule(SAMPLES, spec, np.random.default_rng(5), None, torch.device("cpu"))
    assert all(isinstance(a, np.ndarray) for a in on_cpu)
    meta = device_schedule(SAMPLES, spec, np.random.default_rng(5), None, torch.device("meta"))
    assert [t.device.type for t in meta] == ["meta"] * len(arrays)
    assert [len(t) for t in meta] == [len(a) for a in arrays]


def test_a_procedures_minibatches_are_cut_from_one_upload_of_each_epochs_order():
    """``ctx.batches()`` yields index arrays (slices of one epoch's permutation): off the CPU
    each is cut from one upload of that permutation, at its own offset, instead of a copy a
    step; an array that is no such slice is copied on its own; on the CPU nothing is copied."""
    from rayfl.runtime.local import DeviceIndices

    arrays = batches(LocalSpec(epochs=3, batch_size=7))
    indices = DeviceIndices(torch.device("meta"))
    bases = []
    for a in arrays:
        t = indices(a)
        start = (a.__array_interface__["data"][0]
                 - a.base.__array_interface__["data"][0]) // a.itemsize
        assert t.device.type == "meta" and t.shape == a.shape and t.storage_offset() == start
        bases.append(indices.base)
    assert len({id(b) for b in bases}) == 3 and all(b is a.base for b, a in zip(bases, arrays))
    before = indices.base
    assert indices(np.array([3, 1])).device.type == "meta" and indices.base is before
    on_cpu = DeviceIndices(torch.device("cpu"))(arrays[0])
    assert on_cpu.tolist() == arrays[0].tolist()
    assert on_cpu.data_ptr() == arrays[0].__array_interface__["data"][0]  # wrapped, not copied
