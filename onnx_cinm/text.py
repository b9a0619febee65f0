"""Text for people: names from a model made safe to print, numbers with SI prefixes, and tables.

Node, tensor and output names are arbitrary strings in ONNX. Printed raw, a newline in a name
breaks a table row in two, and a Unicode bidi override (U+202E and friends, the "Trojan Source"
characters, CVE-2021-42574) reorders the rest of the line as a terminal shows it. Every table
and message that shows such a name passes it through :func:`printable`; :func:`table` does it
for every cell. :func:`si` is the one number formatter. :func:`fold_rows` folds the rows of
one source op repeated with the same figures (an unrolled recurrence's steps) into one row
with a count. :func:`progress_bar` is the one progress bar of long steps.
"""
from __future__ import annotations

import math
import re
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def _safe(c: str) -> bool:
    return c.isprintable() and unicodedata.category(c) != "Cf"


def printable(text: str) -> str:
    """``text`` with control characters (newline, tab, ESC, ...) and Unicode format characters
    (category Cf: bidi overrides and isolates, zero-width joiners) written as Python escapes
    (``\\n``, ``\\u202e``); other text, accents and CJK included, unchanged."""
    text = str(text)
    if all(_safe(c) for c in text):
        return text
    return "".join(c if _safe(c) else c.encode("unicode_escape").decode("ascii") for c in text)


#: SI prefixes :func:`si` uses, largest first (``u`` for micro: plain ASCII for terminals and logs).
_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0), ("m", 1e-3), ("u", 1e-6),
             ("n", 1e-9), ("p", 1e-12), ("f", 1e-15), ("a", 1e-18))


def si(x: float | None, unit: str = "") -> str:
    """``x`` with an SI prefix (``a`` .. ``T``) and three significant digits, then ``unit``:
    ``si(1.5e-6, "s")`` is ``"1.5 us"``, ``si(2.5e9, "FLOP")`` ``"2.5 GFLOP"``, ``si(0, "J")``
    ``"0 J"``, ``si(512)`` ``"512"``, ``si(4e-13, "J")`` ``"400 fJ"`` (two MVMs of OCC's
    crossbar, 0.2 pJ each); negative numbers keep their sign, numbers below an atto are written in
    exponent form, and None (a figure not known) is ``"-"``. The one number
    formatter of every table and message."""
    if x is None:
        return "-"
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}".rstrip()
    for prefix, scale in _PREFIXES:
        if abs(x) >= scale * (1 - 5e-4):  # 999.96 rounds to "1 k", not "1e+03"
            return f"{x / scale:.3g} {prefix}{unit}".rstrip()
    return f"{x:.2e} {unit}".rstrip()


@dataclass(frozen=True)
class Column:
    """One column of :func:`table`.

    Attributes:
        title: the header cell.
        align: ``"<"`` (left, for names) or ``">"`` (right, for numbers).
        width: most characters a cell shows (None: all of them); a longer cell is cut.
        keep: which end of a cut cell stays: ``"start"`` or ``"end"`` (e.g. the last dims of a
            long shape).
        fit: the column is as wide as its widest cell up to this many characters (None: no
            limit); a longer cell spans the empty cells after it when it fits there (a total
            row's label), else it is shown whole on a line of its own, and the rest of its
            row follows on the next line in the columns of the others.
    """

    title: str
    align: str = "<"
    width: int | None = None
    keep: str = "start"
    fit: int | None = None

    def cell(self, value) -> str:
        """``value`` as this column shows it: ``str``, :func:`printable`, cut to ``width``."""
        text = printable(value if isinstance(value, str) else str(value))
        if self.width is not None and len(text) > self.width:
            text = text[-self.width:] if self.keep == "end" else text[:self.width]
        return text


