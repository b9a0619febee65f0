"""Pass ``placement``: choose the device of every cinm op.

Two strategies (``ctx.options["placement"]``): ``cost`` (:mod:`.cost_placement`: the device
minimizing the modeled latency, energy or EDP of the whole graph under crossbar, endurance and
DPU constraints) and ``heuristic``, the heuristic of CINM: a matrix product with a constant operand and enough work goes to a
compute-in-memory device (crossbar), every other cinm op the compute-near-memory device (UPMEM)
supports goes there, and the rest stays on the host. User hints win: ``--place PATTERN=DEVICE``
(``fnmatch`` patterns over node names and op types; the first matching hint wins). A hint the
device cannot honour falls back to the strategy, the reason says so, and ``optimize`` warns
(:func:`hint_warnings`: refused, shadowed by an earlier hint, or matching no cinm op).

Each cinm node gets two attributes: ``device`` (a registry name) and ``placement`` (the reason,
in words). Devices are reached only through :mod:`onnx_cinm.devices` (the registry).
"""
from __future__ import annotations

import fnmatch
import json
from collections import Counter
from pathlib import Path

import onnx
from onnx import helper

from .. import devices
from ..analysis import op_info, tensor_infos
from ..dialects import cinm
from ..errors import CinmError
from . import PassContext, register_pass

_PARADIGM_ORDER = ("cim", "cnm")

#: Placement strategies by name.
STRATEGIES = ("cost", "heuristic")


def hint_matches(node: onnx.NodeProto, pattern: str) -> bool:
    """Whether a ``--place`` pattern (fnmatch) matches ``node``: its name, its op type, or the
    name of the source node it was lowered from (``to_cinm`` names a cinm op ``<source>/<Op>``,
    so ``fc1`` matches ``fc1/Gemm``)."""
    source = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
    return any(fnmatch.fnmatchcase(x, pattern) for x in (node.name, node.op_type, source))


class HintLog:
    """What became of each placement hint, for both strategies: the first hint matching a node
    wins it (:meth:`first`); a winning hint whose device cannot run the node is refused there
    (:meth:`refuse`). :meth:`stats` then tells apart hints that matched no cinm op, hints every
    match of which an earlier hint took (shadowed), and refusals with their reasons."""

    def __init__(self, hints) -> None:
        self.hints = list(hints)
        self.matched: set[int] = set()
        self.won: set[int] = set()
        self.shadowed_by: dict[int, set[int]] = {}
        self.refused: dict[int, list[tuple[str, str]]] = {}

    def text(self, k: int) -> str:
        pattern, dev = self.hints[k]
        return f"{pattern}={dev}"

    def first(self, node) -> tuple[int, str, str] | None:
        """``(index, pattern, device)`` of the first hint matching ``node``, or None."""
        ks = [k for k, (pattern, _) in enumerate(self.hints) if hint_matches(node, pattern)]
        if not ks:
            return None
        self.matched.update(ks)
        self.won.add(ks[0])
        for k in ks[1:]:
            self.shadowed_by.setdefault(k, set()).add(ks[0])
        return (ks[0], *self.hints[ks[0]])

    def refuse(self, k: int, node, why: str) -> None:
        """Hint ``k`` won ``node`` but its device cannot run it, because ``why``."""
        self.refused.setdefault(k, []).append((node.name or node.op_type, why))

    def stats(self) -> dict:
        """``unused_hints`` (matched no cinm op), ``shadowed_hints`` (``(hint, [earlier hints
        that took its matches])``) and ``refused_hints`` (``(hint, [(node, why), ...])``)."""
        n = range(len(self.hints))
        return {
            "unused_hints": [self.text(k) for k in n if k not in self.matched],
            "shadowed_hints": [(self.text(k), [self.text(j) for j in sorted(self.shadowed_by[k])])
                               for k in n if k in self.matched and k not in self.won],
            "refused_hints": [(self.text(k), self.refused[k]) for k in n if k in self.refused],
        }


def hint_warnings(stats: dict) -> list[str]:
    """One line per hint that was not (fully) honoured, for a person (from :meth:`HintLog.stats`
    entries in the ``placement`` stats)."""
    out = [f"hint {h} matched no cinm op" for h in stats.get("unused_hints", [])]
    for h, by in stats.get("shadowed_hints", []):
        out.append(f"hint {h} matched only ops an earlier hint took ({', '.join(by)}; the first "
                   "matching hint wins): it changed nothing")
    for h, nodes in stats.get("refused_hints", []):
        name, why = nodes[0]
        more = f" and {len(nodes) - 1} more" if len(nodes) > 1 else ""
        out.append(f"hint {h} refused for {len(nodes)} op(s) ({name}{more}): {why}; "
                   "placed without it")
    return out


