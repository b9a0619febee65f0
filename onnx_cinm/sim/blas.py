"""The matrix kernels the device simulators run their products on, and their BLAS threads.

One :class:`MatrixKernels` per :class:`~onnx_cinm.runtime.session.InferenceSession`: while a
session runs (:meth:`MatrixKernels.active`), numpy's BLAS is limited to ``threads`` threads
through threadpoolctl (the limit is set when the run starts and restored when it ends, so the
rest of the process keeps its own setting), and the crossbar simulator's ideal-mode products go
through :meth:`MatrixKernels.matmul`, which runs each product shape on the faster of numpy's
BLAS and onnxruntime's own matrix kernels (MLAS).

Why: on a machine whose cores are shared with other work, OpenBLAS's worker threads spin and
wait for each other; measured on the project's 2-core machine (issue 16), the provider ran
light ResNet50 at 6.0x onnxruntime with 2 BLAS threads and 1.56x with one, and the crossbar
products took 99 ms through onnxruntime's kernels against 185 ms through single-threaded numpy.
So the default is one thread, and the kernel is chosen by measurement, not assumed.

Choice (``matmul="auto"``): the first product of each ``(M, K, N)`` shape (and output layout)
is computed by both kernels, a warm-up and three timed runs each, the least time counting (the
process's CPU time, not the wall clock: other processes sharing the cores would otherwise decide
for us; measured here, wall-clock decisions flipped between runs of the same model); the
faster one computes every later product of that shape, and its result is the one returned the
first time too, so all runs of a shape use the same arithmetic (the two kernels may differ in
the last bits: they sum in different orders). A product past :data:`TIMING_MACS`
multiply-adds is timed on its first rows only (:func:`_timing_rows`) and then computed whole
once by the chosen kernel, so the choice costs a few milliseconds per shape, not ten whole
products. ``"numpy"`` or ``"onnxruntime"`` force one kernel.

onnxruntime itself sums a product in two orders: over a constant ``B`` (an initializer) it
packs ``B`` once at load and runs its packed-B kernel, otherwise its plain one; measured here
(64x512x256, float32), the two differ in the last bit on 14357 of 16384 outputs (and the
packed one agreed bit for bit with numpy's OpenBLAS). So ``"onnxruntime"`` runs a product over
weights that stay programmed for the session (``const=True``) in a session holding them as an
initializer, as onnxruntime runs the original model's MatMul over its weights, and a product
over an operand given at run time (a programmed activation) in the plain kernel, as it runs a
MatMul of two activations. ``compare`` uses this mode by default: the same accumulation order
as its reference, so a last-bit difference cannot be amplified by a later rounding
(``DynamicQuantizeLinear``) into a failed check of a correct model.

Integer products (:meth:`MatrixKernels.int_matmul`, :meth:`MatrixKernels.int_conv`): an int8 or
uint8 operand times int8 weights with int32 accumulation, the crossbar simulator's ``dtype
int32`` kernels in ideal mode. numpy has no integer BLAS, so its route is the simulator's own:
float64 products (exact below 2**53) wrapped to int32. onnxruntime's ``MatMulInteger`` and
``ConvInteger`` compute the same integers: each operand whose values span at most 256
consecutive integers within -255..255 is fed as uint8 with a zero point (``x + c``, ``c`` in
0..255; int8 weights as ``w + 128``, those of a uint8 model with its zero point subtracted as
they were), so its kernels run the uint8 x uint8 product, exact on every x86 path. The uint8 x
int8 product is 2-2.7x faster where the CPU has VNNI (measured here, 1 thread: 20x1024x8210
0.97 ms against 2.59 ms, 3136x576x64 0.64 against 1.51), and exact there (``vpdpbusd`` sums
the byte products in int32), but elsewhere its pairwise 16-bit sums saturate (``vpmaddubsw``,
as onnxruntime's quantization documentation warns under ``reduce_range``). The CPU flags do
not tell which kernel onnxruntime picks (in its MLAS ``platform.cpp`` the AVX512BW check comes
after the AVX-VNNI one and picks the saturating kernel unless AVX512-VNNI is there too, and
AMX replaces both), so the first product that could use int8 weights
runs the worst case through onnxruntime once per process and compares it with numpy
(:func:`int8_weights`): int8 weights stay int8 only where it was exact, and only in
``MatMulInteger``: onnxruntime's ``ConvInteger`` with
int8 weights took 12.9 ms where uint8 ones took 2.3 ms (1x64x56x56, 3x3 -> 64, 1 thread).
int32 sums wrap as the simulator's do. The choice is timed as for floats; the first product
of each shape is computed by both and the onnxruntime route is kept only if its integers are
equal to numpy's (a guard: they are equal by construction).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time

import numpy as np

#: Integer weights that fit int8 stay int8 in onnxruntime's ``MatMulInteger`` (the faster uint8 x
#: int8 product), else they are fed as uint8: True only where onnxruntime computes that product
#: exactly on this CPU, which :func:`int8_weights` measures at first use and records here (None:
#: not yet measured; set it to True or False to skip the measurement).
INT8_WEIGHTS: bool | None = None
_PROBE_LOCK = threading.Lock()


def int8_weights() -> bool:
    """Whether onnxruntime's uint8 x int8 ``MatMulInteger`` is exact on this CPU
    (:data:`INT8_WEIGHTS`, measured once per process by :func:`_int8_product_is_exact`)."""
    global INT8_WEIGHTS
    if INT8_WEIGHTS is None:
        with _PROBE_LOCK:
            if INT8_WEIGHTS is None:
                INT8_WEIGHTS = _int8_product_is_exact()
    return INT8_WEIGHTS


def _int8_product_is_exact() -> bool:
    """Run the worst case of a uint8 x int8 product through onnxruntime's ``MatMulInteger`` and
    compare it with numpy's int64 product wrapped to int32: ``A`` all 255 against weight
    columns all -128, all 127, alternating -128 and 127, and random int8, over K = 70000
    (each pair of byte products, 2 x 255 x -128 = -65280 or 2 x 255 x 127 = 64770, overflows
    int16, and the column sums pass 2**31, where int32 sums wrap). Both weight forms the
    kernels use (an input; an initializer, which onnxruntime packs at load) and both a single
    row (its matrix-vector kernel) and four. False if any integer differs or onnxruntime
    fails. Measured here: 7 ms (47 ms when it starts onnxruntime in the process), once."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    K = 70000
    A = np.full((4, K), 255, np.uint8)
    B = np.empty((K, 4), np.int8)
    B[:, 0], B[:, 1] = -128, 127
    B[:, 2] = np.where(np.arange(K) % 2, 127, -128)
    B[:, 3] = np.random.default_rng(0).integers(-128, 128, K)
    want = (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32)  # mod 2**32
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    a = helper.make_tensor_value_info("A", TensorProto.UINT8, ["M", K])
    y = helper.make_tensor_value_info("Y", TensorProto.INT32, None)
    node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
    try:
        for const in (False, True):
            g = helper.make_graph(
                [node], "probe", [a] if const else
                [a, helper.make_tensor_value_info("B", TensorProto.INT8, [K, 4])], [y],
                [numpy_helper.from_array(B, "B")] if const else [])
            sess = _session_of(g, so)
            for m in (1, 4):
                feeds = {"A": A[:m]} if const else {"A": A[:m], "B": B}
                if not np.array_equal(sess.run(None, feeds)[0], want[:m]):
                    return False
    except Exception:  # noqa: BLE001 - onnxruntime's own error types: not exact, then
        return False
    return True


