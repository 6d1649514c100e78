"""Client state and checkpoints through pyarrow.fs storage: a local directory or an S3 server
(moto, started by the tests), atomic writes, and checkpoints that load without running code."""

from __future__ import annotations

import errno
import io
import math
import os
import zipfile

import numpy as np
import pytest
import torch

from rayfl import config
from rayfl.runtime import checkpoint, checkpoint_file, state_store
from rayfl.runtime.state_store import StateStore, prune_after
from rayfl.runtime.storage import CheckpointError, Storage, join
from rayfl.schema import ConfigError
from tests.conftest import TINY, s3_keys


def _states(n: int) -> dict[int, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return {c: {"c_i": torch.randn(50, generator=g, dtype=torch.float64),
                "steps": torch.tensor([c], dtype=torch.int64)} for c in range(n)}


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path):
    """A fresh storage location: a local directory, or a prefix on the test S3 server."""
    if request.param == "local":
        return str(tmp_path / "store")
    uri_for, _ = request.getfixturevalue("s3_server")
    return uri_for(f"{request.node.originalname}-{os.urandom(4).hex()}")


def test_state_store_round_trips_and_prunes(location):
    states = _states(1500)  # clients 0..1499: two shard directories (0/ and 1/)
    writer = StateStore(join(location, "state"), budget_bytes=0)
    for c in (3, 1200):
        writer.save(c, 2, states[c])
        writer.save(c, 5, {k: v + 1 for k, v in states[c].items()})
    reader = StateStore(join(location, "state"), budget_bytes=0)  # another actor: no cache
    back = reader.load(1200, 2)
    assert all(torch.equal(back[k], states[1200][k]) and back[k].dtype == states[1200][k].dtype
               for k in states[1200])
    assert torch.equal(reader.load(3, 5)["c_i"], states[3]["c_i"] + 1)
    assert reader.stats["disk_reads"] == 2 and reader.load(3, -1) is None

    versions = np.full(1500, -1, dtype=np.int32)
    versions[[3, 1200]] = 2  # a checkpoint of round 2: both round-5 files came after it
    assert prune_after(join(location, "state"), versions) == 2
    assert sorted(Storage(join(location, "state")).files()) == ["0/3.r2.npz", "1/1200.r2.npz"]
    state_store.delete_versions(join(location, "state"), [(3, 2), (3, 9)])  # (3, 9): missing
    assert Storage(join(location, "state")).files() == ["1/1200.r2.npz"]


def test_state_objects_land_on_the_s3_server(s3_server):
    uri_for, client = s3_server
    root = join(uri_for("objects"), "state")
    StateStore(root, budget_bytes=1e9).save(1042, 7, _states(1)[0])
    assert s3_keys(client, "objects/") == ["objects/state/1/1042.r7.npz"]
    body = client.get_object(Bucket="rayfl-test", Key="objects/state/1/1042.r7.npz")["Body"]
    with np.load(io.BytesIO(body.read()), allow_pickle=False) as z:  # plain npz, no pickle
        assert np.array_equal(z["c_i"], _states(1)[0]["c_i"].numpy())


def test_resume_refuses_a_checkpoint_whose_state_file_is_gone(location):
    store = StateStore(join(location, "state"), budget_bytes=0)
    store.save(4, 1, _states(5)[4])
    versions = np.array([-1, -1, 3, -1, 1], dtype=np.int32)  # client 2's round-3 file: gone
    with pytest.raises(CheckpointError) as err:
        prune_after(join(location, "state"), versions)
    assert str(err.value).startswith("client state ")
    assert err.value.path.endswith("state/0/2.r3.npz")
    assert "testing:testing" not in str(err.value)  # credentials never printed


def test_a_damaged_state_file_is_a_clear_error(tmp_path):
    root = str(tmp_path / "state")
    StateStore(root, budget_bytes=0).save(9, 0, _states(10)[9])
    path = os.path.join(root, "0", "9.r0.npz")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError) as err:
        StateStore(root, budget_bytes=0).load(9, 0)
    assert err.value.path == path and "npz" in err.value.expected


def _payload() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"round": 6, "elapsed": 12.5, "virtual_time": np.float64(0.1) * 3,
            "versions": np.array([-1, 4, 6], dtype=np.int32), "prev_delta": None,
            "state": {"x": torch.randn(40, generator=g),
                      "mim_k": torch.ones((), dtype=torch.float64),
                      "buf": torch.zeros((0, 40)), "half": torch.ones(3, dtype=torch.bfloat16),
                      "s": float("nan"), "peak": float("-inf"), "pair": (1, "a"), "flag": True}}


