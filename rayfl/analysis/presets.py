"""Which kept models the paper's figures use (seed 004 Figs. 1, 5), read from a run directory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rayfl import layer_list
from rayfl.algorithms.wrapper import label
from rayfl.schema import ConfigError

if TYPE_CHECKING:
    from rayfl.analysis.landscape import Model

INTERPOLATIONS = ("auto", "wrapper", "rounds")
PLANES = ("paper", "clients", "globals")


def _fma(run, t: int) -> Model:
    """Round ``t``'s model before the outermost wrapper that keeps one (IMA: the plain
    average, FMA), labelled by that model's name; global when there is none."""
    name = run.fma_name(t)
    return f"{'global' if name == 'global' else name} r{t}", run.load(name, t)


def _deployed(run, t: int) -> Model:
    return f"{label(run.cfg.algorithm, layer_list.wrappers(run.cfg))} r{t}", \
        run.load("global", t)


def interpolation(run, preset: str) -> tuple[str, Model, Model]:
    """(tag, w1, w2): ``wrapper`` — the deployed model (β=1) and the output inside the server
    wrapper it replaced (β=0; IMA: the final IMA model and the plain average); ``rounds`` — the
    last two kept global models (later at β=1); ``auto`` — wrapper when the run kept a
    wrapper's inner model, else rounds."""
    t = run.need_rounds(1, f"`rayfl analyze interpolate --preset {preset}`")[-1]
    if preset == "auto":
        preset = "wrapper" if run.fma_name(t) != "global" else "rounds"
    if preset == "wrapper":
        if run.fma_name(t) == "global":
            key = "layers" if run.cfg.layers else "wrappers"
            raise ConfigError(key, [e.name for e in layer_list.wrappers(run.cfg)],
                              f"a wrapper that keeps its inner model (IMA: ima_inner.npy from "
                              f"its start on) active at the last kept round {t}; rerun with "
                              f"{key}=[ima] and keep.last=1")
        return "wrapper", _deployed(run, t), _fma(run, t)
    kept = run.need_rounds(2, "`rayfl analyze interpolate --preset rounds`")
    return "rounds", _fma(run, kept[-1]), _fma(run, kept[-2])


def clients_plane(run, t: int, clients: list[int] | None = None):
    """(name, three client models of round ``t``, marks: that round's global model)."""
    kept = run.clients(t)
    ids = clients or kept[:3]
    missing = [i for i in ids if i not in kept]
    if len(ids) != 3 or missing:
        raise ConfigError("--clients", ",".join(map(str, ids)),
                          f"three of the clients kept at round {t}: {kept}")
    models = [(f"client {i}", run.load(f"client-{i}", t)) for i in ids]
    return f"clients-r{t:05d}", models, [_fma(run, t)]


def globals_plane(run):
    """(name, the last three kept models before the outermost wrapper, marks: the deployed
    model when a wrapper changed it)."""
    kept = run.need_rounds(3, "`rayfl analyze plane --preset globals`")[-3:]
    marks = [_deployed(run, kept[-1])] if run.fma_name(kept[-1]) != "global" else []
    return "globals", [_fma(run, t) for t in kept], marks


def planes(run, preset: str, t: int | None = None, clients: list[int] | None = None) -> list:
    """The (name, models, marks) of each plane of a preset: ``clients`` (round ``t``, default
    the last kept), ``globals``, or ``paper`` — client planes at the first, middle and last
    kept round plus the globals plane (seed 004 Fig. 1)."""
    if preset == "clients":
        return [clients_plane(run, run.round_of(-1 if t is None else t), clients)]
    if preset == "globals":
        return [globals_plane(run)]
    kept = run.need_rounds(3, "`rayfl analyze plane --preset paper`")
    mid = min(kept, key=lambda r: abs(r - (kept[0] + kept[-1]) / 2))
    return [*(clients_plane(run, r, clients) for r in (kept[0], mid, kept[-1])),
            globals_plane(run)]
