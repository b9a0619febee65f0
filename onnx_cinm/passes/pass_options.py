"""The typed options of the passes (keys of ``PassContext.options``), declared once.

Each pass that reads options declares them here as a dataclass of
:func:`onnx_cinm.options.option` fields and registers it with
:func:`onnx_cinm.passes.register_options`. They live apart from the pass modules because the
CLI builds its flags from them (``onnx-cinm optimize --help``) and must not import onnx to do
so; the pass modules import their defaults and choices from here (``PlacementOptions.objective``
is the one default of the objective, wherever it is read).

Keys are flat and unprefixed (``objective``, ``max_writes_per_cell``); their ``--config``
table and sweep section is the pass name (``[placement] objective = "edp"``,
``--set placement.objective=edp``). The placement strategy's key is ``placement`` (its config
name ``strategy``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CinmError
from ..options import DEFAULT_OBJECTIVE, OBJECTIVES, Alias, option
from . import register_options

#: Placement strategies (``placement`` option).
STRATEGIES = ("cost", "heuristic")


def parse_hint(text: str) -> tuple[str, str]:
    """Parse ``PATTERN=DEVICE``; raises CinmError if malformed or the device is unknown."""
    from .. import devices

    pattern, sep, dev = text.rpartition("=")
    if not sep or not pattern or not dev:
        raise CinmError(f"--place expects PATTERN=DEVICE, got '{text}'")
    devices.get_device(dev)
    return pattern, dev


def _hints(value) -> list[tuple[str, str]]:
    """Placement hints as ``[(pattern, device)]`` from ``PATTERN=DEVICE`` strings or
    ``(pattern, device)`` pairs (a single string is one hint)."""
    from .. import devices

    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError("expected a list of PATTERN=DEVICE hints")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(parse_hint(item))
        elif isinstance(item, (list, tuple)) and len(item) == 2 and \
                all(isinstance(x, str) and x for x in item):
            devices.get_device(item[1])
            out.append((item[0], item[1]))
        else:
            raise ValueError(f"expected PATTERN=DEVICE hints, got {item!r}")
    return out


@dataclass(frozen=True)
class PlacementOptions:
    """Options of the ``placement`` pass (and cost placement, :mod:`.cost_placement`)."""

    strategy: str = option("cost", key="placement", choices=STRATEGIES,
                           help="placement strategy: 'cost' minimizes the objective over the "
                           "whole graph (device cost models, transfers, the host roofline) "
                           "under the crossbar, endurance and DPU constraints; 'heuristic' is "
                           "the CINM paper's (large matmuls with constant weights to the "
                           "crossbar, other cinm ops to UPMEM)")
    objective: str = option(DEFAULT_OBJECTIVE, choices=OBJECTIVES,
                            help="what cost placement minimizes per inference: modeled "
                            "seconds, joules, or their product")
    max_writes_per_cell: float | None = option(
        None, low=0.0, unit="writes",
        help="endurance budget of cost placement: crossbar writes any cell may take per "
        "inference (or over lifetime_inferences); tile writes rotate over the crossbars the "
        "resident kernels leave, the same ones every inference, so writes per cell = "
        "ceil(tile writes per inference / those crossbars) (default: no budget)")
    lifetime_inferences: float = option(1.0, low=1.0, unit="inferences",
                                        help="inferences the max_writes_per_cell budget must last")
    crossbar_residency: bool = option(True, help="cost placement requires the tiles kept by all "
                                      "crossbar kernels to fit the crossbars (false: price every "
                                      "crossbar kernel as if it had the crossbars to itself, as "
                                      "the CINM paper does)",
                                      aliases=(Alias(flag="--per-kernel-crossbars", const=False,
                                                     help="--no-crossbar-residency: an optimistic "
                                                     "estimate, as the CINM paper's (the crossbar "
                                                     "plans still share the device's crossbars)"),))
    place: tuple = option((), parse=_hints, help="placement hints PATTERN=DEVICE (fnmatch over "
                          "node names and op types; the first matching hint wins)")


def _lower_ops(value) -> tuple[str, ...]:
    """Source op types to lower, from ``"Gemm,MatMul"`` or a list of names, each one
    ``to_cinm`` has a rule for (:func:`.to_cinm.lowerable_ops`): an op type it cannot lower
    (``conv`` for ``Conv``, a typo) would lower nothing without a word, so it is an error
    naming the close matches, else the known ones."""
    import difflib

    from .to_cinm import lowerable_ops

    if isinstance(value, str) and value.strip().lower() == "none":
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise ValueError("expected comma-separated op types such as Gemm,MatMul")
    ops = tuple(v.strip() for v in items if v.strip())
    known = lowerable_ops()
    for op in ops:
        if op in known:
            continue
        close = [k for k in known if k.lower() == op.lower()] or \
            difflib.get_close_matches(op, known, n=3, cutoff=0.6)
        if close:
            raise ValueError(f"to_cinm cannot lower op type '{op}'; did you mean "
                             f"{' or '.join(close)}?")
        raise ValueError(f"to_cinm cannot lower op type '{op}' (known: {', '.join(known)})")
    return ops


@dataclass(frozen=True)
class ToCinmOptions:
    """Options of the ``to_cinm`` pass."""

    lower_ops: tuple | None = option(None, parse=_lower_ops, help="source op types to lower to "
                                     "cinm ops, e.g. Gemm,MatMul, as ONNX spells them; 'none' for "
                                     "none (default: every op with a rule; an op type without "
                                     "one is an error naming those that have)", metavar="OP1,OP2")


register_options("placement", PlacementOptions)
register_options("to_cinm", ToCinmOptions)
