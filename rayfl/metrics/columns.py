"""Every column of ``metrics.parquet`` (and of the row ``on_round`` receives): meaning and unit;
every key of ``summary.json``.

The reference ``METRICS.md`` is generated from this table (``rayfl keys --metrics PATH``) and a
test runs every built-in algorithm and checks that each column a run writes is listed here, so
the documentation cannot fall behind the code. Columns named after a model or a dataset's
evaluator are patterns (``<model>_test_accuracy``).
"""

from __future__ import annotations

import re

SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "every round": {
        "round": ("round, from 1", "the communication round this row describes"),
        "lr": ("—", ("local learning rate η_l of the round (after local.lr_decay and the "
                    "algorithm's schedule)")),
        "online": ("clients", "clients the availability model had online at the round's start"),
        "eligible": ("clients", ("online clients the participation bound let the round "
                                 "sample (privacy.mechanism dp_ftrl or banded_mf)")),
        "sampled": ("clients", "clients sampled (dispatched plus dropped)"),
        "completed": ("clients", "clients whose update entered the aggregate"),
        "dropped": ("clients", "sampled clients that dropped out or missed the deadline"),
        "stragglers": ("clients", ("clients past availability.deadline_s or drawn by "
                                  "availability.stragglers (partial work or dropped, per the "
                                  "deadline policy)")),
        "empty_rounds": ("rounds", ("rounds so far, this one included, in which no client "
                                   "completed (the model did not move); "
                                   "availability.max_empty_rounds of them in a row stop the "
                                   "run")),
        "empty_reason": ("text", ("why no client completed (only on such a round): no client "
                                 "online, or how many sampled clients dropped out, went "
                                 "offline before reporting or missed the deadline")),
        "virtual_round_s": ("virtual s", "duration of the round on the simulated device clock"),
        "virtual_time_s": ("virtual s", "simulated time since the start, after this round"),
        "label_tv": ("0–1", ("total-variation distance between the labels pooled over the "
                            "round's clients and the population's (period drift of the sample)")),
        "train_loss": ("loss", "mean minibatch training loss over all local steps of the round"),
        "samples": ("rows", "training rows held by the completed clients"),
        "local_steps": ("steps", "local SGD steps run by all clients together"),
        "update_norm": ("L2 norm", "‖Δ̄‖, the norm of the aggregated model update"),
        "client_drift": ("squared L2", "mean over clients of ‖Δ_k − Δ̄‖² (client drift)"),
        "period_drift": ("squared L2", ("‖Δ̄_t − Δ̄_{t−1}‖², change of the mean update from the "
                                       "previous round (period drift; from round 2)")),
        "dp_epsilon": ("ε", ("privacy spent so far (with `privacy`; δ = privacy.delta; "
                            "dp_ftrl/banded_mf: the worst case over the participation bound, "
                            "each client's own ε in participation.parquet); stated under the "
                            "neighbouring relation summary.json's privacy entry names")),
        "dp_clip_norm": ("L2 norm", ("the clip norm S of the round (privacy.adaptive_clip: it "
                                    "tracks the target quantile of update norms)")),
        "upload_bytes": ("bytes", ("what the round's completed clients uploaded for their "
                                  "updates Δ_i and the algorithm's Upload entries as the "
                                  "transform chain encodes them (compression, secagg); the "
                                  "update's part times the virtual upload")),
        "attackers": ("clients", ("Byzantine clients among the completed ones (the `attack` "
                                 "transform)")),
        "krum_fallbacks": ("rounds", ("rounds so far with m ≤ 2f + 2 updates, where `krum` took "
                                     "the plain mean")),
        "krum_clamped": ("rounds", ("rounds so far with fewer than select + f updates, where "
                                   "`krum` averaged its m − f best-scored")),
        "diverged": ("bool", ("true when this row stopped the run (loss above loss_ceiling, "
                             "NaN or inf)")),
        "diverged_reason": ("text", "why the run stopped (only on the row that stopped it)"),
    },
    "timing and memory": {
        "plan_s": ("s", "sampling and availability planning"),
        "train_s": ("s", "wall time of the clients' training (all actors, in parallel)"),
        "aggregate_s": ("s", "merging the partial sums and the server update"),
        "actor_train_s": ("list of s", ("each client actor call's training time (sync rounds: "
                                        "one entry per busy actor, in actor order)")),
        "actor_samples": ("list of rows", "the rows each of those calls trained"),
        "actor_train_s_max": ("s", "the slowest client actor's training time"),
        "actor_imbalance": ("ratio ≥ 1", ("max / mean of actor_train_s: 1 is a perfectly "
                                         "balanced round")),
        "actor_peak_rss_mb": ("MiB", ("largest peak resident memory of a client actor (with "
                                      "the pages of the memory-mapped data store it read: "
                                      "shared page cache, reclaimable)")),
        "actor_private_mb": ("MiB", ("largest anonymous (allocated, not file-backed) resident "
                                     "memory of a client actor after the round")),
        "server_peak_rss_mb": ("MiB", "peak resident memory of the server process"),
        "round_s": ("s", "plan_s + train_s + aggregate_s"),
        "checkpoint_s": ("s", ("writing the checkpoint that followed the previous round, "
                              "which a thread of the server wrote while this round trained (0 "
                              "when none did)")),
        "eval_s": ("s", "test (and validation) evaluation, on evaluated rounds"),
        "client_eval_s": ("s", "per-client evaluation, on evaluated rounds (eval.clients)"),
        "elapsed_s": ("s", ("wall time since the first round began, resumed runs included "
                            "(start-up and the time on_round takes left out)")),
    },
    "evaluated rounds (every eval.every rounds, the last eval.last_rounds and the last; null "
    "otherwise)": {
        "test_loss": ("loss", "mean loss of the deployed model on the test set"),
        "test_accuracy": ("fraction 0–1", "accuracy of the deployed model on the test set"),
        "val_loss": ("loss", ("mean loss on the validation clients' rows "
                             "(data.validation_clients)")),
        "val_accuracy": ("fraction 0–1", "accuracy on the validation clients' rows"),
        "<model>_test_loss": ("loss", ("test loss of an algorithm's further model (e.g. "
                                      "next_test_loss: AdaBest's x_{t+1}; last_two_test_loss: "
                                      "FedExP's mean of the last two iterates; "
                                      "ima_inner_test_loss: the un-averaged model under IMA)")),
        "<model>_test_accuracy": ("fraction 0–1", "test accuracy of that model"),
        "hr@<k>": ("fraction 0–1", ("hit rate at k (k = 5, 10) of a ranking test set "
                                   "(MovieLens)")),
        "ndcg@<k>": ("0–1", "normalised discounted cumulative gain at k of a ranking test set"),
        "auc": ("0–1", "area under the ROC curve of a ranking test set"),
    },
    "per-client evaluation (eval.clients > 0; evaluated rounds)": {
        "clients_evaluated": ("clients", ("clients scored on their own held-out rows "
                                         "(data.client_holdout)")),
        **{f"client_accuracy_{s}": ("fraction 0–1", what) for s, what in (
            ("mean", ("mean over the evaluated clients of the deployed model's accuracy on each "
                     "client's held-out rows (each client counts once)")),
            ("p10", "10th percentile of those per-client accuracies (linear interpolation)"),
            ("p50", "median of the per-client accuracies"),
            ("p90", "90th percentile of the per-client accuracies"),
            ("worst10", "mean accuracy of the worst 10 % of evaluated clients (⌈m/10⌉ of m)"))},
        **{f"personal_accuracy_{s}": ("fraction 0–1", (f"as client_accuracy_{s}, after "
                                                      "eval.finetune_steps local SGD steps on "
                                                      "each client's training rows (only with "
                                                      "eval.finetune_steps > 0)"))
           for s in ("mean", "p10", "p50", "p90", "worst10")},
    },
    "asynchronous modes (aggregation.mode fedbuff or fedasync: a row per server update)": {
        "in_flight": ("clients", "clients still training when the server update was applied"),
        "discarded": ("clients", "arrivals staler than aggregation.max_staleness, dropped"),
        "staleness_mean": ("server updates", ("mean staleness τ of the applied updates (server "
                                             "updates since the client's model was sent)")),
        "staleness_max": ("server updates", "largest staleness τ among the applied updates"),
        "staleness_hist": ("clients per τ", "counts of applied updates by staleness τ = 0, 1, …"),
        "staleness_weight_mean": ("—", "mean staleness weight s(τ) of the applied updates"),
        "waves": ("calls", ("executor calls since the last update (clients dispatched "
                           "together train in one call, in parallel)")),
        "clients_trained": ("clients", "clients whose local training ran since the last update"),
    },
    "algorithms' own server metrics": {
        "momentum_norm": ("L2 norm", ("server optimizer momentum ‖m‖ (fedavgm, fedadam, fedyogi, "
                                     "fedadagrad, server_opt)")),
        "v_mean": ("—", "mean of the adaptive server optimizer's second moment v"),
        "c_norm": ("L2 norm", "SCAFFOLD's server control variate ‖c‖"),
        "h_norm": ("L2 norm", "FedDyn's / AdaBest's server correction ‖h‖"),
        "tau_eff": ("steps", "FedNova's effective number of local steps τ_eff"),
        "kalman_gain": ("0–1", "FedEve's Kalman gain K"),
        "q": ("squared L2 per coordinate", "FedEve's process-noise estimate"),
        "r": ("squared L2 per coordinate", "FedEve's observation-noise estimate"),
        "mim_delta_norm": ("L2 norm", ("FedMIM's ‖δ_{t+1}‖ = ‖x_t − x_{t+1}‖ / K, the per-step "
                                      "server movement its clients extrapolate with")),
        "ima_active": ("0 or 1",
                       "1 once IMA averages the deployed model (from wrappers.ima.start)"),
        "ima_window_len": ("models", "models in IMA's averaging window"),
        "server_lr": ("—", "FedExP's extrapolated server step size η_g (≥ 1)"),
        "prototypes": ("classes", "FedProto: classes whose global prototype the round updated"),
        "<name>": ("—", ("an algorithm of your own: whatever its server_update returns as "
                        "metrics")),
    },
}

