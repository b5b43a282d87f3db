"""Stored bits stay CPU-independent: every ``.pt`` file of tests/data is listed in
``_helpers.STORED`` (with what in it may be compared bit for bit), and tests read them only
through ``_helpers.load_stored`` (whose list carries the rule) or mixprec's own loaders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

import pytest

from _helpers import DATA, STORED, TESTS, load_stored

#: a path to a ``.pt`` file of tests/data (``DATA / "x.pt"``, ``... / "data" / f"y.pt"``)
_STORED_PATH = re.compile(r"(\bDATA\b|[\"']data[\"'])\s*/\s*f?[\"'][^\"']*\.pt[\"']")
#: the calls that may take one: mixprec's own loaders (what they load is then compared)
_ALLOWED = ("load_stored(", ".load_state(")


def test_every_stored_file_is_listed() -> None:
    on_disk = {p.name for p in DATA.glob("*.pt")}
    assert on_disk == set(STORED), (
        f"not listed in _helpers.STORED: {sorted(on_disk - set(STORED))}; "
        f"listed but missing: {sorted(set(STORED) - on_disk)}")


def _direct_loads(root: Path) -> List[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name in ("_helpers.py", Path(__file__).name) or DATA in path.parents:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _STORED_PATH.search(line) and not any(c in line for c in _ALLOWED):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_tests_read_stored_files_only_through_load_stored() -> None:
    assert _direct_loads(TESTS) == []


def test_a_direct_load_and_an_unlisted_file_are_caught(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        'state = torch.load(DATA / "new.pt", weights_only=True)\n'
        'path = REPO / "tests" / "data" / f"b_{case}.pt"\n'
        'trainer.load_state(DATA / "c.pt")\n')
    assert len(_direct_loads(tmp_path)) == 2
    with pytest.raises(KeyError, match="not listed in _helpers.STORED"):
        load_stored("new_fixture.pt")
