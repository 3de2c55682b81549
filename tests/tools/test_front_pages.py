"""The front pages stay front pages: README.md and benchmarks/RESULTS.md show the current state within a
length a reader takes in; history lives in git and in ``benchmarks/results/``, details in ``docs/``."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"README.md": 300, "benchmarks/RESULTS.md": 400}


@pytest.mark.parametrize("page", sorted(LIMITS))
def test_front_page_stays_within_its_length(page):
    lines = (ROOT / page).read_text().splitlines()
    assert len(lines) <= LIMITS[page], (f"{page} has {len(lines)} lines, over its {LIMITS[page]}: move details to docs/ "
                                       "(README) or history to git and benchmarks/results/ (RESULTS)")


def test_results_page_states_where_history_lives():
    header = "\n".join((ROOT / "benchmarks/RESULTS.md").read_text().splitlines()[:8])
    assert "git" in header and "benchmarks/results/" in header, header
