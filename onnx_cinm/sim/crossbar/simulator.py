"""The ``.xbar`` parser and crossbar simulator: the heavy part of :mod:`onnx_cinm.sim.crossbar`.

The package's docstring describes the format, the simulator's counters and its data paths. The
package re-exports this module's public names (:func:`parse`, :func:`load_file`,
:class:`CrossbarSimulator`, :func:`simulate`, :class:`XbarError`, :class:`Counters`, ...) and
loads it on first use of one: a caller that only writes files (the memristor device's code
generator, which needs the package's constants and :mod:`.mode`) does not load it.
"""
from __future__ import annotations

import hashlib
import math
import threading
import urllib.parse
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CinmError
from .. import blas, scratch
from . import COST_KEYS, FORMAT_VERSION, MODEL_SOURCE, physics
from .mode import CrossbarMode

_HEADER_INT = ("crossbars", "rows", "cols")
_HEADER_CHOICES = {"dtype": ("float32", "int32"), "mode": ("ideal", "quantized"),
                   "order": ("fixed", "serpentine"), "residency": ("on", "off")}
#: Header keys of the non-ideal parameters (``mode quantized`` only) and their value types.
_MODE_KEYS = {"weight_bits": int, "cell_bits": int, "differential": bool, "dac_bits": int,
              "adc_bits": int, "adc_range": float, "noise_sigma": float, "seed": int,
              # device effects (mode.py effect 7, physics.py)
              "device": str, "prog_noise": float, "drift": float, "read_noise_1f": float,
              "time_s": float, "drift_compensation": bool, "stuck_at_0": float,
              "stuck_at_1": float, "wire_ohm_row": float, "wire_ohm_col": float,
              "adc_offset_lsb": float, "adc_gain_std": float, "adc_inl_lsb": float,
              "adc_calibration": str}
_REGION_ARITY = {"input": 2, "weight": 3, "bias": 0, "output": 2}
#: Bytes of float64 column currents a quantized MVM computes at once (:meth:`CrossbarSimulator.
#: _quantized_mvm`): blocks of rows this size (at least 256 rows) keep its temporaries small
#: enough to be reused from the heap, not mapped and faulted in afresh for every product.
_ROW_BLOCK_BYTES = 8 << 20


class _Programmed:
    """One tile as programmed with device effects (:func:`.physics.tile_state`; its arrays
    read-only) and the state of the device generator after the draws, shared by every
    simulator that programs the same levels from the same generator state (see
    :meth:`CrossbarSimulator._programmed`)."""

    __slots__ = ("state", "rng_after", "__weakref__")

    def __init__(self, state: dict, rng_after: dict):
        self.state, self.rng_after = state, rng_after


#: :class:`_Programmed` tiles by what determines them (the weights' fingerprint, the tile,
#: the geometry, the mode and the generator's state), held as long as a simulator holds one
#: on a crossbar: no memory beyond what the simulators keep anyway.
_PROGRAMMED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_PROGRAMMED_LOCK = threading.Lock()


def _frozen(state):
    """A bit generator's ``state`` dict as a hashable key (nested dicts as sorted tuples)."""
    if isinstance(state, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(state.items()))
    return state


class XbarError(CinmError):
    """A malformed or inconsistent ``.xbar`` file; the message starts with ``file:line:``."""


@dataclass
class Cmd:
    """One command: op name, its arguments (strings) and its 1-based line number."""

    op: str
    args: list
    line: int


@dataclass
class ForRows:
    """``FOR ROWS block`` ... ``END``: the body runs once per block of ``block`` input rows."""

    block: int
    body: list
    line: int


@dataclass
class Region:
    """A declared region: kind, name, dims (ints), and where a constant comes from: a sidecar
    ``file`` beside the ``.xbar`` file, or the model's ``tensor`` (:data:`MODEL_SOURCE`; given
    to :class:`CrossbarSimulator` in ``constants``)."""

    kind: str
    name: str
    dims: tuple
    file: str | None
    line: int
    tensor: str | None = None


@dataclass
class XbarProgram:
    """A parsed ``.xbar`` file."""

    path: str
    version: int
    header: dict
    cost: dict
    regions: dict
    load: list
    run: list
    #: the header's :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode`
    mode: object = None


@dataclass
class Counters:
    """What one phase (the load, or one inference) did. Times in seconds, energies in joules.

    - ``tile_writes``: tiles programmed (one logical ``rows x cols`` crossbar each);
      ``tile_writes_skipped``: ``PROGRAM`` lines skipped because the tile was resident.
    - ``cell_writes``: physical cells programmed: ``rows_used * cols_used`` per tile in ideal
      mode, times ``S * (2 if differential else 1)`` (bit slices, pairs) in quantized mode.
    - ``mvms``: input vectors streamed through a tile (one per row per ``MVM`` line; the ``S``
      slice arrays of a quantized tile are read in parallel by that one MVM).
    - ``adc_conversions``: ``cols_used`` per MVM, times ``S`` in quantized mode (one per slice
      column; a differential pair is subtracted in analog, one conversion); one DAC cycle.
    - ``dac_conversions``: input values driven onto rows: ``rows_used`` per MVM.
    - ``adc_clipped``: ADC conversions that saturated (quantized mode with ``adc_bits > 0``).
    - ``max_cell_writes`` is the wear: the most writes any single cell has received since the
      simulator was created (not only in this phase). All ``S`` (x2) cells of a weight are
      written together, so the figure is the same for every physical cell of a logical one.
    """

    tile_writes: int = 0
    tile_writes_skipped: int = 0
    cell_writes: int = 0
    mvms: int = 0
    adc_conversions: int = 0
    max_cell_writes: int = 0
    latency_s: float = 0.0
    energy_j: float = 0.0
    dac_conversions: int = 0
    adc_clipped: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)  # the fields in order; dataclasses.fields is 5x slower


# ----------------------------------------------------------------------------------- parser


def _err(path: str, line: int, msg: str) -> XbarError:
    return XbarError(f"{path}:{line}: {msg}")


def _int(path, line, text, what, lo=0) -> int:
    try:
        v = int(text)
    except ValueError:
        raise _err(path, line, f"{what} must be an integer, got {text!r}") from None
    if v < lo:
        raise _err(path, line, f"{what} must be >= {lo}, got {v}")
    return v


