"""Checkpoints on object storage, against a real S3 endpoint (moto server) and memory:// (issue 15).

The endpoint is a real HTTP S3 server started by the ``s3_endpoint`` fixture
(tests/conftest.py); everything reaches it through s3fs/boto exactly as a user's run
would, configured the standard way (``AWS_ENDPOINT_URL`` and friends).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptkit
from ckptkit.cli import main as cli
from ckptkit.storage.fs import location

pytestmark = [pytest.mark.integration, pytest.mark.s3]


def _ts(seed: int = 0, width: int = 64) -> ckptkit.TrainState:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 8))
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(torch.randn(4, width)).sum().backward()
    o.step()
    return ckptkit.TrainState(model=m, optimizer=o, step=0)


def _same(a: ckptkit.TrainState, b: ckptkit.TrainState) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
        return False
    oa, ob = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]  # type: ignore[union-attr]
    return all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i] if torch.is_tensor(oa[i][k]))


def _objects(url: str) -> list[str]:
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    base = url.removeprefix("s3://")
    return sorted(p.removeprefix(base + "/") for p in fs.find(base))


def test_round_trip_bitwise_in_a_fresh_process(s3_run: str, tmp_path: Path) -> None:
    ts = _ts()
    with ckptkit.CheckpointManager(s3_run, keep_last=2) as mgr:
        for s in (1, 2):
            ts.step = s
            mgr.save(ts)
    objs = _objects(s3_run)
    assert "step-00000002/manifest.json" in objs and "latest" in objs
    assert not any("ckptkit-tmp" in o for o in objs)  # written in place, manifest last
    # a fresh process restores it (the endpoint comes from the environment)
    code = textwrap.dedent(
        f"""
        import torch, ckptkit, xxhash, json
        torch.manual_seed(9)
        m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        o = torch.optim.AdamW(m.parameters(), lr=1e-2)
        ts = ckptkit.TrainState(model=m, optimizer=o)
        r = ckptkit.CheckpointManager({s3_run!r}, readonly=True).restore(ts)
        h = xxhash.xxh3_64()
        for k, v in sorted(m.state_dict().items()):
            h.update(v.numpy().tobytes())
        for i, st in sorted(o.state_dict()["state"].items()):
            for k, v in sorted(st.items()):
                h.update(v.numpy().tobytes())
        print(json.dumps({{"step": r.step, "hash": h.hexdigest()}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "CKPTKIT_NO_PROGRESS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    import xxhash

    h = xxhash.xxh3_64()
    for _k, v in sorted(ts.model.state_dict().items()):
        h.update(v.numpy().tobytes())
    for _i, ost in sorted(ts.optimizer.state_dict()["state"].items()):  # type: ignore[union-attr]
        for _k, v in sorted(ost.items()):
            h.update(v.numpy().tobytes())
    assert got == {"step": 2, "hash": h.hexdigest()}


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_save_load_verify_on_s3_and_memory(s3_run: str, compress: str | None) -> None:
    state = {"model": _ts().model.state_dict(), "step": 3, "big": torch.randn(3_000_000)}
    for url in (f"{s3_run}/plain", f"memory://ck-{os.getpid()}-{compress}/plain"):
        man = ckptkit.save(state, url, compress=compress)  # type: ignore[arg-type]
        assert man.files
        back = ckptkit.load(url)
        assert torch.equal(back["big"], state["big"]) and back["step"] == 3
        res = ckptkit.verify(url)
        assert res.ok, [f.to_dict() for f in res.findings]


def test_corrupted_object_after_commit_falls_back(s3_run: str) -> None:
    ts = _ts()
    with ckptkit.CheckpointManager(s3_run, keep_last=5) as mgr:
        for s in (1, 2):
            ts.step = s
            mgr.save(ts)
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    key = s3_run.removeprefix("s3://") + "/step-00000002/model.safetensors"
    data = bytearray(fs.cat_file(key))
    data[-3] ^= 0x40
    fs.pipe_file(key, bytes(data))
    fresh = _ts(seed=5)
    res = ckptkit.CheckpointManager(s3_run).restore(fresh)
    assert res is not None and res.step == 1
    assert any("CK-F003" in n for n in res.notes), res.notes
    status = {c.step: c.status for c in ckptkit.CheckpointManager(s3_run, readonly=True).list()}
    assert status == {1: "verified", 2: "corrupt"}
    out = CliRunner().invoke(cli, ["verify", s3_run, "--json"], catch_exceptions=False)
    assert out.exit_code == 1 and "CK-F003" in out.stdout


def test_retention_deletes_only_after_verify(s3_run: str) -> None:
    ts = _ts()
    with ckptkit.CheckpointManager(s3_run, keep_last=2) as mgr:
        for s in (1, 2, 3, 4):
            ts.step = s
            mgr.save(ts)
        assert [c.step for c in mgr.list()] == [3, 4]
    objs = _objects(s3_run)
    assert not any(o.startswith(("step-00000001", "step-00000002")) for o in objs)
    assert fsspec.filesystem("s3").cat_file(
        s3_run.removeprefix("s3://") + "/latest"
    ).strip() == b"step-00000004"


def test_two_writers_and_a_dead_holder(s3_run: str, caplog: pytest.LogCaptureFixture) -> None:
    first = ckptkit.CheckpointManager(s3_run, lease_ttl=2.0)
    first.save(_ts())
    with pytest.raises(ckptkit.LockHeldError, match="run is locked by pid"):
        ckptkit.CheckpointManager(s3_run).save(_ts())
    # The holder dies without releasing (it stops renewing its lease).
    assert first.run.lock is not None
    first.run.lock._stop.set()  # type: ignore[union-attr]
    time.sleep(0.1)
    second = ckptkit.CheckpointManager(s3_run, lock_timeout=20, lease_ttl=2.0)
    ts = _ts()
    ts.step = 7
    with caplog.at_level("WARNING", logger="ckptkit"):
        second.save(ts)
    assert "took over the run lock" in caplog.text
    second.close()
    # the first one is fenced off: it commits nothing more
    ts.step = 8
    with pytest.raises(ckptkit.LockHeldError, match="lock was lost"):
        first.save(ts)
    assert [c.step for c in ckptkit.CheckpointManager(s3_run, readonly=True).list()] == [0, 7]


def test_kill_mid_upload_leaves_no_checkpoint_and_is_cleaned(s3_run: str) -> None:
    ts = _ts()
    with ckptkit.CheckpointManager(s3_run, lease_ttl=2.0) as mgr:
        ts.step = 1
        mgr.save(ts)
    code = textwrap.dedent(
        f"""
        import sys, time, torch, ckptkit
        from ckptkit.storage import upload
        real = upload.MultipartUpload._put_part
        def slow(self, *a, **k):
            print("part", flush=True)  # a multipart upload is in flight: kill me now
            time.sleep(5)
            return real(self, *a, **k)
        upload.MultipartUpload._put_part = slow
        upload.PART_SIZE = 5 << 20
        m = torch.nn.Linear(2048, 2048)
        mgr = ckptkit.CheckpointManager({s3_run!r}, lease_ttl=2.0)
        print("saving", flush=True)
        mgr.save(ckptkit.TrainState(model=m, step=2))
        print("done", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CKPTKIT_NO_PROGRESS": "1"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "saving"
    assert proc.stdout.readline().strip() == "part"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert "step-00000002/manifest.json" not in _objects(s3_run)
    # the next writer takes over the dead writer's lease (its pid is gone from this host),
    # cleans the interrupted save, and the previous checkpoint restores
    mgr = ckptkit.CheckpointManager(s3_run, lock_timeout=30, lease_ttl=2.0)
    ts.step = 3
    mgr.save(ts)
    mgr.close()
    assert not any(o.startswith("step-00000002/") for o in _objects(s3_run))
    res = ckptkit.CheckpointManager(s3_run, readonly=True).restore(_ts(seed=3))
    assert res is not None and res.step == 3


def test_cli_on_s3_urls(s3_run: str) -> None:
    ts = _ts()
    with ckptkit.CheckpointManager(s3_run, keep_last=5) as mgr:
        for s in (1, 2, 3):
            ts.step = s
            mgr.save(ts)
    run = CliRunner()
    res = run.invoke(cli, ["verify", s3_run], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    res = run.invoke(cli, ["inspect", f"{s3_run}/step-00000003"], catch_exceptions=False)
    assert res.exit_code == 0 and "model" in res.output
    res = run.invoke(cli, ["ls", s3_run, "--json"], catch_exceptions=False)
    assert [c["step"] for c in json.loads(res.stdout)["checkpoints"]] == [1, 2, 3]
    res = run.invoke(cli, ["prune", s3_run, "--keep-last", "1"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert [c.step for c in ckptkit.CheckpointManager(s3_run, readonly=True).list()] == [3]
    res = run.invoke(cli, ["rollback", s3_run], catch_exceptions=False)
    assert res.exit_code == 0 and "step-00000003" in res.output


def test_urls_never_become_local_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ckptkit.CkptkitError, match="pip install gcsfs"):
        ckptkit.CheckpointManager("gs://bucket/run")
    with pytest.raises(ckptkit.CkptkitError, match=r"malformed URL.*s3://bucket/run"):
        ckptkit.CheckpointManager("s3:bucket/run")
    with pytest.raises(ckptkit.CkptkitError, match="unknown storage protocol"):
        ckptkit.save({"w": torch.ones(1)}, "nosuchproto://b/c")
    assert list(tmp_path.iterdir()) == []  # no './s3:' or './gs:' directory appeared
    res = CliRunner().invoke(cli, ["verify", "gs://bucket/run"])
    assert res.exit_code == 2 and "gcsfs" in res.output


def test_memory_url_manager_round_trip() -> None:
    url = f"memory://mgr-{os.getpid()}/run"
    ts = _ts()
    with ckptkit.CheckpointManager(url, keep_last=1) as mgr:
        for s in (1, 2):
            ts.step = s
            mgr.save(ts)
        assert [(c.step, c.status) for c in mgr.list()] == [(2, "verified")]
    fresh = _ts(seed=4)
    assert ckptkit.CheckpointManager(url, readonly=True).restore(fresh).step == 2  # type: ignore[union-attr]
    assert _same(fresh, ts)
    assert location(url).fs.exists(location(url).path + "/latest")  # type: ignore[union-attr]


@pytest.mark.parametrize("where", ["s3", "memory"])
def test_dcp_storage_on_object_stores(s3_run: str, where: str) -> None:
    """DCP storage through DCP's own fsspec writer/reader, with ckptkit's digests."""
    url = s3_run if where == "s3" else f"memory://dcp-{os.getpid()}/run"
    ts = _ts()
    ts.storage = "dcp"
    with ckptkit.CheckpointManager(url) as mgr:
        ts.step = 5
        mgr.save(ts)
        [info] = mgr.list()
        assert info.status == "verified"
    man = ckptkit.verify(f"{url}/step-00000005").reports[0].manifest
    assert man is not None and any(f.path == "dcp/.metadata" for f in man.files)
    fresh = _ts(seed=8)
    fresh.storage = "dcp"
    res = ckptkit.CheckpointManager(url, readonly=True).restore(fresh)
    assert res is not None and res.step == 5 and _same(fresh, ts)


def test_async_save_to_s3_stages_then_uploads(s3_run: str) -> None:
    ts = _ts()
    before = {k: v.clone() for k, v in ts.model.state_dict().items()}
    mgr = ckptkit.CheckpointManager(s3_run)
    ts.step = 1
    mgr.save(ts, async_=True)
    with torch.no_grad():  # training goes on while the upload runs
        for p in ts.model.parameters():
            p.add_(1.0)
    mgr.wait()
    mgr.close()
    fresh = _ts(seed=2)
    assert ckptkit.CheckpointManager(s3_run, readonly=True).restore(fresh) is not None
    for k, v in fresh.model.state_dict().items():
        assert torch.equal(v, before[k])


_SIZES = [0, 1, 7, 1000, 300_000, 2_500_000, 9_000_000]


@settings(max_examples=25, deadline=None)
@given(layout=st.lists(st.tuples(st.sampled_from(_SIZES), st.booleans()), min_size=1, max_size=10),
       into=st.booleans())
def test_remote_reads_every_layout_bitwise(layout: list[tuple[int, bool]], into: bool) -> None:
    """The ranged reader (header prefetch, coalesced small tensors, large tensors streamed
    into their memory, gaps hashed) returns every layout bitwise, into live tensors too."""
    state = {
        f"t{i}": torch.randn(n) if flt else torch.randint(0, 9, (n,), dtype=torch.int8)
        for i, (n, flt) in enumerate(layout)
    }
    url = f"memory://layouts-{uuid.uuid4().hex[:10]}/c"
    ckptkit.save(state, url)
    if into:
        live = {k: torch.zeros_like(v) for k, v in state.items()}
        ckptkit.load(url, into=live)
        got = live
    else:
        got = ckptkit.load(url)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert ckptkit.verify(url).ok
