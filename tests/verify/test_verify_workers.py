"""``verify --workers N`` and the rank-parallel verify report what one reader reports.

The byte-level work (reading, hashing, header parse, NaN/Inf scan) is spread over threads
(``workers``) or ranks (``group``, here ranks as threads: tests/threadranks.py); the
checks run once, on rank 0, over the merged scans. These tests hold the whole JSON report
(timings aside) equal to a one-worker verify on a run holding good and damaged
checkpoints. The real torchrun launch is tests/verify/test_verify_torchrun.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from damaged_run import make_damaged_run, report_json, shard
from threadranks import on_ranks

import ckptkit
from ckptkit import codes
from ckptkit.checkpoint import manifest_io
from ckptkit.cli import main
from ckptkit.format import manifest as mf
from ckptkit.verify.context import CheckContext
from ckptkit.verify.ranked import ScanRecord, split
from ckptkit.verify.runner import verify


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_damaged_run(tmp_path_factory.mktemp("verify-workers") / "run")


@pytest.fixture(scope="module")
def one_reader(damaged_run: Path) -> dict[str, Any]:
    return report_json(verify(damaged_run, workers=1))


def test_the_damaged_run_has_one_harm_per_step(one_reader: dict[str, Any]) -> None:
    """The baseline the other tests compare against finds what was done (so an agreement
    between readers that both miss everything cannot pass)."""
    got = {
        Path(r["path"]).name: {f["code"] for f in r["findings"] if f["severity"] == "error"}
        for r in one_reader["reports"]
    }
    assert got["step-00000001"] == set()
    assert codes.F003 in got["step-00000002"]
    assert codes.F002 in got["step-00000003"]
    assert codes.F001 in got["step-00000004"]
    assert got["step-00000005"] == {codes.M001}
    assert codes.S010 in got["step-00000006"]
    assert {codes.F003, codes.F005} <= got["step-00000007"]


@pytest.mark.parametrize("workers", [2, 5])
def test_more_workers_give_the_same_report(
    damaged_run: Path, one_reader: dict[str, Any], workers: int
) -> None:
    assert report_json(verify(damaged_run, workers=workers)) == one_reader


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_sharing_the_reading_give_the_same_report_on_rank_0(
    damaged_run: Path, one_reader: dict[str, Any], world: int
) -> None:
    sent: list[tuple[int, Any]] = []

    def run(g: Any) -> Any:
        gather = g.gather

        def spy(obj: Any, dst: int = 0) -> Any:
            sent.append((g.rank, obj))
            return gather(obj, dst)

        g.gather = spy
        return verify(damaged_run, group=g, workers=1)

    results = on_ranks(world, run)
    assert report_json(results[0]) == one_reader
    assert all(r.reports == [] for r in results[1:]), "rank 0 alone reports"
    # The ranks did read: every file of a checkpoint with a manifest was scanned by one
    # rank and reached rank 0 as a record (none was left for rank 0 to scan again).
    with_manifest = [c for c in sorted(damaged_run.iterdir()) if (c / "manifest.json").exists()]
    assert len(sent) == world * len(list(damaged_run.iterdir()))
    assert sum(ident is None for _, (ident, _, _) in sent) == world, "step 5: no manifest"
    by_rank: dict[int, list[str]] = {}
    for rank, (_, failed, records) in sent:
        assert not failed
        by_rank.setdefault(rank, []).extend(r.path for r in records)
    assert all(by_rank[r] for r in range(world)), "every rank had a share"
    listed = sum(len(manifest_io.read(c).files) for c in with_manifest)
    assert sum(len(v) for v in by_rank.values()) == listed


def test_a_checkpoint_given_alone_gets_the_same_report_from_ranks(damaged_run: Path) -> None:
    for step in ("step-00000001", "step-00000005", "step-00000007"):
        alone = report_json(verify(damaged_run / step, workers=1))
        ranked = on_ranks(2, lambda g, s=step: verify(damaged_run / s, group=g))[0]
        assert report_json(ranked) == alone, step


def test_split_gives_every_file_to_one_rank_balancing_bytes() -> None:
    sizes = [900, 10, 500, 500, 300, 200, 200, 7, 0, 120]
    files = [mf.FileEntry(path=f"f{i}", size=n, xxh3_128="0" * 32) for i, n in enumerate(sizes)]
    shares = split(files, 3)
    assert split(list(reversed(files)), 3) == shares, "the split ignores the listing order"
    assert sorted(f.path for s in shares for f in s) == sorted(f.path for f in files)
    loads = [sum(f.size for f in s) for s in shares]
    assert max(loads) - min(loads) <= max(sizes)
    assert split(files, 1) == [sorted(files, key=lambda f: (-f.size, f.path))]
    assert split(files[:2], 4)[2:] == [[], []], "more ranks than files: some read nothing"


def test_a_scan_record_carries_what_the_checks_read(damaged_run: Path) -> None:
    d = damaged_run / "step-00000007"  # the retyped header: it must travel whole
    m = manifest_io.read(d)
    listed: dict[str, dict[str, Any]] = {}
    for te in m.tensors:
        listed.setdefault(te.file, {})[te.key] = te.header_entry()
    for s in CheckContext(root=d, manifest=m).scan_files(m.files):
        rec = ScanRecord.of(s, listed.get(s.entry.path, {}))
        back = rec.scan(s.entry, listed.get(s.entry.path, {}))
        assert rec.header_listed == (s.header is not None and s.header == listed[s.entry.path])
        for name in ("exists", "outside", "not_regular", "size", "digest", "header",
                     "header_error", "header_error_code", "io_error", "io_error_code"):
            assert getattr(back, name) == getattr(s, name), (s.entry.path, name)
        if s.finite is None:
            assert back.finite is None
        else:
            assert back.finite is not None
            assert (back.finite.nonfinite, back.finite.unchecked) == (
                s.finite.nonfinite, s.finite.unchecked
            )
    retyped = shard(d, "model").name
    scan = {s.entry.path: s for s in CheckContext(root=d, manifest=m).scan_files(m.files)}
    assert ScanRecord.of(scan[retyped], listed[retyped]).header is not None


def test_a_nan_found_by_a_rank_reaches_rank_0(damaged_run: Path) -> None:
    d = damaged_run / "step-00000006"
    m = manifest_io.read(d)
    nan_file = shard(d, "model").name
    s = next(s for s in CheckContext(root=d, manifest=m).scan_files(m.files)
             if s.entry.path == nan_file)
    rec = ScanRecord.of(s, {})
    assert rec.nonfinite and rec.header is not None  # {} is not its header: sent whole
    assert len(json.dumps(rec.nonfinite)) < 200


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["verify", *args], catch_exceptions=False)
    return r.exit_code, r.output


def test_cli_workers_report_is_the_one_worker_report(damaged_run: Path) -> None:
    code1, out1 = _cli(str(damaged_run), "--json", "--workers", "1")
    code3, out3 = _cli(str(damaged_run), "--json", "--workers", "3")
    code_auto, out_auto = _cli(str(damaged_run), "--json", "--workers", "auto")
    assert code1 == code3 == code_auto == 1

    def strip(out: str) -> Any:
        rep = json.loads(out)
        for r in rep["reports"]:
            r.pop("seconds")
        return rep

    assert strip(out1) == strip(out3) == strip(out_auto)


@pytest.mark.parametrize("bad", ["-1", "many", "1.5"])
def test_cli_refuses_a_worker_count_that_is_not_one(damaged_run: Path, bad: str) -> None:
    code, out = _cli(str(damaged_run / "step-00000001"), "--workers", bad)
    assert code == 2 and "--workers" in out and "auto" in out


def test_cli_torchrun_outside_torchrun_says_how_to_start_it(
    damaged_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert not torch.distributed.is_initialized()
    r = CliRunner().invoke(main, ["verify", str(damaged_run / "step-00000001"), "--torchrun"])
    assert r.exit_code == 2
    assert "torchrun --nproc-per-node" in r.output and "Traceback" not in r.output


def test_the_library_refuses_fewer_than_one_worker(damaged_run: Path) -> None:
    with pytest.raises(ckptkit.CkptkitError, match="workers=0") as e:
        verify(damaged_run / "step-00000001", workers=0)
    assert e.value.hint and "workers >= 1" in e.value.hint
