"""Device registry.

This is the only module the upper layers use to reach devices: :func:`get_device`,
:func:`all_devices` and :func:`device_names`. The built-in device packages (``host``,
``memristor``, ``upmem``) are imported here, where they register themselves; adding a chip is
adding a package that calls :func:`register`, not editing a pass.
"""
from __future__ import annotations

import importlib

from ..errors import CinmError
from .base import Cost, Device, OpInfo, Registry, Support, TensorInfo

__all__ = ["Cost", "Device", "OpInfo", "Support", "TensorInfo", "register", "get_device", "all_devices",
           "device_names"]

_registry = Registry()
_BUILTIN = ("host", "memristor", "upmem")
_loaded = False


def register(device: Device) -> Device:
    """Register a device instance (called by device packages at import time)."""
    return _registry.register(device)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _BUILTIN:
            importlib.import_module(f"{__name__}.{mod}")


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
