"""The README and the pages it sends readers to: every relative link and anchor resolves, and the
README keeps its first two commands (install and run the demo; install and run the tests) first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
                *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks" / "results").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where ``](...)`` is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids (lower case, punctuation dropped, spaces to hyphens, -1 for a repeat)
    and explicit ``<a id="...">`` targets."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    found: set[str] = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading or <a id> '{anchor}' in {path.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_pages_the_readme_promises_exist_and_are_linked() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in ("semantics", "trackers", "publication", "frameworks", "bad-input", "redaction", "benchmarks",
                 "limits", "cli", "samples", "testing"):
        assert f"(docs/{page}.md)" in readme, page


def test_the_readme_opens_with_its_two_commands() -> None:
    """The first two code blocks: install and run the demo; install the test dependencies and run
    every test (scripts/test), under the Quick start heading."""
    readme = (ROOT / "README.md").read_text()
    head, _, rest = readme.partition("## Quick start\n")
    assert head.strip() == "# posttrain-metrics" and rest, "the README starts with its Quick start"
    blocks = re.findall(r"^```bash\n(.*?)^```", rest, flags=re.M | re.S)
    assert rest.lstrip().startswith("```bash"), "the first thing under Quick start is the first command"
    demo, tests = blocks[0].strip(), blocks[1].strip()
    assert "pip install -e '.[all]'" in demo and demo.endswith("posttrain-metrics demo"), demo
    assert tests.endswith("./scripts/test") and "\n" not in tests, tests
    between = rest.split(blocks[0], 1)[1].split(blocks[1], 1)[0]
    assert between.strip() == "```\n\n```bash", "nothing comes between the two commands"


def test_the_readme_stays_a_front_door() -> None:
    """Issue 26: the README is at most about 300 lines; details go to docs/."""
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 330, f"README.md has {lines} lines: move details to a docs/ page"
