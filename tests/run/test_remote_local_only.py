"""What works on local files only says so for a remote location (issue 36): the error
names the URL and the fix, never a "no such file" about a URL folded into a relative path
(``memory:/bucket/run``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ckptkit.checkpoint.whatis import not_a_checkpoint, not_a_run
from ckptkit.errors import CkptkitError
from ckptkit.run import directory
from ckptkit.run.layouts.hf import TrainerLayout
from ckptkit.run.layouts.lightning import LightningLayout
from ckptkit.run.layouts.torchtitan import TorchtitanLayout
from ckptkit.storage import fs

URL = "memory://bucket/run"


def test_adopting_a_remote_checkpoint_names_it_and_the_fix() -> None:
    with pytest.raises(CkptkitError) as e:
        directory.adopt(f"{URL}/checkpoint-5")
    assert e.value.path == f"{URL}/checkpoint-5"
    assert "adopting a foreign checkpoint works on a local filesystem only" in e.value.what
    assert e.value.hint is not None and "local directory" in e.value.hint


@pytest.mark.parametrize(
    "listing",
    [TrainerLayout().entries, TorchtitanLayout().entries, LightningLayout().leftovers],
    ids=["hf-trainer", "torchtitan", "lightning"],
)
def test_a_framework_layout_names_a_remote_root(listing: Callable[[fs.Location], object]) -> None:
    with pytest.raises(CkptkitError, match="layout works on a local filesystem only") as e:
        listing(fs.location(URL))
    assert e.value.path == URL


def test_what_a_url_is_is_left_to_the_store() -> None:
    assert not_a_checkpoint(URL) is None
    assert not_a_run(URL) is None
