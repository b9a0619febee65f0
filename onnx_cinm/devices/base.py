"""The device contract: everything a chip provides to the layers above it.

The upper layers (dialect, passes, runtime session, report, CLI) reach devices only through the
registry in :mod:`onnx_cinm.devices` and the :class:`Device` base class here; they never import a
device package and never probe a device for optional methods. A device is one subclass of
:class:`Device` that declares, as class attributes, everything the layers above need:

- ``name`` and ``paradigm`` (``"cim"``, ``"cnm"`` or ``"host"``), ``params`` (a dataclass whose
  fields carry units and sources);
- ``Options``: its typed options (a dataclass of :func:`onnx_cinm.options.option` fields, keyed
  ``<option_prefix>_<field>``): CLI flags, sweep keys and config files come from it, and so do
  the other spellings a field declares (:class:`onnx_cinm.options.Alias`: ``--cim-size
  ROWSxCOLS``, the sweep key ``crossbar.count``);
- ``colour``: its colour in the report's pictures;
- ``plan_attrs``: the node attributes its plans write, every name starting with
  ``<attr_prefix>_``; the registry declares them in the cinm dialect's schema;
- ``modes``: how the execution provider may run its nodes (provider option ``<name>_mode``);
- ``RunOptions``: typed options of a run (provider options ``<option_prefix>_<field>``) that
  change what its kernels compute without compiling again (a crossbar's time after
  programming, drift compensation, seed), handed to :meth:`Device.kernel`;

and implements :meth:`Device.supports` and :meth:`Device.cost`; the rest have defaults that make
a *cost-model* device (priced and placed; its nodes run their reference bodies on the host):
:meth:`~Device.supports_under`, :meth:`~Device.check_options`, :meth:`~Device.catalog`,
:meth:`~Device.resources`, :meth:`~Device.price`, :meth:`~Device.price_all`,
:meth:`~Device.transfer_cost`, :meth:`~Device.lower_paradigm`, :meth:`~Device.lower`,
:meth:`~Device.emit`, :meth:`~Device.kernel`, :meth:`~Device.inexact`,
:meth:`~Device.recorded`, :meth:`~Device.summary`, :meth:`~Device.recorded_options`,
:meth:`~Device.cost_notes`. The registry checks a device when it registers (:func:`check_device`).
"""
from __future__ import annotations

import contextvars
import dataclasses
import errno
import functools
import hashlib
import inspect
import json
import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from .. import usercache
from ..graph import Cost, OpInfo, TensorInfo  # noqa: F401  (re-exported: the contract's types)
from ..options import OptionSpec, specs


