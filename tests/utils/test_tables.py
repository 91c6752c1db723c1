"""utils.tables: pipe tables written out by hand, the alignment marks and the refusals."""

from __future__ import annotations

import pytest

from rl_transformers.utils.tables import markdown_row, markdown_table


def test_a_table_is_header_separator_and_rows_without_padding() -> None:
    lines = markdown_table(["encoder", "score", "n"], [["gru", "0.50", 3], ["`full`", "", 10]])
    assert lines == [
        "| encoder | score | n |",
        "|---|---|---|",
        "| gru | 0.50 | 3 |",
        "| `full` |  | 10 |",
    ]


def test_alignment_letters_give_the_separator_marks() -> None:
    assert markdown_table(["a", "b", "c"], align="lrc")[1] == "|---|---:|:---:|"
    assert markdown_table(["a"]) == ["| a |", "|---|"]


def test_a_row_is_cells_joined_by_pipes() -> None:
    assert markdown_row(["x", 1.5, None]) == "| x | 1.5 | None |"


@pytest.mark.parametrize(
    ("rows", "align", "match"), [([["only one"]], None, "1 cells for 2"), ([], "lx", "align")]
)
def test_a_malformed_table_is_refused(rows: list[list[str]], align: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        markdown_table(["a", "b"], rows, align)