def table(columns: Sequence[Column | str], rows: Iterable[Sequence], *, totals: Iterable[Sequence] = (),
          notes: Iterable[str] = (), header: bool = True, indent: str = "") -> str:
    """A text table for a person: a header line and a rule of ``-`` under it, one line per row,
    then (if any) a rule, the ``totals`` rows and the ``notes`` lines as they are; with
    ``header`` false, no header and no rules. Every cell goes through :meth:`Column.cell` (so
    names are :func:`printable`); each column is as wide as its widest cell (see
    :attr:`Column.fit`), columns are two spaces apart, and no line ends in spaces. A plain
    string column is a left-aligned :class:`Column`; a row may have fewer cells than columns
    (the rest are empty). The one table printer of the
    reports, the profile, ``optimize``'s summary and ``onnx-cinm devices``."""
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    body = [[c.cell(v) for c, v in zip(cols, r)] for r in rows]
    tail = [[c.cell(v) for c, v in zip(cols, r)] for r in totals]
    head = [c.title for c in cols] if header else []
    widths = [max([len(r[i]) for r in [head] + body + tail
                   if i < len(r) and (c.fit is None or len(r[i]) <= c.fit)], default=0)
              for i, c in enumerate(cols)]

    def line(cells: list) -> str:
        parts = [f"{v:{c.align}{w}}" for c, v, w in zip(cols, cells, widths)]
        return (indent + "  ".join(parts)).rstrip()

    def lines(cells: list) -> list[str]:
        # a cell past its column's fit spans the empty cells after it when it fits there (a
        # profile's 'total host (6 partitions, 22 nodes; ...)' over the op, device and mode
        # columns); else it stands whole on a line of its own and the row's later cells
        # follow on the next line, in their columns (a long kernel name shifted them)
        for i, (c, v, w) in enumerate(zip(cols, cells, widths)):
            if c.fit is not None and len(v) > w and any(cells[i + 1:]):
                j, room = i + 1, w
                while j < len(cells) and not cells[j]:
                    room += 2 + widths[j]
                    j += 1
                if len(v) <= room:  # (j > i + 1: the cell is longer than its own width)
                    parts = [f"{u:{k.align}{x}}" for k, u, x in zip(cols, cells[:i], widths)]
                    parts.append(f"{v:{c.align}{room}}")
                    parts += [f"{u:{k.align}{x}}" for k, u, x in
                              zip(cols[j:], cells[j:], widths[j:])]
                    return [(indent + "  ".join(parts)).rstrip()]
                return [line(cells[:i + 1])] + lines([""] * (i + 1) + list(cells[i + 1:]))
        return [line(cells)]

    out = [line(head)] if header else []
    rule = indent + "-" * (len(out[0]) - len(indent) if out else 0)  # as long as the header
    if header:
        out.append(rule)
    notes = list(notes)
    out += [text for r in body for text in lines(r)]
    if header and (tail or notes):
        out.append(rule)
    out += [text for r in tail for text in lines(r)]
    out += notes
    return "\n".join(out)


#: A node name that numbers the copies of one source op: ``<source>/<Op>`` or
#: ``<source>/<Op>_<N>`` (a lowered node's nodes, as :class:`onnx_cinm.rewrite.Builder` names
#: them: ``lstm_node_3/Gemm_17``, the 17th of the Gemms of an unrolled recurrence), or
#: ``host partition <N>`` (the runtime's partitions, an If branch's prefixed). A plain
#: ``Conv_2`` is an exporter's name of a source op of its own, not a copy.
_COPY = re.compile(r"(?P<op>.+/[A-Z][A-Za-z0-9]*)(?:_\d+)?|(?P<part>.*host partition) \d+")


def source_name(name: str) -> str | None:
    """The source op node ``name`` is a copy of (:data:`_COPY`), None for a name that names
    no copy: ``lstm_node_3/Gemm_17`` -> ``lstm_node_3/Gemm``, ``host partition 12`` ->
    ``host partition``, ``Conv_2`` -> None."""
    m = _COPY.fullmatch(str(name))
    return None if m is None else m["op"] or m["part"]


def fold_rows(rows: Iterable[Sequence], name: int = 0, add: Sequence[int] = (),
              times: Sequence[int] = (), skip: Sequence[int] = ()) -> list[tuple[list, list[int]]]:
    """Rows of one source op repeated with the same figures folded into one row with a count.

    Rows whose cells are equal (cells hashable) except the name (column ``name``), the
    ``add`` and the ``skip`` columns, and whose names have one :func:`source_name` (copies of
    one lowered source op, or host partitions; never names without one, such as an
    exporter's ``Conv_0`` and ``Conv_2``), become one row: the first of them (where it
    stood), named by its own full name and the count, ``<first> x<count>``
    (``lstm_node_3/Gemm_2 x200``): two groups of one source op (an LSTM's two input
    projections, its two first steps) get two labels, not two rows ``lstm_node_3/Gemm x2``
    (s24 trial #7). With

    * ``add`` cells: the sum of the group's (figures measured per row that differ, a wall
      time; None counts nothing, all None stay None);
    * ``times`` cells (compared like the rest): the first row's times the count, so the row
      gives the group's total (None stays None);
    * ``skip`` cells: the first row's (an index, say; the caller may show the group's range);
    * the other cells: the group's one value (a per-row figure, the same for each).

    A row with no twin keeps its name and cells. Nothing is dropped: the counts add up to the
    rows given, and the ``add`` and ``times`` columns add up to their sums over the rows given.

    Returns ``[(cells, members)]`` in the order of each group's first row: ``cells`` a list,
    ``members`` the indices of the group's rows in ``rows``. The one folding of the tables
    of ``optimize`` (device summaries), ``run --profile`` and ``report``.
    """
    rows = [list(r) for r in rows]
    loose = set(add) | set(skip) | {name}
    groups: dict = {}
    for i, r in enumerate(rows):
        src = source_name(r[name])
        key = ((src,) if src is not None else (None, i)) + tuple(
            v for k, v in enumerate(r) if k not in loose)
        groups.setdefault(key, []).append(i)
    out = []
    for members in groups.values():  # a name without a source op: a group alone
        cells = list(rows[members[0]])
        n = len(members)
        if n > 1:
            cells[name] = f"{cells[name]} x{n}"
            for k in add:
                vals = [rows[i][k] for i in members if rows[i][k] is not None]
                cells[k] = sum(vals) if vals else None
            for k in times:
                cells[k] = None if cells[k] is None else cells[k] * n
        out.append((cells, members))
    return out


