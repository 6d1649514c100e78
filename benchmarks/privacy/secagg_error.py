"""SecAgg's decode error against the modulus width b: 100 clients, d = 10,000, S = 1,
updates of norm ≈ 0.5 (the relative error is of the true sum's norm)."""
import math

import torch

from rayfl.transforms.secagg import SecAgg, SecAggParams

g = torch.Generator().manual_seed(0)
m, d = 100, 10_000
deltas = [torch.randn(d, generator=g, dtype=torch.float64) * (0.5 / math.sqrt(d))
          for _ in range(m)]
true = sum(deltas)
print("| b | rounding | f | max error/coord | bound m·2^-f(·½) | relative error ‖err‖/‖Σ‖ |")
print("|---|---|---|---|---|---|")
for bits in (12, 16, 20, 24):
    for rnd in (True, False):
        agg = SecAgg(SecAggParams(bits=bits, clip_norm=1.0, max_clients=m,
                                  randomized_rounding=rnd), seed=1)
        got = agg.decode(sum(agg.client(x, 0, i) for i, x in enumerate(deltas)))
        err = got - true
        print(f"| {bits} | {'random' if rnd else 'nearest'} | {agg.frac_bits} | "
              f"{err.abs().max():.3g} | {agg.bound(m):.3g} | {err.norm() / true.norm():.3g} |")
