"""Typed options: one declaration per option, from which every way of setting it is derived.

A device or a pass declares its options as a dataclass whose fields are made with
:func:`option` (type from the annotation; default, unit, help and the allowed range or choices
in the field). :func:`specs` turns such a class into :class:`OptionSpec` entries keyed by the
flat option name the passes read (``<prefix>_<field>``, e.g. ``cim_rows``, ``upmem_dpus``);
:func:`check` validates one value against its spec. The schema of the whole compiler (every
registered device and pass) is assembled by :func:`onnx_cinm.devices.option_schema`; the CLI
flags, sweep keys, ``--config`` files and the Python API read that one schema, so an option
exists, is typed and is documented in exactly one place.

Besides the flat key, every option has a *section* and a *name* (``cim`` / ``rows``): the
table and key of a ``--config`` file (``[cim] rows = 64``, :func:`load_config`) and the sweep
key (``cim.rows``). Text from a command line or a sweep is read by :func:`from_text`; a whole
options dict is checked by :func:`validate`.

This module is at the bottom of the layer stack: it imports nothing of onnx_cinm but errors.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CinmError

_MISSING = dataclasses.MISSING

#: What cost placement minimizes (the pass option ``objective``): seconds, joules or their
#: product, and the default. Declared here, below the passes and the devices, because a device
#: that chooses among plans of its own (the crossbar residency) reads the same key from the
#: options it is given, and must take the same default when the key is absent.
OBJECTIVES = ("latency", "energy", "edp")
DEFAULT_OBJECTIVE = "energy"


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
        section, name: its table and key in a ``--config`` file, and its sweep key
            ``section.name`` (``cim``, ``rows``); by default the declaring prefix (or owner)
            and the field name.
        parse: a callable taking the value and returning it normalized, raising CinmError or
            ValueError when it is bad; replaces the type, range and choice checks of
            :func:`check` (for values that are not one of the plain types, e.g. a roofline
            object or ``PATTERN=DEVICE`` hints). None: the plain checks.
        aliases: other spellings of the option (:class:`Alias`) on the command line and in
            sweeps, their ``keys`` resolved to flat keys.
        metavar: how ``--help`` shows its value (``E1,E2|none``); "" for the type's default
            (``N``, ``X``, the choices of a name, ``VALUE``).
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
    section: str = ""
    name: str = ""
    parse: Callable[[Any], Any] | None = None
    aliases: tuple = ()
    metavar: str = ""

    def allowed(self) -> tuple | None:
        """The allowed values of a choice option (evaluated now), None if any value goes."""
        c = self.choices
        return tuple(c()) if callable(c) else c

    def describe(self) -> str:
        """``int in 1..65536, default 2048`` and the like, for help texts and errors."""
        t = {int: "integer", float: "number", bool: "true/false", str: "name",
             tuple: "comma-separated names"}.get(self.type, self.type.__name__)
        allowed = self.allowed()
        if self.parse is not None:  # its own format, which the help gives
            t = "see its help"
        elif allowed is not None:
            t = f"one of {', '.join(map(str, allowed))}" if self.type is str else \
                f"{t} from {', '.join(map(str, allowed))}"
        elif self.low is not None or self.high is not None:
            lo = "" if self.low is None else _num(self.low)
            hi = "" if self.high is None else _num(self.high)
            t += f" in {lo}..{hi}"
        if self.unit:
            t += f" ({self.unit})"
        return t


def _num(v: float) -> str:
    """``65536``, ``0.5``, ``1e-06``: a bound as a person reads it."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"


@dataclass(frozen=True)
class Alias:
    """Another spelling of an option, declared with it (:func:`option`), so that the command
    line and sweeps take it without their code naming the option's owner: an older flag or
    sweep key, a shorter form with a unit, several options in one value.

    Attributes:
        flag: a command-line flag (``--cim-size``), "" for none. A device's flags start with
            ``--<option_prefix>-`` (:func:`onnx_cinm.devices.base.check_device`).
        sweep: a sweep key (``crossbar.size``), "" for none.
        also: fields of the same options class set at once with the declaring one (``--cim-size
            ROWSxCOLS`` on ``rows`` sets ``cols`` too); an option's own flag giving another value
            than the alias gives it this way is a usage error (the same value is not).
        parse: the alias's text -> the value (with ``also``: a tuple, one value per field, the
            declaring one first), each then checked as its option's (:func:`check`); raises
            ValueError naming the form expected. None: the text is read as the option's own
            (:func:`from_text`).
        const: the value of a flag that takes none (``--per-kernel-crossbars``: False); None:
            the flag takes a value.
        metavar, help: for ``--help``.
        keys: the flat keys it sets, the declaring option's first (filled by :func:`specs`).
    """

    flag: str = ""
    sweep: str = ""
    also: tuple = ()
    parse: Callable[[str], Any] | None = None
    const: Any = None
    metavar: str = ""
    help: str = ""
    keys: tuple = ()

    @property
    def label(self) -> str:
        """How the alias is written: its flag, else its sweep key."""
        return self.flag or self.sweep


