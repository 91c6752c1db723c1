"""The README's headline of the encoder study ("the README headline follows the new result"), rebuilt
from the study's main page, ``docs/results/encoders.md``.

The headline is a block of the README between two marker comments (:data:`BEGIN`, :data:`END`). It holds the
page's status (complete, or how many runs are finished), the verdict's summary lines (one per task family and
variant), the candidate-default decision and the rows of unequal size (:mod:`~experiments.encoder_study.candidates`), all copied from the page: the README cannot say more
than the page, and a rebuild of the page (``python -m experiments.encoder_study.run --report-only``) rewrites it.
``tests/test_docs.py`` checks that the committed README's block is the one the committed page gives.
"""

from __future__ import annotations

import re
from pathlib import Path

from experiments.encoder_study import plan as cp
from experiments.encoder_study.sizes import UNEQUAL
from rl_transformers.study import files
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.errors import UserError

BEGIN = "<!-- encoder-study headline: generated from docs/results/encoders.md by experiments/encoder_study/run.py -->"
END = "<!-- end of the encoder-study headline -->"
VERDICT = "## Verdict"


def page_status(page: str) -> str:
    """The page's status sentence ("Complete" or "PARTIAL: n of m runs finished; ..."), without its bold marks."""
    found = re.search(r"^\*\*(Complete|PARTIAL:[^*]*)\.\*\*", page, re.MULTILINE)
    if found is None:
        raise ValueError("the page has no status line (**Complete.** or **PARTIAL: ...**)")
    return found.group(1)


def page_verdict(page: str) -> list[tuple[str, str]]:
    """(family, summary line) of the page's verdict section, in page order: the lines that start with a variant's
    bold label ("**Tuned**: ...") under each family's heading."""
    start = page.find(f"\n{VERDICT}")
    if start < 0:
        raise ValueError(f"the page has no '{VERDICT}' section")
    end = page.find("\n## ", start + 1)
    section = page[start : end if end >= 0 else len(page)]
    out, family = [], ""
    for line in section.splitlines():
        if line.startswith("### "):
            family = line[4:].strip()
        elif family and re.match(r"\*\*(Tuned|Untuned)\*\*: ", line):
            out.append((family, line))
    return out


def page_decision(page: str) -> str | None:
    """The page's candidate-default decision, without its bold label; None on a page without it."""
    found = re.search(r"^\*\*Decision\*\*: (.*)$", page, re.MULTILINE)
    return found.group(1) if found else None


def headline(page: str) -> list[str]:
    """The README block (markers included) for a page's text."""
    status = page_status(page)
    summary = "complete" if status == "Complete" else status.removeprefix("PARTIAL: ").split(";")[0]
    lines = [
        BEGIN,
        f"**Encoder study** ([{files.PAGE}](docs/results/{files.PAGE}), {summary}): "
        f"{len(cp.ENCODERS)} encoders, each untuned and tuned with the same budget, on memory-length ladders, "
        f"{len(cp.SEEDS)} seeds, beside {len(cp.CANDIDATES)} candidate defaults run untuned "
        f"({', '.join(f'`{e.name}`' for e in cp.CANDIDATES)}). Per memory length, P(encoder > GRU of the same variant) with `rliable`'s 95 % "
        "CI; *above* GRU: the whole CI lies above 0.5.",
        "",
    ]
    for family, line in page_verdict(page):
        label, _, rest = line.partition(": ")
        lines.append(f"- {family}, {label.strip('*').lower()}: {rest}")
    decided = page_decision(page)
    if decided is not None:
        lines.append(f"- Candidate defaults: {decided}")
    unequal = re.search(rf"^{re.escape(UNEQUAL)}: (.*?) lie outside ([^ ]+) ", page, re.MULTILINE)
    if unequal is not None:
        lines.append(
            f"- Not parameter-matched (outside {unequal.group(2)}; the page's Parameters): {unequal.group(1)}"
        )
    return [*lines, END]


def replace_block(text: str, block: list[str], source: str) -> str:
    """``text`` with the lines from :data:`BEGIN` to :data:`END` replaced by ``block``; a text without both
    markers (in that order) is refused with a :class:`UserError` naming ``source``."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise UserError(
            f"no encoder-study headline block: put the two lines\n  {BEGIN}\n  {END}\nwhere the headline goes, or "
            "leave out --readme",
            source=source,
        )
    return text[:begin] + "\n".join(block) + text[end + len(END) :]


def write_headline(readme: Path, page_file: Path) -> bool:
    """Rewrite ``readme``'s headline block from ``page_file`` (atomic); True when the text changed."""
    try:
        old = Path(readme).read_text()
    except OSError as err:
        raise UserError(
            f"cannot read the README whose headline follows the page: {err}", source="--readme"
        ) from err
    new = replace_block(old, headline(Path(page_file).read_text()), str(readme))
    if new != old:
        atomic_write_text(Path(readme), new)
    return new != old
