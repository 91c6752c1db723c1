"""Markdown tables (GitHub's pipe tables) from headers and rows: the one renderer of every generated page's tables.

A table is a header line, a separator line and one line per row; each line is ``| a | b |`` (cells joined by
``" | "``, no padding, so a cell's text is what the caller formatted). The separator has one mark per column:
``---`` (left, the default), ``---:`` (right) or ``:---:`` (centre), given by ``align``, one letter per column
(``"lrr"``). Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["markdown_row", "markdown_table"]

_MARKS = {"l": "---", "r": "---:", "c": ":---:"}


def markdown_row(cells: Iterable[object]) -> str:
    """One table line: ``| c1 | c2 | ... |`` (each cell with ``str``)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(
    headers: Sequence[object], rows: Iterable[Sequence[object]] = (), align: str | None = None
) -> list[str]:
    """The lines of a table: header, separator (``align``: one of l / r / c per column, default all l), rows.

    Every row must have one cell per header; a wrong count or an unknown alignment letter is a ``ValueError``.
    """
    align = "l" * len(headers) if align is None else align
    if len(align) != len(headers) or any(a not in _MARKS for a in align):
        raise ValueError(
            f"align {align!r} must give one of {'/'.join(_MARKS)} for each of the {len(headers)} columns"
        )
    lines = [markdown_row(headers), "|" + "|".join(_MARKS[a] for a in align) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a row has {len(row)} cells for {len(headers)} columns: {list(row)!r}")
        lines.append(markdown_row(row))
    return lines
