"""Accuracy of an optimized model under device effects, over time after programming and over
seeds (``onnx-cinm evaluate``): a labeled data set run through the execution provider once per
configuration, each a fresh session with its own provider options.

What a configuration changes is a device's *run options* (:meth:`Device.run_option_specs`),
found by field name among the devices the model's kernels run on, never by device: ``time_s``
(seconds after programming), ``drift_compensation``, ``adc_bits``, ``stuck_at`` and ``seed``.
A device that offers them (the crossbar: :class:`~onnx_cinm.devices.memristor.
CrossbarRunOptions`) draws its device effects from the seed, so one seed at several times is
the same programmed chip read later. With labels the figure is the accuracy (the model's
predicted class: an integer output, or the arg max over the last axis of a float one);
without, the relative RMS error of one float output against the exact run (every node in
onnxruntime, the reference bodies): ``sqrt(sum((y - y_ref)**2) / sum(y_ref**2))``.

The data go through the model in batches along axis 0 (the input's fixed batch size, if it has
one; else ``batch`` samples per call). Axis 0 must be a sample axis: the judged output holds one
result per sample fed (checked on one and two samples before the runs, and on every call), so
a model of one clip (``[T, F] -> [24]``) is refused rather than judged on pieces of its clip. A
per-frame output of a recurrence over axis 0 (``[T, F] -> [T, 1]``) passes this test. A fixed batch the data do not fill at the end is padded
with copies of its last sample, whose results are dropped: they count in no accuracy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import devices
from ..errors import CinmError
from . import session as session_mod
from .profile import saturation_text
from .session import InferenceSession

__all__ = ["Point", "Evaluator", "summarize", "table", "plot", "SWEEPS"]

#: sweep name -> the run option (field name) it sets
SWEEPS = {"time": "time_s", "adc_bits": "adc_bits", "stuck_at": "stuck_at"}
_COMPENSATION = "drift_compensation"
_SEED = "seed"
#: how a sweep's values read in a table
_TITLES = {"time": "time after programming", "adc_bits": "ADC bits", "stuck_at": "stuck-at rate",
           "compiled": "configuration"}


@dataclass(frozen=True)
class Point:
    """One configuration of an evaluation.

    Attributes:
        sweep: ``"time"``, ``"adc_bits"``, ``"stuck_at"`` (:data:`SWEEPS`) or ``"compiled"``
            (the run options given, nothing swept).
        value: the swept value (seconds for ``time``; bits; a fraction of cells), None for
            ``compiled``.
        compensation: global drift compensation on/off (``time`` only; None: as the effects
            say).
        seed: seed of the device draws.
    """

    sweep: str
    value: float | None
    compensation: bool | None
    seed: int


@dataclass
class Evaluator:
    """A labeled (or unlabeled) data set and an optimized model, ready to run configurations.

    Args:
        model_path: the optimized ``.onnx`` (its kernels in ``<model>.cinm/``).
        data: ``{input name: array}``, every model input, the samples along axis 0.
        labels: integer class ids ``[N]``, or None (then the output error is measured).
        output: the output to judge (default: the first output with labels; the first float
            output without).
        options: provider options of every run (e.g. ``{"cim_mode": "device"}``), checked.
        batch: samples per session call when the model's batch size is not fixed.
        progress: called with the number of samples after each batch of a configuration's run
            (:meth:`run`; not the exact run at construction), e.g. to show progress; None: not.
        threshold: judge a one-score output (``[N, 1]`` or ``[N]``, a sigmoid or a logit) as a
            binary classifier: class 1 where the score is above it, else 0 (e.g. 0.5 for a
            sigmoid probability, 0.0 for a logit). None: the class is the arg max of the scores.

    Raises:
        CinmError: the model has no device kernel with run options (nothing to evaluate), an
            array of ``data`` is not an input of the model, an input array is missing or has the wrong sample count or another dtype than the
            model's input (no silent cast, as ``run --input``), labels of the
            wrong length or not integers, an unknown output, bad provider options; labels
            with a class the judged output has no score column for (a one-column output
            without ``threshold``, whose arg max is always 0), ``threshold`` on an output with
            more than one score per sample, with labels other than 0 and 1, or without
            labels.
    """

    model_path: str
    data: dict
    labels: np.ndarray | None = None
    output: str | None = None
    options: dict = field(default_factory=dict)
    batch: int = 256
    progress: Callable[[int], None] | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        base = InferenceSession(self.model_path, provider_options=[dict(self.options), {}])
        self._inputs = base.get_inputs()
        self._outputs = base.get_outputs()
        used = sorted({kind for kind, _ in base.partitions()
                       if kind not in ("host", session_mod.HOST_KERNEL)})
        self._run_specs = {k: s for d in used
                           for k, s in devices.get_device(d).run_option_specs().items()}
        if not self._run_specs:
            raise CinmError(f"model '{self.model_path}' has no device kernels that take run "
                            "options (device effects, time after programming, e.g. crossbar "
                            "kernels): nothing to evaluate" + (
                                f" (its device nodes run on {', '.join(used)})" if used else
                                " (everything runs on the host)"))
        self.samples = self._check_data()
        if self.threshold is not None and self.labels is None:
            raise CinmError("--threshold decides classes to compare with labels; the data "
                            "hold none (without labels the output error is measured)")
        self._output_index = self._choose_output()
        ref = InferenceSession(self.model_path, providers=["CPUExecutionProvider"])
        self._check_sample_axis(ref)
        self._reference = self._outputs_of(ref)
        #: samples whose chosen output holds a NaN or Inf in the exact run (a broken input,
        #: an overflow): their class is no prediction (NaN > t is false, a NaN row's arg max 0)
        self.exact_nonfinite = nonfinite_samples(self._reference)
        #: whether the judged output is an integer (a class: NaN cannot show in it)
        self.integer_output = self._reference.dtype.kind not in "fc"
        #: samples holding a NaN or Inf in any input array (an integer output hides them)
        self.data_nonfinite = int(np.logical_or.reduce(
            [_nonfinite_rows(np.asarray(self.data[a.name])) for a in self._inputs]).sum())
        #: accuracy of the exact run (every node in onnxruntime), None without labels
        self.exact = (float(np.mean(self._predicted(self._reference) == self.labels))
                      if self.labels is not None else None)

    # -- checks ----------------------------------------------------------------------------
    def _check_data(self) -> int:
        names = [a.name for a in self._inputs]
        missing = [n for n in names if n not in self.data]
        if missing:
            held = ", ".join(sorted(self.data)) or "nothing"
            raise CinmError(f"the data have no array '{missing[0]}' (an input of the model; "
                            f"they hold: {held})")
        extra = sorted(set(self.data) - set(names))
        if extra:  # as optimize/run --input: an array nothing reads is a mistake, not ignored
            raise CinmError(f"the data's array '{extra[0]}' is not an input of the model (inputs: "
                            f"{', '.join(names)}); if it holds the labels, name it with --labels "
                            f"{extra[0]}")
        counts = {n: np.shape(self.data[n])[0] if np.ndim(self.data[n]) else None for n in names}
        if any(c is None for c in counts.values()):
            raise CinmError(f"input array '{next(n for n, c in counts.items() if c is None)}' "
                            "is a scalar; the samples must lie along axis 0")
        if len(set(counts.values())) > 1:
            raise CinmError("the input arrays hold different numbers of samples: "
                            + ", ".join(f"{n} {c}" for n, c in counts.items()))
        n = next(iter(counts.values()))
        if n == 0:
            raise CinmError("the data hold no samples")
        for arg in self._inputs:  # as run/compare/optimize --input: no silent cast
            want = _np_dtype(arg.type)
            have = np.asarray(self.data[arg.name]).dtype
            if want is not None and have != want:
                raise CinmError(f"the data's array '{arg.name}' holds {have}, but the model's "
                                f"input is {want} (convert it, e.g. numpy's a.astype(np.{want.name}))")
        self._fixed = {a.name: a.shape[0] for a in self._inputs
                       if a.shape and isinstance(a.shape[0], int)}
        if len(set(self._fixed.values())) > 1:
            raise CinmError("the model's inputs have different fixed batch sizes: " + ", ".join(
                f"{k} {v}" for k, v in self._fixed.items()))
        if self.labels is not None:
            lab = np.asarray(self.labels)
            if lab.ndim != 1 or len(lab) != n:
                raise CinmError(f"the labels have shape {list(lab.shape)}; the inputs hold {n} "
                                f"samples, so they must be [{n}]")
            if lab.dtype.kind not in "iub" and not (lab.dtype.kind == "f"
                                                    and np.all(lab == np.rint(lab))):
                raise CinmError(f"the labels must be integer class ids, not {lab.dtype}")
            self.labels = lab.astype(np.int64)
        return n

    def _check_sample_axis(self, sess) -> None:
        """CinmError unless the judged output's axis 0 follows the inputs' axis 0: one result
        per sample for the first sample alone and for the first two (a model whose batch
        is not fixed), as far as the runs feed that many (``batch`` and the samples: a model
        that runs on one sample at a time only is probed on one). A model of one clip
        ``[T, F] -> [24]`` has no sample axis: batches along its axis 0 would be shorter
        clips, each judged as if it were the data set's."""
        if self._fixed:  # the model declares its batch; each call's rows are checked as it runs
            return
        most = max(1, min(self.batch, self.samples))  # the most samples one run is fed
        for k in (1, 2)[:most]:
            feed = {a.name: np.asarray(self.data[a.name][:k]) for a in self._inputs}
            try:
                y = np.asarray(sess.run([self.output_name], feed)[0])
            except CinmError as e:
                raise CinmError(f"evaluate needs a sample axis (axis 0 of every input and of the "
                                f"output), but the model does not run on {k} sample(s) along "
                                f"axis 0: {e}") from None
            self._check_rows(y, k)

    def _check_rows(self, y: np.ndarray, fed: int) -> None:
        """CinmError unless output ``y`` holds ``fed`` results along axis 0."""
        if y.ndim == 0 or y.shape[0] != fed:
            raise CinmError(f"evaluate needs a sample axis: output '{self.output_name}' has shape "
                            f"{list(y.shape)} for {fed} sample(s) along axis 0 of the inputs, so "
                            "axis 0 is not a batch of samples (one [T, F] clip, say); give data "
                            "of a model with a batch axis")

    def _choose_output(self) -> int:
        names = [o.name for o in self._outputs]
        if self.output is not None:
            if self.output not in names:
                raise CinmError(f"the model has no output '{self.output}' (outputs: "
                                f"{', '.join(names)})")
            return names.index(self.output)
        if self.labels is not None:
            return 0
        for i, o in enumerate(self._outputs):
            dt = _np_dtype(o.type)
            if dt is not None and dt.kind == "f":
                return i
        raise CinmError("the model has no float output to measure an error on; give labels")

    # -- runs ------------------------------------------------------------------------------
    @property
    def output_name(self) -> str:
        return self._outputs[self._output_index].name

    def offers(self, run_option: str) -> bool:
        """Whether a device of the model's kernels takes run option ``run_option`` (a field
        name: ``time_s``, ``adc_bits``, ...)."""
        return any(s.name == run_option for s in self._run_specs.values())

    def points(self, times=(), adc_bits=(), stuck_at=(), seeds: int = 1) -> list[Point]:
        """The configurations: every time with compensation off and on, every ADC width and
        stuck-at rate (as compiled otherwise), each over seeds ``0 .. seeds - 1``; only the
        compiled configuration if nothing is swept. Raises CinmError if no device of the model
        takes a swept run option."""
        out = []
        sweeps = (("time", times), ("adc_bits", adc_bits), ("stuck_at", stuck_at))
        for sweep, values in sweeps:
            if values and not self.offers(SWEEPS[sweep]):
                raise CinmError(f"no device kernel of this model takes run option "
                                f"'{SWEEPS[sweep]}' ({_TITLES[sweep]})")
        if times and not self.offers(_COMPENSATION):
            raise CinmError(f"no device kernel of this model takes run option '{_COMPENSATION}'")
        for sweep, values in sweeps:
            for v in values:
                for comp in ((False, True) if sweep == "time" else (None,)):
                    out += [Point(sweep, v, comp, s) for s in range(seeds)]
        if not out:
            out = [Point("compiled", None, None, s) for s in range(seeds)]
        return out

    def options_of(self, point: Point) -> dict:
        """The provider options of ``point``: the given ones with the point's run options set
        on every device that takes them."""
        opts = dict(self.options)
        for key, spec in self._run_specs.items():
            if point.sweep in SWEEPS and spec.name == SWEEPS[point.sweep]:
                opts[key] = point.value
            elif spec.name == _COMPENSATION and point.compensation is not None:
                opts[key] = point.compensation
            elif spec.name == _SEED:
                opts[key] = point.seed
        return opts

    def run(self, point: Point) -> dict:
        """One configuration: a record ``{sweep, value, compensation, seed, adc_clipped,
        accuracy}`` (with labels; a fraction in [0, 1]) or ``{..., rel_rms}`` (without);
        ``adc_clipped``: the crossbar ADC conversions that saturated over the data set (and
        then ``clipped_note``, the kernel's words on why)."""
        sess = InferenceSession(self.model_path, provider_options=[self.options_of(point), {}])
        y = self._outputs_of(sess, self.progress)
        rec = {"sweep": point.sweep, "value": point.value, "compensation": point.compensation,
               "seed": point.seed,
               "adc_clipped": 0, "nonfinite": nonfinite_samples(y)}
        for r in sess.profile():
            if r.get("adc_clipped"):
                rec["adc_clipped"] += r["adc_clipped"]
                rec["clipped_note"] = r.get("clipped_note", "")
        if self.labels is not None:
            rec["accuracy"] = float(np.mean(self._predicted(y) == self.labels))
        else:
            ref = self._reference.astype(np.float64)
            err = np.sqrt(np.sum((y.astype(np.float64) - ref) ** 2))
            norm = np.sqrt(np.sum(ref ** 2))
            rec["rel_rms"] = float(err / norm) if norm > 0 else float(err)
        return rec

    def _outputs_of(self, sess, progress: Callable[[int], None] | None = None) -> np.ndarray:
        """The chosen output over the whole data set, the batches concatenated; ``progress``
        is called with the samples of each batch done."""
        step = min(self._fixed.values()) if self._fixed else max(1, min(self.batch, self.samples))
        parts = []
        for lo in range(0, self.samples, step):
            feed = {a.name: np.asarray(self.data[a.name][lo:lo + step]) for a in self._inputs}
            real = min(step, self.samples - lo)
            if self._fixed and real < step:  # a fixed batch the data do not fill: pad it with
                feed = {k: np.concatenate([v, np.repeat(v[-1:], step - real, axis=0)])
                        for k, v in feed.items()}  # copies of its last sample, dropped below
            y = np.asarray(sess.run([self.output_name], feed)[0])
            self._check_rows(y, len(next(iter(feed.values()))))
            parts.append(y[:real])
            if progress is not None:
                progress(real)
        return np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]

    def _predicted(self, y: np.ndarray) -> np.ndarray:
        """The class per sample ``[N]`` int of output ``y``: an integer output as it is, the
        arg max of float scores ``[N, classes]``, or with :attr:`threshold` one float score
        per sample (``[N, 1]`` or ``[N]``) above the threshold (class 1) or not (0). Raises
        CinmError when that gives no class per sample or cannot give a class of the labels."""
        name = f"output '{self.output_name}' {list(y.shape)}"
        float_scores = y.dtype.kind not in "iub"
        columns = y.shape[-1] if float_scores and y.ndim >= 2 else None
        if self.threshold is not None:
            if not float_scores or (columns is not None and columns != 1) or y.ndim > 2:
                raise CinmError(f"--threshold judges one float score per sample ([N, 1] or "
                                f"[N]); {name} {y.dtype} is not one: drop --threshold to take "
                                "the arg max of its scores")
            if not np.isin(self.labels, (0, 1)).all():
                raise CinmError(f"--threshold makes a binary classifier (classes 0 and 1), but "
                                f"the labels hold class(es) "
                                f"{_classes(np.setdiff1d(self.labels, (0, 1)))}")
            pred = (y.reshape(y.shape[0], -1)[:, 0] > self.threshold).astype(np.int64) \
                if y.ndim else None
        else:
            pred = y if not float_scores else (y.argmax(axis=-1) if y.ndim >= 2 else None)
        if pred is not None and pred.ndim > 1 and pred.size == self.samples:
            pred = pred.reshape(-1)
        if pred is None or pred.shape != (self.samples,):
            raise CinmError(f"{name} {y.dtype} gives no "
                            f"class per sample (want integer [{self.samples}] or scores "
                            f"[{self.samples}, classes]); choose another output")
        if columns is not None and self.threshold is None and self.labels.max() >= columns:
            why = ("a one-column output has no arg max (it is always class 0, so the accuracy "
                   "would be the share of label-0 samples); for one sigmoid or logit score per "
                   "sample give --threshold (0.5 for a probability, 0 for a logit)"
                   if columns == 1 else "choose another output or check the labels")
            raise CinmError(f"the labels need one score column per class, but {name} has "
                            f"{columns} column{'s' * (columns != 1)} (classes 0.."
                            f"{columns - 1}) and the labels hold class(es) "
                            f"{_classes(self.labels[self.labels >= columns])}: {why}")
        return pred


