"""Loss landscapes around kept models (seed 004 §5.1–5.2): 1-D interpolation and 2-D planes.

1-D: L(β·w1 + (1−β)·w2) for β over a range that includes 0 and 1 (Goodfellow et al.).
2-D: the plane through w1, w2, w3 with Gram–Schmidt, *unit*-normalised directions (the SWA /
mode-connectivity code the paper follows; its printed ‖·‖² is a typo, spec 004 §5.2):
    û = (w2 − w1)/‖w2 − w1‖,  v̂ = v/‖v‖ with v = (w3 − w1) − ⟨w3 − w1, û⟩ û,
    w_P(a, b) = w1 + a·û + b·v̂,
evaluated on a size × size grid over the bounding box of the projected models plus a relative
margin on every side (default 21 × 21 and 20 %, as SWA's plane.py). The three models, their plain
average and any marked models (projected; their distance to the plane is reported) are
evaluated exactly alongside the grid, in the same Ray tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl.analysis.evaluate import EvalData, score
from rayfl.schema import ConfigError

Model = tuple[str, np.ndarray]  # (label, flat parameters)


def betas(lo: float = -0.5, hi: float = 1.5, steps: int = 41) -> np.ndarray:
    """``steps`` evenly spaced β in [lo, hi], plus 0 and 1 exactly."""
    return np.union1d(np.round(np.linspace(lo, hi, steps), 12), [0.0, 1.0])


@dataclass(frozen=True)
class Plane:
    """The affine plane w1 + a·û + b·v̂ (float64; û, v̂ orthonormal)."""

    origin: np.ndarray
    dirs: np.ndarray  # (2, d): û, v̂

    @classmethod
    def through(cls, w1: np.ndarray, w2: np.ndarray, w3: np.ndarray) -> Plane:
        """The plane through three models (Gram–Schmidt, unit directions)."""
        w1, w2, w3 = (np.asarray(w, dtype=np.float64) for w in (w1, w2, w3))
        u = w2 - w1
        if not np.linalg.norm(u) > 0:
            raise ConfigError("--models", "w1 = w2", "three distinct models")
        u /= np.linalg.norm(u)
        v = (w3 - w1) - np.dot(w3 - w1, u) * u
        if not np.linalg.norm(v) > 1e-12 * max(np.linalg.norm(w3 - w1), 1e-30):
            raise ConfigError("--models", "collinear models", "three models spanning a plane")
        return cls(w1, np.stack([u, v / np.linalg.norm(v)]))

    def coords(self, w: np.ndarray) -> np.ndarray:
        """(a, b) of the projection of ``w`` onto the plane."""
        return self.dirs @ (np.asarray(w, dtype=np.float64) - self.origin)

    def distance(self, w: np.ndarray) -> float:
        """Euclidean distance of ``w`` from the plane."""
        r = np.asarray(w, dtype=np.float64) - self.origin
        return float(np.linalg.norm(r - self.coords(w) @ self.dirs))


def grid_axes(points: np.ndarray, size: int = 21, margin: float = 0.2):
    """Axes (a, b) of a size × size grid over the points' bounding box ± margin × its span."""
    lo, hi = points.min(axis=0), points.max(axis=0)
    span = np.maximum(hi - lo, 1e-12)
    lo, hi = lo - margin * span, hi + margin * span
    return np.linspace(lo[0], hi[0], size), np.linspace(lo[1], hi[1], size)


@dataclass
class Line:
    """1-D interpolation result: loss and error at each β (β=1: w1, β=0: w2)."""

    w1: str
    w2: str
    beta: np.ndarray
    loss: np.ndarray
    error: np.ndarray
    data: str

    def rows(self) -> list[dict]:
        return [{"beta": float(b), "loss": float(l), "error": float(e)}
                for b, l, e in zip(self.beta, self.loss, self.error)]

    def summary(self) -> dict:
        """Endpoints and the minima along the line (the paper's Fig. 5b/5c reading)."""
        at = {float(b): i for i, b in enumerate(self.beta)}
        il, ie = int(np.argmin(self.loss)), int(np.argmin(self.error))
        return {"w1 (beta=1)": self.w1, "w2 (beta=0)": self.w2, "data": self.data,
                "w1_loss": float(self.loss[at[1.0]]), "w1_error": float(self.error[at[1.0]]),
                "w2_loss": float(self.loss[at[0.0]]), "w2_error": float(self.error[at[0.0]]),
                "min_loss": float(self.loss[il]), "argmin_loss_beta": float(self.beta[il]),
                "min_error": float(self.error[ie]), "argmin_error_beta": float(self.beta[ie])}