def parse(text: str, path: str = "<xbar>") -> XbarProgram:
    """Parse the text of a ``.xbar`` file. Raises :class:`XbarError` with ``path:line:``."""
    # one str object per distinct token: a program's commands repeat a few thousand tokens
    # (crossbar, tile and group numbers), and the parsed program is kept as long as its
    # kernel (a re-planned attention product of the trial BERT at batch 2000: 18.2 MB held,
    # 11.9 MB with its tokens shared; parse time unchanged, 0.24 s)
    seen: dict = {}
    tok = seen.setdefault
    lines = [(i + 1, [tok(t, t) for t in raw.split("#", 1)[0].split()])
             for i, raw in enumerate(text.splitlines())]
    lines = [(n, toks) for n, toks in lines if toks]
    if not lines or lines[0][1][0] != "XBAR":
        raise _err(path, lines[0][0] if lines else 1, "a .xbar file starts with 'XBAR <version>'")
    n0, toks = lines[0]
    if len(toks) != 2:
        raise _err(path, n0, "expected 'XBAR <version>'")
    version = _int(path, n0, toks[1], "format version")
    if version != FORMAT_VERSION:
        raise _err(path, n0, f"format version {version} is not supported (this reader: "
                             f"{FORMAT_VERSION})")
    header: dict = {"order": "fixed", "residency": "on"}
    keylines: dict = {}  # header key -> line
    mode_args: dict = {}
    mode = None
    cost = dict(COST_KEYS)
    regions: dict[str, Region] = {}
    load: list | None = None
    run: list | None = None
    i = 1
    while i < len(lines):
        n, toks = lines[i]
        key = toks[0]
        if key in ("LOAD", "RUN"):
            if len(toks) != 1:
                raise _err(path, n, f"'{key}' takes no arguments")
            for req in ("crossbars", "rows", "cols", "dtype", "mode"):
                if req not in header:
                    raise _err(path, n, f"header lacks '{req}' before {key}")
            if mode is None:
                mode = _make_mode(path, header, keylines, mode_args)
            if (key == "LOAD" and (load is not None or run is not None)) or \
                    (key == "RUN" and run is not None):
                raise _err(path, n, f"section {key} out of place (LOAD, then RUN, once each)")
            body, i = _parse_block(lines, i + 1, path, header, regions, in_for=False)
            if key == "LOAD":
                load = body
            else:
                run = body
            continue
        if load is not None or run is not None:
            raise _err(path, n, f"'{key}' after a section: only LOAD and RUN may follow")
        if key in keylines and key != "cost":
            raise _err(path, n, f"header key '{key}' given twice (line {keylines[key]})")
        if key in _HEADER_INT or key in _HEADER_CHOICES or key in _MODE_KEYS:
            keylines[key] = n
        if key in _MODE_KEYS:
            if len(toks) != 2:
                raise _err(path, n, f"expected '{key} <value>'")
            typ = _MODE_KEYS[key]
            if typ is bool:
                if toks[1] not in ("on", "off"):
                    raise _err(path, n, f"'{key}' must be on or off")
                mode_args[key] = toks[1] == "on"
            elif typ is int:
                mode_args[key] = _int(path, n, toks[1], key)
            elif typ is str:
                mode_args[key] = toks[1]
            else:
                try:
                    mode_args[key] = float(toks[1])
                except ValueError:
                    raise _err(path, n, f"{key} must be a number, got {toks[1]!r}") from None
        elif key in _HEADER_INT:
            if len(toks) != 2:
                raise _err(path, n, f"expected '{key} <int>'")
            header[key] = _int(path, n, toks[1], key, lo=1)
        elif key in _HEADER_CHOICES:
            if len(toks) != 2 or toks[1] not in _HEADER_CHOICES[key]:
                raise _err(path, n, f"'{key}' must be one of {', '.join(_HEADER_CHOICES[key])}")
            header[key] = toks[1]
        elif key == "cost":
            if len(toks) != 3 or toks[1] not in COST_KEYS:
                raise _err(path, n, f"expected 'cost <name> <value>' with name in "
                                    f"{', '.join(COST_KEYS)}")
            try:
                v = float(toks[2])
            except ValueError:
                raise _err(path, n, f"cost {toks[1]} must be a number, got {toks[2]!r}") from None
            if not math.isfinite(v) or v < 0:
                raise _err(path, n, f"cost {toks[1]} must be finite and >= 0, got {v}")
            cost[toks[1]] = v
        elif key in _REGION_ARITY:
            arity = _REGION_ARITY[key]
            has_file = key in ("weight", "bias")
            want = 2 + arity + (1 if has_file else 0)
            if len(toks) != want:
                shape = " ".join(["<name>"] + ["<int>"] * arity + (["<file.npy>"] if has_file else []))
                raise _err(path, n, f"expected '{key} {shape}'")
            name = toks[1]
            if name in regions:
                raise _err(path, n, f"region {name!r} declared twice (line {regions[name].line})")
            dims = tuple(_int(path, n, t, f"{key} dim", lo=1) for t in toks[2:2 + arity])
            source, tensor = (toks[-1] if has_file else None), None
            if source is not None and source.startswith(MODEL_SOURCE):
                tensor = urllib.parse.unquote(source[len(MODEL_SOURCE):])
                if not tensor:
                    raise _err(path, n, f"'{MODEL_SOURCE}' names no tensor")
                source = None
            regions[name] = Region(key, name, dims, source, n, tensor)
        else:
            raise _err(path, n, f"unknown header key or command {key!r}")
        i += 1
    if run is None:
        raise _err(path, lines[-1][0], "no RUN section")
    prog = XbarProgram(path, version, header, cost, regions, load or [], run, mode)
    return prog


#: Header keys that describe how the integer weights of a ``dtype int32`` file sit in cells.
_INT_CELL_KEYS = ("weight_bits", "cell_bits", "differential")


def _make_mode(path, header, keylines, mode_args):
    """The header's CrossbarMode; errors name the line of the offending key. A ``dtype int32``
    file computes in ideal mode; its ``weight_bits``, ``cell_bits`` and ``differential`` say
    how its integer weights sit in cells (``header["int_cells"]``, a CrossbarMode used for its
    slice and cell counts only)."""
    if header["dtype"] == "int32":
        if header["mode"] != "ideal":
            raise _err(path, keylines["mode"], "dtype int32 needs mode ideal: integer weights "
                                               "sit in the cells as they are, never re-quantized")
        cells = {k: mode_args.pop(k) for k in _INT_CELL_KEYS if k in mode_args}
        if mode_args:
            key = min(mode_args, key=lambda k: keylines[k])
            raise _err(path, keylines[key], f"'{key}' does not apply to dtype int32")
        try:
            header["int_cells"] = CrossbarMode("quantized", **cells, dac_bits=0, adc_bits=0)
        except ValueError as e:
            field = str(e).split()[0]
            raise _err(path, keylines.get(field, keylines["dtype"]), str(e)) from None
        return CrossbarMode("ideal")
    if header["mode"] == "ideal" and mode_args:
        key = min(mode_args, key=lambda k: keylines[k])
        raise _err(path, keylines[key], f"'{key}' needs 'mode quantized' (line "
                                        f"{keylines['mode']} says mode ideal)")
    try:
        return CrossbarMode(header["mode"], **mode_args)
    except ValueError as e:
        field = str(e).split()[0]
        raise _err(path, keylines.get(field, keylines["mode"]), str(e)) from None


_ARGS = {"PROGRAM": 5, "MVM": 4, "ACC": 4, "BARRIER": 0, "ADD": 2, "READ": 1}