def _classes(values: np.ndarray) -> str:
    """Up to five distinct values of ``values``, ascending, for a message ('1', '3, 4, ...')."""
    u = np.unique(values)
    return ", ".join(str(int(v)) for v in u[:5]) + (", ..." if len(u) > 5 else "")


def _np_dtype(type_text: str):
    """``tensor(float32)`` -> ``float32`` (the session's type text); None for other types."""
    if not type_text.startswith("tensor("):
        return None
    try:
        return np.dtype(type_text[7:-1])
    except TypeError:
        return None


def majority_text(labels) -> str:
    """What always answering the labels' most frequent class scores (``labels``: integer
    class per sample): an accuracy near it may be a model that collapsed to that class (a
    trial's face detector after a year of drift scored exactly this, every sample 'no face')."""
    classes, counts = np.unique(np.asarray(labels), return_counts=True)
    k = int(np.argmax(counts))
    return (f"the labels' most frequent class, {classes[k]}, holds {counts[k]} of "
            f"{int(counts.sum())} samples: always answering it scores "
            f"{100 * counts[k] / counts.sum():.2f} %")


def _nonfinite_rows(a: np.ndarray) -> np.ndarray:
    """Per row of axis 0 of ``a``, whether it holds a NaN or an Inf ``[N]`` bool (all False
    for an integer array or one without rows)."""
    if a.ndim == 0 or a.dtype.kind not in "fc":
        return np.zeros(a.shape[:1] or (1,), bool)
    return ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)


