"""The comparison table: one row per run, every column named with its unit.

Cells are taken from summary.json as stored (no recomputation), so the table shows what training
measured; only MFU is rescaled, from a fraction to percent. The report adds two columns that need the
other runs or a price, scaling efficiency and cost (analysis/scaling.py).
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Callable
from dataclasses import dataclass

from analysis.runs import Run, recorded
from training.records.schema import TABLE, TableColumn

Cell = str | int | float | bool | None


@dataclass(frozen=True)
class Column:
    """A table column: its header (with unit), how to get its value, how to show it in markdown."""

    header: str
    value: Callable[[Run], Cell]
    fmt: Callable[[Cell], str]


def _fact(key: str) -> Callable[[Run], Cell]:
    return lambda run: run.fact(key)


def _figure(column: TableColumn) -> Callable[[Run], Cell]:
    """A whole-run figure as stored; a fraction shown in percent is the only one rescaled."""

    def value(run: Run) -> Cell:
        stored = recorded(run.total, column.metric)
        if column.percent and stored is not None:
            return 100.0 * stored
        return stored

    return value


def fixed(decimals: int) -> Callable[[Cell], str]:
    """Thousands separators and a fixed number of decimals; n/a for a missing value."""

    def fmt(value: Cell) -> str:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return "n/a" if value is None else str(value)
        return f"{value:,.{decimals}f}"

    return fmt


def text(value: Cell) -> str:
    return "n/a" if value is None else str(value)


def metric_column(column: TableColumn) -> Column:
    """The column of a whole-run figure, as the run schema declares it (header, unit, decimals)."""
    return Column(column.header, _figure(column), fixed(column.decimals))


# The run's identity, its whole-run figures (the run schema's TABLE, in its order), then the facts
# that make runs comparable.
COLUMNS: tuple[Column, ...] = (
    Column("run", lambda run: run.path.name, text),
    Column("strategy", lambda run: run.arm, text),  # ddp#2: the second arm of ddp in an A/A experiment
    Column("complete", lambda run: run.complete, lambda v: "yes" if v else "**no (partial)**"),
    *(metric_column(column) for column in TABLE),
    Column("world size (devices)", _fact("world_size"), text),
    Column("global batch (tokens)", _fact("global_batch_tokens"), fixed(0)),
    Column("tokens trained", _fact("tokens_trained"), fixed(0)),
    Column("precision", _fact("precision"), text),
    Column("seed", _fact("seed"), text),
    Column("data (content key)", lambda run: str(run.fact("data_key"))[:12] if run.fact("data_key") else None, text),
)


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Cell]]  # raw values, full precision
    shown: list[list[str]]  # the same values formatted for reading

    def column(self, header: str) -> list[Cell]:
        index = self.headers.index(header)
        return [row[index] for row in self.rows]


def build_table(runs: list[Run], columns: tuple[Column, ...] = COLUMNS) -> Table:
    rows = [[column.value(run) for column in columns] for run in runs]
    shown = [[column.fmt(cell) for column, cell in zip(columns, row)] for row in rows]
    return Table(headers=[column.header for column in columns], rows=rows, shown=shown)


def to_markdown(table: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    # Text columns left, numbers right: numbers line up by their last digit.
    align = ["---:" if _is_numeric(table, i) else "---" for i in range(len(table.headers))]
    return "\n".join([line(table.headers), line(align), *(line(row) for row in table.shown)]) + "\n"


def to_csv(table: Table) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.headers)
    for row in table.rows:
        # repr keeps every digit of a float; an empty cell is the usual CSV spelling of "missing".
        writer.writerow(["" if cell is None else repr(cell) if isinstance(cell, float) else cell for cell in row])
    return buffer.getvalue()


def to_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.headers)
    body = []
    for shown in table.shown:
        cells = []
        for i, cell in enumerate(shown):
            css = ' class="num"' if _is_numeric(table, i) else ""
            cells.append(f"<td{css}>{html.escape(cell.replace('**', ''))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def _is_numeric(table: Table, index: int) -> bool:
    values = [row[index] for row in table.rows if row[index] is not None]
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
