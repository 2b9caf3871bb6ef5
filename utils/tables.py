"""Measurement rows as tables that render as HTML on the site and as aligned text in a terminal."""
import html

HEADERS = {"median_ms": "median ms", "p10_ms": "p10 ms", "p90_ms": "p90 ms", "eager_ms": "eager ms",
           "gpu_ms": "GPU ms", "compile_s": "compile s", "peak_mem_gb": "memory GB", "graph_breaks": "breaks",
           "max_abs_err": "max error", "speedup": "speedup"}


def cell_text(row, column):
    """One cell as text: numbers rounded for reading, a speedup with its spread, a missing value as a dash (chapter 1)."""
    value = row.get(column)
    if column == "speedup" and value is not None:
        lo, hi = row.get("speedup_lo"), row.get("speedup_hi")
        spread = f" ({lo:.2f}-{hi:.2f})" if lo is not None and hi is not None and lo != hi else ""
        return f"{value:.2f}x{spread}"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:,.{max(0, 3 - len(str(int(abs(value)))))}f}"
    return str(value)


class Table:
    """Rows shown as an HTML table in a notebook and on the site, as text elsewhere (chapter 1)."""

    def __init__(self, rows, columns):
        self.columns = list(columns)
        self.cells = []
        for row in rows:
            if row.get("status", "ok") == "ok":
                self.cells.append([cell_text(row, c) for c in self.columns])
            else:  # a row that did not measure says why, across the measurement columns
                label = [cell_text(row, c) for c in self.columns[:2]]
                why = row["status"] + (f": {row['reason']}" if row.get("reason") else "")
                self.cells.append(label + [why] + [""] * (len(self.columns) - 3))
        self.headers = [HEADERS.get(c, c.replace("_", " ")) for c in self.columns]

    def _repr_html_(self):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = ""
        for cells in self.cells:
            if self._is_note(cells):
                body += (f"<tr><td>{html.escape(cells[0])}</td><td>{html.escape(cells[1])}</td>"
                         f"<td colspan=\"{len(cells) - 2}\">{html.escape(cells[2])}</td></tr>")
            else:
                body += "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        return f'<table class="measurements"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def __repr__(self):
        measured = [r for r in self.cells if not self._is_note(r)]
        widths = [max([len(h)] + [len(r[i]) for r in measured]) for i, h in enumerate(self.headers)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(self.headers, widths))]
        for r in self.cells:
            if self._is_note(r):  # the label columns, then why it did not measure
                lines.append("  ".join(c.rjust(w) for c, w in zip(r[:2], widths)) + "  " + r[2])
            else:
                lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        return "\n".join(lines)

    @staticmethod
    def _is_note(cells):
        """Whether a row of cells is a label and a status note rather than measurements."""
        return len(cells) > 3 and cells[3:] == [""] * (len(cells) - 3)


COLUMNS = ("workload", "variant", "median_ms", "eager_ms", "speedup", "gpu_ms", "compile_s", "peak_mem_gb", "graph_breaks",
           "recompiles", "max_abs_err")


def show_table(rows, columns=COLUMNS):
    """Display measurement rows as a table; rows that failed or were skipped show why (chapter 1)."""
    from IPython.display import display

    display(Table(rows, columns))