def alias_values(alias: Alias, schema: dict[str, OptionSpec], text: str | None = None,
                 name: str = "") -> dict:
    """``{flat key: value}`` that ``alias`` sets, given as ``text`` (None for a flag without a
    value), each value checked as its option's. Raises CinmError naming the alias as it was
    written (``name``: its flag or its sweep key; default :attr:`~Alias.label`) and the form
    it expects, or naming the option whose check a value fails."""
    if alias.const is not None:
        values: tuple = (alias.const,)
    elif alias.parse is None:
        return {alias.keys[0]: from_text(schema[alias.keys[0]], text)}
    else:
        try:
            v = alias.parse(text)
        except ValueError as e:
            raise CinmError(f"{name or alias.label}: {e}") from None
        values = tuple(v) if len(alias.keys) > 1 else (v,)
    return {k: check(schema[k], v) for k, v in zip(alias.keys, values)}


def option(default: Any = None, *, help: str, unit: str = "", choices=None,
           low: float | None = None, high: float | None = None, key: str | None = None,
           parse: Callable[[Any], Any] | None = None, aliases: tuple = (),
           metavar: str = "") -> Any:
    """A dataclass field declaring one option (see :class:`OptionSpec` for the arguments;
    ``key`` overrides the flat key ``<prefix>_<field>``, e.g. for a key older than its
    declaration; ``aliases``: its other spellings, :class:`Alias`)."""
    meta = {"help": help, "unit": unit, "choices": choices, "low": low, "high": high,
            "key": key, "parse": parse, "aliases": tuple(aliases), "metavar": metavar}
    if isinstance(default, (list, dict, set)):
        raise TypeError("option defaults must be immutable (use a tuple)")
    return dataclasses.field(default=default, metadata={"onnx_cinm.option": meta})


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "tuple": tuple}


def _field_type(cls: type, f: dataclasses.Field, hints: dict) -> type:
    """The option type (int, float, bool, str or tuple) of field ``f`` of ``cls``, from
    ``hints`` (``typing.get_type_hints(cls)``). Raises TypeError for any other type."""
    hint = hints.get(f.name, f.type)
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = typing.get_origin(args[0]) or args[0]
    if isinstance(base, str):
        base = _TYPES.get(base.split("|")[0].strip().split("[")[0], str)
    if base not in (int, float, bool, str, tuple):
        raise TypeError(f"{cls.__name__}.{f.name}: option type {hint!r} is not int, float, bool, "
                        "str or tuple")
    return base


def specs(cls: type, prefix: str, owner: str, section: str | None = None) -> dict[str, OptionSpec]:
    """The :class:`OptionSpec` of each :func:`option` field of dataclass ``cls``, keyed
    ``<prefix>_<field>`` (``<field>`` if ``prefix`` is empty) unless the field names its own
    key; ``section`` (default: ``prefix``, else ``owner``) is its table in a config file.
    Raises TypeError if a field is not an option or has an unsupported type. Computed once per
    arguments (``typing.get_type_hints`` per field cost placement seconds on DenseNet121, where
    a device reads its options per op); the dict returned is the caller's own."""
    return dict(_specs(cls, prefix, owner, section))


@functools.lru_cache(maxsize=None)
def _specs(cls: type, prefix: str, owner: str, section: str | None) -> dict[str, OptionSpec]:
    out = {}
    keys = {}
    hints = None  # the class's, evaluated once (each evaluation compiles every annotation)
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata.get("onnx_cinm.option") or {})
        if not meta:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with options.option()")
        keys[f.name] = meta.pop("key") or (f"{prefix}_{f.name}" if prefix else f.name)
        default = None if f.default is _MISSING else f.default
        if hints is None:
            hints = typing.get_type_hints(cls)
        out[keys[f.name]] = OptionSpec(keys[f.name], _field_type(cls, f, hints), default, owner=owner,
                                       section=section or prefix or owner, name=f.name, **meta)
    for key, spec in out.items():
        if not spec.aliases:
            continue
        resolved = []
        for alias in spec.aliases:
            bad = [a for a in alias.also if a not in keys]
            if not isinstance(alias, Alias) or not alias.label or bad:
                raise TypeError(f"{cls.__name__}.{spec.name}: an alias must be an Alias with a "
                                f"flag or a sweep key, its 'also' naming fields of the class "
                                f"(unknown: {bad})")
            resolved.append(dataclasses.replace(alias, keys=(key, *(keys[a] for a in alias.also))))
        out[key] = dataclasses.replace(spec, aliases=tuple(resolved))
    return out


def check(spec: OptionSpec, value: Any) -> Any:
    """``value`` checked against ``spec`` and normalized (a tuple option accepts a list or a
    comma-separated string; an int option accepts an integral float). None passes (unset).
    Raises CinmError naming the option and what it expects."""
    if value is None:
        return None
    if spec.parse is not None:
        try:
            return spec.parse(value)
        except (CinmError, ValueError, TypeError) as e:
            raise CinmError(f"option {spec.key}={_shown(value)}: {e}") from None
    bad = CinmError(f"option {spec.key}={_shown(value)}: expected {spec.describe()}")
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


