"""Placement rules both strategies share: the user's hints and the heuristic of CINM.

Hints: ``--place PATTERN=DEVICE`` (:func:`parse_hint`) or a ``--place-config`` file
(:func:`load_hints`), ``fnmatch`` patterns over node names and op types (:func:`hint_matches`);
the first matching hint wins and :class:`HintLog` records what became of each
(:func:`hint_warnings`). The heuristic (:func:`heuristic`) is the ``heuristic`` strategy and the
baseline the ``cost`` strategy starts from. Devices are reached only through
:mod:`onnx_cinm.devices` (the registry).
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import onnx

from .. import devices
from ..errors import CinmError
from .pass_options import parse_hint

_PARADIGM_ORDER = ("cim", "cnm")


def hint_matches(node: onnx.NodeProto, pattern: str, source_op: str | None = None) -> bool:
    """Whether a ``--place`` pattern (fnmatch) matches ``node``: its name, its op type, the
    name of the source node it was lowered from (``to_cinm`` names a cinm op ``<source>/<Op>``,
    so ``fc1`` matches ``fc1/Gemm``) or that source node's op type ``source_op`` (``MatMul``
    matches the cinm Gemm a MatMul became; ``Conv`` a Conv's Im2Col and Gemm)."""
    source = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
    return any(fnmatch.fnmatchcase(x, pattern) for x in (node.name, node.op_type, source)) or \
        (source_op is not None and fnmatch.fnmatchcase(source_op, pattern))


class HintLog:
    """What became of each placement hint, for both strategies: the first hint matching a node
    wins it (:meth:`first`); a winning hint whose device cannot run the node is refused there
    (:meth:`refuse`). :meth:`stats` then tells apart hints that matched no cinm op, hints every
    match of which an earlier hint took (shadowed), and refusals with their reasons.
    ``sources``: ``{cinm node name: source op type}`` (:attr:`.PassContext.source_ops`), for
    :func:`hint_matches`."""

    def __init__(self, hints, sources: dict | None = None) -> None:
        self.hints = list(hints)
        self.sources = sources or {}
        self.matched: set[int] = set()
        self.won: set[int] = set()
        self.shadowed_by: dict[int, set[int]] = {}
        self.refused: dict[int, list[tuple[str, str]]] = {}

    def text(self, k: int) -> str:
        pattern, dev = self.hints[k]
        return f"{pattern}={dev}"

    def first(self, node) -> tuple[int, str, str] | None:
        """``(index, pattern, device)`` of the first hint matching ``node``, or None."""
        if not self.hints:  # (none given, the usual case: none matches)
            return None
        source_op = self.sources.get(node.name)
        ks = [k for k, (pattern, _) in enumerate(self.hints)
              if hint_matches(node, pattern, source_op)]
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
        """``unused_hints`` (matched no cinm op), ``matched_hints`` (the others: a model's If
        branches are placed apart and their stats merged, so a hint one graph matched is not
        unused, :func:`hint_warnings`), ``shadowed_hints`` (``(hint, [earlier hints that took
        its matches])``) and ``refused_hints`` (``(hint, [(node, why), ...])``)."""
        n = range(len(self.hints))
        return {
            "unused_hints": [self.text(k) for k in n if k not in self.matched],
            "matched_hints": [self.text(k) for k in n if k in self.matched],
            "shadowed_hints": [(self.text(k), [self.text(j) for j in sorted(self.shadowed_by[k])])
                               for k in n if k in self.matched and k not in self.won],
            "refused_hints": [(self.text(k), self.refused[k]) for k in n if k in self.refused],
        }


def hint_warnings(stats: dict) -> list[str]:
    """One line per hint that was not (fully) honoured, for a person (from :meth:`HintLog.stats`
    entries in the ``placement`` stats)."""
    matched = set(stats.get("matched_hints", []))  # by any graph of the model
    unused = dict.fromkeys(h for h in stats.get("unused_hints", []) if h not in matched)
    out = [f"hint {h} matched no cinm op (a pattern matches a cinm op's name '<source node>/"
           "<Op>' or op type, or its source node's name or op type; optimize -v lists the "
           "cinm ops)" for h in unused]
    for h, by in stats.get("shadowed_hints", []):
        out.append(f"hint {h} matched only ops an earlier hint took ({', '.join(by)}; the first "
                   "matching hint wins): it changed nothing")
    for h, nodes in stats.get("refused_hints", []):
        name, why = nodes[0]
        more = f" and {len(nodes) - 1} more" if len(nodes) > 1 else ""
        out.append(f"hint {h} refused for {len(nodes)} op(s) ({name}{more}): {why}; "
                   "placed without it")
    return out


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


def heuristic(info, options: dict | None = None, supports=None) -> tuple[str, str]:
    """The heuristic of CINM for one op (an :class:`~onnx_cinm.graph.OpInfo`): the first device,
    paradigm by paradigm (cim, then cnm), that prefers it under the pass ``options``
    (:meth:`Device.supports_under`; ``supports(device)``, when given, answers it instead, e.g.
    from answers already asked for); else the host. Returns ``(device name, reason in
    words)``."""
    why_not = []
    for paradigm in _PARADIGM_ORDER:
        for dev in devices.all_devices():
            if dev.paradigm != paradigm:
                continue
            s = supports(dev) if supports else dev.supports_under(info, options or {})
            if s and s.preferred:
                return dev.name, "heuristic: " + "; ".join(why_not + [s.reason])
            if s:
                why_not.append(f"not {dev.name} unless asked: {s.reason}")
                continue
            if s.applicable:
                why_not.append(f"not {dev.name}: {s.reason}")
    return "host", "heuristic: no device takes it (" + "; ".join(why_not) + ")"