def nonfinite_samples(y: np.ndarray) -> int:
    """Samples (rows of axis 0 of ``y``, one output over the data set) holding a NaN or an Inf;
    0 for an integer output."""
    return int(_nonfinite_rows(y).sum()) if y.ndim else int(y.dtype.kind in "fc" and not np.isfinite(y))


def nonfinite_text(exact: int, records: list[dict], samples: int,
                   options: dict | None = None, data: int = 0,
                   integer_output: bool = False) -> str | None:
    """What NaN or Inf in the data (``data`` samples) or in the judged output (``exact``
    samples of the exact run; any run of ``records``, :meth:`Evaluator.run`'s, the run with
    most named) does to the figures; None when every value was finite.

    A judged output that is NaN or Inf: a warning, such a sample's class being no prediction
    (NaN > t is false, the arg max of a NaN row is 0) and its error NaN (a trial fed NaN
    features and read 64.71 %, the share of label 0, at every point). NaN in the data only: a
    note, for a model may handle them (an imputer); with an integer judged output (a class),
    which cannot show NaN scores behind it, the note says to judge a score output."""
    hit = [r for r in records if r.get("nonfinite")]
    held = f"the data hold NaN or Inf in {data} of {samples} samples"
    where = [f"in {exact} of {samples} samples of the exact run"] if exact else []
    if hit:
        worst = max(hit, key=lambda r: r["nonfinite"])
        where.append(f"in {len(hit)} of {len(records)} device runs (most {worst['nonfinite']} "
                     f"of {samples} samples, at {_point_text(worst, options)}, seed "
                     f"{worst['seed']})")
    if where:
        return ("warning: " + (f"{held}; " if data else "") + "the judged output is NaN or Inf "
                + " and ".join(where) + ": those samples' classes are no prediction (a NaN "
                "score is below any threshold, a NaN row's arg max is 0) and their error is "
                "NaN; check the data and the model")
    if not data:
        return None
    if integer_output:
        return (f"note: {held}; the judged output is an integer (a class), which cannot show "
                "whether they made the scores behind it NaN (a NaN row's arg max is 0): judge "
                "a score output (--output NAME) to see")
    return f"note: {held}; the judged output is finite in all of them"