def accepts_keyword(method, name: str) -> bool:
    """Whether a device's bound ``method`` accepts the keyword argument ``name`` (a parameter of
    that name or ``**kwargs``). A plugin written before a method of :class:`Device` gained a
    keyword overrides it without that keyword; the caller then leaves it out (and gives up
    what it asks for) rather than fail with TypeError: ``from_patches(groups=)``,
    ``summary(fold=)``. False when there is no signature to read (a builtin: no guess)."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name and p.kind is not p.POSITIONAL_ONLY
               or p.kind is p.VAR_KEYWORD for p in params)


@dataclass(frozen=True)
class Support:
    """A device's answer to "can you run this op?": ``ok`` and, either way, the reason in words.

    ``applicable`` is False when the op is simply not of a kind the device computes (a crossbar
    asked about a Relu); placement then leaves the refusal out of its explanation. ``preferred``
    is False when the device can run the op but the paper heuristic should not choose it on its
    own (a crossbar asked to program an activation every inference); a user hint still may.
    """

    ok: bool
    reason: str
    applicable: bool = True
    preferred: bool = True

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class Resources:
    """What a device has that the ops placed on it share, for the placement's budgets.

    Attributes:
        crossbars: crossbar arrays (tiles kept programmed by all kernels must fit), 0 if none.
        memory_bytes: device memory for resident constants (e.g. DPUs x MRAM), bytes; 0 if none.
    """

    crossbars: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True)
class Wear:
    """A device's cell wear under one model's plans (:meth:`Device.wear`).

    Attributes:
        figures: JSON-ready figures, written into ``report``'s ``wear.json`` (for a crossbar:
            writes per cell per inference of the most-written cells, the cells' endurance,
            the lifetime in inferences and in seconds at back-to-back inference, ...).
        line: one line for people, e.g. ``"wear: 81 writes per cell per inference ..."``.
        note: advice when the device wears out soon, else ``""``.
    """

    figures: dict
    line: str
    note: str = ""


@dataclass(frozen=True)
class Priced:
    """One way a device can run one op, with what it costs and what it keeps.

    Attributes:
        cost: per-inference :class:`Cost`.
        kept_crossbars: crossbar tiles this choice keeps programmed across inferences (each
            holds one crossbar of :attr:`Resources.crossbars`), 0 if none.
        resident_bytes: constant bytes kept in device memory (:attr:`Resources.memory_bytes`).
        streamed: the choice shares the device's arrays with other kernels (its tiles are
            rewritten every inference), as opposed to pinning them.
        load_s, load_j: one-time cost of loading the resident data (seconds, joules); not part
            of the per-inference cost.
        tile_set: names the programmed data the kept crossbars hold when other ops can run
            over the same (a crossbar's weight initializer, programmed the same way); choices
            of one device with the same non-empty ``tile_set`` keep one copy between them.
    """

    cost: Cost
    kept_crossbars: int = 0
    resident_bytes: int = 0
    streamed: bool = False
    load_s: float = 0.0
    load_j: float = 0.0
    tile_set: str = ""


class Device:
    """Base class of every device. Subclasses set the class attributes below and implement
    :meth:`supports` and :meth:`cost`; every other method has a working default.

    Class attributes:
        name: registry name (``--place PATTERN=NAME``, the node's ``device`` attribute).
        paradigm: ``"cim"``, ``"cnm"`` or ``"host"``.
        option_prefix: prefix of the device's option keys (``cim`` gives ``cim_rows``); empty
            when the device has no options.
        Options: dataclass of :func:`~onnx_cinm.options.option` fields (None: no options).
        attr_prefix: prefix of its plan attribute names (``cnm`` gives ``cnm_dpus``).
        plan_attrs: ``{attribute name: type}`` its :meth:`lower` writes, types named as in
            :data:`onnx_cinm.dialects.ATTR_TYPE_NAMES` (``"int"``, ``"float"``, ``"string"``,
            ``"ints"``, ``"floats"``, ``"strings"``).
        modes: run modes of its nodes in the execution provider, the default first. ``"model"``
            means: the node runs its reference body on the host and the profile charges the
            plan's modeled cost; other modes run :meth:`kernel`. Provider option
            ``<name>_mode`` picks one.
        RunOptions: dataclass of :func:`~onnx_cinm.options.option` fields the execution
            provider accepts as provider options (keys ``<option_prefix>_<field>``, e.g.
            ``cim_time_s``) and passes to :meth:`kernel` (``run_options``, by field name):
            what a run changes without compiling again (None: nothing).
        plans_together: the ops placed on the device share its resources (crossbars), so
            :meth:`price_all` and :meth:`lower` must see all of them at once.
        colour: ``#rrggbb``, the device's colour in the report's pictures (bars, graph nodes);
            "" for one picked from matplotlib's ``tab10`` in order of appearance.

    Instance attribute ``params``: a dataclass instance of the device's parameters (the figures
    ``onnx-cinm devices`` prints), each field documented with unit and source.
    """

    name: ClassVar[str] = ""
    paradigm: ClassVar[str] = ""
    option_prefix: ClassVar[str] = ""
    Options: ClassVar[type | None] = None
    attr_prefix: ClassVar[str] = ""
    plan_attrs: ClassVar[dict] = {}
    modes: ClassVar[tuple] = ("model",)
    RunOptions: ClassVar[type | None] = None
    plans_together: ClassVar[bool] = False
    colour: ClassVar[str] = ""
    params: Any = None

    # -- what it runs and what that costs ------------------------------------------------------
    def supports(self, op: OpInfo) -> Support:
        """Whether this device can run ``op``, with the reason in words."""
        raise NotImplementedError

    def supports_under(self, op: OpInfo, options: dict) -> Support:
        """Whether the device runs ``op`` under the pass ``options`` (keys as in
        :meth:`option_specs`): :meth:`supports`, unless one of the device's options widens what
        it takes (a dtype it computes only when asked to). Placement and lowering ask this one;
        default: :meth:`supports`."""
        return self.supports(op)

    def writes_permuted(self, op: OpInfo, perm: list[int]) -> bool:
        """Whether the device's kernel of ``op`` (a cinm Gemm) can write its result in the
        layout ``Transpose(result, perm)`` itself (the Gemm's ``y_perm`` attribute), so that a
        Transpose after the node is folded into it (pass ``fold_layouts``): e.g. a Conv's
        ``[N, *O, M]`` product written as NCHW. The node then runs with ``y_perm`` on this
        device only. Default: False (the device writes ``A @ B`` as it is)."""
        return False

    def cost(self, op: OpInfo, options: dict) -> Cost:
        """Modeled cost of one inference of ``op`` alone on the device under ``options`` (the
        pass options, keys as in :meth:`option_specs`). Raises CinmError on bad options or an
        op that does not fit."""
        raise NotImplementedError

    def option_specs(self) -> dict[str, OptionSpec]:
        """The device's options, keyed by flat name (empty if it declares none)."""
        if self.Options is None:
            return {}
        return specs(self.Options, self.option_prefix, self.name)

    def run_option_specs(self) -> dict[str, OptionSpec]:
        """The device's run options (:attr:`RunOptions`), keyed by flat name, as provider
        options (section: the provider's); empty if it declares none."""
        if self.RunOptions is None:
            return {}
        return specs(self.RunOptions, self.option_prefix, self.name,
                     section="CinmExecutionProvider")

    def check_options(self, options: dict) -> None:
        """Raise CinmError if options that are each valid (the schema checked their types,
        ranges and choices before) contradict each other on this device, e.g. more tasklets
        than the chosen DPU generation runs. Called at the one validation point
        (:func:`onnx_cinm.passes.check_options`); default: nothing to check."""

    def catalog(self) -> list[str]:
        """Lines the device adds to ``onnx-cinm devices`` after its parameters and options (e.g.
        its chip presets with their sources). Default: none."""
        return []

    def resources(self, options: dict) -> Resources:
        """What the ops placed on the device share under ``options`` (default: nothing)."""
        return Resources()

    def price(self, op: OpInfo, options: dict) -> list[Priced]:
        """Every way the device can run ``op`` (e.g. crossbar tiles pinned or streamed), each
        priced; default: one choice, :meth:`cost`, keeping nothing. Raises like :meth:`cost`."""
        return [Priced(self.cost(op, options))]

    def price_all(self, items: list) -> list[Priced] | None:
        """The choices the device's compiled plans make for all the ops placed on it together,
        ``items`` being ``[(OpInfo, options)]`` in execution order, one :class:`Priced` per
        item; None if the ops do not share anything (each is priced alone). Raises like
        :meth:`cost`."""
        return None

    def transfer_cost(self, nbytes: int, to_device: bool, options: dict) -> Cost:
        """Moving ``nbytes`` between host memory and the device (``to_device``: host to device).
        Default: free (a device whose kernel costs include their transfers)."""
        return Cost(0.0, 0.0, 0, 0)

    # -- compiling -----------------------------------------------------------------------------
    def lower_paradigm(self, items: list) -> list[dict]:
        """The paradigm-level part of :meth:`lower`'s plans (the ``paradigm`` level of
        ``--stop-after``): per item, the attributes that say how the device's paradigm computes
        the op -- cim: tiles, loop order, residency (:mod:`onnx_cinm.paradigms.cim`); cnm:
        workgroup, distribution, memory, merge (:mod:`onnx_cinm.paradigms.cnm`) -- without the
        device's modeled cost, run modes or kernel path. ``items`` as in :meth:`lower`; names
        from :attr:`plan_attrs`. :meth:`lower` must write the same values again. Default:
        nothing (the device level writes the whole plan). Raises CinmError on bad options."""
        return [{} for _ in items]

    def lower(self, items: list) -> list[dict]:
        """The plans of all the ops placed on the device, ``items`` being ``[(OpInfo, options)]``
        in execution order (``options["kernel_stem"]``: a unique, file-safe stem for the node's
        kernel; ``options["per_inference"]``, if given and False: the node sits in an If branch
        the planning probe did not see taken, so it is loaded but does not count per inference,
        and the device may give its shared resources to the others first). One dict of node
        attributes per item: names from :attr:`plan_attrs`, plus
        ``kernel`` (the kernel's path under the ``<model>.cinm/`` folder) when it emits one.
        Default: no plan (the node keeps its reference body). Raises CinmError on bad options."""
        return [{} for _ in items]

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root: Path) -> list[Path]:
        """Write the kernel of a lowered node under ``root`` (the ``<model>.cinm/`` folder being
        built) at ``attrs["kernel"]``; ``consts`` maps the node's constant input names to numpy
        arrays. Returns the paths written. Files written with :func:`write_kernel_file` are
        listed in the manifest from their bytes in memory; any other file is read back to hash
        it. Default: nothing to write."""
        return []

    def kernel(self, op: OpInfo, attrs: dict, root: Path, consts: dict,
               mode: str, run_options: dict | None = None,
               shared: dict | None = None) -> Callable | None:
        """A callable running the node's kernel in ``mode`` (one of :attr:`modes` other than
        ``"model"``): ``f(inputs) -> (outputs, metrics)``, ``inputs`` and ``outputs`` lists of
        numpy arrays (None for an absent optional input; the outputs are the caller's, who may
        write them in place: a kernel reuses an output array only once nobody holds it),
        ``metrics`` the per-call figures
        (``latency_s`` seconds, ``energy_j`` joules, ``writes``, ``bytes_moved`` bytes; None
        where unknown; ``basis``: ``"run"`` when they are counted on this call's inputs, at
        their sizes, ``"plan"`` (the default when absent) when they are the recorded plan's,
        at the sizes the model was planned at); its attribute ``load_metrics`` is the one-time load (``tile_writes``,
        ``latency_s``, ``energy_j``) or None. None: the node runs its reference body on the
        host. ``root`` is the ``<model>.cinm/`` folder; ``consts`` the node's constant inputs
        by name; ``run_options`` the :attr:`RunOptions` given to the provider, by field name
        (only those given; raise CinmError if they do not fit the node's plan).
        ``shared``: a dict the caller keeps as long as its kernels, the same for all of them
        (None: none), where a kernel may keep an array it derives from a constant for the
        kernels over the same constant (keyed by all it depends on: the constant array
        itself, held in the entry, not only its name), so they hold one copy between them."""
        return None

    def from_patches(self, kernel: Callable, geometry: tuple,
                     activation: str | None = None, groups: int = 1) -> Callable | None:
        """For a :meth:`kernel` whose first input is made by a cinm Im2Col of ``geometry``
        (``(kernel_shape, strides, pads, dilations)``) that nothing else reads (``groups`` >
        1: through the views splitting the patches ``[n, *O, C*k]`` into ``[n, G, *O, C/G*k]``,
        a grouped convolution's): a callable
        ``f(x) -> (outputs, metrics) | None`` computing the node from the Im2Col's input ``x``
        without materializing the patches (None from ``f``: not for this call; the provider
        then runs the Im2Col and the kernel as usual). ``activation`` ``"Relu"``: the output
        only a Relu reads, which ``f`` applies too (its outputs are the Relu's). None (the
        default): the kernel always takes the patches. An override without a ``groups``
        parameter (or ``**kwargs``), as written before it existed, is asked for ungrouped
        patches only. ``f`` may take keywords the provider then uses: ``out``, a C-contiguous
        array of the output's shape and dtype (its slice of a Concat's buffer) to write the
        result into when it can, so the Concat moves nothing (a result elsewhere is as
        correct); ``residual`` with ``residual_activation``, an array of the output's shape to
        add to the result and then None or ``"Relu"`` to apply (a residual connection's Add
        and Relu; ``f``'s outputs are then theirs, or ``f`` returns None and the provider adds
        it in onnxruntime)."""
        return None

    def inexact(self, attrs: dict, mode: str, run_options: dict | None = None) -> str | None:
        """Why a lowered node's kernel, run in ``mode`` with ``run_options`` (as for
        :meth:`kernel`), differs from the exact op by design
        (a quantized or noisy data path, arithmetic in a narrower type), in words; ``compare``
        then reports error statistics instead of a pass/fail verdict. None: meant to be exact
        (the default)."""
        return None

    def option_warnings(self, options: dict) -> list[str]:
        """One-line warnings on pass options ``options`` (flat keys, as given) that are valid
        but change nothing in what this device compiles (a time after programming for an exact
        data path, say); ``optimize`` prints them. [] by default."""
        return []

    def cost_notes(self, options: dict) -> list[str]:
        """One-line notes, in parentheses, on where this device's cost figures under pass
        options ``options`` come from when a reader could not tell from the table (e.g. a
        chip's per-array figures scaled from its published array size to another), for
        ``optimize``'s and ``report``'s tables; [] by default."""
        return []

    def wear(self, plans: list, counted: list | None = None,
             seconds_per_inference: float | None = None) -> Wear | None:
        """How fast the plans ``plans`` (as in :meth:`summary`; ``counted`` too) wear out this
        device's write-limited cells when inferences run back to back every
        ``seconds_per_inference`` seconds (None: the plans' own modeled latency, a lower bound
        of the period), for ``optimize``'s summary, ``report`` and ``run --profile``; None if
        the device has no such cells (the default) or no plan uses them."""
        return None

    # -- reading a compiled plan back ----------------------------------------------------------
    def recorded(self, attrs: dict) -> Priced | None:
        """The choice a node's recorded plan ``attrs`` made (per-inference cost, kept crossbars,
        load cost), None if the node has no plan of this device."""
        return None

    def fixed_operands(self, op_type: str, attrs: dict) -> tuple[int, ...]:
        """The inputs of a lowered node (indices into its inputs; op type ``op_type``, plan
        ``attrs``) whose shape its compiled plan fixes: a run where such an input, if it is
        no constant, has another shape fails (a kernel compiled for that shape alone).
        ``optimize`` warns when one follows a symbolic dim of the model's inputs. Default:
        none (the kernel takes any size of its inputs; the crossbar device plans a programmed
        activation again at a run's shape)."""
        return ()

    def summary(self, plans: list, counted: list | None = None, fold: bool = True,
                ops: list | None = None) -> str:
        """A table for people of the plans of a model's nodes on this device, ``plans`` being
        ``[(node name, op type, attrs)]`` (a node inside an If branch named with its branch
        path, ``/dec/If_1[then] /dec/rnn/Gemm``); printed by ``optimize``. ``counted``: per
        plan, whether per-inference totals count it (False: the other branch of an If whose
        taken branch the planning probe saw; such a kernel still counts in load-time totals,
        as both branches are loaded); None: all. ``fold``: rows of one source op with the
        same figures (an unrolled recurrence's steps) shown as one row with a count
        (:func:`onnx_cinm.text.fold_rows`; the totals unchanged); False (``optimize -v``):
        one row per plan. ``ops``: per plan, the node's :class:`OpInfo` (shapes, dtypes,
        constness) or None where it is not known (a node in an If branch); a summary that
        does not take the keyword is called without it. Default: none."""
        return ""

    def recorded_options(self, plans: list) -> dict:
        """Options the plans were compiled with (``plans`` as in :meth:`summary`), so that a
        report prices alternatives with the same device configuration. Default: none."""
        return {}


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")


def _alias_labels(dev: Device) -> set[str]:
    """The flags and sweep keys of the aliases of ``dev``'s options
    (:class:`~onnx_cinm.options.Alias`)."""
    return {label for spec in dev.option_specs().values() for a in spec.aliases
            for label in (a.flag, a.sweep) if label}


def check_device(dev: object) -> None:
    """Raise TypeError unless ``dev`` keeps the contract: a :class:`Device` instance with a
    lower-case ``name``, a known ``paradigm``, ``params`` a dataclass instance, ``modes``
    starting with ``"model"``, plan attributes, options and option alias flags named under its
    prefixes, and ``colour`` empty or ``#rrggbb``."""
    if not isinstance(dev, Device):
        raise TypeError(f"{type(dev).__name__} is not a device (not a subclass of "
                        "onnx_cinm.devices.Device)")
    if not isinstance(dev.name, str) or not _NAME.match(dev.name):
        raise TypeError(f"device name {dev.name!r} must be lower-case letters, digits and _")
    if dev.paradigm not in ("cim", "cnm", "host"):
        raise TypeError(f"device '{dev.name}': unknown paradigm {dev.paradigm!r}")
    if not dataclasses.is_dataclass(dev.params) or isinstance(dev.params, type):
        raise TypeError(f"device '{dev.name}': params must be a dataclass instance, not "
                        f"{type(dev.params).__name__}")
    for meth in ("supports", "cost"):
        if getattr(type(dev), meth) is getattr(Device, meth):
            raise TypeError(f"device '{dev.name}' does not implement {meth}()")
    if not isinstance(dev.modes, tuple) or not dev.modes or \
            not all(isinstance(m, str) for m in dev.modes):
        raise TypeError(f"device '{dev.name}': modes must be a non-empty tuple of names")
    if dev.plan_attrs:
        if not dev.attr_prefix:
            raise TypeError(f"device '{dev.name}' declares plan attributes but no attr_prefix")
        bad = [a for a in dev.plan_attrs if not a.startswith(dev.attr_prefix + "_")]
        if bad:
            raise TypeError(f"device '{dev.name}': plan attributes {bad} do not start with "
                            f"'{dev.attr_prefix}_'")
    for what, cls, declared in (("options", dev.Options, dev.option_specs),
                                ("run options", dev.RunOptions, dev.run_option_specs)):
        if cls is None:
            continue
        if not dev.option_prefix:
            raise TypeError(f"device '{dev.name}' declares {what} but no option_prefix")
        bad = [k for k in declared()  # TypeError on a field that is not a typed option
               if not k.startswith(dev.option_prefix + "_")]
        if bad:  # a field may name its own key: it must still be the device's
            raise TypeError(f"device '{dev.name}': {what} {bad} do not start with "
                            f"'{dev.option_prefix}_'")
    flag = f"--{dev.option_prefix.replace('_', '-')}-"
    bad = sorted(a.flag for spec in dev.option_specs().values() for a in spec.aliases
                 if a.flag and not a.flag.startswith(flag))
    if bad:
        raise TypeError(f"device '{dev.name}': option alias flags {bad} do not start with "
                        f"'{flag}'")
    if not isinstance(dev.colour, str) or dev.colour and not _COLOUR.match(dev.colour):
        raise TypeError(f"device '{dev.name}': colour {dev.colour!r} is not '#rrggbb'")


@dataclass
class Registry:
    """Devices by name. Device packages register themselves; the upper layers only look up."""

    devices: dict[str, Device] = field(default_factory=dict)

    def register(self, device: Device) -> Device:
        """Add ``device`` after :func:`check_device`; raises TypeError if it breaks the contract
        and ValueError if its name, an option key or a plan attribute prefix is taken."""
        check_device(device)
        if device.name in self.devices:
            raise ValueError(f"device {device.name!r} is already registered")
        for other in self.devices.values():
            if device.attr_prefix and device.attr_prefix == other.attr_prefix:
                raise ValueError(f"device {device.name!r}: plan attribute prefix "
                                 f"'{device.attr_prefix}_' is {other.name!r}'s")
            clash = ({*device.option_specs(), *device.run_option_specs()}
                     & {*other.option_specs(), *other.run_option_specs()})
            if clash:
                raise ValueError(f"device {device.name!r}: options {sorted(clash)} are "
                                 f"{other.name!r}'s")
            clash = _alias_labels(device) & _alias_labels(other)
            if clash:
                raise ValueError(f"device {device.name!r}: option aliases {sorted(clash)} are "
                                 f"taken by device {other.name!r}")
        self.devices[device.name] = device
        return device


#: ``{path: (bytes, sha256 hex)}`` of the files :func:`write_kernel_file` wrote while
#: :func:`recorded_writes` is active (the manifest of the kernel folder being built), else None
_WRITTEN: contextvars.ContextVar = contextvars.ContextVar("kernel_files_written", default=None)


#: ``open(name, "wb")``'s flags: created or truncated, not inherited by child processes
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)


