"""Device registry.

This is the only module the upper layers use to reach devices: :func:`get_device`,
:func:`all_devices` and :func:`device_names`. The built-in device packages (``host``,
``memristor``, ``upmem``) are imported here, where they register themselves; adding a chip is
adding a package that calls :func:`register`, not editing a pass.

Plugins: an installed distribution adds a device through the entry-point group
``onnx_cinm.devices`` (:data:`ENTRY_POINT_GROUP`), e.g. in its ``pyproject.toml``::

    [project.entry-points."onnx_cinm.devices"]
    hbm_pim = "hbm_pim_device:HbmPimDevice"

The entry point may name a device instance, a class or factory returning one (called without
arguments), or a module that calls :func:`register` when imported. Plugins load after the
built-ins, in entry-point name order; a plugin that fails (import error, bad object, ``params``
that are not a dataclass instance, name taken, even ``sys.exit()``) is skipped with one line on
stderr and listed by :func:`plugin_errors`; the built-ins stay.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import types

from ..errors import CinmError
from .base import Cost, Device, OpInfo, Registry, Support, TensorInfo

__all__ = ["Cost", "Device", "OpInfo", "Support", "TensorInfo", "register", "get_device", "all_devices",
           "device_names", "preset_names", "plugin_errors", "ENTRY_POINT_GROUP"]

_registry = Registry()
_BUILTIN = ("host", "memristor", "upmem")
_loaded = False
_plugin_errors: list[str] = []

#: Entry-point group through which installed packages register devices.
ENTRY_POINT_GROUP = "onnx_cinm.devices"


def _check_device(obj) -> None:
    """Raise TypeError unless ``obj`` looks like a device: ``name``, ``paradigm``, ``params``
    (a dataclass instance, as every command that lists parameters expects) and ``supports``."""
    missing = [a for a in ("name", "paradigm", "params", "supports") if not hasattr(obj, a)]
    if missing:
        raise TypeError(f"{type(obj).__name__} is not a device (no {', '.join(missing)})")
    if not dataclasses.is_dataclass(obj.params) or isinstance(obj.params, type):
        raise TypeError(f"device '{obj.name}': params must be a dataclass instance, not "
                        f"{type(obj.params).__name__}")


def register(device: Device) -> Device:
    """Register a device instance (called by device packages at import time). Raises TypeError
    if it is not a device (see :func:`_check_device`)."""
    _check_device(device)
    return _registry.register(device)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
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
            if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "supports")):
                obj = obj()
            _check_device(obj)
            if _registry.devices.get(obj.name) is not obj:
                _registry.register(obj)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - one bad plugin never breaks the
            # others; a plugin calling sys.exit() must not end every command silently
            first = str(e).splitlines()[0] if str(e) else ""
            if isinstance(e, SystemExit):
                first = f"it called sys.exit({'' if e.code is None else repr(e.code)})"
            _report(f"device plugin '{ep.name}' ({ep.value}) not loaded: {type(e).__name__}: {first}")


def _report(line: str) -> None:
    _plugin_errors.append(line)
    print(f"onnx-cinm: warning: {line}", file=sys.stderr)


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
    """The device called ``name``. Raises CinmError listing the known names if there is none."""
    _load()
    try:
        return _registry.devices[name]
    except KeyError:
        raise CinmError(f"unknown device '{name}' (known: {', '.join(_registry.devices)})") from None


def preset_names(paradigm: str = "cim", table: str = "presets") -> list[str]:
    """Names in a device's optional table ``table`` (``presets``: parameter presets, e.g. the
    crossbar chips of ``--cim-preset``; ``modes``, ``effects``: its data-path modes and effects)
    over the devices of ``paradigm``, in registration order."""
    return [name for dev in all_devices() if dev.paradigm == paradigm
            for name in getattr(dev, table, None) or ()]