def parse_hint(text: str) -> tuple[str, str]:
    """Parse ``PATTERN=DEVICE``; raises CinmError if malformed or the device is unknown."""
    pattern, sep, dev = text.rpartition("=")
    if not sep or not pattern or not dev:
        raise CinmError(f"--place expects PATTERN=DEVICE, got '{text}'")
    devices.get_device(dev)
    return pattern, dev


def load_hints(path: str) -> list[tuple[str, str]]:
    """Read placement hints from a JSON or TOML file with a ``place`` table ``{pattern: device}``.

    A ``.toml`` file is read as TOML, any other as JSON (whatever its extension).

    Raises CinmError if the file is missing, not UTF-8 text, malformed or names an unknown device.
    """
    p = Path(path)
    fmt = "TOML" if p.suffix.lower() == ".toml" else "JSON"
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CinmError(f"cannot read placement config '{path}': {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CinmError(f"placement config '{path}' is not valid {fmt}: it is not UTF-8 text "
                        f"(byte 0x{raw[e.start]:02x} at offset {e.start})") from None
    text = text.removeprefix("\ufeff")  # a leading byte-order mark (Notepad) is not an error
    if fmt == "TOML":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise CinmError(f"placement config '{path}': reading TOML needs Python 3.11 or "
                            "later; write it as JSON") from None
    try:
        if fmt == "TOML":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as e:
        raise CinmError(f"placement config '{path}' is not valid {fmt}: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except RecursionError:
        raise CinmError(f"placement config '{path}' is not valid {fmt}: nested too deeply") from None
    place = data.get("place") if isinstance(data, dict) else None
    if not isinstance(place, dict):
        raise CinmError(f"placement config '{path}' needs a 'place' table of PATTERN = DEVICE")
    return [parse_hint(f"{k}={v}") for k, v in place.items()]


def _set_attr(node: onnx.NodeProto, name: str, value: str) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _heuristic(info, options: dict) -> tuple[str, str]:
    why_not = []
    for paradigm in _PARADIGM_ORDER:
        for dev in devices.all_devices():
            if dev.paradigm != paradigm:
                continue
            s = dev.supports_under(info, options)
            if s and s.preferred:
                return dev.name, "heuristic: " + "; ".join(why_not + [s.reason])
            if s:
                why_not.append(f"not {dev.name} unless asked: {s.reason}")
                continue
            if s.applicable:
                why_not.append(f"not {dev.name}: {s.reason}")
    return "host", "heuristic: no device takes it (" + "; ".join(why_not) + ")"


@register_pass("placement")
def placement(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Annotate every cinm op with the device that runs it (cost model or paper heuristic, plus
    user hints).

    Reads ``ctx.options["placement"]`` (``"heuristic"``, the default here, or ``"cost"``, whose
    options are listed in :func:`.cost_placement.place_by_cost`) and ``ctx.options["place"]`` (a
    list of ``(pattern, device)``). Records ``ctx.stats["placement"] = {"devices": Counter,
    "unused_hints": [...], "shadowed_hints": [...], "refused_hints": [...]}`` (see
    :meth:`HintLog.stats`; cost placement adds its totals, baselines and method).
    """
    strategy = ctx.options.get("placement", "heuristic")
    if strategy not in STRATEGIES:
        raise CinmError(f"unknown placement strategy '{strategy}' (available: {', '.join(STRATEGIES)})")
    if strategy == "cost":
        from .cost_placement import place_by_cost

        ctx.stats["placement"] = stats = place_by_cost(model, ctx, _set_attr)
        for line in hint_warnings(stats):
            ctx.log(f"placement: {line}")
        return model
    hints = HintLog(ctx.options.get("place", []))
    infos = tensor_infos(model)
    counts: Counter = Counter()
    for node in model.graph.node:
        if node.domain != cinm.DOMAIN:
            continue
        info = op_info(node, infos)
        chosen = None
        hint = hints.first(node)
        if hint is not None:
            k, pattern, dev_name = hint
            s = devices.get_device(dev_name).supports_under(info, ctx.options)
            if s:
                chosen = (dev_name, f"hint {pattern}={dev_name}: {s.reason}")
            else:
                hints.refuse(k, node, f"{dev_name}: {s.reason}")
                dev, why = _heuristic(info, ctx.options)
                chosen = (dev, f"hint {pattern}={dev_name} not possible ({s.reason}); {why}")
        dev, reason = chosen or _heuristic(info, ctx.options)
        _set_attr(node, "device", dev)
        _set_attr(node, "placement", reason)
        counts[dev] += 1
    ctx.stats["placement"] = stats = {"devices": counts, **hints.stats()}
    for line in hint_warnings(stats):
        ctx.log(f"placement: {line}")
    return model