def write_kernel_file(path, data) -> Path:
    """Write one kernel file: ``data`` (``str``, encoded as UTF-8, or a bytes-like object such
    as ``bytes`` or a contiguous ``uint8`` array) to ``path`` (created or replaced); return the
    path as a :class:`~pathlib.Path`. While :func:`recorded_writes` is active (the manifest
    being built by :func:`onnx_cinm.artifacts.emit`), the file's size and SHA-256 are recorded
    from the bytes in memory, so the manifest does not open and read every file again.
    Raises OSError as ``open`` does.

    Written through the descriptor (``os.open``/``os.write``), not a Python file object: that
    one asks whether the file is a terminal, stats it and seeks to its end, three system calls
    more per file (a DenseNet121 kernel folder has 245 files)."""
    name = os.fspath(path)  # opened by its string: a Path costs more than the write of a kernel
    view = memoryview(data.encode() if isinstance(data, str) else data).cast("B")
    fd = os.open(name, _WRITE_FLAGS, 0o666)  # the mode open(name, "wb") creates a file with
    try:
        done = 0
        while done < view.nbytes:  # a regular file takes it in one write; loop all the same
            n = os.write(fd, view[done:])
            if n == 0:  # no progress (never on a regular file): an error, not an endless loop
                raise OSError(errno.EIO, f"no bytes written to {name!r}")
            done += n
    finally:
        os.close(fd)
    log = _WRITTEN.get()
    if log is not None:
        log[name] = (view.nbytes, hashlib.sha256(view).hexdigest())
    return path if isinstance(path, Path) else Path(name)