def clipped_text(records: list[dict], options: dict | None = None) -> str | None:
    """How many of the runs ``records`` (:meth:`Evaluator.run`'s) had crossbar ADC
    conversions saturate, and the run with most; None when none did."""
    hit = [r for r in records if r.get("adc_clipped")]
    if not hit:
        return None
    worst = max(hit, key=lambda r: r["adc_clipped"])
    return (f"ADC: conversions saturated in {len(hit)} of {len(records)} runs (most "
            f"{worst['adc_clipped']:,}, at {_point_text(worst, options)}, seed {worst['seed']}): "
            + saturation_text(worst.get("clipped_note", "")))


def summarize(records: list[dict]) -> list[dict]:
    """Records grouped by ``(sweep, value, compensation)`` in first-seen order: ``{sweep,
    value, compensation, seeds, metric, mean, min, max}`` (``metric``: ``accuracy`` or
    ``rel_rms``)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["sweep"], r["value"], r["compensation"]), []).append(r)
    out = []
    for (sweep, value, comp), rs in groups.items():
        metric = "accuracy" if "accuracy" in rs[0] else "rel_rms"
        v = np.array([r[metric] for r in rs])
        out.append({"sweep": sweep, "value": value, "compensation": comp, "seeds": len(rs),
                    "metric": metric, "mean": float(v.mean()), "min": float(v.min()),
                    "max": float(v.max())})
    return out


def duration_text(seconds: float) -> str:
    """``3600.0`` -> ``1 h``: a time in the largest unit (s, min, h, d, y) it is at least one
    of, to 3 significant digits."""
    for unit, s in (("y", 365.25 * 86400), ("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= s:
            return f"{seconds / s:.3g} {unit}"
    return f"{seconds:.3g} s"


def _point_text(record: dict, options: dict | None = None) -> str:
    """The sweep point of one run of :meth:`Evaluator.run` (its value, and its compensation
    when the sweep has one), as the notes on that run name it."""
    text = _value_text(record["sweep"], record["value"], options)
    if record["compensation"] is not None:
        text += f", compensation {'on' if record['compensation'] else 'off'}"
    return text


def _value_text(sweep: str, value, options: dict | None = None) -> str:
    if sweep == "time":
        return duration_text(value)
    if sweep == "compiled":  # nothing swept: the run options given, or the model's own plans
        shown = ", ".join(f"{k}={(','.join(v) or 'none') if isinstance(v, tuple) else v}"
                          for k, v in (options or {}).items())
        return shown or "as compiled"
    return f"{value:g}"


def table(summary: list[dict], options: dict | None = None) -> str:
    """The summary as text, one table per sweep: value, compensation (time only), and the
    metric's mean, min and max over seeds (accuracy in %, relative RMS error as is).
    ``options``: the provider options every run had (``{"cim_mode": "device"}``); the row of
    an evaluation that sweeps nothing shows them, or ``as compiled`` when there are none."""
    from ..text import Column
    from ..text import table as text_table

    blocks = []
    for sweep in dict.fromkeys(s["sweep"] for s in summary):
        rows = [s for s in summary if s["sweep"] == sweep]
        acc = rows[0]["metric"] == "accuracy"
        scale, unit = (100.0, " %") if acc else (1.0, "")
        name = "accuracy" if acc else "rel. RMS error"
        cols = [Column(_TITLES[sweep])]
        if sweep == "time":
            cols.append(Column("drift compensation"))
        cols += [Column(f"{name}{unit} mean", ">"), Column("min", ">"), Column("max", ">"),
                 Column("seeds", ">")]
        body = []
        for s in rows:
            fmt = (lambda v: f"{scale * v:.2f}") if acc else (lambda v: f"{v:.4g}")
            row = [_value_text(sweep, s["value"], options)]
            if sweep == "time":
                row.append("on" if s["compensation"] else "off")
            body.append(row + [fmt(s["mean"]), fmt(s["min"]), fmt(s["max"]), s["seeds"]])
        blocks.append(text_table(cols, body))
    return "\n\n".join(blocks)


def plot(summary: list[dict], title: str = "") -> bytes:
    """A PNG (bytes) of the time sweep: the metric against time after programming (log x),
    one line with and one without drift compensation, bars from min to max over seeds. Raises
    CinmError if the summary has no time sweep."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summary if s["sweep"] == "time"]
    if not rows:
        raise CinmError("nothing to plot: no time sweep (give --times)")
    acc = rows[0]["metric"] == "accuracy"
    scale = 100.0 if acc else 1.0
    fig, ax = plt.subplots(figsize=(6, 4))
    for comp, style in ((False, "o-"), (True, "s--")):
        rs = sorted((s for s in rows if s["compensation"] is comp), key=lambda s: s["value"])
        t = np.array([s["value"] for s in rs])
        m = scale * np.array([s["mean"] for s in rs])
        lo = m - scale * np.array([s["min"] for s in rs])
        hi = scale * np.array([s["max"] for s in rs]) - m
        ax.errorbar(t, m, yerr=[lo, hi], fmt=style, capsize=3,
                    label=f"drift compensation {'on' if comp else 'off'}")
    ax.set_xscale("log")
    ax.set_xlabel("time after programming (s)")
    ax.set_ylabel("accuracy (%)" if acc else "relative RMS error")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
