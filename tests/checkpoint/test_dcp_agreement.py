"""Issue 39 item 4: ``ckptkit verify`` ⇔ ``ckptkit.dcp.load`` ⇔ ``ckptkit.dcp.check``.

For every hostile ``ckptkit.dcp`` directory of the catalogue (tests/hostile_dcp.py) the
three readers refuse it with the same code: ``check`` and ``load`` raise it, ``verify``
reports it as an error finding, and ``ckptkit verify`` exits 1 without a traceback. No
case runs pickled code.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hostile_dcp import CASES, MARKER, fresh, train_state

import ckptkit
import ckptkit.checkpoint.dcp
from ckptkit.cli import main
from ckptkit.errors import CkptkitError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("dcp-template") / "step-7"
    ckptkit.dcp.save(train_state(), d, step=7)
    return d


def test_the_template_is_good_to_every_reader(template: Path) -> None:
    assert ckptkit.verify(template).ok
    assert ckptkit.dcp.check(template).step == 7
    assert ckptkit.dcp.load(fresh(), template).step == 7


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_check_and_load_refuse_with_the_same_code(
    template: Path, tmp_path: Path, name: str
) -> None:
    case = CASES[name]
    d = tmp_path / "step-7"
    shutil.copytree(template, d)
    case.damage(d)

    with pytest.raises(CkptkitError) as checked:
        ckptkit.dcp.check(d)
    with pytest.raises(CkptkitError) as loaded:
        ckptkit.dcp.load(fresh(), d)
    report = ckptkit.verify(d)
    errors = {f.code for r in report.reports for f in r.findings if f.severity == "error"}
    assert (checked.value.code, loaded.value.code) == (case.code, case.code), (
        f"check: {checked.value}; load: {loaded.value}"
    )
    assert not report.ok and case.code in errors, f"verify found {sorted(errors)}"

    res = CliRunner().invoke(main, ["verify", str(d)], catch_exceptions=True)
    assert res.exit_code == 1 and (res.exception is None or isinstance(res.exception, SystemExit))
    assert "Traceback" not in res.output, res.output
    assert not (tmp_path / MARKER).exists(), "pickled code ran"
