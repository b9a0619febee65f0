"""``onnx-cinm evaluate``: a labeled data set through the execution provider under device
effects, over time after programming, drift compensation, ADC widths, stuck-at rates and seeds
(:mod:`onnx_cinm.runtime.evaluate`); a table, optionally a plot and JSON records."""
from __future__ import annotations

import json
import sys
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
                     str(artifacts.artifact_dir(args.model)): "the model's kernel folder"}
        _check_output_file(args.plot, "--plot", protected)
    arrays = _load_data(args.data)
    key = args.labels or "labels"
    if args.labels and key not in arrays:
        raise CinmError(f"'{args.data}' has no array '{key}' (it holds: "
                        f"{', '.join(sorted(arrays))})")
    labels = arrays.pop(key, None)
    evaluator = ev.Evaluator(args.model, arrays, labels, output=args.judged, options=opts,
                             batch=args.batch)
    points = evaluator.points(args.times, args.adc_bits, args.stuck_at, args.seeds)
    from tqdm import tqdm

    records = [evaluator.run(p) for p in tqdm(
        points, desc="evaluate", unit="run", file=sys.stderr, leave=False,
        disable=args.quiet or args.json or not sys.stderr.isatty())]
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
                          "exact": evaluator.exact, "records": records, "summary": summary},
                         indent=1, default=_jsonable))
        return 0
    if args.quiet:
        return 0
    what = (f"labels '{key}', accuracy of output '{evaluator.output_name}'" if labels is not None
            else f"no labels: relative RMS error of output '{evaluator.output_name}' against "
                 "the exact run")
    shown = ", ".join(f"{k}={_show(v)}" for k, v in opts.items()) or "none (as compiled)"
    print(f"onnx-cinm evaluate: {args.model} on {args.data}, {evaluator.samples} samples "
          f"({what}); {args.seeds} seed(s); run options {shown}")
    if labels is not None:
        print(f"  exact run (onnxruntime, reference bodies): accuracy {100 * evaluator.exact:.2f} %")
    print()
    print(ev.table(summary, opts))
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


def _show(v) -> str:
    return ",".join(v) if isinstance(v, tuple) else str(v)


def _jsonable(v):
    if isinstance(v, tuple):
        return list(v)
    return str(v) if not isinstance(v, (int, float, str, bool, type(None))) else v