_JSON_STR = json.encoder.encode_basestring_ascii  # the C encoder json.dumps uses for strings


class _NotPlain(Exception):
    """A value :func:`json_text` leaves to ``json.dumps``."""


def json_text(obj) -> str:
    """``json.dumps(obj, indent=1) + "\\n"``, the same text (the kernel folder's manifest and
    kernel files are written in it), built directly: with ``indent`` ``json`` encodes in Python
    through a generator per value (0.02 s of a DenseNet121 save, for 33 small files). Plain
    JSON values (dict with str keys, list, tuple, str, int, float, bool, None) are built
    here; anything else goes to ``json.dumps`` as it is, which converts it or raises its
    TypeError."""
    out: list[str] = []
    try:
        _json_parts(obj, "\n", out)
    except _NotPlain:
        return json.dumps(obj, indent=1) + "\n"
    out.append("\n")
    return "".join(out)


def _json_parts(v, newline: str, out: list) -> None:
    kind = type(v)
    if kind is str:
        out.append(_JSON_STR(v))
    elif kind is int:
        out.append(int.__repr__(v))
    elif kind is dict or kind is list or kind is tuple:
        if not v:
            out.append("{}" if kind is dict else "[]")
            return
        inner = newline + " "
        sep = ("{" if kind is dict else "[") + inner
        # strings and integers, most values (a manifest's file entries), are written here
        # rather than by a call each
        if kind is dict:
            for key, value in v.items():
                if type(key) is not str:
                    raise _NotPlain
                out.append(sep)
                out.append(_JSON_STR(key))
                leaf = type(value)
                if leaf is str:
                    out.append(": " + _JSON_STR(value))
                elif leaf is int:
                    out.append(": " + int.__repr__(value))
                else:
                    out.append(": ")
                    _json_parts(value, inner, out)
                sep = "," + inner
        else:
            for value in v:
                out.append(sep)
                leaf = type(value)
                if leaf is str:
                    out.append(_JSON_STR(value))
                elif leaf is int:
                    out.append(int.__repr__(value))
                else:
                    _json_parts(value, inner, out)
                sep = "," + inner
        out.append(newline + ("}" if kind is dict else "]"))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif kind is float:  # as json's floatstr: repr, and its names for the non-finite values
        out.append(float.__repr__(v) if math.isfinite(v)
                   else "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity")
    else:
        raise _NotPlain