def parse_pair(text: str) -> tuple[int, int]:
    """``"64x64"`` -> ``(64, 64)``: two positive integers joined by ``x`` (case-insensitive), as
    in ROWSxCOLS. Raises ValueError naming the expected form."""
    a, sep, b = str(text).lower().partition("x")
    if not sep or not a.isdigit() or not b.isdigit() or int(a) < 1 or int(b) < 1:
        raise ValueError(f"expected ROWSxCOLS such as 64x64, got '{text}'")
    return int(a), int(b)


#: Units of :func:`parse_duration`, in seconds (a year of 365.25 days).
DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
                  "y": 365.25 * 86400.0}


def parse_duration(text: str) -> float:
    """``"1h"`` -> ``3600.0``: a number of seconds with an optional unit of
    :data:`DURATION_UNITS` (s, min or m, h, d, w, y). Raises ValueError on another form or a
    negative time."""
    import re

    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*", str(text))
    if not m or m.group(2) not in DURATION_UNITS and m.group(2) != "":
        raise ValueError(f"expected a time like 10s, 1h, 1d or 1y, got '{text}'")
    if float(m.group(1)) < 0:
        raise ValueError(f"a time cannot be negative, got '{str(text).strip()}'")
    return float(m.group(1)) * DURATION_UNITS.get(m.group(2), 1.0)


def unknown_key(key: str, known, what: str = "option") -> CinmError:
    """The error for an option nobody declares: names the closest known keys."""
    import difflib  # here: only a mistyped key needs it (1.2 ms of every start-up)

    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return CinmError(f"unknown {what} '{key}'{hint} (known: {', '.join(known)})")


def _shown(value: Any) -> str:
    """``value`` for an error message: repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def from_text(spec: OptionSpec, text: str) -> Any:
    """The value of ``spec`` written as ``text`` (a command-line flag, a sweep value),
    converted to the option's type and checked (:func:`check`): ``64``, ``0.5``,
    ``true``/``false``, a name, or comma-separated names (``none`` for no names).
    Raises CinmError naming the option and what it expects."""
    t, raw = spec.type, text.strip()
    if spec.parse is not None:
        return check(spec, raw)
    value: Any = raw
    try:
        if t is int:
            value = int(raw)
        elif t is float:
            value = float(raw)
        elif t is bool:
            low = raw.lower()
            if low not in _TRUE + _FALSE:
                raise ValueError
            value = low in _TRUE
        elif t is tuple:
            value = () if raw.lower() == "none" else raw
        return check(spec, value)
    except (ValueError, CinmError):  # the error shows the text as given
        raise CinmError(f"option {spec.key}={raw!r}: expected {spec.describe()}") from None


def help_text(spec: OptionSpec) -> str:
    """One line for ``--help`` and listings: the help, what the option takes (with its unit)
    and its default."""
    default = spec.default
    if isinstance(default, tuple):
        default = ",".join(default) or "none"
    elif isinstance(default, bool):
        default = str(default).lower()
    parts = ["" if spec.parse is not None else spec.describe(),
             "" if default is None else f"default {default}"]
    parts = [p for p in parts if p]
    return f"{spec.help} [{'; '.join(parts)}]" if parts else spec.help


def validate(options: dict, schema: dict[str, OptionSpec], what: str = "option") -> dict:
    """``options`` (flat keys) checked against ``schema`` and normalized (:func:`check`).
    Raises CinmError on an unknown key (an unknown ``what``, naming the closest known ones) or
    a bad value."""
    out = {}
    for key, value in options.items():
        spec = schema.get(key)
        if spec is None:
            raise unknown_key(key, schema, what)
        out[key] = check(spec, value)
    return out


def load_config(path, schema: dict[str, OptionSpec]) -> dict:
    """The options of a TOML file with one table per section (``[cim] rows = 64``,
    ``[upmem] dpus = 256``, ``[placement] objective = "energy"``; the sections and names of
    :class:`OptionSpec`), as flat keys, checked (:func:`check`). Raises CinmError naming the
    file on a missing or unreadable file, invalid TOML, an unknown table or key (with the known
    ones) or a bad value."""
    where = f"config '{path}'"
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise CinmError(f"{where}: reading TOML needs Python 3.11 or later") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise CinmError(f"cannot read {where}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CinmError(f"{where} is not valid TOML: {first}") from None
    by_section: dict[str, dict[str, OptionSpec]] = {}
    for spec in schema.values():
        by_section.setdefault(spec.section, {})[spec.name] = spec
    out = {}
    for section, table in data.items():
        if section not in by_section:
            raise CinmError(f"{where}: {unknown_key(section, by_section, 'table')}")
        if not isinstance(table, dict):
            raise CinmError(f"{where}: '{section}' must be a table ([{section}] with NAME = VALUE "
                            "lines)")
        names = by_section[section]
        for name, value in table.items():
            spec = names.get(name)
            if spec is None:
                raise CinmError(f"{where}: [{section}] {unknown_key(name, names, 'key')}")
            try:
                out[spec.key] = check(spec, value)
            except CinmError as e:
                raise CinmError(f"{where}: [{section}] {e}") from None
    return out
