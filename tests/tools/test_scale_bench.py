"""The cost-model benchmark (issue 27 item 4) runs and reports every phase.

One tiny run of ``benchmarks/scale_bench.py``: a real save at one rank, and the simulation
at 2 and 4 ranks of 10 and 20 tensors with a budget so small that every point after the
first is extrapolated, so both paths of the table are exercised. No timing is asserted:
only that the report is whole and well formed, and the per-rank layout's facts (what a
restoring rank reads, the part's size independent of T).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_bench.py"


def test_scale_bench_quick_reports_every_phase(tmp_path: Path) -> None:
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--ranks", "1", "--sim-tensors", "10,20",
         "--budget-s", "0.001", "--json", str(out), "--plot", str(png),
         "--dir", str(tmp_path / "scratch")],
        capture_output=True, text=True, timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    [real] = res["real"]
    assert (real["world"], real["tensors"]) == (1, 10)
    for k in ("commit_s", "commit_rss", "ck_sent", "ck_received", "obj_sent", "obj_received",
              "parse_s", "plan_s", "verify_s", "manifest_bytes", "dcp_metadata_bytes"):
        assert isinstance(real["rank0"][k], (int, float)), k
    points = res["sim"]["points"]
    assert sorted((p["world"], p["tensors"]) for p in points) == [(2, 10), (2, 20), (4, 10), (4, 20)]
    for p in points:
        for ph in ("commit_rank0", "parse", "plan", "partial_read"):
            assert p[ph]["s"] > 0, (p, ph)
        pay = p["payload"]
        assert pay["rank0_received"] == (p["world"] - 1) * pay["rank_sent"]
        assert p["manifest_bytes"] > 0 and p["rank_manifests_bytes"] > 0
        # The per-rank layout: a restoring rank read the root, rank 0's manifest and its
        # own, and restore's choice in this layout is every rank's.
        part = p["partial_read"]
        assert part["root_bytes"] > 0 and part["own_bytes"] > 0 and part["shared_s"] > 0
        assert part["restore_reads"] == p["world"]
    for p in (p for p in points if p["ran"]):
        assert p["commit_rank0"]["readback_s"] > 0 and p["plan_reads"] == p["world"]
        assert p["manifest_bytes"] == pytest.approx(p["partial_read"]["root_bytes"], rel=0.01)
    # What a rank sends rank 0 is a record of its manifest: T does not change it.
    assert len({p["payload"]["rank_sent"] for p in points if p["world"] == 4}) == 1
    ran = [p for p in points if p["ran"]]
    guessed = [p for p in points if not p["ran"]]
    assert ran and guessed, points
    assert all(p["parse"]["extrapolated"] and p["skipped_because"] for p in guessed)
    assert {"commit_rank0 seconds", "parse seconds", "plan seconds", "root manifest size"} <= set(
        res["sim"]["fits"]
    )
    assert res["targets"] and all(isinstance(t["pass"], bool) for t in res["targets"])
    # The report names each target with its verdict; the plot is a PNG.
    assert "Targets:" in r.stdout and ("PASS" in r.stdout or "FAIL" in r.stdout)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