@contextmanager
def recorded_writes():
    """Record the files :func:`write_kernel_file` writes in this context (this thread or
    task): yields the ``{path string: (bytes, sha256 hex)}`` dict it fills; the last write of a
    path wins. Recording stops when the context ends. :func:`emit_memo` dicts live as long as
    the context (one kernel folder being written)."""
    log: dict = {}
    token = _WRITTEN.set(log)
    memo = _MEMO.set({})
    try:
        yield log
    finally:
        _MEMO.reset(memo)
        _WRITTEN.reset(token)


#: the :func:`emit_memo` dicts of the active :func:`recorded_writes` context, by owner, else None
_MEMO: contextvars.ContextVar = contextvars.ContextVar("emit_memos", default=None)


def emit_memo(owner: str) -> dict:
    """A dict a device's ``emit`` may keep results in (e.g. a plan by the attributes it is made
    from, so that kernels of one shape are planned and rendered once) for as long as the active
    :func:`recorded_writes` context lasts (one kernel folder being written: nothing is kept
    between two saves, which may have other options); ``owner`` names the user (one dict
    each). Outside such a context, a new empty dict each call (nothing kept)."""
    memos = _MEMO.get()
    if memos is None:
        return {}
    memo = memos.get(owner)
    if memo is None:
        memo = memos[owner] = {}
    return memo


