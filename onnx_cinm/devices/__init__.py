"""Device registry.

This is the only module the upper layers use to reach devices: :func:`get_device`,
:func:`all_devices` and :func:`device_names`. The built-in device packages (``host``,
``memristor``, ``upmem``) are imported here, where they register themselves; adding a chip is
adding a package that calls :func:`register`, not editing a pass.

Plugins: an installed distribution adds a device through the entry-point group
``onnx_cinm.devices`` (:data:`ENTRY_POINT_GROUP`), e.g. in its ``pyproject.toml``::

    [project.entry-points."onnx_cinm.devices"]
    my_chip = "my_chip_device:MyChipDevice"

The entry point may name a device instance, a :class:`Device` subclass or a factory returning
one (called without arguments), or a module that calls :func:`register` when imported. Plugins
load after the built-ins, in entry-point name order; a plugin that fails (import error, an object
that breaks the contract of :func:`~onnx_cinm.devices.base.check_device`, name, option or
attribute prefix taken, even ``sys.exit()``) is skipped with one line on stderr and listed by
:func:`plugin_errors`; the built-ins stay.

Registering a device declares its plan attributes in the cinm dialect's schema
(:func:`onnx_cinm.dialects.declare_plan_attrs`) and its options in the compiler's option
schema (:func:`option_schema`).
"""
from __future__ import annotations

import importlib
import sys
import types

from ..dialects import declarations_batched, declare_plan_attrs
from ..errors import CinmError
from ..options import OptionSpec
from .base import (
    Cost,
    Device,
    OpInfo,
    Priced,
    Registry,
    Resources,
    Support,
    TensorInfo,
    Wear,
    emit_memo,
    json_text,
    recorded_writes,
    write_kernel_file,
)

__all__ = ["Cost", "Device", "OpInfo", "Priced", "Resources", "Support", "TensorInfo", "Wear", "register",
           "get_device", "all_devices", "device_names", "plugin_errors",
           "option_schema", "ENTRY_POINT_GROUP", "json_text", "emit_memo", "recorded_writes",
           "write_kernel_file"]

_registry = Registry()
_BUILTIN = ("host", "memristor", "upmem")
_loaded = False
_plugin_errors: list[str] = []

#: Entry-point group through which installed packages register devices.
ENTRY_POINT_GROUP = "onnx_cinm.devices"


def register(device: Device) -> Device:
    """Register a device instance (called by device packages at import time) and declare its
    plan attributes in the cinm dialect. Raises TypeError if it breaks the contract
    (:func:`~onnx_cinm.devices.base.check_device`), ValueError if its name, an option key or
    its attribute prefix is taken."""
    _registry.register(device)
    try:
        declare_plan_attrs(device.plan_attrs)
    except ValueError:
        del _registry.devices[device.name]
        raise
    return device


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        with declarations_batched():  # the dialect takes every device's attributes at once
            for mod in _BUILTIN:
                importlib.import_module(f"{__name__}.{mod}")
            _load_plugins()


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    try:
        eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    except Exception as e:  # noqa: BLE001 - broken metadata must not break the built-ins
        _report(f"device plugins not loaded: cannot read entry points: {type(e).__name__}: {e}")
        return
    seen = set()
    for ep in eps:
        if ep.name in seen:  # the same distribution seen twice on sys.path
            continue
        seen.add(ep.name)
        try:
            obj = ep.load()
            if isinstance(obj, types.ModuleType):
                continue  # the module registered its device(s) on import
            if not isinstance(obj, Device) and callable(obj):
                obj = obj()  # a Device subclass or a factory
            if _registry.devices.get(getattr(obj, "name", None)) is not obj:
                register(obj)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one bad plugin never breaks the
            # others; a plugin calling sys.exit() must not end every command silently
            first = str(e).splitlines()[0] if str(e) else ""
            if isinstance(e, SystemExit):
                first = f"it called sys.exit({'' if e.code is None else repr(e.code)})"
            _report(f"device plugin '{ep.name}' ({ep.value}) not loaded: {type(e).__name__}: {first}")


#: Whether a plugin's failure to load is printed on stderr as it happens (:func:`_report`);
#: the command line turns this off while it parses its arguments and prints the failures
#: itself, unless ``-q`` (:func:`echo_plugin_errors`).
_echo = True


def _report(line: str) -> None:
    _plugin_errors.append(line)
    if _echo:
        print(f"onnx-cinm: warning: {line}", file=sys.stderr)


def echo_plugin_errors(on: bool) -> None:
    """Print (True, the default) or only record (False) each device plugin's failure to load
    from now on; :func:`plugin_errors` lists them either way."""
    global _echo
    _echo = on


def plugin_errors() -> list[str]:
    """One line per device plugin that failed to load (empty if all loaded)."""
    _load()
    return list(_plugin_errors)


def all_devices() -> list[Device]:
    """Every registered device, in registration order (host first)."""
    _load()
    return list(_registry.devices.values())


def device_names() -> list[str]:
    """Names of every registered device."""
    return [d.name for d in all_devices()]


def get_device(name: str) -> Device:
    """The device called ``name``. Raises CinmError listing the known names if there is none
    (and the devices of that paradigm, when ``name`` is one: ``cim``, ``cnm``)."""
    _load()
    try:
        return _registry.devices[name]
    except KeyError:
        pass
    known = _registry.devices.values()
    of_paradigm = [d.name for d in known if d.paradigm == name]
    hint = (f"; '{name}' is a paradigm, not a device: its device(s) here: {', '.join(of_paradigm)}"
            if of_paradigm else "")
    raise CinmError(f"unknown device '{name}' (known: {', '.join(_registry.devices)}){hint}")


def option_schema() -> dict[str, OptionSpec]:
    """Every registered device's options, keyed by flat name (``cim_rows``), in registration
    order (see :mod:`onnx_cinm.options`)."""
    out: dict[str, OptionSpec] = {}
    for dev in all_devices():
        out.update(dev.option_specs())
    return out