#: Rows a device table of ``optimize``'s summary shows (not ``-v``): a model with more kernel
#: rows (a transformer's distinct layers: 587 rows on Kokoro-82M) shows those of the most
#: energy, and a note on the rest.
TABLE_ROWS = 30


def folded_kernels(rows: list, fold: bool, example: str = "",
                   energy: Sequence[float] | None = None) -> tuple[list, str]:
    """A device table's kernel rows folded by :func:`fold_rows` (``fold`` False: as given) and
    the note saying so, '' when no row folded; ``example``: what a folded group may be
    (``", e.g. the steps of an unrolled recurrence"``).

    ``energy``: each row's energy, joules. With ``fold`` and more than :data:`TABLE_ROWS`
    rows after folding, only the :data:`TABLE_ROWS` rows of the most energy (a folded row:
    its kernels' sum; ties: the earlier row) stay, in their order, and the note says how
    many rows and kernels were left out and their energy's share of the rows'."""
    n_rows = len(rows)
    groups = fold_rows(rows) if fold else [(list(r), [i]) for i, r in enumerate(rows)]
    notes = []
    if len(groups) < n_rows:
        notes.append(f"({n_rows} kernels in {len(groups)} rows: '<kernel> xN' stands for N "
                     f"kernels of one source op, named by the first, with the same figures "
                     f"each{example}; the totals count every kernel; optimize -v lists them "
                     "one by one)")
    if fold and energy is not None and len(groups) > TABLE_ROWS:
        sums = [sum(energy[i] for i in members) for _, members in groups]
        top = set(sorted(range(len(groups)), key=lambda g: -sums[g])[:TABLE_ROWS])
        out = [g for g in range(len(groups)) if g not in top]
        kernels = sum(len(groups[g][1]) for g in out)
        total = sum(sums)
        share = f": {100 * sum(sums[g] for g in out) / total:.1f}% of the kernels' energy" \
            if total else ""
        notes.append(f"(the {TABLE_ROWS} rows of the most energy of {len(groups)}: "
                     f"{len(out)} rows of {kernels} kernel{'s' * (kernels != 1)} left out"
                     f"{share}; the totals count them; optimize -v lists every kernel)")
        groups = [groups[g] for g in sorted(top)]
    return [cells for cells, _ in groups], " ".join(notes)


def if_rule(ifs: dict, others: str) -> str:
    """How per-inference totals count If branches, in words: ``ifs`` counts the Ifs whose
    taken branch the planning probe saw (``"taken"``) and those counted with both branches
    (``"both"``), as :func:`onnx_cinm.dialects.cinm.labelled_nodes` counts them; ``others``
    names what shows the branches left out. '' without an If."""
    taken, both = ifs.get("taken", 0), ifs.get("both", 0)
    out = []
    if taken:
        out.append(f"one branch per If, the one the planning probe took ({taken} "
                   f"If{'s' * (taken != 1)} on the path a run takes, nested ones included; "
                   f"the other branch: {others})")
    if both:
        out.append(f"UPPER BOUND: both branches summed of {both} If{'s' * (both != 1)} whose "
                   "branch the planning probe did not see")
    return "; ".join(out)


class _NoBar:
    """The progress bar of a run that shows none: what ``tqdm(disable=True)`` does, without
    importing tqdm (and the multiprocessing it imports) in every quiet or piped run."""

    disable = True

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, show: bool):
    """A tqdm bar of ``total`` ``unit`` steps on stderr (``leave=False``), or one that shows
    nothing (tqdm not imported) when ``show`` is False or stderr is not a terminal."""
    if not (show and sys.stderr.isatty()):
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