def test_checkpoint_round_trips_every_value_exactly(location):
    payload = _payload()
    checkpoint.save(location, payload)
    assert checkpoint.exists(location)
    back = checkpoint.load(location)
    assert back["round"] == 6 and back["elapsed"] == 12.5 and back["prev_delta"] is None
    assert back["virtual_time"] == np.float64(0.1) * 3  # the same float, bit for bit
    assert back["versions"].dtype == np.int32 and back["versions"].tolist() == [-1, 4, 6]
    for k in ("x", "mim_k", "buf", "half"):
        want = payload["state"][k]
        got = back["state"][k]
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert math.isnan(back["state"]["s"]) and back["state"]["peak"] == float("-inf")
    assert back["state"]["pair"] == (1, "a") and back["state"]["flag"] is True


def test_a_prepared_checkpoint_holds_the_values_as_they_were_when_prepared(tmp_path):
    """The server writes a round's checkpoint while the next round trains; what it writes is
    the state as the round left it, whatever is changed in place meanwhile."""
    payload = _payload()
    before = {k: payload["state"][k].clone() for k in ("x", "half")}
    save = checkpoint.prepared(payload)
    payload["state"]["x"].add_(1.0)
    payload["state"]["half"].mul_(3)
    payload["versions"][1] = 99
    save(str(tmp_path), False)
    back = checkpoint.load(str(tmp_path))
    assert torch.equal(back["state"]["x"], before["x"])
    assert torch.equal(back["state"]["half"], before["half"])
    assert back["versions"].tolist() == [-1, 4, 6]


def test_checkpoint_size_follows_the_clients_with_state_not_the_population(tmp_path):
    """A million registered clients, three holding state: the version table is stored sparse
    (a few hundred bytes, not 4 MB) and loads back as the full array."""
    versions = np.full(1_000_000, -1, dtype=np.int32)
    versions[[0, 5, 999_999]] = [3, 0, 7]
    checkpoint.save(str(tmp_path), {"round": 7, "versions": versions})
    assert os.path.getsize(checkpoint.path_of(str(tmp_path))) < 10_000
    back = checkpoint.load(str(tmp_path))["versions"]
    assert back.dtype == np.int32 and np.array_equal(back, versions)


def test_checkpoint_on_s3_is_one_object(s3_server):
    uri_for, client = s3_server
    checkpoint.save(uri_for("one-object"), _payload())
    checkpoint.save(uri_for("one-object"), {**_payload(), "round": 7})  # replaced in place
    assert s3_keys(client, "one-object/") == ["one-object/checkpoints/checkpoint.pt"]
    assert checkpoint.load(uri_for("one-object"))["round"] == 7


