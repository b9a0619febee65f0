"""Pass ``placement``: choose the device of every cinm op.

Two strategies (``ctx.options["placement"]``): ``cost`` (:mod:`.cost_placement`: the device
minimizing the modeled latency, energy or EDP of the whole graph under crossbar, endurance and
DPU constraints) and ``heuristic``, the heuristic of CINM: a matrix product with a constant operand and enough work goes to a
compute-in-memory device (crossbar), every other cinm op the compute-near-memory device (UPMEM)
supports goes there, and the rest stays on the host. User hints win: ``--place PATTERN=DEVICE``
(``fnmatch`` patterns over node names and op types; the first matching hint wins). A hint the
device cannot honour falls back to the heuristic, and the reason says so.

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


def _heuristic(info) -> tuple[str, str]:
    why_not = []
    for paradigm in _PARADIGM_ORDER:
        for dev in devices.all_devices():
            if dev.paradigm != paradigm:
                continue
            s = dev.supports(info)
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
    "unused_hints": [...]}`` (cost placement adds its totals, baselines and method).
    """
    strategy = ctx.options.get("placement", "heuristic")
    if strategy not in STRATEGIES:
        raise CinmError(f"unknown placement strategy '{strategy}' (available: {', '.join(STRATEGIES)})")
    if strategy == "cost":
        from .cost_placement import place_by_cost

        ctx.stats["placement"] = stats = place_by_cost(model, ctx, _set_attr)
        for h in stats["unused_hints"]:
            ctx.log(f"placement: hint {h} matched no cinm op")
        return model
    hints = list(ctx.options.get("place", []))
    used_hints: set[int] = set()
    infos = tensor_infos(model)
    counts: Counter = Counter()
    for node in model.graph.node:
        if node.domain != cinm.DOMAIN:
            continue
        info = op_info(node, infos)
        chosen = None
        for k, (pattern, dev_name) in enumerate(hints):
            if hint_matches(node, pattern):
                used_hints.add(k)
                s = devices.get_device(dev_name).supports(info)
                if s:
                    chosen = (dev_name, f"hint {pattern}={dev_name}: {s.reason}")
                else:
                    dev, why = _heuristic(info)
                    chosen = (dev, f"hint {pattern}={dev_name} not possible ({s.reason}); {why}")
                break
        dev, reason = chosen or _heuristic(info)
        _set_attr(node, "device", dev)
        _set_attr(node, "placement", reason)
        counts[dev] += 1
    unused = [f"{p}={d}" for k, (p, d) in enumerate(hints) if k not in used_hints]
    ctx.stats["placement"] = {"devices": counts, "unused_hints": unused}
    for h in unused:
        ctx.log(f"placement: hint {h} matched no cinm op")
    return model