def render(template, **context) -> str:
    """``template.render(**context)``: the same text, and the same errors (Jinja's traceback
    rewriting included), without building the template's globals into a new dict per call
    (``Template.render`` reads its ``ChainMap`` of globals key by key every time: a third of
    rendering a crossbar kernel). The globals are read once per template, which is what Jinja
    does too as long as nobody adds globals after loading (this package never does)."""
    from jinja2.runtime import new_context

    flat = _GLOBALS.get(id(template))
    if flat is None or flat[0] is not template:
        flat = _GLOBALS[id(template)] = (template, dict(template.globals))
    env = template.environment
    ctx = new_context(env, template.name, template.blocks, {**flat[1], **context}, True,
                      flat[1])  # the context reads only the globals' names
    try:
        return env.concat(template.root_render_func(ctx))
    except Exception:
        env.handle_exception()
        raise  # handle_exception always raises


#: :func:`render`'s globals per template, by id: ``(template, plain dict of its globals)``
_GLOBALS: dict = {}


@functools.cache
def template(name: str):
    """The package template ``name`` (e.g. ``"upmem/unary/dpu.c.j2"``), looked up once per
    process in one :func:`template_environment`, made at the first kernel rendered, not when a
    device is imported: importing Jinja is ~100 M instructions that ``--help``, ``devices`` and
    a run with no kernel to write never need. Raises ``jinja2.TemplateNotFound``."""
    return _environment().get_template(name)