#: Kernel choices of :class:`MatrixKernels`.
MATMULS = ("auto", "numpy", "onnxruntime")
#: How much slower than the numpy route, timed warm on its own (:meth:`MatrixKernels.conv`), a
#: convolution may be and still be chosen. In a whole model the numpy route also pays for what
#: the timing leaves out -- the simulator replaying its data path, the bias and Relu as passes
#: of their own over colder caches -- while the convolution folds them in. Measured on the
#: project machine (1 thread, CPU time per inference, 40 runs): light SqueezeNet 14.3 ms with
#: the warm choice per shape (numpy won most 1x1 convolutions by 10-20%), 13.1 ms with the
#: convolution wherever it applies; light ResNet50 118 ms either way.
CONV_MARGIN = 1.25
#: onnxruntime graph optimization levels by the names the provider's ``graph_optimization``
#: option takes (its host partitions and the product sessions, :meth:`MatrixKernels.conv`).
GRAPH_LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
                "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


#: The level of the second convolution session :meth:`MatrixKernels._decide_conv` times when the
#: configured level is ``"all"``: ``"extended"``, every fusion of ``"all"`` (the Relu folded
#: into the Conv) but not its layout transform. At ``"all"`` onnxruntime runs a convolution in
#: its blocked NCHWc layout between ``ReorderInput`` and ``ReorderOutput`` nodes; in a whole
#: model it keeps NCHWc from one convolution to the next, but a session of one convolution pays
#: both reorders on every call, while at ``"extended"`` a 1x1 convolution is one GEMM over the
#: NCHW input. Measured on the project machine (1 thread, Conv+Relu, the least of 30 runs,
#: microseconds, ``all`` against ``extended``): 1x1 convolutions are faster without the
#: layout (64->16 at 55x55: 86 against 70; 16->64 at 55x55: 104 against 72; 128->16 at
#: 55x55: 203 against 131; 32->128 at 27x27: 58 against 53), 3x3 ones with it (16->64 at
#: 55x55: 361 against 515; 32->128 at 27x27: 298 against 401; 3->64 at 224x224, stride 2:
#: 540 against 570), and so is SqueezeNet's last 1x1 (512->1000 at 13x13: 1040 against 1096):
#: no rule by kernel size, so the choice is timed per shape.
CONV_PLAIN_LEVEL = "extended"
#: The conv choice (:meth:`MatrixKernels.describe`) of a convolution run in the session built at
#: :data:`CONV_PLAIN_LEVEL` (plain NCHW); ``"onnxruntime"`` is the one built at the configured
#: level.
CONV_PLAIN = "onnxruntime-nchw"
#: The most, as a share of the time of the convolution session at level ``"all"``, the
#: :data:`CONV_PLAIN_LEVEL` one may take and be chosen instead (:meth:`MatrixKernels._decide_conv`).
#: The timing runs warm, weights in cache; in the model they are not, and onnxruntime's NCHWc
#: kernel reads weights it reordered at load. Measured on the project machine (1 thread): the
#: timed ratios were 0.6-0.83 on SqueezeNet's 1x1 convolutions of small weights (128->16 at
#: 55x55: 0.62-0.66; 16->64 at 55x55: 0.68) but 0.85-1.0 on most of ResNet50's, and choosing
#: the plain session wherever it was timed faster ran light ResNet50 at 1.53-1.55x onnxruntime
#: (3 runs of ``benchmarks/runtime_overhead.py --runs 10``, against 1.46-1.51x with the NCHWc
#: session alone) for SqueezeNet's 1.99-2.07x (2.13-2.15x); at 0.9, 1.49x and 1.95x.
CONV_PLAIN_MARGIN = 0.9


def graph_level(name: str):
    """onnxruntime's ``GraphOptimizationLevel`` for ``name``, a key of :data:`GRAPH_LEVELS`
    (KeyError otherwise)."""
    import onnxruntime as ort

    return getattr(ort.GraphOptimizationLevel, GRAPH_LEVELS[name])

_ARENA = {"registered": None}


def share_arena(so) -> None:
    """Make a session of options ``so`` allocate from one CPU arena shared by every session
    of the process (onnxruntime's environment allocator, registered at the first call), as
    one onnxruntime session's nodes share one arena. Each session's own arena keeps the most
    it ever held: on DNSMOS at batch 4 the provider's partitions and convolutions held 2.05
    GB that way, onnxruntime on the original 531 MB. If onnxruntime cannot register the
    allocator the session keeps its own arena."""
    import onnxruntime as ort

    if _ARENA["registered"] is None:
        with _CONTROLLER_LOCK:
            if _ARENA["registered"] is None:
                try:
                    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                             ort.OrtMemType.DEFAULT)
                    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
                    _ARENA["registered"] = True
                except Exception:  # noqa: BLE001 - onnxruntime's own error types
                    _ARENA["registered"] = False
    if _ARENA["registered"]:
        so.add_session_config_entry("session.use_env_allocators", "1")


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("onnx_cinm_matrix_kernels", default=None)
_CONTROLLER_LOCK = threading.Lock()


