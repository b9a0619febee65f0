"""Typed options: one declaration per option, from which every way of setting it is derived.

A device or a pass declares its options as a dataclass whose fields are made with
:func:`option` (type from the annotation; default, unit, help and the allowed range or choices
in the field). :func:`specs` turns such a class into :class:`OptionSpec` entries keyed by the
flat option name the passes read (``<prefix>_<field>``, e.g. ``cim_rows``, ``upmem_dpus``);
:func:`check` validates one value against its spec. The schema of the whole compiler (every
registered device and pass) is assembled by :func:`onnx_cinm.devices.option_schema`; the CLI
flags, sweep keys, ``--config`` files and the Python API read that one schema, so an option
exists, is typed and is documented in exactly one place.

This module is at the bottom of the layer stack: it imports nothing of onnx_cinm but errors.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CinmError

_MISSING = dataclasses.MISSING


@dataclass(frozen=True)
class OptionSpec:
    """One option of a device or a pass.

    Attributes:
        key: flat name the passes read (``cim_rows``); CLI flag ``--cim-rows``.
        type: ``int``, ``float``, ``bool``, ``str`` or ``tuple`` (a list of strings).
        default: value when unset (None: the owner decides, e.g. from a preset).
        help: one sentence for ``--help``, ``onnx-cinm devices`` and the docs.
        unit: SI unit of a number (``s``, ``J``, ``B``, ``Hz``), "" if none.
        choices: allowed values of a ``str`` option (or of each item of a ``tuple`` one), or a
            callable returning them (names known only once devices are loaded); None: any.
        low, high: inclusive range of a number; None: unbounded on that side.
        owner: the device or pass that declares it.
    """

    key: str
    type: type
    default: Any = None
    help: str = ""
    unit: str = ""
    choices: tuple | Callable[[], tuple] | None = None
    low: float | None = None
    high: float | None = None
    owner: str = ""

    def allowed(self) -> tuple | None:
        """The allowed values of a choice option (evaluated now), None if any value goes."""
        c = self.choices
        return tuple(c()) if callable(c) else c

    def describe(self) -> str:
        """``int in 1..65536, default 2048`` and the like, for help texts and errors."""
        t = {int: "integer", float: "number", bool: "true/false", str: "name",
             tuple: "comma-separated names"}.get(self.type, self.type.__name__)
        allowed = self.allowed()
        if allowed is not None:
            t = f"one of {', '.join(map(str, allowed))}" if self.type is str else \
                f"{t} from {', '.join(map(str, allowed))}"
        elif self.low is not None or self.high is not None:
            lo = "" if self.low is None else f"{self.low:g}"
            hi = "" if self.high is None else f"{self.high:g}"
            t += f" in {lo}..{hi}"
        if self.unit:
            t += f" ({self.unit})"
        return t


def option(default: Any = None, *, help: str, unit: str = "", choices=None,
           low: float | None = None, high: float | None = None) -> Any:
    """A dataclass field declaring one option (see :class:`OptionSpec` for the arguments)."""
    meta = {"help": help, "unit": unit, "choices": choices, "low": low, "high": high}
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata={"onnx_cinm.option": meta})


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "tuple": tuple}


def _field_type(cls: type, f: dataclasses.Field) -> type:
    hint = typing.get_type_hints(cls).get(f.name, f.type)
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = typing.get_origin(args[0]) or args[0]
    if isinstance(base, str):
        base = _TYPES.get(base.split("|")[0].strip().split("[")[0], str)
    if base not in (int, float, bool, str, tuple):
        raise TypeError(f"{cls.__name__}.{f.name}: option type {hint!r} is not int, float, bool, "
                        "str or tuple")
    return base


def specs(cls: type, prefix: str, owner: str) -> dict[str, OptionSpec]:
    """The :class:`OptionSpec` of each :func:`option` field of dataclass ``cls``, keyed
    ``<prefix>_<field>`` (``<field>`` if ``prefix`` is empty). Raises TypeError if a field is
    not an option or has an unsupported type."""
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("onnx_cinm.option")
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with options.option()")
        key = f"{prefix}_{f.name}" if prefix else f.name
        default = None if f.default is _MISSING else f.default
        out[key] = OptionSpec(key, _field_type(cls, f), default, owner=owner, **meta)
    return out


def check(spec: OptionSpec, value: Any) -> Any:
    """``value`` checked against ``spec`` and normalized (a tuple option accepts a list or a
    comma-separated string; an int option accepts an integral float). None passes (unset).
    Raises CinmError naming the option and what it expects."""
    if value is None:
        return None
    bad = CinmError(f"option {spec.key}={value!r}: expected {spec.describe()}")
    t = spec.type
    if t is bool:
        if not isinstance(value, bool):
            raise bad
    elif t is int:
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) and type(value).__name__.startswith(("int", "uint")):
            value = int(value)  # numpy integers
        if not isinstance(value, int):
            raise bad
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) and \
                not type(value).__name__.startswith("float"):
            raise bad
        value = float(value)
        if not math.isfinite(value):
            raise bad
    elif t is str:
        if not isinstance(value, str):
            raise bad
    elif t is tuple:
        if isinstance(value, str):
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            value = tuple(value)
        else:
            raise bad
    if t in (int, float):
        if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
            raise bad
    allowed = spec.allowed()
    if allowed is not None:
        items = value if t is tuple else (value,)
        if any(v not in allowed for v in items):
            raise bad
    return value


def unknown_key(key: str, known) -> CinmError:
    """The error for an option nobody declares: names the closest known keys."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return CinmError(f"unknown option '{key}'{hint} (known: {', '.join(known)})")