def _fast_check(header, regions):
    """A check of one command's arguments that says only whether they are valid (True), for
    the millions of lines of a large model: a False (or an exception) sends the command to
    :func:`_check_cmd`, which names what is wrong. Accepts exactly what :func:`_check_cmd`
    accepts."""
    P, R, C = header["crossbars"], header["rows"], header["cols"]
    tiles = {r.name: (r.dims[0], -(-r.dims[1] // R), -(-r.dims[2] // C))
             for r in regions.values() if r.kind == "weight"}
    kinds = {r.name: r.kind for r in regions.values()}

    def ok(op, a) -> bool:
        try:
            if op == "PROGRAM":
                lim = tiles.get(a[1])
                return (lim is not None and 0 <= int(a[0]) < P and 0 <= int(a[2]) < lim[0]
                        and 0 <= int(a[3]) < lim[1] and 0 <= int(a[4]) < lim[2])
            if op == "MVM":
                return (0 <= int(a[0]) < P and kinds.get(a[1]) == "input" and int(a[2]) >= 0
                        and int(a[3]) >= 0)
            if op == "ACC":
                return (kinds.get(a[0]) == "output" and int(a[1]) >= 0 and int(a[2]) >= 0
                        and 0 <= int(a[3]) < P)
            return op == "BARRIER"
        except ValueError:
            return False
    return ok


def _parse_block(lines, i, path, header, regions, in_for, ok=None):
    body: list = []
    P = header["crossbars"]
    ok = ok or _fast_check(header, regions)
    while i < len(lines):
        n, toks = lines[i]
        op, args = toks[0], toks[1:]
        if op in ("PROGRAM", "MVM", "ACC", "BARRIER") and len(args) == _ARGS[op] and ok(op, args):
            body.append(Cmd(op, args, n))
            i += 1
            continue
        if op == "END":
            if len(args):
                raise _err(path, n, "'END' takes no arguments")
            if in_for and not (body and isinstance(body[-1], Cmd) and body[-1].op == "BARRIER"):
                raise _err(path, n, "a FOR ROWS body must end with BARRIER")
            return body, i + 1
        if op == "FOR":
            if in_for:
                raise _err(path, n, "FOR ROWS blocks do not nest")
            if len(args) != 2 or args[0] != "ROWS":
                raise _err(path, n, "expected 'FOR ROWS <block>'")
            block = _int(path, n, args[1], "row block", lo=1)
            inner, i = _parse_block(lines, i + 1, path, header, regions, in_for=True, ok=ok)
            programmed = set()
            for c in inner:
                if c.op == "PROGRAM":
                    programmed.add(int(c.args[0]))
                if c.op == "MVM" and int(c.args[0]) not in programmed:
                    raise _err(path, c.line, "an MVM inside FOR ROWS must follow a PROGRAM of "
                                             "its crossbar in the same body")
            body.append(ForRows(block, inner, n))
            continue
        if op not in _ARGS:
            raise _err(path, n, f"unknown command {op!r} (known: {', '.join(_ARGS)}, FOR, END)")
        if len(args) != _ARGS[op]:
            raise _err(path, n, f"{op} takes {_ARGS[op]} arguments, got {len(args)}")
        _check_cmd(op, args, n, path, P, header, regions)
        body.append(Cmd(op, args, n))
        i += 1
    raise _err(path, lines[-1][0], "missing END")


def _region(path, n, regions, name, kind):
    r = regions.get(name)
    if r is None:
        raise _err(path, n, f"unknown region {name!r}")
    if r.kind != kind:
        raise _err(path, n, f"region {name!r} is a {r.kind}, not a {kind}")
    return r


def _check_cmd(op, args, n, path, P, header, regions):
    R, C = header["rows"], header["cols"]
    if op in ("PROGRAM", "MVM"):
        x = _int(path, n, args[0], "crossbar")
        if x >= P:
            raise _err(path, n, f"crossbar {x} out of range (crossbars {P})")
    if op == "PROGRAM":  # PROGRAM x W g k n
        w = _region(path, n, regions, args[1], "weight")
        G, K, N = w.dims
        g, k, t = (_int(path, n, a, nm) for a, nm in zip(args[2:], ("group", "k tile", "n tile")))
        if g >= G or k >= -(-K // R) or t >= -(-N // C):
            raise _err(path, n, f"tile ({g}, {k}, {t}) outside {args[1]} "
                                f"({G} groups, {-(-K // R)} x {-(-N // C)} tiles)")
    elif op == "MVM":  # MVM x X g k
        _region(path, n, regions, args[1], "input")
        _int(path, n, args[2], "group")
        _int(path, n, args[3], "k tile")
    elif op == "ACC":  # ACC Y g n x
        _region(path, n, regions, args[0], "output")
        _int(path, n, args[1], "group")
        _int(path, n, args[2], "n tile")
        x = _int(path, n, args[3], "crossbar")
        if x >= P:
            raise _err(path, n, f"crossbar {x} out of range (crossbars {P})")
    elif op == "ADD":
        _region(path, n, regions, args[0], "output")
        _region(path, n, regions, args[1], "bias")
    elif op == "READ":
        _region(path, n, regions, args[0], "output")


def load_file(path) -> XbarProgram:
    """Read and parse a ``.xbar`` file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise XbarError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, str(p))


# -------------------------------------------------------------------------------- simulator


class _Phase:
    """Counters plus the crossbar clocks of one phase."""

    def __init__(self, P: int) -> None:
        self.c = Counters()
        self.clock = np.zeros(P)

    def snapshot(self):
        return (self.c.as_dict(), self.clock.copy())


class CrossbarSimulator:
    """Execute a parsed ``.xbar`` program.

    Args:
        program: an :class:`XbarProgram` (or a path to a ``.xbar`` file).
        constants: arrays for ``weight``/``bias`` regions by name (a weight ``float32 [G, K,
            N]``, used as given when it is float32: never copied); regions not given are read
            from their ``.npy`` sidecar next to the file (a sidecar path leading out of the
            file's folder, by ``..``, an absolute path or a symlink, is an XbarError). A region
            whose source is a tensor of the model (``model:<name>``) must be given here.

        resident: the weights stay this simulator's for its lifetime (a session's programmed
            constants, not an activation programmed for one run): the ideal products may then
            keep them in a matrix kernel of their own
            (:meth:`onnx_cinm.sim.blas.MatrixKernels.matmul`).
        checked: a dict the caller keeps across simulators (None: none) recording the arrays
            of ``constants`` a ``dtype int32`` file's checks passed, by the array and the
            levels checked against, so simulators given one array (the steps of an unrolled
            recurrence) check it once; in ``mode quantized`` also the levels and scales each
            array quantizes to (read-only, shared: one copy for all those simulators).

    ``load_counters`` holds what the ``LOAD`` section did (run at construction). Each
    :meth:`run` is one inference; crossbar contents and wear persist between runs.
    """

    def __init__(self, program, constants: dict | None = None, resident: bool = False,
                 checked: dict | None = None) -> None:
        if not isinstance(program, XbarProgram):
            program = load_file(program)
        self.prog = program
        h = program.header
        self.P, self.R, self.C = h["crossbars"], h["rows"], h["cols"]
        self.residency = h["residency"] == "on"
        # dtype int32: exact integer products (module docstring, "Integer kernels")
        self._int = h.get("dtype") == "int32"
        self._dt = np.float64 if self._int else np.float32
        self.const: dict[str, np.ndarray] = {}
        self._resident = resident
        base = Path(program.path).parent
        for r in program.regions.values():
            if r.kind not in ("weight", "bias"):
                continue
            if constants and r.name in constants:
                arr = np.asarray(constants[r.name])
            elif r.tensor is not None:
                raise _err(program.path, r.line, f"{r.name} is the model's tensor {r.tensor!r}: "
                                                 "pass its array in constants")
            else:
                # a kernel folder is untrusted input: a sidecar stays beside its .xbar file
                target = (base / r.file).resolve()
                if not target.is_relative_to(base.resolve()):
                    raise _err(program.path, r.line, f"{r.name}: sidecar '{r.file}' is outside "
                                                     "the .xbar file's folder")
                try:
                    arr = np.load(base / r.file, allow_pickle=False)
                except (OSError, ValueError) as e:
                    raise _err(program.path, r.line, f"cannot load {r.file}: {e}") from None
            arr = np.asarray(arr, dtype=self._dt)  # a strided view stays one (BLAS takes it)
            if r.kind == "weight" and arr.shape != r.dims:
                raise _err(program.path, r.line, f"{r.name}: sidecar shape {arr.shape} != "
                                                 f"declared {r.dims}")
            if self._int:
                key = ("int32 check", id(arr), r.kind, program.header["int_cells"].weight_levels)
                if checked is None or checked.get(key) is not arr:
                    _check_integer(program, r, arr)
                    if checked is not None:
                        checked[key] = arr  # held: its id is not reused while the entry lives
            self.const[r.name] = arr
        self._shared = checked
        self.mode = program.mode
        if self.mode is None:  # an XbarProgram built by hand, not by parse()
            self.mode = CrossbarMode(h["mode"])
        self._quant = not self.mode.ideal
        cells = h["int_cells"] if self._int else self.mode
        self._cells_per_weight = cells.cells_per_weight
        self._adc_per_col = cells.slices
        if self._quant:
            self._init_quantized()
        self.tags: list = [None] * self.P  # (weight, g, k, n) held by each crossbar
        # Tile writes per crossbar. A tile sits in its crossbar's top-left corner (rows_used x
        # cols_used), so every write covers cell (0, 0): a crossbar's count is the most writes
        # any of its cells received, and the maximum over crossbars is the wear
        # (``max_cell_writes``) -- a per-cell array would be P x R x C counters to update and
        # scan at every inference (64 x 256 x 256 on the default chip) for the same figure.
        self.wear = np.zeros(self.P, dtype=np.int64)
        self.inferences = 0
        self._latch: list = [None] * self.P
        self._read: list = []
        self._trace = None
        self._pending: list = []
        self._untouched: set = set()  # (output, group) not written in this inference
        self._cache: dict = {}
        #: (rows, transposed) -> :meth:`_steady_entry` of an inference that changes no tile
        self._steady: dict = {}
        #: (input shape, transposed) -> (tags before, counters, tags after, wear added, input
        #: name, [(output, G, N)]) of a counted inference (``data=False``), for
        #: :meth:`_count_steady`
        self._counted: dict = {}
        self._reversed = None
        self._has_loop = any(isinstance(c, ForRows) for c in program.run)
        self.load_counters = self._phase(program.load, rows=0, acts={}, outs={})

    # -- quantized mode
    def _init_quantized(self) -> None:
        """Per-channel weight quantization of every weight region (mode.py, effect 1); an
        array another simulator of the caller's ``checked`` dict quantized at the same levels
        is not quantized again (an unrolled recurrence's steps: 128 copies of one weight's
        levels, float64, on silero-vad at 128 steps in device mode)."""
        m = self.mode
        Lw = m.weight_levels
        self._q: dict[str, np.ndarray] = {}       # float64 integers [G, K, N] in -Lw..Lw
        self._wscale: dict[str, np.ndarray] = {}  # float64 [G, N]
        self._qinfo: dict = {}  # weight region -> its shared entry [array, q, scale, fingerprint]
        for r in self.prog.regions.values():
            if r.kind != "weight":
                continue
            arr = self.const[r.name]
            key = ("quantized", id(arr), Lw)
            entry = self._shared.get(key) if self._shared is not None else None
            if entry is None or entry[0] is not arr:
                W = arr.astype(np.float64)
                s = np.abs(W).max(axis=1) / Lw
                s[s == 0] = 1.0
                q = np.clip(np.rint(W / s[:, None, :]), -Lw, Lw)
                q.setflags(write=False)
                s.setflags(write=False)
                entry = [arr, q, s, None]  # (the array held: its id is not reused meanwhile)
                if self._shared is not None:
                    self._shared[key] = entry
            self._qinfo[r.name] = entry
            self._q[r.name], self._wscale[r.name] = entry[1], entry[2]
        self._rng = np.random.default_rng(m.seed)
        self._qtile: list = [None] * self.P  # (tag, prepared slices) per crossbar
        if m.physical:  # device effects: their own generator, so read-noise draws stay put
            self._physics = physics
            self._dev_rng = np.random.default_rng([m.seed, 15])
            self._adc_err = physics.adc_errors(m, self.P, m.slices * self.C, self._dev_rng)
        self._Lx = 2 ** (m.dac_bits - 1) - 1 if m.dac_bits else 1
        self._La = 2 ** (m.adc_bits - 1) - 1 if m.adc_bits else 0
        self._shift = 2.0 ** (m.cell_bits * np.arange(m.slices))  # slice significance
        self._adc_cal: dict = {}  # tile tag -> calibrated ADC steps [S * c] (adc_calibration)

    def _prepare(self, x: int, tag):
        """Cell levels of tile ``tag`` as programmed in crossbar ``x`` (cached per crossbar), the
        ``S`` slices side by side along the columns (slice-major, ``[r, S * c]``): ``D`` the signed
        levels (``G+ - G-`` of a pair, or the offset cell), ``G2`` the summed squared levels of the
        cells (read-noise variance), ``step [S * c]`` the ADC step of each slice column, ``shift
        [S, 1]`` the slice significances ``2**(s * cell_bits)``."""
        cached = self._qtile[x]
        if cached is not None and cached[0] == tag:
            return cached[1]
        m = self.mode
        w, g, k, n = tag
        R, C = self.R, self.C
        q = self._q[w][g, k * R:(k + 1) * R, n * C:(n + 1) * C]
        stored = (np.abs(q) if m.differential else q + m.weight_levels).astype(np.int64)
        mask = (1 << m.cell_bits) - 1
        planes = np.concatenate([(stored >> (s * m.cell_bits)) & mask for s in range(m.slices)],
                                axis=1).astype(np.float64)  # [r, S * c]
        sign = np.tile(np.sign(q), m.slices)
        shared = None
        if m.physical:  # conductances as programmed, drifted, ... (physics.tile_state)
            shared = self._programmed(w, tag, planes, sign)
            prep = dict(shared.state)
        else:
            prep = {"D": planes * sign if m.differential else planes, "G2": planes * planes}
        D = planes * sign if m.differential else planes  # the target levels set the ADC range
        if m.adc_bits:
            F = m.adc_range * self._Lx * np.abs(D).sum(axis=0)  # full scale per slice column
            prep["step"] = np.where(F > 0, F / self._La, 1.0)
            if m.adc_calibration == "data":
                prep["target"] = D  # calibrated on the first inference's currents of these
                cal = self._adc_cal.get(tag)
                if cal is not None:
                    prep["step"] = cal
        else:
            prep["step"] = None
        self._qtile[x] = (tag, prep, shared)  # (shared: held while the tile is on x)
        return prep

    def _programmed(self, w: str, tag, planes: np.ndarray, sign: np.ndarray) -> _Programmed:
        """:func:`.physics.tile_state` of tile ``tag`` (``planes``, ``sign`` as in
        :meth:`_prepare`), drawn from the device generator, or the same draws made by another
        simulator: kernels over the same weights (the steps of an unrolled recurrence, ``=``
        in the kernel table: on the tiles of an earlier kernel) each seed their generator
        alike and program the same tiles in the same order, so each drew the same
        conductances; the first one's are shared and the generator is set to where the draws
        left it, so every number is as before. The key is the whole weight region's levels
        (a BLAKE2b digest, once per quantized array), the tile's position, the crossbar geometry, the
        mode and the generator's state. On silero-vad unrolled for 128 steps in device mode,
        the first run drew 266 tile states (1.6 s of its 1.7 s), 12 of them distinct; now 12
        (first run 0.26 s)."""
        rng = self._dev_rng
        entry = self._qinfo[w]
        fp = entry[3]
        if fp is None:  # once per quantized array, however many simulators share it
            q = np.ascontiguousarray(entry[1])
            fp = entry[3] = (q.shape, hashlib.blake2b(q.data, digest_size=16).digest())
        key = (fp, tag[1:], self.R, self.C, self.mode, self._physics,
               _frozen(rng.bit_generator.state))
        with _PROGRAMMED_LOCK:
            hit = _PROGRAMMED.get(key)
        if hit is not None:
            rng.bit_generator.state = hit.rng_after
            return hit
        state = self._physics.tile_state(planes, sign, self.mode, rng)
        for v in state.values():
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        hit = _Programmed(state, rng.bit_generator.state)
        with _PROGRAMMED_LOCK:
            _PROGRAMMED[key] = hit
        return hit

    def _calibrate(self, tag, prep: dict, peak: np.ndarray) -> None:
        """Set the ADC step of tile ``tag``'s slice columns from its first inference that
        carries current (``adc_calibration data``, mode.py effect 6): one full scale per slice
        of the tile, ``F_s = adc_range * peak[s]``, ``peak`` ``[S]`` the largest ``|I|`` over
        every row of the inference's DAC levels ``xl`` and every column of slice ``s``,
        ``I = xl @ D`` the currents of the target levels (:meth:`_quantized_mvm`), so the step
        is ``F_s / La``.
        One range per tile and slice, not per column: a column's own largest current over one
        input vector (a dense layer at batch 1 has one) says little of the next vector's,
        which then clipped (OriNet, one image at a time, effects off: relative RMS error 0.031
        on the first image, 0.14 to 0.95 on the next seven with ranges per column; 0.017 to
        0.050 on all eight per tile; docs/crossbar-presets.md). Inputs without any current
        (all zeros: a warm-up run, a block of dead ReLUs) set nothing: the tile is calibrated
        on the next inference that has some; a slice without current keeps the full-scale
        rule's steps. Kept per tile for the simulator's lifetime."""
        if not peak.any():
            return
        F = self.mode.adc_range * np.repeat(peak, prep["D"].shape[1] // self.mode.slices)
        step = np.where(F > 0, F / self._La, prep["step"])
        self._adc_cal[tag] = prep["step"] = step

    def _quantized_mvm(self, x: int, tag, Xk: np.ndarray) -> np.ndarray:
        """One MVM in quantized mode: ``Xk`` float32 ``[M, r]`` -> float32 ``[M, c]``, in blocks
        of rows (:data:`_ROW_BLOCK_BYTES` of float64 currents ``[rows, S * c]``), each row on
        its own from its DAC levels to its output. On a whole activation at once, every
        float64 temporary was mapped and faulted in afresh: spindle-detector-eeg at batch 8
        (60,000 rows per product) took 7.02 s per run on the crossbars against 0.45 s at
        batch 1 (trial s36)."""
        m = self.mode
        prep = self._prepare(x, tag)
        width = prep["D"].shape[1]  # S * c
        block = max(256, _ROW_BLOCK_BYTES // (8 * max(width, 1)))
        M = len(Xk)
        if m.adc_bits and m.adc_calibration == "data" and tag not in self._adc_cal and M:
            peak = np.zeros(m.slices)  # on every row of this first inference
            for lo in range(0, M, block):
                I = self._dac_levels(Xk[lo:lo + block])[0] @ prep["target"]
                peak = np.maximum(peak, np.abs(I).reshape(len(I), m.slices, -1).max(axis=(0, 2)))
            self._calibrate(tag, prep, peak)
        out = np.empty((M, width // m.slices), np.float32)
        for lo in range(0, M, block):
            xl, sx = self._dac_levels(Xk[lo:lo + block])
            out[lo:lo + block] = self._mvm_rows(x, tag, prep, xl, sx)
        return out

    def _dac_levels(self, Xk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(xl, sx)``: rows ``Xk`` ``[rows, r]`` as DAC levels (float64, each row scaled by its
        own largest magnitude ``sx`` ``[rows, 1]``, then to ``dac_bits``)."""
        # per-vector DAC scale [rows, 1], on the float32 rows (the same values, half the bytes)
        sx = np.abs(Xk).max(axis=1, keepdims=True).astype(np.float64)
        sx[sx == 0] = 1.0
        xl = Xk.astype(np.float64)
        xl /= sx
        if self.mode.dac_bits:
            xl *= self._Lx
            np.rint(xl, out=xl)
        return xl, sx

    def _mvm_rows(self, x: int, tag, prep: dict, xl: np.ndarray, sx: np.ndarray) -> np.ndarray:
        """:meth:`_quantized_mvm` of some rows: DAC levels ``xl`` float64 ``[rows, r]`` with
        their scales ``sx`` ``[rows, 1]`` -> ``[rows, c]`` (float64)."""
        m = self.mode
        # column currents of every slice column [rows, S * c]
        Ys = self._physics.column_currents(xl, prep, m) if m.physical else xl @ prep["D"]
        if m.noise_sigma:
            std = (xl * xl) @ prep["G2"]
            np.sqrt(std, out=std)
            std *= m.noise_sigma
            std *= self._rng.standard_normal(Ys.shape)  # (row after row: as one draw would)
            Ys += std
        if m.adc_bits:
            La = self._La
            Ys /= prep["step"]
            if m.physical:
                cols = Ys.shape[1] // m.slices  # this tile's columns of each slice
                off, gain = (e[x].reshape(m.slices, self.C)[:, :cols].ravel()
                             for e in self._adc_err)
                Ys, clipped = self._physics.adc_convert(Ys, La, off, gain, m.adc_inl_lsb)
                self._clipped += clipped
            else:
                np.rint(Ys, out=Ys)
                self._clipped += int(np.count_nonzero(np.abs(Ys) > La))
                np.clip(Ys, -La, La, out=Ys)
            Ys *= prep["step"]
        c = Ys.shape[1] // m.slices
        y = np.einsum("msc,s->mc", Ys.reshape(len(Ys), m.slices, c), self._shift)  # shift-add
        if m.physical and prep["alpha"] != 1.0:
            y *= prep["alpha"]  # global drift compensation (digital)
        if not m.differential:
            y -= m.weight_levels * xl.sum(axis=1, keepdims=True)  # digital offset removal
        w, g, _, n = tag
        y *= sx / self._Lx
        y *= self._wscale[w][g, n * self.C:n * self.C + c]
        return y

    # -- helpers
    def _tile(self, tag):
        w, g, k, n = tag
        R, C = self.R, self.C
        return self.const[w][g, k * R:(k + 1) * R, n * C:(n + 1) * C]

    def _energy(self, c: Counters) -> float:
        k = self.prog.cost
        busy = c.tile_writes * k["write_latency_s"] + c.mvms * k["mvm_latency_s"]
        return (c.tile_writes * k["write_energy_j"] + c.mvms * k["mvm_energy_j"]
                + c.adc_conversions * k["adc_energy_j"] + c.dac_conversions * k["dac_energy_j"]
                + busy * k["clock_hz"] * k["periphery_energy_per_cycle_j"])

    def _phase(self, cmds, rows, acts, outs, data: bool = True) -> Counters:
        ph = _Phase(self.P)
        self._clipped = 0
        self._exec(cmds, ph, rows, acts, outs, data=data)
        ph.c.adc_clipped = self._clipped
        ph.c.latency_s = float(ph.clock.max()) if self.P else 0.0
        ph.c.max_cell_writes = self._wear_max = int(self.wear.max())
        ph.c.energy_j = self._energy(ph.c)
        return ph.c

    # -- execution
    def _exec(self, cmds, ph, rows, acts, outs, data):
        """Run ``cmds``; ``rows`` rows stream per MVM; ``ph`` None: data only, no counting."""
        k = self.prog.cost
        path = self.prog.path
        for cmd in cmds:
            if isinstance(cmd, ForRows):
                self._for_rows(cmd, ph, rows, acts, outs)
                continue
            op, a = cmd.op, cmd.args
            if op == "PROGRAM":
                x, tag = int(a[0]), (a[1], int(a[2]), int(a[3]), int(a[4]))
                if self.residency and self.tags[x] == tag:
                    if ph:
                        ph.c.tile_writes_skipped += 1
                    continue
                self.tags[x] = tag
                if ph:
                    t = self._tile(tag)
                    ph.c.tile_writes += 1
                    ph.c.cell_writes += t.size * self._cells_per_weight
                    self.wear[x] += 1
                    ph.clock[x] += k["write_latency_s"]
            elif op == "MVM":
                x, name, g, kt = int(a[0]), a[1], int(a[2]), int(a[3])
                tag = self.tags[x]
                if tag is None:
                    raise _err(path, cmd.line, f"MVM on crossbar {x}, which holds no tile")
                if tag[1] != g or tag[2] != kt:
                    raise _err(path, cmd.line, f"MVM streams group {g} k tile {kt} through "
                                               f"crossbar {x}, which holds {tag[0]}{list(tag[1:])}")
                t = self._tile(tag)
                if ph:
                    ph.c.mvms += rows
                    ph.c.adc_conversions += rows * t.shape[1] * self._adc_per_col
                    ph.c.dac_conversions += rows * t.shape[0]
                    ph.clock[x] += rows * k["mvm_latency_s"]
                if data:
                    X = acts[name]
                    if g >= X.shape[0]:
                        raise _err(path, cmd.line, f"group {g} outside input {name} "
                                                   f"({X.shape[0]} groups)")
                    if self._quant:
                        Xk = X[g, :, kt * self.R:kt * self.R + t.shape[0]]
                        self._latch[x] = self._quantized_mvm(x, tag, Xk)
                    else:  # ideal: the product is deferred to the flush (see _flush)
                        self._latch[x] = (name, tag)
            elif op == "ACC":
                name, g, nt, x = a[0], int(a[1]), int(a[2]), int(a[3])
                tag = self.tags[x]
                if tag is None or tag[1] != g or tag[3] != nt:
                    raise _err(path, cmd.line, f"ACC into group {g} n tile {nt} from crossbar "
                                               f"{x}, which holds {tag}")
                if data:
                    lat = self._latch[x]
                    if lat is None:
                        raise _err(path, cmd.line, f"ACC from crossbar {x} before any MVM")
                    if isinstance(lat, tuple):
                        self._pending.append((name, lat[0], lat[1]))
                    else:
                        self._touch(outs, name, g)
                        outs[name][g, :, nt * self.C:nt * self.C + lat.shape[1]] += lat
            elif op == "BARRIER":
                if ph:
                    ph.clock[:] = ph.clock.max()
            elif op == "ADD":
                if data:
                    self._add_bias(a[0], a[1], acts, outs, cmd.line)
                    if self._trace is not None:
                        self._trace.append(("add", a[0], a[1], cmd.line))
            elif op == "READ":
                if data:
                    self._flush(acts, outs)
                    self._read.append(a[0])
                    if self._trace is not None:
                        self._trace.append(("read", a[0]))

    def affine(self) -> tuple | None:
        """``(input, weight, bias or None, output)`` region names when this program's data path
        is exactly ``Y = X @ W (+ bias)`` -- ideal mode, one input and one output, every
        inference so far summing each group's product over all its tiles once, then adding the
        bias -- so a caller may compute it with any exact product kernel (and run the
        simulator with ``data=False`` for the counters); None otherwise, and before the first
        inference with data (the data path is read from its record). For a ``dtype int32``
        program the product is the exact integer one, wrapped to int32 (module docstring,
        "Integer kernels")."""
        if self._quant or self._has_loop:
            return None
        kinds = [r.kind for r in self.prog.regions.values()]
        if kinds.count("input") != 1 or kinds.count("output") != 1:
            return None
        groups = next(r for r in self.prog.regions.values() if r.kind == "output").dims[0]
        forms = {_affine_of(e[3], groups) for e in self._cache.values() if e[3] is not None}
        return forms.pop() if len(forms) == 1 and None not in forms else None

    def _touch(self, outs, out, g) -> None:
        """Group ``g`` of output ``out`` is about to be added to: zero it if nothing wrote it
        yet in this inference (a reused buffer holds the last inference's values)."""
        if (out, g) in self._untouched:
            outs[out][g] = 0.0
            self._untouched.discard((out, g))

    def _output(self, name: str, shape: tuple, transposed: bool) -> np.ndarray:
        """The ``[G, M, N]`` accumulator of output ``name`` for one inference (with
        ``transposed`` the view of a C-contiguous ``[G, N, M]`` array), its contents undefined:
        :meth:`_touch` zeroes a group before it is added to, and a group written whole by a
        product is never zeroed. Its memory is a block of the session's scratch pool nobody
        holds any more (:mod:`onnx_cinm.sim.scratch`), so a large output does not fault in fresh
        pages at every inference and no kernel keeps its own outputs alive between runs; an
        output the caller still holds is never written."""
        G, M, N = shape
        buf = scratch.take((G, N, M) if transposed else shape, self._dt)
        return buf.transpose(0, 2, 1) if transposed else buf

    def _add_bias(self, out, bias, acts, outs, line) -> None:
        self._flush(acts, outs)
        for g in range(outs[out].shape[0]):
            self._touch(outs, out, g)
        try:
            outs[out] += self.const[bias]
        except ValueError:
            raise _err(self.prog.path, line, f"bias {bias} {self.const[bias].shape} does not "
                                             f"broadcast to {outs[out].shape}") from None

    def _replay(self, trace, acts, outs) -> None:
        """The data path of a cached inference: the recorded events in order -- the products
        of each flush already grouped (:meth:`_group`), the bias additions and reads."""
        for ev in trace:
            if ev[0] == "products":
                self._products(ev[1], acts, outs)
            elif ev[0] == "add":
                self._add_bias(ev[1], ev[2], acts, outs, ev[3])
            else:
                self._flush(acts, outs)
                self._read.append(ev[1])

    def _flush(self, acts, outs) -> None:
        """Add the deferred ideal-mode partial products into their outputs.

        Each ``ACC`` of an ideal MVM records ``(output, input, tile)``; here the records are
        summed per output column block in ascending k order, which is exactly the sum the
        accumulator forms, independent of the order the rounds ran in (a serpentine inference
        gives bit-identical results in both directions). When a group's records cover every
        tile of its weight matrix exactly once (the normal case), the whole group is one
        ``X[g] @ W[g]`` matmul instead of one small product per tile.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return
        groups = self._group(pending)
        if self._trace is not None:  # a cached inference replays the grouped products
            self._trace.append(("products", groups))
        self._products(groups, acts, outs)

    def _group(self, pending: list) -> list:
        """The records of :meth:`_flush` grouped per ``(output, input, weight, group)``: a
        list of ``(out, inp, w, g, by_n)`` with ``by_n`` None when the records cover every tile
        of ``w[g]`` exactly once (one matmul), else ``[(n tile, [k tiles ascending])]``."""
        R, C = self.R, self.C
        groups: dict = {}
        for out, inp, (w, g, kt, nt) in pending:
            groups.setdefault((out, inp, w, g), []).append((kt, nt))
        plan = []
        for (out, inp, w, g), tiles in groups.items():
            _, K, N = self.const[w].shape
            kts, nts = -(-K // R), -(-N // C)
            if len(tiles) == kts * nts and set(tiles) == {(k, n) for k in range(kts) for n in range(nts)}:
                plan.append((out, inp, w, g, None))
                continue
            by_n: dict = {}
            for kt, nt in tiles:
                by_n.setdefault(nt, []).append(kt)
            plan.append((out, inp, w, g, [(nt, sorted(ks)) for nt, ks in by_n.items()]))
        return plan

    def _products(self, plan: list, acts, outs) -> None:
        """Add the products of a :meth:`_group` plan into their outputs."""
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs: IEEE, no warning
            self._products_of(plan, acts, outs)

    def _products_of(self, plan: list, acts, outs) -> None:
        R, C = self.R, self.C
        for out, inp, w, g, by_n in plan:
            W = self.const[w][g]
            X = acts[inp][g]
            Y = outs[out][g]
            if by_n is None:
                if (out, g) in self._untouched:  # not written yet: the product overwrites it
                    blas.current().matmul(X[:, :W.shape[0]], W, Y, const=self._resident)
                    self._untouched.discard((out, g))
                else:
                    Y += X[:, :W.shape[0]] @ W
                continue
            self._touch(outs, out, g)
            for nt, ks in by_n:
                for kt in ks:
                    Y[:, nt * C:(nt + 1) * C] += X[:, kt * R:(kt + 1) * R] @ W[kt * R:(kt + 1) * R, nt * C:(nt + 1) * C]

    def _for_rows(self, loop: ForRows, ph, rows, acts, outs):
        if ph is not None:
            ph.clock[:] = ph.clock.max()  # entering a FOR ROWS block is a barrier
            b = loop.block
            n = -(-rows // b) if rows else 0
            sizes = [b] * (n - 1) + [rows - (n - 1) * b] if n else []
            saved = list(self.tags)
            if n >= 1:
                self._exec(loop.body, ph, sizes[0], acts, outs, data=False)
            if n >= 3:
                before_c, before_clock = ph.snapshot()
                before_wear = self.wear.copy()
                self._exec(loop.body, ph, b, acts, outs, data=False)
                after = ph.c.as_dict()
                reps = n - 3
                for key, v in after.items():
                    setattr(ph.c, key, v + (v - before_c[key]) * reps)
                ph.clock += (ph.clock - before_clock) * reps
                self.wear += (self.wear - before_wear) * reps
            if n >= 2:
                self._exec(loop.body, ph, sizes[-1], acts, outs, data=False)
            final = list(self.tags)
            self.tags = saved
        else:
            final = None
        # data: the whole row range at once
        self._exec(loop.body, None, rows, acts, outs, data=True)
        if final is not None:
            self.tags = final

    def run(self, inputs: dict, transposed: bool = False,
            data: bool = True) -> tuple[dict, Counters]:
        """One inference. ``inputs``: ``{name: array [G, M, K] or [M, K]}`` for every ``input``.

        Returns ``({output name: float32 array [G, M, N]}, Counters)``; with ``transposed`` each
        output is the ``[G, M, N]`` view of a C-contiguous ``[G, N, M]`` array, the layout of a
        node whose result is ``Y^T`` (a programmed ``A``), so nobody transposes it back.

        ``data=False`` (ideal kernels only, float32 or ``dtype int32``: the quantized data path
        draws noise and counts clipped conversions) counts the inference without computing it:
        the counters, tiles and wear advance as in a full run, the inputs are read for their
        shapes only (a zero-stride stand-in will do; an integer program's values are not
        checked) and the outputs are returned with undefined contents (float32 or float64),
        for a caller that computes the data path itself (:meth:`affine`).
        Raises :class:`XbarError` for missing or mis-shaped inputs.
        """
        if not data and self._quant:
            raise ValueError("a run without its data path is for ideal kernels only")
        if data and self._steady:
            got = self._run_steady(inputs, transposed)
            if got is not None:
                return got
        if not data and self._counted:
            got = self._count_steady(inputs, transposed)
            if got is not None:
                return got
        prog = self.prog
        acts, M = {}, None
        for r in prog.regions.values():
            if r.kind != "input":
                continue
            if r.name not in inputs:
                raise _err(prog.path, r.line, f"input {r.name} not given")
            X = np.asarray(inputs[r.name], dtype=self._dt)
            if X.ndim == 2:
                X = X[None]
            if X.ndim != 3 or X.shape[0] != r.dims[0] or X.shape[2] != r.dims[1]:
                raise _err(prog.path, r.line, f"input {r.name}: shape {np.shape(inputs[r.name])} "
                                              f"!= [{r.dims[0]}, M, {r.dims[1]}]")
            if M is not None and X.shape[1] != M:
                raise _err(prog.path, r.line, f"inputs disagree on M ({M} vs {X.shape[1]})")
            if self._int and data and X.size and not (np.abs(X).max() < 2**16 and np.array_equal(X, np.rint(X))):
                raise _err(prog.path, r.line, f"input {r.name}: dtype int32 takes integers of "
                                              "magnitude below 2**16")
            M = X.shape[1]
            acts[r.name] = X
        M = M or 0
        outs = {r.name: self._output(r.name, (r.dims[0], M, r.dims[1]), transposed)
                for r in prog.regions.values() if r.kind == "output"}
        self._latch: list = [None] * self.P
        self._read: list = []
        self._pending: list = []
        self._untouched = {(name, g) for name, arr in outs.items() for g in range(arr.shape[0])}
        reverse = prog.header["order"] == "serpentine" and self.inferences % 2 == 1
        if reverse and self._reversed is None:
            self._reversed = _reverse_rounds(prog.run)
        body = self._reversed if reverse else prog.run
        # Ideal weight-stationary inferences are deterministic given the rows and the tiles
        # resident when they start: the second time round, replay the recorded counters, wear
        # and data events instead of walking every command again.
        key = None if (self._quant or self._has_loop) else (reverse, M, tuple(self.tags))
        hit = self._cache.get(key) if key is not None else None
        if hit is not None and data and hit[3] is None:
            hit = None  # counted without its data: walk it again, with the data
        if hit is not None:
            counts, tags, wear_delta, trace = hit
            self.tags = list(tags)
            if wear_delta is not None:
                self.wear += wear_delta
                self._wear_max = int(self.wear.max())
            c = Counters(**counts)
            c.max_cell_writes = self._wear_max
            if data:
                self._replay(trace, acts, outs)
        else:
            wear0 = self.wear.copy() if key is not None else None
            self._trace = [] if key is not None and data else None
            c = self._phase(body, M, acts, outs, data)
            self._flush(acts, outs)  # the last products, traced with the rest
            if key is not None:
                delta = self.wear - wear0
                if len(self._cache) >= 8:  # a few row counts (dynamic batch) x 2 directions
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = (c.as_dict(), tuple(self.tags), delta if delta.any() else None,
                                    self._trace)
            self._trace = None
        if key is not None and data and not reverse:
            self._note_steady(key, transposed)
        self.inferences += 1
        if not data:
            if key is not None and prog.header["order"] != "serpentine" and len(acts) == 1:
                (name, X), = acts.items()
                counts, tags, wear_delta, _ = self._cache[key]
                if len(self._counted) >= 8:  # as the cache: a few row counts x layouts
                    self._counted.pop(next(iter(self._counted)))
                self._counted[(X.shape, transposed)] = (
                    key[2], counts, key[2] if tags == key[2] else tags, wear_delta, name,
                    [(r.name, r.dims[0], r.dims[1]) for r in prog.regions.values()
                     if r.kind == "output"])
            return outs, c
        self._flush(acts, outs)
        for name, g in list(self._untouched):  # nothing reached it: the accumulator's zeros
            self._touch(outs, name, g)
        if self._int:  # exact integers in float64; int32 wraps as onnxruntime's int32 MatMul
            outs = {k: v.astype(np.int64).astype(np.int32) for k, v in outs.items()}
        return {name: outs[name] for name in (self._read or outs)}, c


    def _count_steady(self, inputs: dict, transposed: bool):
        """A counted inference (``data=False``) the simulator has counted before on an input
        of this shape from the same resident tiles, in a fixed-order program: its recorded
        counters again, the tiles it leaves resident and the wear it adds (a kernel streaming
        its tiles through the crossbars programs the same ones every inference), the outputs'
        buffers (contents undefined, as :meth:`run` gives them without data) and nothing
        walked. None when this run is not one (another shape, other tiles resident, more than
        one input): :meth:`run` then counts it. On light ResNet50, 28 of its 54 crossbar
        kernels stream; the provider's steady run counts each this way."""
        if len(inputs) != 1:
            return None
        (name, X), = inputs.items()
        shape = X.shape if type(X) is np.ndarray else np.shape(X)
        if len(shape) == 2:
            shape = (1,) + tuple(shape)
        st = self._counted.get((shape, transposed))
        if st is None or st[4] != name:
            return None
        before, counts, after, wear_delta, _, outputs = st
        if tuple(self.tags) != before:
            return None
        outs = {o: self._output(o, (g, shape[1], n), transposed) for o, g, n in outputs}
        if wear_delta is not None:
            self.wear += wear_delta
            self._wear_max = int(self.wear.max())
        if after is not before:
            self.tags = list(after)
        c = Counters(**counts)
        c.max_cell_writes = self._wear_max
        self.inferences += 1
        return outs, c

    def _note_steady(self, key: tuple, transposed: bool) -> None:
        """Remember the cached inference ``key`` for :meth:`_run_steady` when it programs no
        tile (the tiles it starts from are the ones it leaves, no wear) and its data path is
        one product per group plus a bias (:func:`_affine_of`), in a fixed-order program."""
        counts, tags, wear_delta, trace = self._cache[key]
        if self.prog.header["order"] == "serpentine" or wear_delta is not None or \
                trace is None or tags != key[2]:
            return
        kinds = [r for r in self.prog.regions.values() if r.kind in ("input", "output")]
        if len(kinds) != 2 or {r.kind for r in kinds} != {"input", "output"}:
            return
        inp_r = next(r for r in kinds if r.kind == "input")
        form = _affine_of(trace, inp_r.dims[0])
        if form is None:
            return
        inp, w, b, out = form
        G, _, N = self.const[w].shape
        self._steady[(key[1], transposed)] = (tags, counts, inp, w, b, out, (G, key[1], N),
                                              (inp_r.dims[0], inp_r.dims[1]))

    def _run_steady(self, inputs: dict, transposed: bool):
        """An inference the simulator has run before from the same resident tiles and that
        programs none (:meth:`_note_steady`), computed directly: the same products into the
        same output buffer and the same bias addition as the replay of its record, the
        recorded counters. Returns what :meth:`run` returns, or None when this run is not one
        (another input shape or dtype, other tiles resident): :meth:`run` then does it."""
        if len(inputs) != 1:
            return None
        X = next(iter(inputs.values()))
        if not isinstance(X, np.ndarray) or X.dtype != self._dt or X.ndim not in (2, 3):
            return None
        if X.ndim == 2:
            X = X[None]
        st = self._steady.get((X.shape[1], transposed))
        if st is None:
            return None
        tags, counts, inp, w, b, out, shape, (G, K) = st
        if inp not in inputs or X.shape[0] != G or X.shape[2] != K or tuple(self.tags) != tags:
            return None
        if self._int and X.size and not (np.abs(X).max() < 2**16 and np.array_equal(X, np.rint(X))):
            return None  # run() says what is wrong with it
        Y = self._output(out, shape, transposed)
        W = self.const[w]
        kern = blas.current()
        with np.errstate(invalid="ignore", over="ignore"):  # as _products
            for g in range(G):
                kern.matmul(X[g][:, :W.shape[1]], W[g], Y[g], const=self._resident)
            if b is not None:
                Y += self.const[b]
        c = Counters(**counts)
        c.max_cell_writes = self._wear_max
        self.inferences += 1
        if self._int:
            Y = Y.astype(np.int64).astype(np.int32)
        return {out: Y}, c


def _affine_of(trace: list, G: int) -> tuple | None:
    """``(input, weight, bias or None, output)`` if the traced data path is ``Y[g] = X[g] @
    W[g] (+ bias)`` for every group: one whole product per group, then at most one bias
    addition, then the read of that output; None otherwise."""
    if not trace or trace[0][0] != "products" or trace[-1] != ("read", trace[0][1][0][0]):
        return None
    prods = trace[0][1]
    out, inp, w = prods[0][:3]
    if sorted(p[3] for p in prods) != list(range(G)) or \
            any(p[:3] != (out, inp, w) or p[4] is not None for p in prods):
        return None
    middle = trace[1:-1]
    if not middle:
        return inp, w, None, out
    if len(middle) == 1 and middle[0][0] == "add" and middle[0][1] == out:
        return inp, w, middle[0][2], out
    return None


def _check_integer(program: XbarProgram, region: Region, arr: np.ndarray) -> None:
    """XbarError unless the weights of a ``dtype int32`` file are integers within the signed
    levels of its ``weight_bits`` (``-Lw .. Lw``, ``Lw = 2**(weight_bits - 1) - 1``)."""
    if region.kind != "weight":
        if not np.array_equal(arr, np.rint(arr)):
            raise _err(program.path, region.line, f"{region.name}: dtype int32 needs integer values")
        return
    Lw = program.header["int_cells"].weight_levels
    if not np.array_equal(arr, np.rint(arr)) or (arr.size and np.abs(arr).max() > Lw):
        raise _err(program.path, region.line, f"{region.name}: dtype int32 weights must be integers "
                                              f"in -{Lw}..{Lw} (weight_bits "
                                              f"{program.header['int_cells'].weight_bits})")


def _reverse_rounds(body: list) -> list:
    """The BARRIER-terminated rounds of ``body`` in reverse order; the tail stays last."""
    rounds, cur = [], []
    for c in body:
        cur.append(c)
        if isinstance(c, Cmd) and c.op == "BARRIER":
            rounds.append(cur)
            cur = []
    return [c for r in reversed(rounds) for c in r] + cur


def simulate(path, inputs: dict, runs: int = 1,
             constants: dict | None = None) -> tuple[dict, list[Counters], Counters]:
    """Load ``path``, run ``runs`` inferences on ``inputs``; return (outputs of the last run,
    counters per run, load counters). ``constants``: the arrays of regions the file takes from
    its model (``model:<tensor>``), by region name (see :class:`CrossbarSimulator`)."""
    sim = CrossbarSimulator(path, constants)
    per = []
    outs = {}
    for _ in range(runs):
        outs, c = sim.run(inputs)
        per.append(c)
    return outs, per, sim.load_counters