@functools.cache
def _environment():
    return template_environment()


def template_environment():
    """The Jinja environment a device's code generator renders the package's templates with
    (``onnx_cinm/templates/``, one folder per kernel kind): package data, so each template is
    compiled once per process and never checked for changes (``auto_reload`` would stat its file
    on every kernel), and its compiled code is kept across processes in
    ``$XDG_CACHE_HOME/onnx-cinm/jinja`` (``~/.cache/onnx-cinm/jinja`` when XDG_CACHE_HOME is
    unset or empty), as Python keeps a module's bytecode: compiling the templates a model needs
    took 20-30 ms of every ``optimize``. An entry holds its template's checksum and Jinja's
    version, so an edited template or another Jinja compiles afresh; a cache that cannot be read
    (missing, unreadable, an entry cut short) or written is ignored. Undefined names are errors
    (``StrictUndefined``); nothing is escaped; a template's trailing newline is kept."""
    import os

    import jinja2

    class _Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket) -> None:
            # Any failure, not only OSError: an entry cut short (a full disk, a killed
            # process) fails in pickle or marshal (EOFError, UnpicklingError, ValueError...).
            try:
                super().load_bytecode(bucket)
            except Exception:  # noqa: BLE001 - a cache never fails an optimize
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            try:
                os.makedirs(self.directory, exist_ok=True)
                super().dump_bytecode(bucket)
            except OSError:
                pass

    folder = usercache.cache_dir("jinja")  # None: no known home, templates compiled each time
    return jinja2.Environment(
        loader=jinja2.PackageLoader("onnx_cinm", "templates"), keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False, auto_reload=False,
        bytecode_cache=None if folder is None else _Cache(folder))
