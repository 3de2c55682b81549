"""The front pages stay front pages: README.md and benchmarks/RESULTS.md show the current state within a
length a reader takes in; history lives in git and in ``benchmarks/results/``, details in ``docs/``."""
import re
import subprocess
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


def _tracked_paths() -> set[str]:
    """Every tracked file, and every folder holding one (with a trailing slash)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {f"{parent}/" for f in files for parent in Path(f).parents if parent != Path(".")}
    return set(files) | folders


def test_architecture_names_only_what_the_tree_holds_and_every_package():
    """ARCHITECTURE.md matches the tree: each module or folder it names in backticks exists (named from the
    project root or from a package, e.g. `actors/groups.py`), and it names every package of async_rl/ and envs/."""
    named = set(re.findall(r"`([A-Za-z0-9_./-]+(?:\.py|/))`", (ROOT / "ARCHITECTURE.md").read_text()))
    tracked = _tracked_paths()
    gone = sorted(n for n in named if not any(p == n or p.endswith(f"/{n}") for p in tracked))
    assert not gone, f"ARCHITECTURE.md names {gone}, which the tree no longer holds"
    packages = {f"{p.parent.relative_to(ROOT)}/" for top in ("async_rl", "envs") for p in (ROOT / top).rglob("__init__.py")}
    unnamed = sorted(d for d in packages if not any(n == d or ("/" in n.rstrip("/") and d.endswith(f"/{n}"))
                                                    or d == f"async_rl/{n}" for n in named))
    assert not unnamed, f"ARCHITECTURE.md does not say what {unnamed} hold"


def _front_and_docs_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(page: Path) -> list[str]:
    """The targets of the page's Markdown links and images, `](target)`, outside fenced code blocks; web and
    mail addresses left out, `#anchors` cut off (a link to an anchor of the page itself is the page)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)]
    return [t for t in targets if t and not re.match(r"(?i)(https?|mailto):", t)]


def test_front_and_docs_pages_link_only_to_what_the_tree_holds():
    """Every relative link in README.md and docs/*.md names a file or folder of the repository, resolved from
    the page's own folder."""
    pages = _front_and_docs_pages()
    assert len(pages) > 1, "docs/ holds no page: the README's details live in docs/*.md"
    broken = []
    for page in pages:
        for target in _relative_links(page):
            path = (page.parent / target).resolve()
            if not (path.is_relative_to(ROOT) and path.exists()):
                broken.append(f"{page.relative_to(ROOT)}: ]({target})")
    assert not broken, f"links to what the tree does not hold: {broken}"
