"""The documentation cannot rot silently.

- Every relative link in README.md, docs/**/*.md and benchmarks/README.md points at a file that exists, and every
  ``#anchor`` at a heading of the target page (GitHub's slug rule).
- Every command in a fenced shell block (and every inline ``python scripts/...`` or ``rlt <command>`` span) that
  runs ``scripts/<name>.py``, ``python -m <our module>`` or ``rlt <command>`` uses only flags that the script's
  ``--help`` lists (one ``--help`` subprocess per script or command, cached). ``VAR="..."`` assignments in a block are expanded into later ``$VAR``.
- docs/variants.md equals what ``scripts/gen_variants_doc.py`` generates from the registry.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rl_transformers.cli import COMMANDS as RLT_COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    p
    for p in [
        ROOT / "README.md",
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").glob("**/*.md"),
        *(ROOT / "experiments").glob("**/*.md"),
    ]
    if p.is_file()
)
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
OUR_MODULES = ("envs", "offline_data", "rl_transformers", "scripts", "experiments")

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HELP_FLAG = re.compile(r"^\s*(?:-\w,\s+)?(--[\w.-]+)(?:\s+[^\s,]+)?(?:,\s+(--[\w.-]+))?")
"""A flag of ``--help`` and its alias (``--video-dir {None}|STR, --video {None}|STR``)."""
SEPARATORS = {";", "&&", "||", "|", "&", ">", ">>", "2>&1", "do", "done", "then"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the first line of the block's content."""
    lang: str
    lines: tuple[str, ...]


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if ROOT in page.parents else str(page)


