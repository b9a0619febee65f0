"""Where onnx-cinm keeps its per-user caches: ``$XDG_CACHE_HOME/onnx-cinm`` (the XDG base
directory), else ``~/.cache/onnx-cinm``. The compiled Jinja templates, the stdlib's compiled
code (:mod:`onnx_cinm.cli.compile_cache`), UPMEM builds and the measured host roofline live
in folders under it; every one is only a cache, rebuilt when missing."""
from __future__ import annotations

import os


def cache_dir(name: str) -> str | None:
    """The folder ``name`` under onnx-cinm's cache root (not created), or None when the user
    has no known home to put it in (HOME unset and no passwd entry, e.g. a container run as
    an unknown uid: ``os.path.expanduser`` then leaves ``~`` as it is, and a relative
    ``~/.cache`` would land in the working directory)."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "onnx-cinm", name)
