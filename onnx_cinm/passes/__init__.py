"""Passes and the pass manager.

A pass is a function ``fn(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto``
registered under a name with :func:`register_pass`. A pipeline is data: an ordered list of pass
names (:data:`DEFAULT_PIPELINE`). :class:`PassManager` runs a pipeline, times every pass, lets the
user skip passes by name and stop after a level (:data:`STOP_LEVELS`).

Passes read the level above them and write the level below (see DESIGN.md): the frontend passes
(``canonicalize_opset`` .. ``fold_batchnorm``, ``share_weights`` among them) keep standard ONNX, ``to_cinm`` writes
device-agnostic ``cinm`` ops, ``placement`` annotates them with a device, ``cim_tiling`` and
``cnm_mapping`` add each paradigm's plan (tiles, workgroups), ``device_lowering`` the device's
(cost, run mode, kernel path). No pass imports a device package; devices are reached through
:mod:`onnx_cinm.devices` (the registry).

Options: a pass declares the options it reads as typed fields (:mod:`onnx_cinm.options`) and
registers them with :func:`register_options` (declarations in :mod:`.pass_options`);
:func:`option_schema` is the compiler's whole schema (passes and devices) and
:func:`check_options` the one place every option is checked.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..errors import CinmError
from ..options import OptionSpec, specs, validate

if TYPE_CHECKING:  # annotations only: `onnx-cinm --help` must not pay for importing onnx
    import onnx

PassFn = Callable[["onnx.ModelProto", "PassContext"], "onnx.ModelProto"]

_REGISTRY: dict[str, tuple[PassFn, str]] = {}

#: Passes that only add node attributes (no shape changes): the tensor infos they share
#: (:meth:`PassContext.tensor_infos`) stay valid across them.
_KEEPS_SHAPES: set[str] = set()

#: Passes that read a model whose initializers may be left unwritten (:attr:`PassContext.unwritten`):
#: they write (or drop) those they read.
_READS_UNWRITTEN: set[str] = set()

#: The named pipeline run by ``onnx-cinm optimize``.
DEFAULT_PIPELINE: list[str] = [
    "canonicalize_opset",
    "share_weights",
    "fold_constants",
    "normalize",
    "fold_batchnorm",
    "to_cinm",
    "placement",
    "restore_host_ops",
    "fold_layouts",
    "cim_tiling",
    "cnm_mapping",
    "device_lowering",
]

#: ``--stop-after LEVEL`` -> the last pass of that level: ``cinm`` (device-agnostic ops),
#: ``placement`` (each op's device), ``paradigm`` (each paradigm's plan: crossbar tiles, loop
#: order, residency; workgroups, distribution, merges), ``device`` (the devices' whole plans:
#: modeled cost, run mode, kernel paths).
STOP_LEVELS: dict[str, str] = {"cinm": "to_cinm", "placement": "restore_host_ops",
                               "paradigm": "cnm_mapping", "device": "device_lowering"}

# Modules that define passes; imported lazily so that the registry is complete on first use.
_PASS_MODULES = ["canonicalize", "shared_weights", "to_cinm", "placement", "host_restore", "fold_layouts", "device_lowering",
                 "cnm_mapping"]


@dataclass
class PassContext:
    """State shared by the passes of one pipeline run.

    Attributes:
        options: pass options by flat key (e.g. ``"placement"`` -> ``"heuristic"``,
            ``"place"`` -> list of ``(pattern, device)`` hints, ``"cim_rows"`` -> 64), every
            key declared in :func:`option_schema` (checked by :meth:`PassManager.run`).
        stats: free-form counters a pass may record for the summary, by pass name.
        log: a callable taking one string, for progress lines (``print`` in the CLI with ``-v``).
        scope: prefix of the kernel stems the device passes hand out: empty for the main graph;
            for a control-flow body compiled on its own (:mod:`.control_flow`) the path of its
            If node, e.g. ``if0012t_`` (then-branch of the main graph's node 12), so the kernels
            of every graph of a model have distinct files.
        infos: tensor infos to use instead of inferring them (:meth:`tensor_infos`): an If
            branch annotated as a model of its own (:func:`.branches.lower_branches`) reads
            the whole model's, where its captured values have their shapes.
    """

    options: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    log: Callable[[str], None] = lambda msg: None
    scope: str = ""
    infos: dict | None = None
    #: what ``to_cinm`` lowered, one entry per standard node replaced alone: ``(NodeProto,
    #: {initializer name: TensorProto it read}, [names of the nodes it became])``; read and
    #: cleared by ``restore_host_ops`` (:mod:`.host_restore`)
    origins: list = field(default_factory=list)
    #: ``{cinm node name: op type of the source node to_cinm lowered it from}`` (none for a
    #: fusion's op, made from several): placement hints match these too (``MatMul=upmem``);
    #: set by ``to_cinm``, the If branches' added by ``compile_if_bodies``
    source_ops: dict = field(default_factory=dict)
    #: ``{initializer name: (element type, dims, the one value's bytes)}``: the initializers
    #: ``fold_constants`` wrote as one value repeated (the light models' weights), for the pass
    #: right after it, which then uses them without reading their bytes back (``normalize``
    #: permutes them: a copy of 490 MB on light VGG19); a pass that keeps it current hands it
    #: on by setting a new dict (``normalize`` to ``fold_batchnorm`` to ``to_cinm``); else the
    #: :class:`PassManager` empties it after that pass (and at every run's start)
    fills: dict = field(default_factory=dict)
    #: the cost placement's priced model (:class:`.cost_placement.Placed`), for
    #: ``restore_host_ops`` to price the model as placed without building its problem again;
    #: read and cleared by it
    placed: object | None = field(default=None, repr=False, compare=False)
    #: ``(model, weightless copy, moved names, inferred copy)``: what ``canonicalize_opset``
    #: converts a model below opset 13 from, made already by the planning probe of
    #: :func:`onnx_cinm.pipeline.optimize` (:func:`.canonicalize.conversion_inference`), which
    #: hands it on only when it leaves the model as it is; read by that pass for that very
    #: model, and cleared by the :class:`PassManager` after the first pass (and at every run's
    #: end)
    opset_inference: tuple | None = field(default=None, repr=False, compare=False)
    #: ``{initializer name: (element type, dims, the one value's bytes)}``: initializers of one
    #: value repeated a pass appended without their bytes (:func:`onnx_cinm.rewrite.add_unwritten`:
    #: ``fold_constants``' weights, which ``fold_batchnorm`` may drop unread); None where no pass
    #: may leave any (a pass called on its own). The :class:`PassManager` sets it to a dict for
    #: its run and writes the bytes (:func:`onnx_cinm.rewrite.write_unwritten`) before a pass
    #: not registered ``reads_unwritten`` runs, and at the run's end
    unwritten: dict | None = field(default=None, repr=False, compare=False)
    _infos: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def tensor_infos(self, model: onnx.ModelProto) -> dict:
        """:func:`onnx_cinm.analysis.tensor_infos` of ``model`` (:attr:`infos` when given),
        inferred once for the passes that only annotate nodes (``register_pass(...,
        keeps_shapes=True)``: placement and the paradigm and device passes, which add
        attributes no shape depends on); the :class:`PassManager` forgets it after every other
        pass. Whole-graph shape inference ran once per such pass before (4 of them on every
        optimize)."""
        from ..analysis import keep_static_types, tensor_infos

        if self.infos is not None:
            return self.infos
        key = (id(model), len(model.graph.node))
        if self._infos is None or self._infos[0] != key:
            infos = tensor_infos(model)
            # kept in the model when all known: the next pass that asks, after one that
            # rewrote the graph keeping the types (restore_host_ops), reads them back instead of
            # inferring every shape again (one whole-graph inference fewer on DenseNet121)
            keep_static_types(model, infos)
            self._infos = (key, infos)
        return self._infos[1]

    def infos_current(self, model: onnx.ModelProto) -> bool:
        """Whether the tensor infos of :meth:`tensor_infos` were taken of ``model`` as it is:
        no pass that may change a shape ran since (the :class:`PassManager` forgets them after
        every such pass), and the model has as many nodes. False with :attr:`infos` given."""
        return self.infos is None and self._infos is not None and \
            self._infos[0] == (id(model), len(model.graph.node))

    def forget_infos(self) -> None:
        """Drop the tensor infos of :meth:`tensor_infos` (the graph's shapes may change)."""
        self._infos = None

    def infos_still_hold(self, model: onnx.ModelProto) -> None:
        """Keep the tensor infos of :meth:`tensor_infos` for ``model`` after a pass removed
        nodes without changing the type or shape of any tensor that remains (``fold_layouts``:
        a Gemm now writes what its dropped Transpose wrote, the same tensor), so the next pass
        does not infer every shape again; the removed nodes' own tensors are no longer read."""
        if self._infos is not None and self.infos is None:
            self._infos = ((id(model), len(model.graph.node)), self._infos[1])


def register_pass(name: str, doc: str = "", keeps_shapes: bool = False,
                  reads_unwritten: bool = False) -> Callable[[PassFn], PassFn]:
    """Register ``fn`` as the pass ``name`` (a decorator). ``doc`` defaults to the docstring's
    first paragraph, on one line. ``keeps_shapes``: the pass changes no tensor's type or shape
    (it only annotates nodes), so the tensor infos of :meth:`PassContext.tensor_infos` stay
    valid after it. ``reads_unwritten``: the pass takes a model with initializers left
    unwritten (:attr:`PassContext.unwritten`) and writes those whose bytes it reads."""

    def deco(fn: PassFn) -> PassFn:
        first_paragraph = (fn.__doc__ or "").strip().split("\n\n")[0]
        text = doc or " ".join(first_paragraph.split())
        _REGISTRY[name] = (fn, text)
        if keeps_shapes:
            _KEEPS_SHAPES.add(name)
        if reads_unwritten:
            _READS_UNWRITTEN.add(name)
        return fn

    return deco


_OPTIONS: dict[str, tuple[type, str]] = {}


def register_options(owner: str, cls: type, prefix: str = "") -> type:
    """Declare the options of pass ``owner``: ``cls`` is a dataclass of
    :func:`onnx_cinm.options.option` fields, keyed ``<prefix>_<field>`` (the field name when
    ``prefix`` is empty); their config table and sweep section is ``owner``. Declarations live
    in :mod:`.pass_options` (importable without onnx). Raises TypeError on a field that is not
    a typed option."""
    specs(cls, prefix, owner, section=owner)
    _OPTIONS[owner] = (cls, prefix)
    return cls


def pass_option_schema() -> dict[str, OptionSpec]:
    """The options every pass declares, keyed by flat name (``objective``)."""
    importlib.import_module(f"{__name__}.pass_options")
    out: dict[str, OptionSpec] = {}
    for owner, (cls, prefix) in _OPTIONS.items():
        out.update(specs(cls, prefix, owner, section=owner))
    return out


def option_schema() -> dict[str, OptionSpec]:
    """The whole compiler's options: every pass's and every registered device's
    (:func:`onnx_cinm.devices.option_schema`), keyed by flat name. CLI flags, sweep keys,
    ``--config`` tables and the checks of :func:`check_options` all come from it. Raises
    TypeError if a device declares a key a pass declares."""
    from .. import devices

    out = pass_option_schema()
    for key, spec in devices.option_schema().items():
        if key in out:
            raise TypeError(f"option '{key}' of device '{spec.owner}' is pass "
                            f"'{out[key].owner}'s")
        out[key] = spec
    return out


def check_options(options: dict) -> dict:
    """The one check of pass options: every key must be declared (:func:`option_schema`; an
    unknown key is an error naming the closest known ones), every value must have its
    option's type, range and choices, and every device accepts the combination
    (:meth:`Device.check_options`, e.g. tasklets within the chosen DPU generation's). Returns
    the options normalized (a list of names as a tuple, ``PATTERN=DEVICE`` hints as pairs).
    Raises CinmError, one line naming the option. Called by :func:`onnx_cinm.pipeline.optimize`,
    :class:`PassManager` and the sweep."""
    from .. import devices

    out = validate(options, option_schema())
    for dev in devices.all_devices():
        dev.check_options(out)
    return out


def _load_all() -> None:
    for mod in _PASS_MODULES:
        importlib.import_module(f"{__name__}.{mod}")


def available_passes() -> dict[str, str]:
    """Return ``{pass name: one-line description}`` for every registered pass."""
    _load_all()
    return {name: text for name, (_, text) in _REGISTRY.items()}


def get_pass(name: str) -> PassFn:
    """Return the pass called ``name``. Raises :class:`CinmError` if there is none."""
    _load_all()
    if name not in _REGISTRY:
        raise CinmError(f"unknown pass '{name}' (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name][0]


@dataclass
class PassManager:
    """Run a named pipeline of passes.

    Args:
        pipeline: pass names in order; defaults to :data:`DEFAULT_PIPELINE`.
        skip: pass names not to run (``--skip-pass``); unknown names raise :class:`CinmError`.
        stop_after: a level in :data:`STOP_LEVELS` or a pass name; passes after it are not run.

    After :meth:`run`, ``timings`` holds ``(pass name, seconds)`` for each pass that ran.
    """

    pipeline: list[str] = field(default_factory=lambda: list(DEFAULT_PIPELINE))
    skip: list[str] = field(default_factory=list)
    stop_after: str | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)

    def run(self, model: onnx.ModelProto, ctx: PassContext | None = None) -> onnx.ModelProto:
        """Run the pipeline on ``model`` and return the rewritten model. Raises CinmError on
        an unknown pass or level, or options that :func:`check_options` rejects."""
        ctx = ctx or PassContext()
        ctx.options = check_options(ctx.options)
        for name in self.skip:
            get_pass(name)  # validates the name
        last = STOP_LEVELS.get(self.stop_after, self.stop_after) if self.stop_after else None
        if last is not None and last not in self.pipeline:
            raise CinmError(
                f"--stop-after '{self.stop_after}' is neither a level ({', '.join(STOP_LEVELS)}) "
                "nor a pass of the pipeline"
            )
        ctx.fills = {}  # another run's (another model's), never read here
        ctx.unwritten = {}
        try:
            for name in self.pipeline:
                if name not in self.skip:
                    fn = get_pass(name)
                    t0 = time.perf_counter()
                    if ctx.unwritten and name not in _READS_UNWRITTEN:
                        _write_unwritten(model, ctx)
                    fills = ctx.fills
                    model = fn(model, ctx)
                    if ctx.fills is fills:  # not handed on (see PassContext.fills)
                        ctx.fills = {}
                    ctx.opset_inference = None  # for the first pass only
                    if name not in _KEEPS_SHAPES:
                        ctx.forget_infos()
                    self.timings.append((name, time.perf_counter() - t0))
                    ctx.log(f"pass {name}: {self.timings[-1][1]:.2f} s")
                if name == last:
                    break
        finally:  # (a pass raising leaves a model whose initializers all have their bytes)
            if ctx.unwritten:
                _write_unwritten(model, ctx)
            ctx.unwritten = None
            ctx.fills = {}
            ctx.opset_inference = None
        return model


def _write_unwritten(model: onnx.ModelProto, ctx: PassContext) -> None:
    """Write the bytes of the initializers of ``model``'s main graph left unwritten
    (:attr:`PassContext.unwritten`), emptying it."""
    from ..rewrite import write_unwritten

    write_unwritten(model.graph, ctx.unwritten)