def _controller():
    """threadpoolctl's view of the BLAS libraries loaded in this process now (it scans the
    loaded libraries: done once per session, when its first run starts)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


_ACTIVE = {"count": 0, "limiter": None}


class _Limit:
    """BLAS libraries (threadpoolctl's controllers) set to ``threads`` threads, those that ran
    another count restored by :meth:`restore_original_limits`: what threadpoolctl's
    ``limit(limits=threads, user_api="blas")`` does, without re-reading the process's
    libraries each time (25-60 us per run against 1-2 us, a small model's whole run)."""

    def __init__(self, libs: list, threads: int) -> None:
        self.saved = [(c, c.num_threads) for c in libs]
        for c, n in self.saved:
            if n != threads:
                c.set_num_threads(threads)
        self.threads = threads

    def restore_original_limits(self) -> None:
        for c, n in self.saved:
            if n != self.threads:
                c.set_num_threads(n)


@contextlib.contextmanager
def _limited(threads: int, libs: list):
    """Limit the BLAS libraries to ``threads`` threads while any run is inside: the first run
    to enter sets the limit, the last to leave restores the libraries' setting (runs of one
    session may overlap in threads; a second session's different count waits for the next
    first entrant). ``libs``: the BLAS libraries of threadpoolctl's controller, read once per
    session (:class:`_Limit`)."""
    with _CONTROLLER_LOCK:
        if _ACTIVE["count"] == 0:
            _ACTIVE["limiter"] = None
        _ACTIVE["count"] += 1
    if _ACTIVE["limiter"] is None:
        with _CONTROLLER_LOCK:
            if _ACTIVE["limiter"] is None:
                _ACTIVE["limiter"] = _Limit(libs, threads)
    try:
        yield
    finally:
        with _CONTROLLER_LOCK:
            _ACTIVE["count"] -= 1
            if _ACTIVE["count"] == 0 and _ACTIVE["limiter"] is not None:
                _ACTIVE["limiter"].restore_original_limits()
                _ACTIVE["limiter"] = None


def _session_of(graph, options):
    """An onnxruntime CPU session of the one-node ``graph`` (opset 13, IR 8: what every product
    and probe here builds) under session ``options``."""
    import onnxruntime as ort
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


_NATIVE: dict = {}


def _run_bound(sess, inputs: dict, name: str, out: np.ndarray) -> None:
    """Run onnxruntime session ``sess`` on ``inputs`` (``{input name: C-contiguous array}``)
    with its output ``name`` written into ``out`` (a C-contiguous array of the output's dtype
    and shape): io-binding, so the result is not copied out of onnxruntime's memory. Bound
    through onnxruntime's native binding when this onnxruntime has one (``sess._sess``), not
    its public ``IOBinding``, which checks for WebGPU graph capture at each bind and run:
    measured on the project machine (onnxruntime 1.24, one Relu on 2x4), 5.8 us per call
    against 7.7 us, paid by every convolution of every inference."""
    native = getattr(sess, "_sess", None)
    if "C" not in _NATIVE:
        try:
            from onnxruntime.capi import _pybind_state as C
            from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

            _NATIVE["C"], _NATIVE["cpu"] = C, OrtDevice.make("cpu", 0)._get_c_device()
        except Exception:  # noqa: BLE001 - another onnxruntime's layout: the public binding
            _NATIVE["C"] = None
    C = _NATIVE["C"]
    if C is None or native is None or not hasattr(native, "run_with_iobinding"):
        b = sess.io_binding()
        for n, a in inputs.items():
            b.bind_cpu_input(n, a)
        b.bind_output(name, "cpu", 0, out.dtype.type, list(out.shape), out.ctypes.data)
        sess.run_with_iobinding(b)
        return
    b = C.SessionIOBinding(native)
    for n, a in inputs.items():
        b.bind_input(n, a)
    b.bind_output(name, _NATIVE["cpu"], out.dtype.type, list(out.shape),
                  out.__array_interface__["data"][0])
    native.run_with_iobinding(b, None)


def _least_cpu(routes: list, rounds: int = 4) -> list[float]:
    """The least CPU time (seconds, ``time.process_time``) of each callable of ``routes`` over
    ``rounds`` rounds that run them alternately (so load that changes over time falls on all
    of them alike): how the kernel choices compare routes after their warm-up run."""
    best = [float("inf")] * len(routes)
    for _ in range(rounds):
        for i, fn in enumerate(routes):
            t0 = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - t0)
    return best

class MatrixKernels:
    """Matrix products of the device simulators: BLAS thread count and kernel choice.

    Args:
        threads: BLAS threads while a run is active (>= 1), or 0 to leave the libraries'
            own setting (``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` or all cores).
        matmul: ``"auto"`` (per shape, the faster of numpy and onnxruntime, measured on the
            first product), ``"numpy"`` or ``"onnxruntime"``.

    Raises:
        ValueError: a negative thread count or an unknown kernel name.
    """

    def __init__(self, threads: int = 1, matmul: str = "auto",
                 graph_optimization: str = "all") -> None:
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
            raise ValueError(f"BLAS threads must be an integer >= 0, got {threads!r}")
        if matmul not in MATMULS:
            raise ValueError(f"matmul must be one of {', '.join(MATMULS)}, got {matmul!r}")
        if graph_optimization not in GRAPH_LEVELS:
            raise ValueError(f"graph_optimization must be one of {', '.join(GRAPH_LEVELS)}, "
                             f"got {graph_optimization!r}")
        self.threads = int(threads)
        self.mode = matmul
        self.graph_optimization = graph_optimization
        self._choice: dict = {}
        self._conv_choice: dict = {}
        self._int_choice: dict = {}
        self._int_conv_choice: dict = {}
        self._lock = threading.Lock()
        self._deciding = threading.Lock()
        self._ctl = None
        self._ort: dict = {}

    # -- activation -----------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Make these kernels the current ones (for :func:`current`) and limit the BLAS threads
        for the duration of the block."""
        token = _CURRENT.set(self)
        try:
            if self.threads:
                if self._ctl is None:
                    self._ctl = _controller()
                    self._libs = [c for c in self._ctl.lib_controllers if c.user_api == "blas"]
                with _limited(self.threads, self._libs):
                    yield self
            else:
                yield self
        finally:
            _CURRENT.reset(token)

    def describe(self) -> dict:
        """The configuration for a report: ``blas_threads`` (0: the libraries' own),
        ``blas`` (``[(library, internal API, threads it uses outside a run)]``), ``matmul`` (the
        mode) and ``chosen`` (``{"MxKxN": kernel}`` decided so far; ``T`` marks a product written
        transposed; ``"conv <input shape> k<kernel> s<strides> -><N>"`` the products of
        patches run as convolutions or not, :meth:`conv`: ``"numpy"``, ``"onnxruntime"`` (a
        session at the configured graph level) or :data:`CONV_PLAIN` (one at
        :data:`CONV_PLAIN_LEVEL`, plain NCHW))."""
        libs = [(i.get("prefix"), i.get("internal_api"), i.get("num_threads"))
                for i in (self._ctl or _controller()).select(user_api="blas").info()]
        with self._lock:
            chosen = {f"{m}x{k}x{n}" + ("" if c else "T"): v
                      for (m, k, n, c), v in sorted(self._choice.items())}
            # by text: keys of one geometry, one with an activation (a string) and one without
            # (None), do not compare
            chosen.update(sorted((_conv_text(key), v) for key, v in self._conv_choice.items()))
            chosen.update(sorted((f"int {m}x{k}x{n}", v)
                                 for (m, k, n), v in self._int_choice.items()))
            chosen.update(sorted(("int " + _conv_text(key[:3] + (None,))
                                  + (f" g{key[3]}" if key[3] > 1 else ""), v)
                                 for key, v in self._int_conv_choice.items()))
        return {"blas_threads": self.threads, "blas": libs, "matmul": self.mode, "chosen": chosen}

    # -- products -------------------------------------------------------------------------
    def matmul(self, X: np.ndarray, W: np.ndarray, out: np.ndarray, const: bool = False) -> None:
        """``out[:] = X @ W`` for 2-D float32 ``X[M, K]``, ``W[K, N]``, ``out[M, N]``.

        ``out`` may be the transpose of a C-contiguous array (a node whose result is the
        transpose of the simulator's, see ``CrossbarSimulator.run``): then ``out^T = W^T X^T``
        is computed in place, so the result never needs transposing back. ``const``: ``W``
        is a weight that stays programmed (same memory) for the session's lifetime; under
        ``"onnxruntime"`` it is then an initializer of the product's session (module
        docstring), which keeps a reference to it."""
        if out.dtype != np.float32 or not (out.flags.c_contiguous or out.T.flags.c_contiguous):
            np.matmul(X, W, out=out)
            return
        if self.mode == "numpy":
            _np_matmul(X, W, out)
            return
        if self.mode == "onnxruntime":
            if const and W.dtype == np.float32:
                self._ort_const_matmul(X, W, out)
            else:
                self._ort_matmul(X, W, out)
            return
        key = (X.shape[0], X.shape[1], W.shape[1], bool(out.flags.c_contiguous))
        kind = self._choice.get(key)
        if kind is None:
            with self._deciding:  # one decision per shape, even when kernels run in threads
                kind = self._choice.get(key)
                if kind is None:
                    self._decide(key, X, W, out)
                    return
        if kind == "numpy":
            _np_matmul(X, W, out)
        else:
            self._ort_matmul(X, W, out)

    def _decide(self, key, X, W, out) -> str:
        """Time both kernels on this product (the least of three runs after a warm-up run that
        also builds the session) and keep the faster for its shape; ``out`` gets the chosen
        kernel's product. A product past :data:`TIMING_MACS` is timed on its first rows
        (:func:`_timing_rows`), in buffers of ``out``'s layout, then computed whole once."""
        m = _timing_rows(X.shape[0], X.shape[1], W.shape[1])
        whole = (X, out) if m < X.shape[0] else None
        if whole is not None:
            X = X[:m]
            out = np.empty((W.shape[1], m), np.float32).T if key[3] is False else \
                np.empty((m, W.shape[1]), np.float32)
        other = np.empty(out.shape[::-1], np.float32).T if key[3] is False else np.empty_like(out)

        def best(fn, dst) -> float:  # the least of three timed runs after a warm-up
            fn(X, W, dst)
            times = []
            for _ in range(3):
                t0 = time.process_time()
                fn(X, W, dst)
                times.append(time.process_time() - t0)
            return min(times)

        t_np = best(_np_matmul, out)
        try:
            t_ort = best(self._ort_matmul, other)
        except Exception:  # noqa: BLE001 - onnxruntime cannot run it: numpy it is
            t_ort = float("inf")
        kind = "onnxruntime" if t_ort < t_np else "numpy"
        if kind == "onnxruntime":
            out[...] = other
        with self._lock:
            self._choice[key] = kind
        if whole is not None:
            (_np_matmul if kind == "numpy" else self._ort_matmul)(whole[0], W, whole[1])
        return kind

    def _session(self, trans_a: bool, trans_b: bool):
        """The onnxruntime session of ``A @ B`` with ``A``/``B`` fed transposed (``transA`` /
        ``transB`` of a Gemm) when they arrive as transposed views, so they are not copied."""
        key = (trans_a, trans_b)
        if key not in self._ort:
            with self._lock:
                if key not in self._ort:
                    from onnx import TensorProto, helper

                    f = TensorProto.FLOAT
                    node = helper.make_node("Gemm", ["A", "B"], ["Y"], transA=int(trans_a),
                                            transB=int(trans_b))
                    g = helper.make_graph(
                        [node], "matmul",
                        [helper.make_tensor_value_info("A", f, ["K", "M"] if trans_a else ["M", "K"]),
                         helper.make_tensor_value_info("B", f, ["N", "K"] if trans_b else ["K", "N"])],
                        [helper.make_tensor_value_info("Y", f, ["M", "N"])])
                    self._ort[key] = _session_of(g, self._options())
        return self._ort[key]

    def _options(self, level: str | None = None):
        """Options of a product's session: this session's threads, the shared arena
        (:func:`share_arena`) and graph optimization ``level`` (a key of
        :data:`GRAPH_LEVELS`; None: the configured ``graph_optimization``)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        share_arena(so)
        so.log_severity_level = 3
        so.intra_op_num_threads = max(self.threads, 1)
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.graph_optimization_level = graph_level(level or self.graph_optimization)
        return so

    # -- products of patches -----------------------------------------------------------------
    def conv(self, x: np.ndarray, W: np.ndarray, bias: np.ndarray | None, geometry: tuple,
             activation: str | None = None, residual: bool = False):
        """The product of the patches of ``x`` with ``W`` (plus ``bias``) as one convolution in
        onnxruntime's kernels, the patches never materialized: a callable ``f(x, out=None) ->
        Y`` for inputs of ``x``'s shape, or None when the product should be computed on the
        materialized patches instead (by :meth:`matmul`).

        ``x`` float32 ``[n, C, *S]``; ``W`` float32 ``[C * prod(k), N]``, a weight that stays
        programmed for the session (held by the kernel's session, as an initializer); ``bias``
        float32 ``[N]`` or None; ``geometry`` ``(kernel_shape, strides, pads, dilations)`` as an
        Im2Col node has them (``pads`` begins then ends). The patches are those of Im2Col:
        channel-major, then kernel position, so ``W``'s columns are the weights of a Conv's
        ``N`` filters ``[C, *k]``. ``f`` returns ``Y`` float32 ``[n, N, *O]``, into ``out``
        when given (a C-contiguous array of that shape): ``Y[i, :, o] = patch(i, o) @ W +
        bias``, the sums of :meth:`matmul` on the patches up to their order, with
        ``activation`` ``"Relu"`` applied (in the same session: onnxruntime fuses it into the
        convolution) or none (None).

        Which kernel: ``"numpy"`` never convolves: None, or for patches larger than
        :data:`IM2COL_BYTES` numpy's product computed in blocks of output rows
        (:func:`_tiled_numpy_conv`: numpy's bits, the patches never all materialized; so
        too when ``"auto"`` chose numpy); ``"onnxruntime"`` always does, in a session built at
        the configured ``graph_optimization`` level (not timed: the level the host partitions
        run at, and the one onnxruntime runs the original model's convolutions at);
        ``"auto"`` times both on the first product of each shape and geometry
        (:meth:`_decide_conv`: the convolution against copying the patches, numpy's product of
        them and the bias addition) and keeps the convolution unless it took more than
        :data:`CONV_MARGIN` times the numpy route. At level ``"all"`` it times two
        convolution sessions, the one at ``"all"`` (onnxruntime's NCHWc layout; chosen as
        ``"onnxruntime"``) and one at :data:`CONV_PLAIN_LEVEL` (plain NCHW; chosen as
        :data:`CONV_PLAIN`), and the faster of the two (by :data:`CONV_PLAIN_MARGIN`) is the
        convolution kept: neither layout is faster on every shape (:data:`CONV_PLAIN_LEVEL`).
        Measured on the
        project's 2-core machine (1 thread, light ResNet50's 3x3 convolutions): onnxruntime's
        convolution 2.1 ms where numpy's product of the patches took 2.5-3.5 ms, plus 0.3-0.7
        ms to copy the patches; on 1x1 convolutions the two are within a few percent.

        ``residual``: ``f(x, out=None, z=None)`` adds ``z`` (float32, ``Y``'s shape: a
        residual connection's other input) to the convolution, inside its session, before
        ``activation``, as onnxruntime fuses a Conv, Add and Relu of a whole model; None when
        the convolution of this shape is not run in onnxruntime (``"numpy"``, or ``"auto"``
        chose numpy: the caller then adds ``z`` itself), the choice being the plain
        convolution's.

        Raises ValueError if the shapes do not fit the geometry (``W`` rows != ``C * prod(k)``).
        """
        geo = tuple(tuple(int(v) for v in g) for g in geometry)
        kernel_shape = geo[0]
        if x.ndim != 2 + len(kernel_shape) or W.ndim != 2 or \
                W.shape[0] != x.shape[1] * math.prod(kernel_shape):
            raise ValueError(f"conv: input {list(x.shape)} and weights {list(W.shape)} do not "
                             f"fit kernel {list(kernel_shape)}")
        if activation not in (None, "Relu"):
            raise ValueError(f"conv: unknown activation {activation!r}")
        big = x.shape[0] * math.prod(_conv_out(x.shape[2:], geo)) * W.shape[0] * 4 > IM2COL_BYTES
        if self.mode == "numpy":
            return _tiled_numpy_conv(W, bias, geo, activation) if big and not residual else None
        # a residual's convolution takes the plain one's choice (its Add follows the Conv)
        plain_act = None if residual else activation
        key = (tuple(x.shape), W.shape[1], geo, plain_act)
        kind = self._conv_choice.get(key)
        if kind is None and self.mode == "onnxruntime":
            with self._lock:
                kind = self._conv_choice[key] = "onnxruntime"
        if kind is None:
            with self._deciding:
                kind = self._conv_choice.get(key)
                if kind is None:
                    kind = self._decide_conv(key, x, W, bias, geo, plain_act)
        if kind == "numpy":
            return _tiled_numpy_conv(W, bias, geo, activation) if big and not residual else None
        return self._ort_conv(x, W, bias, geo, activation,
                              CONV_PLAIN_LEVEL if kind == CONV_PLAIN else None, residual)

    def _decide_conv(self, key, x, W, bias, geo, activation) -> str:
        """Time the convolution of ``x`` against the numpy route on arrays of its shapes --
        copying the patches out of ``x`` (as Im2Col does, unless they are a view of ``x``:
        a 1x1 kernel, unit strides, no padding), numpy's product of them in the layout Im2Col
        gives them (the transpose of a C-contiguous ``[K, rows]``), the bias (and Relu) added
        -- and keep the choice for the key (:meth:`conv`, :data:`CONV_MARGIN`). The two run
        alternately, four times each after a warm-up, the least CPU time of each counting
        (module docstring). Timed on a slice of ``x`` whose patches fit :data:`TIMING_BYTES`
        (:func:`_timing_slice`): both routes cost in proportion to the output rows, and the
        whole input's patches were 2.7 GB on DNSMOS at batch 4 (with the product's operand
        copied for a batch, 5.4 GB), built only to time a choice.

        At the configured level ``"all"`` the convolution is timed in two sessions, at
        ``"all"`` and at :data:`CONV_PLAIN_LEVEL`, the three routes alternately; the plain
        one is the convolution compared with numpy's route if it took less than
        :data:`CONV_PLAIN_MARGIN` times the other's CPU time, else the other is, and the
        sessions built here and not chosen are dropped (their copy of the weights with them):
        one session per choice stays."""
        kernel_shape, strides, pads, dilations = geo
        x = _timing_slice(x, W.shape[0], geo)
        n, C, spatial = x.shape[0], x.shape[1], x.shape[2:]
        r = len(spatial)
        span = [d * (k - 1) + 1 for k, d in zip(kernel_shape, dilations)]
        O = [(s + pads[i] + pads[i + r] - span[i]) // t + 1
             for i, (s, t) in enumerate(zip(spatial, strides))]
        rows, K, N = n * math.prod(O), W.shape[0], W.shape[1]
        # ones, not zeros: calloc'ed zeros all read one shared page, which would flatter numpy
        cols = np.ones((n, C) + tuple(kernel_shape) + tuple(O), np.float32)
        # the product's operand: Im2Col's memory as it is for one image (a batch is copied)
        cols_t = (cols.reshape(K, rows) if n == 1 else np.ones((K, rows), np.float32)).T
        prod_out = np.empty((N, rows), np.float32).T
        conv_out = np.empty((n, N, *O), np.float32)
        view = all(k == 1 for k in kernel_shape) and all(t == 1 for t in strides) and not any(pads)
        if not view:
            xp = np.ones((n, C) + tuple(s + pads[i] + pads[i + r] for i, s in enumerate(spatial)),
                         np.float32)
            win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + r)))
            win = win[(slice(None), slice(None)) + tuple(slice(None, None, t) for t in strides)
                      + tuple(slice(None, None, d) for d in dilations)]
            # [n, C, *O, *k] -> [n, C, *k, *O], Im2Col's memory
            win = win.transpose((0, 1) + tuple(range(2 + r, 2 + 2 * r)) + tuple(range(2, 2 + r)))

        def numpy_route():
            if not view:
                np.copyto(cols, win)
            _np_matmul(cols_t, W, prod_out)
            if bias is not None:
                np.add(prod_out, bias, out=prod_out)
            if activation:
                np.maximum(prod_out, 0, out=prod_out)

        numpy_route()  # warm-up
        routes, kinds, built = [numpy_route], ["numpy"], {}
        levels = [(None, "onnxruntime")]
        if self.graph_optimization == "all":
            levels.append((CONV_PLAIN_LEVEL, CONV_PLAIN))
        for level, name in levels:
            skey = self._conv_key(x, W, bias, geo, activation, level)
            fresh = skey not in self._ort
            try:
                f = self._ort_conv(x, W, bias, geo, activation, level)
                f(x, conv_out)  # warm-up
            except Exception:  # noqa: BLE001 - onnxruntime cannot run it: not this route
                continue
            finally:
                if fresh and skey in self._ort:
                    built[name] = skey
            routes.append(lambda f=f: f(x, conv_out))
            kinds.append(name)
        best = _least_cpu(routes)
        kind = "numpy"
        if len(best) > 1:
            i = 1  # the convolution at the configured level, unless the plain one beat it
            if len(best) == 3 and best[2] < best[1] * CONV_PLAIN_MARGIN:
                i = 2
            if best[i] < best[0] * CONV_MARGIN:
                kind = kinds[i]
        with self._lock:
            for name, skey in built.items():
                if name != kind:
                    self._ort.pop(skey, None)
            self._conv_choice[key] = kind
        return kind

    def release_conv(self, W: np.ndarray) -> None:
        """Drop the sessions of plain convolutions (no residual input) of weight array ``W``
        (:meth:`conv`), at every level: for a caller that convolves ``W`` only with a
        residual from now on, so its weights are not held twice."""
        addr = W.__array_interface__["data"][0]
        with self._lock:
            for k in [k for k in self._ort if k[0] == "conv" and k[1] == addr and
                      k[-1] != "residual"]:
                del self._ort[k]

    def _conv_key(self, x, W, bias, geo, activation, level=None, residual=False) -> tuple:
        """The key in ``self._ort`` of :meth:`_ort_conv`'s session: the weight and bias arrays
        (by address), the geometry, the activation, the graph optimization level (None: the
        configured one) and whether it adds a residual input."""
        return ("conv", W.__array_interface__["data"][0], W.shape, W.strides,
                None if bias is None else bias.__array_interface__["data"][0], geo, x.ndim,
                activation, level or self.graph_optimization) + (("residual",) if residual else ())

    def _ort_conv(self, x, W, bias, geo, activation=None, level=None, residual=False):
        """``f(x, out=None)`` (``residual``: ``f(x, out=None, z=None)``, ``z`` added before
        the activation): ``x`` convolved with ``W`` (and ``bias``) in an onnxruntime session
        holding them as initializers, one session per weight array, geometry, graph
        optimization ``level`` (None: the configured one) and kind (:meth:`_conv_key`; the
        arrays held: their addresses stay theirs)."""
        key = self._conv_key(x, W, bias, geo, activation, level, residual)
        entry = self._ort.get(key)
        if entry is None:
            with self._lock:
                entry = self._ort.get(key)
                if entry is None:
                    entry = self._ort[key] = (W, bias, self._conv_session(
                        x, W, bias, geo, activation, level, residual))
        sess = entry[2]

        if residual:
            def run_z(x, out=None, z=None):
                feeds = {"X": np.ascontiguousarray(x, dtype=np.float32),
                         "Z": np.ascontiguousarray(z, dtype=np.float32)}
                if out is None:
                    return sess.run(None, feeds)[0]
                _run_bound(sess, feeds, "Y", out)
                return out
            return run_z

        def run(x, out=None):
            xin = np.ascontiguousarray(x, dtype=np.float32)
            if out is None:
                return sess.run(None, {"X": xin})[0]
            _run_bound(sess, {"X": xin}, "Y", out)
            return out
        return run

    def _conv_session(self, x, W, bias, geo, activation, level=None, residual=False):
        from onnx import TensorProto, helper, numpy_helper

        kernel_shape, strides, pads, dilations = geo
        C, N = x.shape[1], W.shape[1]
        # W's rows are channel-major, then kernel position: W^T is [N, C, *k] in Conv's layout
        Wc = np.ascontiguousarray(W.T, dtype=np.float32).reshape((N, C) + kernel_shape)
        inits = [numpy_helper.from_array(Wc, "W")]
        if bias is not None:
            inits.append(numpy_helper.from_array(np.ascontiguousarray(bias, np.float32), "B"))
        last = "C" if residual else "Y"  # the convolution, then the residual's Add
        nodes = [helper.make_node("Conv", ["X", "W"] + (["B"] if bias is not None else []),
                                  ["A" if activation and not residual else last],
                                  kernel_shape=list(kernel_shape), strides=list(strides),
                                  pads=list(pads), dilations=list(dilations))]
        if residual:
            nodes.append(helper.make_node("Add", ["C", "Z"], ["A" if activation else "Y"]))
        if activation:
            nodes.append(helper.make_node(activation, ["A"], ["Y"]))
        f = TensorProto.FLOAT
        spatial = [None] * len(kernel_shape)
        inputs = [helper.make_tensor_value_info("X", f, [None, C] + spatial)]
        if residual:
            inputs.append(helper.make_tensor_value_info("Z", f, [None, N] + spatial))
        g = helper.make_graph(nodes, "conv", inputs,
                              [helper.make_tensor_value_info("Y", f, None)], inits)
        return _session_of(g, self._options(level))

    def _ort_const_matmul(self, X, W, out) -> None:
        """``out[:] = X @ W`` in a session whose ``W`` is an initializer (packed once, as
        onnxruntime packs a MatMul's constant weights), one session per weight array."""
        key = (W.__array_interface__["data"][0], W.shape, W.strides)
        entry = self._ort.get(key)
        if entry is None:
            with self._lock:
                entry = self._ort.get(key)
                if entry is None:
                    from onnx import TensorProto, helper, numpy_helper

                    f = TensorProto.FLOAT
                    trans = not W.flags.c_contiguous and W.T.flags.c_contiguous
                    B = np.ascontiguousarray(W.T if trans else W)
                    g = helper.make_graph(
                        [helper.make_node("MatMul" if not trans else "Gemm", ["A", "B"], ["Y"],
                                          **({"transB": 1} if trans else {}))], "matmul",
                        [helper.make_tensor_value_info("A", f, ["M", W.shape[0]])],
                        [helper.make_tensor_value_info("Y", f, ["M", W.shape[1]])],
                        [numpy_helper.from_array(B, "B")])
                    sess = _session_of(g, self._options())
                    entry = self._ort[key] = (W, sess)  # W held: its address stays its own
        Y = entry[1].run(None, {"A": np.ascontiguousarray(X, dtype=np.float32)})[0]
        out[...] = Y

    def _ort_matmul(self, X, W, out) -> None:
        A, B, Y = (X, W, out) if out.flags.c_contiguous else (W.T, X.T, out.T)
        fed = []
        for M in (A, B):
            if M.flags.c_contiguous:
                fed.append((M, False))
            elif M.T.flags.c_contiguous:
                fed.append((M.T, True))
            else:
                fed.append((np.ascontiguousarray(M), False))
        sess = self._session(fed[0][1], fed[1][1])
        _run_bound(sess, {"A": np.asarray(fed[0][0], dtype=np.float32),
                          "B": np.asarray(fed[1][0], dtype=np.float32)}, "Y", Y)

    # -- integer products ------------------------------------------------------------------
    def int_matmul(self, X: np.ndarray, W: np.ndarray, out: np.ndarray, const: bool = False,
                   x_range: tuple | None = None) -> None:
        """``out[:] = X @ W`` exactly, wrapped to int32 as onnxruntime's int32 sums wrap.

        ``X[M, K]`` integer values (an integer dtype, or float64 holding integers) of
        magnitude below 2**16; ``W[K, N]`` integers (any dtype) of magnitude below 2**15;
        ``out[M, N]`` int32, C-contiguous. ``const``: ``W`` stays the same array for the
        session (its uint8 form and session are kept, keyed by its address). ``x_range``:
        ``(min, max)`` of ``X`` when the caller knows it (else computed here).
        ``"numpy"``: float64 products (the simulator's route); ``"onnxruntime"``:
        ``MatMulInteger`` wherever both operands fit uint8 with a zero point (module
        docstring), numpy otherwise; ``"auto"``: the faster, timed per ``(M, K, N)``."""
        if self.mode == "numpy" or X.shape[0] == 0:
            _np_int_matmul(X, W, out)
            return
        wq = self._int_weights(W, const)
        lo, hi = x_range if x_range is not None else (
            (int(X.min()), int(X.max())) if X.size else (0, 0))
        c = _u8_offset(lo, hi)
        if wq is None or c is None:
            _np_int_matmul(X, W, out)
            return
        if self.mode == "onnxruntime":
            self._ort_int_matmul(X, c, wq, out)
            return
        key = (X.shape[0], X.shape[1], W.shape[1])
        kind = self._int_choice.get(key)
        if kind is None:
            with self._deciding:
                kind = self._int_choice.get(key)
                if kind is None:
                    # timed on the first rows past TIMING_MACS (both give the same integers),
                    # then the whole product below on the chosen route
                    m = _timing_rows(*key)
                    Xs, ref = (X, out) if m == X.shape[0] else \
                        (X[:m], np.empty((m, W.shape[1]), np.int32))
                    kind = self._decide_int(key, lambda: _np_int_matmul(Xs, W, ref),
                                            lambda dst: self._ort_int_matmul(Xs, c, wq, dst), ref)
                    if m == X.shape[0]:
                        return
        if kind == "numpy":
            _np_int_matmul(X, W, out)
        else:
            self._ort_int_matmul(X, c, wq, out)

    def _decide_int(self, key, numpy_fn, ort_fn, out, table=None) -> str:
        """Time the numpy route (writing ``out``) against the onnxruntime one (into a copy),
        alternately, four times each after a warm-up, the least CPU time counting; keep
        onnxruntime if faster and its integers equal numpy's. ``out`` holds numpy's result."""
        other = np.empty_like(out)
        routes = [numpy_fn, lambda: ort_fn(other)]
        try:
            for fn in routes:
                fn()
            same = np.array_equal(out, other)
        except Exception:  # noqa: BLE001 - onnxruntime cannot run it: numpy it is
            routes, same = routes[:1], False
        best = _least_cpu(routes)
        margin = 1.0 if table is None else CONV_MARGIN
        kind = "onnxruntime" if same and best[-1] < best[0] * margin else "numpy"
        with self._lock:
            (self._int_choice if table is None else table)[key] = kind
        return kind

    def _int_weights(self, W: np.ndarray, const: bool, signed: bool = True):
        """``(Wq, const, c)``: ``W`` as int8 with zero point 0 when it fits, ``signed`` and
        :func:`int8_weights`, else ``W + c`` as uint8 (zero point ``c``,
        :func:`_u8_offset`); None when ``W`` is not all integers spanning at most 256 values
        within -255..255. Kept per weight array when ``const`` (the array held: its address
        stays its own)."""
        key = ("intW", W.__array_interface__["data"][0], W.shape, W.strides)
        if const:
            got = self._ort.get(key)
            if got is not None:
                return got[1]
        q = None
        lo, hi = (int(W.min()), int(W.max())) if W.size else (0, 256)
        c = _u8_offset(lo, hi)
        if c is not None and (W.dtype.kind in "iu" or np.array_equal(W, np.rint(W))):
            if signed and lo >= -128 and hi <= 127 and int8_weights():
                q = (W.astype(np.int8), const, 0)
            else:
                q = ((W.astype(np.int16) + c).astype(np.uint8), const, c)
        if const:
            with self._lock:
                self._ort[key] = (W, q)
        return q

    def _ort_int_matmul(self, X, c: int, wq, out) -> None:
        """``out[:] = X @ W`` by ``MatMulInteger`` over ``X + c`` (zero point ``c``) and the
        uint8 weights ``wq`` (:meth:`_int_weights`: an initializer of a session of their own
        when constant)."""
        Wu8, const, wz = wq
        if const:
            key = ("intmm", Wu8.__array_interface__["data"][0])
            entry = self._ort.get(key)
            if entry is None:
                with self._lock:
                    entry = self._ort.get(key)
                    if entry is None:
                        entry = self._ort[key] = (Wu8, self._int_session(
                            "MatMulInteger", {"B": Wu8, "bz": wz}, ["M", Wu8.shape[0]], {}))
        else:
            key = ("intmm", Wu8.dtype.str)
            entry = self._ort.get(key)
            if entry is None:
                with self._lock:
                    entry = self._ort.setdefault(key, (None, self._int_session(
                        "MatMulInteger", None, ["M", "K"], {}, Wu8.dtype)))
        sess = entry[1]
        feeds = {"A": _as_u8(X, c), "az": np.array(c, np.uint8)}
        if not const:
            feeds.update(B=np.ascontiguousarray(Wu8), bz=np.array(wz, Wu8.dtype))
        _run_bound(sess, feeds, "Y", out)

    def _int_session(self, op: str, inits: dict | None, a_shape: list, attrs: dict,
                     b_type=None):
        """A one-node onnxruntime session ``op(A, B, az, bz)`` (``MatMulInteger`` or
        ``ConvInteger``): ``A`` and its zero point ``az`` uint8 inputs, ``B`` (uint8 or int8:
        ``b_type``, or that of ``inits["B"]``) and its zero point ``bz`` initializers when
        ``inits`` gives them (``{"B": array, "bz": int}``), else inputs too; int32 ``Y``."""
        from onnx import TensorProto, helper, numpy_helper

        u8 = TensorProto.UINT8
        bt = np.dtype(inits["B"].dtype if inits is not None else b_type)
        b8 = TensorProto.INT8 if bt == np.int8 else u8
        ins = [helper.make_tensor_value_info("A", u8, a_shape),
               helper.make_tensor_value_info("az", u8, [])]
        init = []
        if inits is None:
            ins += [helper.make_tensor_value_info("B", b8, ["K", "N"]),
                    helper.make_tensor_value_info("bz", b8, [])]
        else:
            init += [numpy_helper.from_array(inits["B"], "B"),
                     numpy_helper.from_array(np.array(inits["bz"], bt), "bz")]
        g = helper.make_graph([helper.make_node(op, ["A", "B", "az", "bz"], ["Y"], **attrs)],
                              op, ins, [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
                              init)
        return _session_of(g, self._options())

    def int_conv(self, x: np.ndarray, W: np.ndarray, geometry: tuple, groups: int = 1):
        """The integer product of the patches of ``x`` with ``W`` as one ``ConvInteger``, the
        patches never materialized: a callable ``f(x, out=None) -> Y`` or None (compute on the
        materialized patches instead, :meth:`int_matmul`).

        ``x`` integers ``[n, C, *S]`` (an integer dtype), ``W`` integers ``[G, C/G * prod(k),
        N/G]`` (``groups`` G: group ``g`` multiplies channels ``g*C/G ..`` by ``W[g]``),
        ``geometry`` as for :meth:`conv` (padding contributes zeros, as Im2Col pads). ``f``
        returns int32 ``Y[n, N, *O]`` with ``Y[i, g*N/G + j, o] = patch_g(i, o) @ W[g][:, j]``
        exactly, wrapped to int32. ``f`` returns None for an ``x`` whose values do not fit
        uint8 with a zero point (module docstring); the caller then materializes the
        patches. None instead of ``f`` under ``"numpy"``, for weights that do not fit uint8
        with a zero point, or
        when ``"auto"`` timed the numpy route (copying the patches to float64 and their
        product) faster on the first call than :data:`CONV_MARGIN` times the convolution.
        ``x`` of the first call decides, so it must fit. ValueError if the shapes do not fit.
        """
        geo = tuple(tuple(int(v) for v in g) for g in geometry)
        kernel_shape = geo[0]
        G = int(groups)
        if x.ndim != 2 + len(kernel_shape) or W.ndim != 3 or W.shape[0] != G or \
                x.shape[1] % G or W.shape[1] != x.shape[1] // G * math.prod(kernel_shape):
            raise ValueError(f"int_conv: input {list(x.shape)} and weights {list(W.shape)} do "
                             f"not fit kernel {list(kernel_shape)} in {G} groups")
        if self.mode == "numpy" or x.dtype.kind not in "iu":
            return None
        Cg, Ng = x.shape[1] // G, W.shape[2]
        wkey = ("intconvW", W.__array_interface__["data"][0], W.shape, W.strides, geo)
        entry = self._ort.get(wkey)
        if entry is None:
            wq = self._int_weights(W, const=False, signed=False)
            sess = None
            if wq is not None:  # [G, Cg*k, Ng] -> Conv's [G*Ng, Cg, *k]
                Wc = np.ascontiguousarray(wq[0].transpose(0, 2, 1)).reshape(
                    (G * Ng, Cg) + kernel_shape)
                _, strides, pads, dilations = geo
                try:
                    sess = self._int_session(
                        "ConvInteger", {"B": Wc, "bz": wq[2]},
                        [None, x.shape[1]] + [None] * len(kernel_shape),
                        {"kernel_shape": list(kernel_shape), "strides": list(strides),
                         "pads": list(pads), "dilations": list(dilations), "group": G})
                except Exception:  # noqa: BLE001 - onnxruntime cannot run it: numpy it is
                    sess = None
            with self._lock:
                entry = self._ort[wkey] = (W, sess)
        sess = entry[1]
        if sess is None:
            return None

        def run(x, out=None):
            lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
            c = _u8_offset(lo, hi)
            if c is None:
                return None
            if out is None:  # written in place, not copied out of onnxruntime's buffer
                out = np.empty((x.shape[0], G * Ng) + _conv_out(x.shape[2:], geo), np.int32)
            _run_bound(sess, {"A": _as_u8(x, c), "az": np.array(c, np.uint8)}, "Y", out)
            return out

        if self.mode == "onnxruntime":
            return run
        key = (tuple(x.shape), G * Ng, geo, G)
        kind = self._int_conv_choice.get(key)
        if kind is None:
            with self._deciding:
                kind = self._int_conv_choice.get(key)
                if kind is None:
                    # timed on a slice whose patches fit TIMING_BYTES, as conv() times: the
                    # numpy route copies the patches to float64, five times per route
                    xs = _timing_slice(x, W.shape[0] * W.shape[1], geo)
                    probe = run(xs)
                    if probe is None:  # this input does not fit: decide on one that does
                        return run
                    ref = np.empty_like(probe)
                    kind = self._decide_int(key, _patch_product(xs, W, geo, ref),
                                            lambda dst: run(xs, dst), ref,
                                            table=self._int_conv_choice)
        return run if kind == "onnxruntime" else None

def _np_matmul(X, W, out) -> None:
    """numpy's product into ``out``; a transposed ``out`` gets ``out^T = W^T X^T`` (BLAS needs
    rows of unit stride in its output)."""
    if out.flags.c_contiguous:
        np.matmul(X, W, out=out)
    else:
        np.matmul(W.T, X.T, out=out.T)


def _np_int_matmul(X, W, out) -> None:
    """``out[:] = X @ W`` in float64 (exact: every partial sum of integers below 2**16 and
    2**15 over K < 2**21 is below 2**53), wrapped to int32 as the simulator wraps."""
    Y = np.matmul(np.asarray(X, np.float64), np.asarray(W, np.float64))
    np.copyto(out, Y.astype(np.int64), casting="unsafe")


def _u8_offset(lo: int, hi: int) -> int | None:
    """``c`` in 0..255 with ``lo + c >= 0`` and ``hi + c <= 255`` (values ``lo..hi`` fed as
    uint8 ``x + c`` with zero point ``c``), None when there is none."""
    if hi - lo > 255 or lo < -255 or hi > 255:
        return None
    return max(-lo, 0)


def _as_u8(x: np.ndarray, c: int) -> np.ndarray:
    """``x + c`` as a C-contiguous uint8 array (values known to fit: :func:`_u8_offset`)."""
    if x.dtype == np.uint8 and c == 0:
        return np.ascontiguousarray(x)
    if x.dtype.kind == "f":
        x = x.astype(np.int32)
    u = x.astype(np.uint8, order="C")  # x mod 256, then + c mod 256: x + c, which fits
    if c:
        np.add(u, np.uint8(c), out=u)
    return u


#: The most bytes of float32 patches :meth:`MatrixKernels._decide_conv` builds to time a
#: convolution against the numpy route (:func:`_timing_slice`): 32 MB, a few thousand output
#: rows at the widest kernels here (DNSMOS conv2d_1: 1152 patch values a row, 7281 rows), many
#: times the 10-100 us a call takes at which per-call overhead would decide.
TIMING_BYTES = 32 << 20
#: The most multiply-adds of one product :meth:`MatrixKernels.matmul` and
#: :meth:`MatrixKernels.int_matmul` time per route to choose a kernel for a shape
#: (:func:`_timing_rows`): 2**26, 256 rows of a 512x512 weight, a few ms per route. Both routes
#: cost in proportion to the rows past a few hundred, and the whole products were timed
#: before: ten products per shape, numpy's integer route in float64, so that the first run of
#: the T5 encoder (``traceforge-title-model``, batch 8 x 256 tokens, int8: four 2048-row
#: integer shapes) took 5.1 s against 1.4 s for each later run (measured on the project
#: machine, 1 thread).
TIMING_MACS = 1 << 26
#: The fewest rows a timing slice keeps (:func:`_timing_rows`), so that neither route is
#: timed where its per-call overhead, not its per-row cost, decides.
TIMING_MIN_ROWS = 256


#: The most bytes of float32 patches a product of patches computed by numpy materializes at
#: once (:meth:`MatrixKernels.conv`): a larger one is computed by :func:`_tiled_numpy_conv` in
#: blocks of output rows. 64 MB; DNSMOS's conv2d_1 at batch 4 would otherwise copy 2.7 GB of
#: patches (579,600 rows of 1152 values).
IM2COL_BYTES = 64 << 20


def _tiled_numpy_conv(W, bias, geo, activation):
    """numpy's route of :meth:`MatrixKernels.conv` for patches larger than
    :data:`IM2COL_BYTES`: ``f(x, out=None) -> Y[n, N, *O]`` float32, per image and per block of
    output rows along the first spatial axis (at least one) the block's patches copied in
    Im2Col's layout (``[C * prod(k), rows]``), numpy's product of them with ``W`` written as
    ``Y^T = W^T X^T`` (rows of unit stride, as the simulator writes a transposed output), the
    bias added after the product and a Relu setting the negative elements to zero (``-0.0``
    and NaN kept, as the provider's Relu does). BLAS sums each output over ``K`` alike
    whatever the number of rows, so the blocks give the bits of the whole product
    (tests/test_crossbar_sim.py compares them)."""
    kernel_shape, strides, pads, dilations = geo
    K, N = W.shape
    Wf = np.asarray(W, np.float32)

    def run(x, out=None):
        n, spatial = x.shape[0], x.shape[2:]
        r = len(spatial)
        O = _conv_out(spatial, geo)
        if out is None:
            out = np.empty((n, N) + O, np.float32)
        per_row = math.prod(O[1:]) * K * 4 if r else K * 4
        b = max(1, min(O[0], IM2COL_BYTES // max(per_row, 1))) if r else 1
        span = [d * (k - 1) + 1 for k, d in zip(kernel_shape, dilations)]
        for i in range(n):
            xp = np.pad(x[i:i + 1], [(0, 0), (0, 0)] + [(pads[a], pads[a + r]) for a in range(r)])
            win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + r)))
            win = win[(slice(None), slice(None)) + tuple(slice(None, None, t) for t in strides)
                      + tuple(slice(None, None, d) for d in dilations)]
            # [1, C, *O, *k] -> [C, *k, *O], Im2Col's memory of one image
            win = win[0].transpose((0,) + tuple(range(1 + r, 1 + 2 * r)) + tuple(range(1, 1 + r)))
            for o0 in range(0, O[0], b):
                o1 = min(o0 + b, O[0])
                blk = win[(slice(None),) * (1 + r) + (slice(o0, o1),)]
                rows = blk.size // K
                cols = np.ascontiguousarray(blk).reshape(K, rows)
                prod = np.empty((N, rows), np.float32)
                _np_matmul(cols.T, Wf, prod.T)
                if bias is not None:
                    np.add(prod, np.asarray(bias, np.float32).reshape(N, 1), out=prod)
                if activation:
                    np.copyto(prod, 0, where=prod < 0)
                out[i, :, o0:o1] = prod.reshape((N, o1 - o0) + O[1:])
        return out
    return run


def _timing_rows(M: int, K: int, N: int) -> int:
    """The rows of an ``[M, K] @ [K, N]`` product the kernel choice times: all ``M`` when the
    product fits :data:`TIMING_MACS` multiply-adds, else as many as fit, at least
    :data:`TIMING_MIN_ROWS` (never more than ``M``)."""
    if M * K * N <= TIMING_MACS:
        return M
    return min(M, max(TIMING_MIN_ROWS, TIMING_MACS // max(K * N, 1)))


def _timing_slice(x: np.ndarray, K: int, geo: tuple) -> np.ndarray:
    """A view of ``x[n, C, *S]`` whose patches (``K`` float32 values per output row, geometry
    ``geo`` of :meth:`MatrixKernels.conv`) take at most :data:`TIMING_BYTES` where it can: the
    first image, then the first input rows along the first spatial axis that give that many
    output rows (at least one output row). ``x`` itself when its patches fit."""
    kernel_shape, strides, pads, dilations = geo
    O = _conv_out(x.shape[2:], geo)
    if x.shape[0] * math.prod(O) * K * 4 <= TIMING_BYTES:
        return x
    x = x[:1]
    if math.prod(O) * K * 4 <= TIMING_BYTES or x.ndim < 3:
        return x
    per_row = math.prod(O[1:]) * K * 4  # bytes of one output row along the first axis
    o0 = max(1, min(O[0], TIMING_BYTES // max(per_row, 1)))
    span0 = dilations[0] * (kernel_shape[0] - 1) + 1
    h = max((o0 - 1) * strides[0] + span0 - pads[0], 1)
    return x[:, :, :min(h, x.shape[2])]


def _conv_out(spatial: tuple, geo: tuple) -> tuple:
    """The output spatial shape of a convolution of geometry ``geo`` (:meth:`MatrixKernels.conv`)
    over ``spatial``."""
    kernel_shape, strides, pads, dilations = geo
    r = len(spatial)
    return tuple((spatial[i] + pads[i] + pads[i + r] - dilations[i] * (kernel_shape[i] - 1) - 1)
                 // strides[i] + 1 for i in range(r))


def _patch_product(x, W, geo, ref):
    """The numpy route of :meth:`MatrixKernels.int_conv`, as the simulator computes a Gemm
    over Im2Col's patches: ``f()`` copies the patches of ``x`` (zero padding) to float64 and
    multiplies them by ``W`` per group, writing int32 ``ref[n, N, *O]``."""
    kernel_shape, strides, pads, dilations = geo
    n, spatial = x.shape[0], x.shape[2:]
    r = len(spatial)
    G, Kg, Ng = W.shape
    span = [d * (k - 1) + 1 for k, d in zip(kernel_shape, dilations)]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + r]) for i in range(r)])
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + r)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, t) for t in strides)
              + tuple(slice(None, None, d) for d in dilations)]
    O = win.shape[2:2 + r]
    win = win.transpose((0, 1) + tuple(range(2 + r, 2 + 2 * r)) + tuple(range(2, 2 + r)))
    cols = np.empty(win.shape, np.float64)  # [n, C, *k, *O]
    W64 = np.asarray(W, np.float64).transpose(0, 2, 1)  # [G, Ng, Kg]
    P = math.prod(O)

    def f():
        np.copyto(cols, win)
        c = cols.reshape(n, G, Kg, P)
        Y = np.matmul(W64[None], c)  # [n, G, Ng, P]
        np.copyto(ref.reshape(n, G, Ng, P), Y.astype(np.int64), casting="unsafe")
    return f

def _conv_text(key) -> str:
    """A convolution's key (:meth:`MatrixKernels.conv`) as text: ``conv 1x64x56x56 k3x3 s1x1
    p1x1x1x1 ->64 Relu`` (pads and dilations when not 0 and 1)."""
    shape, n, (k, s, p, d), activation = key
    return (f"conv {'x'.join(map(str, shape))} k{'x'.join(map(str, k))} "
            f"s{'x'.join(map(str, s))}" + (f" p{'x'.join(map(str, p))}" if any(p) else "")
            + (f" d{'x'.join(map(str, d))}" if any(x != 1 for x in d) else "")
            + f" ->{n}" + (f" {activation}" if activation else ""))


_NUMPY = MatrixKernels(threads=0, matmul="numpy")


def current() -> MatrixKernels:
    """The kernels of the session running in this thread (plain numpy outside a session)."""
    return _CURRENT.get() or _NUMPY


@contextlib.contextmanager
def plain():
    """Plain numpy products for the block, whatever the session's kernels: for a throwaway run
    whose products must not be timed for, nor recorded as, the session's choices."""
    token = _CURRENT.set(_NUMPY)
    try:
        yield
    finally:
        _CURRENT.reset(token)