def interpolate(cfg, handle, w1: Model, w2: Model, beta: np.ndarray, data: EvalData,
                batch_size: int = 1000) -> Line:
    """Loss/error along β·w1 + (1−β)·w2 = w2 + β(w1 − w2) (Ray tasks)."""
    diff = np.asarray(w1[1], np.float64) - np.asarray(w2[1], np.float64)
    out = score(cfg, handle, data, w2[1], diff[None], beta[:, None], batch_size)
    return Line(w1[0], w2[0], beta, out[:, 0], 1 - out[:, 1], data.label)


@dataclass
class PlaneResult:
    """2-D landscape: grid values and the evaluated points (models, average, marks)."""

    name: str
    a: np.ndarray
    b: np.ndarray
    loss: np.ndarray  # (len(b), len(a))
    error: np.ndarray
    points: list[dict]  # kind (model|average|mark), label, a, b, loss, error, [distance]
    data: str

    def rows(self) -> list[dict]:
        A, B = np.meshgrid(self.a, self.b)
        return [{"a": float(x), "b": float(y), "loss": float(l), "error": float(e)}
                for x, y, l, e in zip(A.ravel(), B.ravel(), self.loss.ravel(),
                                      self.error.ravel())]

    def summary(self) -> dict:
        """Points with their distance to the grid's lowest-loss node, and the verdicts."""
        i = np.unravel_index(np.argmin(self.loss), self.loss.shape)
        low = np.array([self.a[i[1]], self.b[i[0]]])
        pts = [{**p, "to_grid_min": float(np.hypot(p["a"] - low[0], p["b"] - low[1]))}
               for p in self.points]
        models = [p for p in pts if p["kind"] == "model"]
        avg = next(p for p in pts if p["kind"] == "average")
        return {"name": self.name, "data": self.data, "grid": [len(self.a), len(self.b)],
                "grid_min": {"a": float(low[0]), "b": float(low[1]),
                             "loss": float(self.loss[i]), "error": float(self.error[i])},
                "points": pts,
                "average_loss_below_every_model": avg["loss"] < min(m["loss"] for m in models),
                "average_error_below_every_model": avg["error"] < min(m["error"]
                                                                      for m in models)}


def plane(cfg, handle, name: str, models: list[Model], marks: list[Model], data: EvalData,
          size: int = 21, margin: float = 0.2, batch_size: int = 1000) -> PlaneResult:
    """Loss/error on the plane through three models, plus the points (one batch of Ray tasks).

    Marked models are evaluated where they are (off the plane) and reported with their
    projection's coordinates and their distance to the plane.
    """
    p = Plane.through(*(w for _, w in models))
    xy = np.array([p.coords(w) for _, w in models])
    mxy = np.array([p.coords(w) for _, w in marks]).reshape(-1, 2)
    a, b = grid_axes(np.vstack([xy, mxy]), size, margin)
    A, B = np.meshgrid(a, b)
    plane_pts = np.vstack([np.column_stack([A.ravel(), B.ravel()]), xy, xy.mean(axis=0)])
    # marks: w1 + (w_m − w1), one extra direction each
    dirs = np.vstack([p.dirs, *[np.asarray(w, np.float64) - p.origin for _, w in marks]])
    coeffs = np.zeros((len(plane_pts) + len(marks), len(dirs)))
    coeffs[:len(plane_pts), :2] = plane_pts
    coeffs[len(plane_pts):, 2:] = np.eye(len(marks))
    out = score(cfg, handle, data, p.origin, dirs, coeffs, batch_size)
    n = size * size
    loss, err = out[:n, 0].reshape(size, size), 1 - out[:n, 1].reshape(size, size)
    rest = out[n:]
    points = [{"kind": "model", "label": lab, "a": float(c[0]), "b": float(c[1]),
               "loss": float(r[0]), "error": float(1 - r[1])}
              for (lab, _), c, r in zip(models, xy, rest)]
    c, r = xy.mean(axis=0), rest[3]
    points.append({"kind": "average", "label": "average of the three", "a": float(c[0]),
                   "b": float(c[1]), "loss": float(r[0]), "error": float(1 - r[1])})
    points += [{"kind": "mark", "label": lab, "a": float(c[0]), "b": float(c[1]),
                "loss": float(r[0]), "error": float(1 - r[1]), "distance": p.distance(w)}
               for (lab, w), c, r in zip(marks, mxy, rest[4:])]
    return PlaneResult(name, a, b, loss, err, points, data.label)
