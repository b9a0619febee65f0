"""``onnx-cinm evaluate``: a labeled data set through the execution provider under device
effects, over time after programming, drift compensation, ADC widths, stuck-at rates and seeds
(:mod:`onnx_cinm.runtime.evaluate`); a table, optionally a plot and JSON records."""
from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import zipfile
from pathlib import Path

from ..errors import CinmError
from .args import _check_output_file, evaluate_flag


def _load_data(path: str) -> dict:
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = getattr(e, "strerror", None) or (str(e).splitlines() or ["truncated"])[0]
        if isinstance(e, (EOFError, zipfile.BadZipFile)) or "pickled" in why:
            why = "not an .npz archive"
        raise CinmError(f"cannot read the data from '{path}': {why}") from None
    if not arrays:
        raise CinmError(f"'{path}' holds no arrays")
    return arrays


def _cmd_evaluate(args, parser) -> int:
    from .. import artifacts, frontend
    from ..runtime import evaluate as ev
    from .cmd_run import _provider_options

    if args.plot and not args.times:
        parser.error("--plot draws the time sweep: give --times")
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        parser.error(f"--plot must end in .png, got '{args.plot}'")
    opts = _provider_options(args.provider_option, parser)
    from ..devices import all_devices

    for dev in all_devices():
        for key, spec in dev.run_option_specs().items():
            if key in opts:  # evaluate sets these itself: a second way in would be overridden
                parser.error(f"--provider-option {key}: evaluate sets it itself; "
                             f"{evaluate_flag(key, spec)}")
            if getattr(args, key, None) is not None:
                opts[key] = getattr(args, key)
    if args.plot:
        protected = {args.model: "the model", args.data: "the data",
                     str(artifacts.find_artifact_dir(args.model)): "the model's kernel folder"}
        _check_output_file(args.plot, "--plot", protected)
    # the model first: a missing one is said at once, not after loading a large archive (or
    # as the archive's error)
    frontend.check_model_file(args.model)
    arrays = _load_data(args.data)
    key = args.labels or "labels"
    if args.labels and key not in arrays:
        raise CinmError(f"'{args.data}' has no array '{key}' (it holds: "
                        f"{', '.join(sorted(arrays))})")
    labels = arrays.pop(key, None)
    evaluator = ev.Evaluator(args.model, arrays, labels, output=args.judged, options=opts,
                             batch=args.batch, threshold=args.threshold)
    points = evaluator.points(args.times, args.adc_bits, args.stuck_at, args.seeds)
    with _progress(len(points), evaluator.samples, quiet=args.quiet) as bar:
        evaluator.progress = bar.update
        records = [evaluator.run(p) for p in points]
    summary = ev.summarize(records)
    if args.plot:
        png = ev.plot(summary, f"{Path(args.model).name} on {Path(args.data).name}")
        try:
            frontend.write_file_atomic(args.plot, png)
        except OSError as e:
            raise CinmError(f"cannot write '{args.plot}': {e.strerror}") from None
    if args.json:
        print(json.dumps({"model": args.model, "data": args.data, "samples": evaluator.samples,
                          "output": evaluator.output_name, "provider_options": opts,
                          "exact": evaluator.exact,
                          "exact_nonfinite": evaluator.exact_nonfinite,
                          "data_nonfinite": evaluator.data_nonfinite, "records": records,
                          "summary": summary},
                         indent=1, default=_jsonable))
        return 0
    if args.quiet:
        return 0
    judged = (f"output '{evaluator.output_name}' > {args.threshold} as class 1"
              if args.threshold is not None else f"output '{evaluator.output_name}'")
    what = (f"labels '{key}', accuracy of {judged}" if labels is not None
            else f"no labels: relative RMS error of output '{evaluator.output_name}' against "
                 "the exact run")
    shown = ", ".join(f"{k}={_show(v)}" for k, v in opts.items()) or "none (as compiled)"
    print(f"onnx-cinm evaluate: {args.model} on {args.data}, {evaluator.samples} samples "
          f"({what}); {args.seeds} seed(s); run options {shown}")
    if labels is not None:
        print(f"  exact run (onnxruntime, reference bodies): accuracy {100 * evaluator.exact:.2f} %")
        print(f"  {ev.majority_text(evaluator.labels)}")
    print()
    print(ev.table(summary, opts))
    clipped = ev.clipped_text(records, opts)
    if clipped:
        print(f"\n{clipped}")
    nonfinite = ev.nonfinite_text(evaluator.exact_nonfinite, records, evaluator.samples, opts,
                                  evaluator.data_nonfinite, evaluator.integer_output)
    if nonfinite:
        print(f"\n{nonfinite}")
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


class _Lines:
    """Progress as lines on stderr, for a pipe or a log file where a bar does not show: one
    line at most every ``interval`` seconds (the first after ``interval``), with the sample
    runs done (``configs`` configurations of ``samples`` samples each), the elapsed time and an
    estimate of the rest, and none for a run shorter than that."""

    def __init__(self, configs: int, samples: int, interval: float = 15.0, clock=time.monotonic,
                 stream=None) -> None:
        self.configs, self.samples = configs, samples
        self.total, self.done, self.interval, self.clock = configs * samples, 0, interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.start = self.last = clock()

    def update(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if now - self.last < self.interval or self.done >= self.total:
            return
        self.last = now
        spent = now - self.start
        left = spent * (self.total - self.done) / self.done if self.done else float("nan")
        print(f"onnx-cinm evaluate: {self.done}/{self.total} sample runs ({self.samples} "
              f"samples x {self.configs} configuration{'s' * (self.configs != 1)}, "
              f"{100 * self.done / self.total:.0f}%), {_duration(spent)} elapsed, about "
              f"{_duration(left)} left", file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


@contextlib.contextmanager
def _progress(configs: int, samples: int, quiet: bool):
    """A tqdm bar over the ``configs * samples`` sample runs on a terminal's stderr, else
    :class:`_Lines`; nothing with -q (``update(n)`` either way)."""
    if quiet:
        yield _Lines(configs, samples, interval=float("inf"))
    elif sys.stderr.isatty():
        from tqdm import tqdm

        with tqdm(total=configs * samples, desc=f"evaluate ({samples} samples x {configs} "
                  f"configuration{'s' * (configs != 1)})", unit=" sample runs", file=sys.stderr,
                  leave=False) as bar:
            yield bar
    else:
        yield _Lines(configs, samples)


def _duration(seconds: float) -> str:
    """A duration for a progress line ('?' before anything is done)."""
    from ..runtime.evaluate import duration_text

    return "?" if math.isnan(seconds) else duration_text(seconds)


def _show(v) -> str:
    return (",".join(v) or "none") if isinstance(v, tuple) else str(v)


def _jsonable(v):
    if isinstance(v, tuple):
        return list(v)
    return str(v) if not isinstance(v, (int, float, str, bool, type(None))) else v

