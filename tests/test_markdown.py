"""popgrpo.markdown.md_table: the one Markdown table writer."""

import pytest

from popgrpo.markdown import md_table


def test_md_table_writes_header_rule_and_rows_with_str():
    assert md_table(["a", "b"], [[1, 2.5], ["x", None]]) == "| a | b |\n| --- | --- |\n| 1 | 2.5 |\n| x | None |"


def test_md_table_aligns_columns_right_when_asked():
    assert md_table(["m", "n"], [], align="lr").splitlines()[1] == "| --- | ---: |"
    with pytest.raises(ValueError, match="one of 'l' or 'r'"):
        md_table(["m", "n"], [], align="l")