class _Trap:
    """Unpickling this runs code (writes a marker file): what a checkpoint must never do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _write_checkpoint_bytes(run_dir: str, data: bytes) -> str:
    path = checkpoint.path_of(run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_checkpoint_with_code_in_it_is_refused_without_running_it(tmp_path):
    marker = str(tmp_path / "pwned")
    path = _write_checkpoint_bytes(str(tmp_path), _torch_bytes({"round": 1,
                                                                "state": _Trap(marker)}))
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(str(tmp_path))
    assert err.value.path == path and not os.path.exists(marker)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "garbage", "old-format",
                                    "zip-of-nothing"])
def test_damaged_checkpoint_is_a_config_error_naming_the_file(tmp_path, damage):
    run_dir = str(tmp_path)
    good = checkpoint_file.encode(_payload())
    x = bytearray(good)
    x[good.index(_payload()["state"]["x"].numpy().tobytes()[:16]) + 20] ^= 0xFF
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("a.txt", "hello")
    data = {"truncated": good[: len(good) // 2], "flipped": bytes(x), "empty": b"",
            "garbage": np.random.default_rng(0).bytes(300),
            "old-format": _torch_bytes({"round": 1, "versions": np.zeros(3)}),
            "zip-of-nothing": zipped.getvalue()}[damage]
    path = _write_checkpoint_bytes(run_dir, data)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(run_dir)
    assert err.value.path == path and str(err.value).startswith(f"checkpoint {path}: expected")


def test_checkpoint_rejects_objects_it_cannot_store_as_data():
    with pytest.raises(TypeError, match="_Trap"):
        checkpoint_file.encode({"state": _Trap("x")})


def test_an_interrupted_write_leaves_the_old_content(location):
    store = Storage(location)
    store.write("a/b.bin", b"old")

    def dies_midway(f):
        f.write(b"new-but-incomplete")
        raise KeyboardInterrupt

    def disk_full(f):
        f.write(b"new-but-incomplete")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(KeyboardInterrupt):
        store.write_with("a/b.bin", dies_midway)
    with pytest.raises(OSError) as e:
        store.write_with("a/b.bin", disk_full)
    assert store.read("a/b.bin") == b"old"
    assert store.files() == ["a/b.bin"]  # the partial temporary gave its space back
    if store.is_local:
        assert e.value.filename == os.path.join(location, "a", "b.bin")  # says which file


@pytest.mark.parametrize("value", ["foo://bucket/x", "s3://", "s3:///", "http://host/x",
                                   "file://relative/dir", "file:///tmp/x?opt=1"])
def test_bad_storage_location_is_a_config_error(value):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, [f"runtime.storage={value}"])
    assert err.value.key == "runtime.storage" and err.value.value == value


def test_storage_locations_accepted():
    for value in ("s3://bucket/prefix?region=eu-west-1", "/mnt/shared/runs", "relative/dir",
                  "gs://bucket", "file:///tmp/runs"):
        assert config.load(TINY, [f"runtime.storage={value}"]).runtime.storage == value


def test_resume_refuses_a_lost_state_file_or_a_damaged_checkpoint(ray_local, tiny, tmp_path):
    import rayfl

    run_dir = str(tmp_path / "paused")
    rayfl.run(TINY, tiny + ["algorithm.name=scaffold"], run_dir=run_dir, quiet=True,
              max_rounds=2)
    state = os.path.join(run_dir, "state")
    lost = os.path.join(state, sorted(Storage(state).files())[0])
    os.rename(lost, lost + ".away")
    with pytest.raises(CheckpointError) as err:
        rayfl.resume(run_dir, quiet=True)
    assert str(err.value).startswith(f"client state {lost}: expected the file the checkpoint")
    os.rename(lost + ".away", lost)
    path = checkpoint.path_of(run_dir)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError) as err:
        rayfl.resume(run_dir, quiet=True)
    assert err.value.path == path and "a complete rayfl checkpoint" in err.value.expected


def test_a_new_run_refuses_storage_already_holding_its_files(s3_server, tiny, tmp_path):
    import rayfl

    uri_for, _ = s3_server
    base = uri_for("taken")
    checkpoint.save(join(base, "mine"), _payload())  # an earlier run named "mine"
    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + [f"runtime.storage={base}"], run_dir=str(tmp_path / "mine"),
                  quiet=True)
    assert err.value.key == "runtime.storage" and "holding no files" in err.value.expected
    assert not os.path.exists(tmp_path / "mine")  # nothing created


def test_an_unusable_storage_uri_is_refused_without_printing_its_keys(tiny, tmp_path):
    import rayfl

    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + ["runtime.storage=s3://KEY:SECRET@bucket/a[1]?region=us-east-1"],
                  run_dir=str(tmp_path / "r"), quiet=True)
    assert err.value.key == "runtime.storage" and "SECRET" not in str(err.value)
    assert not os.path.exists(tmp_path / "r")


def test_a_file_uri_is_the_local_directory_it_names(tiny, tmp_path):
    """file:///PATH was accepted and every checkpoint write failed (no parent directories)."""
    import rayfl

    common = tiny + ["runtime.executor=inprocess", "algorithm.name=scaffold", "rounds=3",
                     f"runtime.storage=file://{tmp_path / 'st'}"]
    rayfl.run(TINY, common, run_dir=str(tmp_path / "paused"), quiet=True, max_rounds=2)
    assert os.path.isfile(checkpoint.path_of(str(tmp_path / "st" / "paused")))
    resumed = rayfl.resume(str(tmp_path / "paused"), quiet=True)
    plain = rayfl.run(TINY, common[:-1], run_dir=str(tmp_path / "plain"), quiet=True)
    assert resumed.summary["model_sha256"] == plain.summary["model_sha256"]


def test_storage_where_a_file_is_is_refused_before_anything_is_created(tiny, tmp_path):
    import rayfl

    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(ConfigError) as err:
        rayfl.run(TINY, tiny + ["runtime.executor=inprocess",
                                f"runtime.storage={tmp_path / 'a_file'}"], quiet=True)
    assert err.value.key == "runtime.storage"
    assert not (tmp_path / "runs").exists() and (tmp_path / "a_file").read_text() == "mine"