#: the listed columns a run's components (algorithm, server optimiser, layers) write as their
#: metrics; the runtime writes every other listed column itself
FROM_COMPONENTS = frozenset({*SECTIONS["algorithms' own server metrics"], "dp_clip_norm",
                             "attackers", "krum_fallbacks", "krum_clamped"}) - {"<name>"}


ROUNDS_KEY = ("rounds", "on_round only", "the run's configured round count")
LABEL_KEY = ("dp_label", "on_round only", "with `privacy`: the neighbouring relation ε is "
             "stated under, and the reports it excludes (privacy.public_reports)")


#: every key of a finished run's ``summary.json``: meaning
SUMMARY: dict[str, str] = {
    "name": "the run's name (the config's `name`)",
    "algorithm": "the algorithm and its wrappers as tables and plots list them (fedavg+ima)",
    "rounds": "rounds recorded in metrics.parquet",
    "final_accuracy": "test accuracy at the last evaluation (null: none)",
    "mean_last_<k>_evals_accuracy": "mean test accuracy over the last eval.last_k evaluations",
    "evaluations": "evaluations made",
    "empty_rounds": "rounds in which no client completed",
    "final_test_loss": "test loss at the last evaluation",
    "target_accuracy": "eval.target_accuracy",
    "rounds_to_target": "the first round (from 1) whose test accuracy reached the target "
                        "(null: none did)",
    "wall_time_s": "wall-clock seconds the rounds took, over every resume (the last row's "
                   "elapsed_s: starting Ray, the actors and the data left out)",
    "mean_round_s": "mean wall-clock seconds a round",
    "virtual_time_s": "simulated device-clock seconds at the end",
    "virtual_hours_to_target": "simulated hours until rounds_to_target (null: never reached)",
    "model_sha256": "SHA-256 of final_model.npy's float32 bytes, then final_buffers.npy's",
    "diverged": "whether the run stopped as diverged (NaN/inf or a loss above loss_ceiling)",
    "diverged_at_round": "diverged runs: the round that stopped it",
    "diverged_reason": "diverged runs: which value, and the ceiling it passed",
    "stopped_at_round": "runs stopped early (nobody online, availability.max_empty_rounds): "
                        "the round",
    "stopped": "runs stopped early: why",
    "epsilon": "with privacy: ε spent over the rounds run (dp_epsilon of the last row)",
    "delta": "with privacy: privacy.delta",
    "stopped_at_target_epsilon": "with privacy: whether the run ended at the round "
                                 "privacy.target_epsilon allowed, before `rounds`",
    "privacy": "with privacy: the guarantee in words (mechanism, neighbouring relation, "
               "accountant, what the reports exclude)",
    "participation": "dp_ftrl and banded_mf: the participation bound and each client's "
                     "participations and ε (participation.parquet holds them per client)",
    "privacy_audit": "privacy.audit_canaries: the canaries and the empirical ε "
                     "(privacy_audit.json holds the details)",
    "provenance": "versions, command lines, config hash and git commit (provenance.json)",
}


