"""A new user's tour, second pass: "did you mean" for mistyped keys, ``rayfl data``'s per-client
table, and the documented metrics row."""

from __future__ import annotations

import math

import pytest

from rayfl import cli
from rayfl import config as config_mod
from rayfl.schema import ConfigError
from tests.conftest import TINY


@pytest.mark.parametrize("override, key, guess", [
    ("local.lrr=0.1", "local.lrr", "local.lr"),
    ("loacl.lr=0.1", "loacl", "local"),
    ("lr=0.1", "lr", "local.lr"),  # a key one section down
    ("clients_per_rnd=3", "clients_per_rnd", "clients_per_round"),
    ("data.num_client=4", "data.num_client", "data.num_clients"),
    ("eval.client=3", "eval.client", "eval.clients"),
    ("algorithm.nam=x", "algorithm.nam", "algorithm.name"),  # a component's section
])
def test_a_mistyped_override_gets_a_guess(override, key, guess):
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, [override])
    assert e.value.key == key
    assert f"(did you mean '{guess}'?)" in str(e.value)


def test_nothing_close_gets_no_guess():
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, ["xyzzy=1"])
    assert "did you mean" not in str(e.value) and "valid keys here: aggregation" in str(e.value)


def test_a_mistyped_key_in_a_file_is_one_line_with_a_guess(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    with open(TINY) as f:
        path.write_text(f.read().replace("batch_size: 10", "batchsize: 10"))
    out = tmp_path / "runs"
    assert cli.main(["run", str(path), f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists()
    assert err[0].startswith("rayfl: error: config key 'local.batchsize' = 10: expected no such "
                             "key (did you mean 'local.batch_size'?); valid keys here: ")


def test_data_table_lists_each_clients_size_and_classes(tmp_path, capsys):
    import numpy as np
    import pyarrow.parquet as pq

    from rayfl.data import prepare

    table = tmp_path / "clients.parquet"
    args = ["data", TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'c'}",
            "data.client_holdout=0.2", "--clients", "3", "--table", str(table)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    cfg = config_mod.load(TINY, [f"data.cache_dir={tmp_path / 'c'}", "data.client_holdout=0.2"])
    reader = prepare(cfg.data, cfg.seed).open()
    rows = pq.read_table(table).to_pylist()
    assert len(rows) == 20
    for c in range(20):  # every client, against its own rows counted here
        y = np.asarray(reader.client(c)[1])
        counts = np.bincount(y, minlength=4)
        r = rows[c]
        assert (r["client"], r["samples"], r["classes"]) == (c, len(y), int((counts > 0).sum()))
        assert r["holdout_samples"] == len(reader.holdout(c)[1]) == int(0.2 * (len(y) +
                                                                              r["holdout_samples"]))
        assert [r[f"class_{k}"] for k in range(4)] == counts.tolist()
        best = int(np.argmax(counts))  # the first top class is the most frequent (lowest id)
        assert r["top_classes"].split()[0] == f"{best}:{100 * counts[best] / len(y):.0f}%"
    header = next(i for i, line in enumerate(out) if line.split()[:2] == ["client", "samples"])
    for c in range(3):
        cells = out[header + 1 + c].split()
        assert cells[:4] == [str(c), str(rows[c]["samples"]), str(rows[c]["holdout_samples"]),
                             str(rows[c]["classes"])]
        assert " ".join(cells[4:]) == rows[c]["top_classes"]
    assert out[header + 4].startswith("... 17 more clients")


def test_data_table_path_must_be_csv_or_parquet(tmp_path, capsys):
    args = ["data", TINY, f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'c'}",
            "--table", str(tmp_path / "t.txt")]
    assert cli.main(args) == 2
    assert "'--table'" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_metrics_reference_is_the_generated_one():
    import os

    from rayfl.metrics.columns import markdown
    from tests.conftest import ROOT

    with open(os.path.join(ROOT, "METRICS.md")) as f:
        assert f.read() == markdown()


def test_documented_matches_names_and_patterns_only():
    from rayfl.metrics.columns import documented

    for name in ("round", "test_accuracy", "next_test_accuracy", "ima_inner_test_loss",
                 "hr@10", "client_accuracy_worst10", "personal_accuracy_p90"):
        assert documented(name), name
    for name in ("nonsense", "test_accuracyx", "hr@k", "client_accuracy_p95", "rounds"):
        assert not documented(name), name


def _nan_free(v):
    """NaN as a string, so rows holding one compare equal."""
    return "nan" if isinstance(v, float) and math.isnan(v) else v


RUNS = [[f"algorithm={name}"] for name in (
    "fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedprox", "scaffold", "feddyn",
    "adabest", "fednova", "fedeve", "fedmim", "fedmsi")] + [
    ["wrappers.ima.start=1", "wrappers.ima.window=2"],
    ["privacy.noise_multiplier=0.5", "privacy.clip_norm=1.0", "aggregation.weighting=uniform"],
    ["data.validation_clients=4", "availability.model=bernoulli", "availability.dropout=0.3",
     "availability.deadline_s=0.5", "availability.deadline_policy=partial"],
    ["data.client_holdout=0.25", "eval.clients=5", "eval.finetune_steps=2"],
    ["loss_ceiling=1e-9"],  # diverges at once: the diverged row and its reason
    ["privacy.noise_multiplier=1.0", "privacy.clip_norm=1.0", "aggregation.weighting=uniform",
     "privacy.adaptive_clip.count_noise=1.0", "compression.method=topk",
     "compression.error_feedback=true"],
    ["aggregation.mode=fedbuff", "aggregation.concurrency=4", "aggregation.buffer_size=2"],
]


def test_every_column_a_run_writes_is_documented_and_on_round_sees_the_row(tiny):
    """Every built-in algorithm and the optional features: each column written, and each key
    of summary.json, is in METRICS.md, and ``on_round`` receives exactly the rows of metrics.parquet (plus rounds,
    and with privacy the ε's label)."""
    import rayfl
    from rayfl.metrics.columns import documented, summary_documented

    seen, keys = set(), set()
    for i, extra in enumerate(RUNS):
        rows: list[dict] = []
        result = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=3",
                                         f"name=c{i}"] + extra, quiet=True,
                           on_round=lambda row, rows=rows: rows.append(row) and False)
        written = [{k: _nan_free(v) for k, v in r.items() if v is not None}
                   for r in result.metrics.to_pylist()]
        assert [{k: _nan_free(v) for k, v in r.items() if k not in ("rounds", "dp_label")}
                for r in rows] == written, extra
        assert all(("dp_label" in r) == ("dp_epsilon" in r) for r in rows), extra
        assert all(r["rounds"] == 3 for r in rows) and rows[0]["round"] == 1
        seen |= set(result.metrics.column_names)
        keys |= set(result.summary)
    missing = sorted(c for c in seen if not documented(c))
    assert not missing, f"columns written but not in rayfl/metrics/columns.py: {missing}"
    missing = sorted(k for k in keys if not summary_documented(k))
    assert not missing, f"summary.json keys not in rayfl/metrics/columns.py: {missing}"
    for k in ("mean_last_10_evals_accuracy", "diverged_reason", "stopped_at_target_epsilon"):
        assert k in keys, k
    for c in ("dp_epsilon", "val_accuracy", "stragglers", "diverged_reason", "c_norm",
              "ima_inner_test_accuracy", "personal_accuracy_worst10", "next_test_accuracy",
              "dp_clip_norm", "upload_bytes", "staleness_hist"):
        assert c in seen, c  # the runs above exercise what they are meant to


def test_divergence_message_names_the_row_that_stopped_the_run(tiny, capsys):
    import rayfl

    result = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "loss_ceiling=1e-9"],
                       quiet=True)
    assert result.summary["diverged_at_round"] == result.metrics.to_pylist()[-1]["round"] == 1
    assert "run diverged in round 1 " in capsys.readouterr().err