def split_page(page: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """Fenced blocks and the prose lines outside them (1-based line numbers)."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        blocks.append(Block(page, start + 1, lang, tuple(lines[start:j])))
        i = j + 1
    return blocks, prose


# -- links ----------------------------------------------------------------------------------------------------
def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading's rendered text: lower case, punctuation dropped (underscores kept), spaces ->
    hyphens. Markup goes first: link syntax keeps its text, emphasis marks (``*``, ``~``, ``_`` at a word's edge)
    vanish, code spans keep every character (``ppo_trxl`` and `` `_banded` `` keep their underscores)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # links keep their text
    parts = re.split(r"(`[^`]*`)", text)
    text = "".join(
        part[1:-1] if part.startswith("`") else re.sub(r"[*~]|(?<!\w)_+|_+(?!\w)", "", part) for part in parts
    ).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_github_slug_keeps_underscores_of_words_and_code() -> None:
    assert github_slug("PPO vs cleanrl's ppo_trxl at an equal parameter count") == (
        "ppo-vs-cleanrls-ppo_trxl-at-an-equal-parameter-count"
    )
    assert github_slug("**Bold** _emphasis_ and `_banded` [link](x.md)") == "bold-emphasis-and-_banded-link"
    assert (
        github_slug("Attention kernels vs PyTorch SDPA (L = 16K)")
        == "attention-kernels-vs-pytorch-sdpa-l--16k"
    )


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in split_page(page)[1]:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    for _, line in split_page(page)[1]:  # explicit <a name="..."> / id="..." anchors
        out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return frozenset(out)


def links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in split_page(page)[1]:
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, m.group(1)))
    return found


def check_link(page: Path, target: str) -> str | None:
    """None when the link resolves, else why not."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
        return None
    path_part, _, anchor = target.partition("#")
    dest = page if not path_part else (page.parent / path_part).resolve()
    if not dest.exists():
        return f"{path_part} does not exist"
    if ROOT in page.parents and ROOT not in dest.parents and dest != ROOT:
        return f"{path_part} points outside the repository"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        close = difflib.get_close_matches(anchor, sorted(anchors(dest)), n=1)
        hint = f" (closest: #{close[0]})" if close else ""
        return f"#{anchor} is not a heading of {rel(dest)}{hint}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    bad = [f"{rel(page)}:{n}: {t}: {why}" for n, t in links(page) if (why := check_link(page, t))]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_link_checker_catches_broken_links(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text("# Top title\n\n## A `code` heading, with punctuation!\n", encoding="utf-8")
    assert check_link(page, "#top-title") is None
    assert check_link(page, "#a-code-heading-with-punctuation") is None
    assert check_link(page, "#nope") is not None
    assert check_link(page, "missing.md") is not None
    assert check_link(page, "https://example.org/x") is None
    assert links(page) == []


# -- commands -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    target: str
    """``scripts/<name>.py`` or ``-m <module>``."""
    flags: tuple[str, ...]


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined (line number of the first physical line)."""
    out: list[tuple[int, str]] = []
    buf, start = "", None
    for offset, raw in enumerate(block.lines):
        if start is None:
            start = block.line + offset
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        out.append((start, buf + raw))
        buf, start = "", None
    if buf and start is not None:
        out.append((start, buf))
    return out


def tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes in an illustrative line
        return line.split("#", 1)[0].split()


def commands_in(page: Path, number: int, words: list[str], variables: dict[str, list[str]]) -> list[Command]:
    expanded: list[str] = []
    for word in words:
        m = re.fullmatch(r"\$\{?(\w+)\}?", word)
        expanded.extend(variables[m.group(1)] if m and m.group(1) in variables else [word])
    found = []
    for i, word in enumerate(expanded):
        target = None
        skip = 1  # words after this one that name the target, not flags
        following = expanded[i + 1 : i + 3]
        if re.fullmatch(r"(\./)?(scripts|benchmarks)/\w+\.py", word):
            target, skip = word.removeprefix("./"), 0
        elif word == "rlt" and following[:1] and following[0] in RLT_COMMANDS:
            target = f"-m rl_transformers.cli {following[0]}"  # the same command, run from this checkout
        elif word == "-m" and following[:1] == ["rl_transformers.cli"] and following[1:2] in ([], ["--help"]):
            target = "-m rl_transformers.cli"
        elif word == "-m" and following[:1] == ["rl_transformers.cli"] and following[1] in RLT_COMMANDS:
            target, skip = f"-m rl_transformers.cli {following[1]}", 2
        elif word == "-m" and following[:1] and following[0].split(".")[0] in OUR_MODULES:
            target = f"-m {following[0]}"
        if target is None:
            continue
        flags = []
        for arg in expanded[i + 1 + skip :]:
            if arg in SEPARATORS or arg.endswith(";"):
                break
            if arg.startswith("--"):
                flags.append(arg.split("=", 1)[0])
        found.append(Command(page, number, target, tuple(flags)))
    return found


def shell_commands(page: Path) -> list[Command]:
    blocks, prose = split_page(page)
    found: list[Command] = []
    for block in blocks:
        if block.lang not in SHELL_LANGS and block.lang != "":
            continue
        variables: dict[str, list[str]] = {}
        for number, line in logical_lines(block):
            words = tokens(line)
            m = re.fullmatch(r"\s*(\w+)=(.*)", line.split("#", 1)[0]) if len(words) == 1 else None
            if m and "=" in words[0]:  # VAR="--a 1 --b 2"
                variables[m.group(1)] = tokens(words[0].split("=", 1)[1])
                continue
            found.extend(commands_in(page, number, words, variables))
    for number, line in prose:  # inline `python scripts/x.py --flag` spans (tables, prose)
        for m in INLINE_CODE.finditer(line):
            code = m.group(2)
            if re.search(
                r"(python|torchrun)\S*\s.*(scripts|benchmarks)/\w+\.py|python\S*\s+-m\s|^rlt\s", code
            ):
                found.extend(commands_in(page, number, tokens(code), {}))
    return found


@functools.cache
def help_flags(target: str) -> frozenset[str]:
    """Flags listed by ``--help`` of a script (or ``python -m`` module), one subprocess per target."""
    args = target.split() if target.startswith("-m ") else [str(ROOT / target)]
    env = {**os.environ, "COLUMNS": "250", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, *args, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{target} --help failed:\n{proc.stderr[-2000:]}"
    flags = set()
    for line in proc.stdout.splitlines():
        for cell in line.split("│"):  # tyro may draw two boxes side by side
            m = HELP_FLAG.match(cell)
            if m:
                flags.update(f for f in m.groups() if f)
    assert flags, f"no flags parsed from {target} --help:\n{proc.stdout[:1000]}"
    return frozenset(flags)


ALL_COMMANDS = [c for page in PAGES for c in shell_commands(page)]
TARGETS = sorted({c.target for c in ALL_COMMANDS})


def test_docs_name_some_commands() -> None:
    assert any(c.target == "scripts/train_gtrxl.py" for c in ALL_COMMANDS)


@pytest.mark.parametrize("target", TARGETS)
def test_documented_flags_exist(target: str) -> None:
    commands = [c for c in ALL_COMMANDS if c.target == target]
    if not target.startswith("-m "):
        assert (ROOT / target).is_file(), f"{target} does not exist; named at " + ", ".join(
            f"{rel(c.page)}:{c.line}" for c in commands
        )
    valid = help_flags(target)
    bad = []
    for c in commands:
        for flag in c.flags:
            if flag not in valid:
                close = difflib.get_close_matches(flag, sorted(valid), n=1)
                hint = f" (closest: {close[0]})" if close else ""
                bad.append(f"{rel(c.page)}:{c.line}: {target} has no flag {flag}{hint}")
    assert not bad, "unknown flags:\n" + "\n".join(bad)


def test_command_parser(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text(
        "```bash\n"
        'COMMON="--seed 1 \\\n  --threads 1"\n'
        "for s in 0 1; do\n"
        "  OMP_NUM_THREADS=1 python scripts/train_dt.py --dataset d $COMMON --x=3  # --not-a-flag\n"
        "done\n"
        "torchrun --nproc_per_node 2 scripts/train_gtrxl.py --ppo.seq-len 8 | tee log\n"
        "python -m envs.scores --episodes 5\n"
        "rlt train-dt --dataset d --seed 1\n"
        "python -m rl_transformers.cli evaluate RUN --episodes 3\n"
        "```\n"
        "A table cell: `python scripts/evaluate.py RUN --episodes 100`, `rlt tune --n-trials 4`, `rlt <command>`.\n",
        encoding="utf-8",
    )
    got = [(c.target, c.flags) for c in shell_commands(page)]
    assert got == [
        ("scripts/train_dt.py", ("--dataset", "--seed", "--threads", "--x")),
        ("scripts/train_gtrxl.py", ("--ppo.seq-len",)),
        ("-m envs.scores", ("--episodes",)),
        ("-m rl_transformers.cli train-dt", ("--dataset", "--seed")),
        ("-m rl_transformers.cli evaluate", ("--episodes",)),
        ("scripts/evaluate.py", ("--episodes",)),
        ("-m rl_transformers.cli tune", ("--n-trials",)),
    ]


# -- generated pages ------------------------------------------------------------------------------------------
def test_variants_doc_is_generated() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_variants_doc
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    committed = (ROOT / "docs" / "variants.md").read_text(encoding="utf-8")
    assert committed == gen_variants_doc.render(), (
        "docs/variants.md is out of date: run `python scripts/gen_variants_doc.py`"
    )


def test_envs_doc_is_generated() -> None:
    pytest.importorskip("popgym")
    pytest.importorskip("minigrid")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_envs_doc
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    committed = (ROOT / "docs" / "envs.md").read_text(encoding="utf-8")
    assert committed == gen_envs_doc.render(), (
        "docs/envs.md is out of date: run `python scripts/gen_envs_doc.py`"
    )


README_MAX_BYTES = 15_000
"""The README is a short user guide (at most 15 KB); the full guide (docs/usage.md), results, design and env
notes live in docs/."""


def test_readme_stays_a_short_user_guide() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size:,} bytes (limit {README_MAX_BYTES:,}): move detail to docs/"
    )


def test_the_readme_headline_follows_the_encoder_study_page() -> None:
    """The README's encoder-study headline is the block the committed page gives (its status and
    verdict lines), so a rebuilt page that is committed without its README block fails here."""
    from experiments.encoder_study.headline import headline, replace_block

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "results" / "encoders.md").read_text(encoding="utf-8")
    assert readme == replace_block(readme, headline(page), "README.md"), (
        "README.md's encoder-study headline is out of date: run `python -m experiments.encoder_study.run --report-only`"
    )
