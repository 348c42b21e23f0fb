"""A save's collectives scale with the job (issue 27 item 2): every rank but rank 0 sends
its own record and receives rank 0's answers, the same bytes at any world size; rank 0
alone receives one record per rank. Before, the commit all-gathered every rank's file table
to every rank: each rank received the whole job's tables (O(world) per rank, O(world²) in
all).

Measured with :func:`ckptkit.collective.metered` around one synchronous save on 2 and 4
gloo ranks (the byte counts are the collectives' payloads as pickled; tensor collectives
count their tensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _launch import launch

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def traffic(tmp_path: Path, world: int) -> list[dict[str, Any]]:
    codes, res = launch(
        world, tmp_path / f"out{world}", scenario="save", ckpt=str(tmp_path / f"ck{world}")
    )
    assert codes == [0] * world, res
    return [r["traffic"] for r in res if r is not None]


def total(t: dict[str, Any], way: str) -> int:
    return sum(t[way].values())


def test_a_ranks_save_traffic_does_not_grow_with_the_world(tmp_path: Path) -> None:
    two, four = traffic(tmp_path, 2), traffic(tmp_path, 4)
    assert len(two) == 2 and len(four) == 4
    for t in two + four:
        # No collective of a save sends every rank the others' records.
        assert "all_gather" not in t["calls"], t
    # Rank 1 at a world of 2 and ranks 1-3 at a world of 4: the same bytes received (rank
    # 0's broadcasts: the temporary directory, the outcome, the health; yes/no all-reduces)
    # and no more sent (a rank writes a smaller share of the replicated state in a larger
    # world, so its record is no larger).
    base_in, base_out = total(two[1], "received"), total(two[1], "sent")
    assert base_in > 0 and base_out > 0
    for r, t in enumerate(four[1:], start=1):
        assert total(t, "received") == pytest.approx(base_in, rel=0.02), (r, t, two[1])
        assert total(t, "sent") <= base_out * 1.02, (r, t, two[1])
    # Rank 0 receives a record from every other rank: more at a larger world.
    assert total(four[0], "received") > total(two[0], "received")
    assert total(four[0], "received") >= 3 * min(total(t, "sent") for t in four[1:]) * 0.9