def summary_documented(key: str) -> bool:
    """Whether a ``summary.json`` key is listed."""
    return any(key == name or "<" in name and _pattern(name).match(key) for name in SUMMARY)


def _pattern(name: str) -> re.Pattern:
    return re.compile("^" + re.escape(name).replace(re.escape("<model>"), r"[A-Za-z0-9_]+")
                      .replace(re.escape("<k>"), r"\d+") + "$")


def documented(column: str) -> bool:
    """Whether ``column`` is listed (an algorithm's own ``<name>`` matches nothing: the test
    holds the built-ins to the table)."""
    return any(column == name or ("<" in name and name != "<name>" and
                                  _pattern(name).match(column))
               for rows in SECTIONS.values() for name in rows)


def written_by_runtime(column: str) -> bool:
    """Whether the runtime writes ``column`` itself (a component's metric of that name would
    overwrite it, or be overwritten)."""
    return column not in FROM_COMPONENTS and (documented(column) or column in (
        ROUNDS_KEY[0], LABEL_KEY[0]))


def markdown() -> str:
    """``METRICS.md``: one table per section."""
    out = ["# metrics.parquet columns", "",
           ("Generated from `rayfl/metrics/columns.py` by `rayfl keys --metrics METRICS.md`; a "
           "test keeps it in sync and checks that every column a run writes is listed. "
           "`rayfl.run(..., on_round=fn)` calls `fn(row)` with exactly this row after every "
           f"round, plus `{ROUNDS_KEY[0]}` ({ROUNDS_KEY[2]}) and `{LABEL_KEY[0]}` "
           f"({LABEL_KEY[2]}). A column a round does not "
           "produce is null (missing from `on_round`'s row). Accuracies are fractions here and "
           "percent in the terminal and figures. Per-client scores of every evaluated client "
           "are in `client_eval.parquet` (round, client, samples, accuracy, loss, "
           "personal_accuracy, personal_loss)."), ""]
    for title, rows in SECTIONS.items():
        out += [f"## {title[0].upper()}{title[1:]}", "", "| column | unit | meaning |",
                "|---|---|---|"]
        out += [f"| `{name}` | {unit} | {meaning} |" for name, (unit, meaning) in rows.items()]
        out.append("")
    out += ["# summary.json", "", ("What a finished run (ended, diverged or stopped early; a "
            "paused one has none yet) says of itself; `rayfl.run` returns it as "
            "`RunResult.summary`."), "", "| key | meaning |", "|---|---|"]
    out += [f"| `{name}` | {meaning} |" for name, meaning in SUMMARY.items()]
    out.append("")
    return "\n".join(out)
