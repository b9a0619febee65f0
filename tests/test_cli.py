"""The onnx-cinm command line: the main job, --stop-after levels, hints, and clean failures."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import onnx
import pytest
from helpers import assert_matches_ort

from onnx_cinm.cli import clock, main
from onnx_cinm.examples import get_example


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _devices(path):
    m = onnx.load(str(path))
    return {n.name: {a.name: a.s.decode() for a in n.attribute if a.name == "device"}.get("device")
            for n in m.graph.node if n.domain == "cinm"}


def test_optimize_example_writes_checked_model(tmp_model_dir, capsys):
    out = tmp_model_dir / "lenet.cinm.onnx"
    code, stdout, err = _run(["optimize", "--example", "lenet", "-o", str(out), "--placement", "heuristic"],
                             capsys)
    assert code == 0, err
    assert "check: 1 run" in stdout and "OK" in stdout and "FLOPs on devices" in stdout
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert_matches_ort(get_example("lenet"), m, dims={"batch": 3})
    devices = set(_devices(out).values())
    assert {"memristor", "upmem"} <= devices
    assert not list(tmp_model_dir.glob("*.tmp*"))  # no temporaries left


def test_stop_after_cinm_has_no_placement(tmp_model_dir, capsys):
    out = tmp_model_dir / "level.onnx"
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out), "--stop-after", "cinm", "-q"], capsys)
    assert code == 0, err
    devs = _devices(out)
    assert devs and all(d is None for d in devs.values())
    # run says placement never ran, not that it chose the host for every op
    code, _, err = _run(["run", str(out)], capsys)
    assert code == 0 and err.count("\n") == 1
    assert f"its {len(devs)} cinm ops were never placed (written before placement" in err
    assert "placement put" not in err
    assert _run(["run", str(out), "-q"], capsys) == (0, "", "")  # -q: nothing but errors


def test_place_hint_and_config(tmp_model_dir, capsys):
    out = tmp_model_dir / "hinted.onnx"
    cfg = tmp_model_dir / "place.json"
    cfg.write_text(json.dumps({"place": {"Gemm": "host"}}))
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out), "--place", "Relu=memristor",
                         "--place-config", str(cfg), "-q"], capsys)
    assert code == 0, err
    m = onnx.load(str(out))
    for n in m.graph.node:
        if n.domain == "cinm" and n.op_type == "Gemm":
            assert {a.name: a.s for a in n.attribute}["device"] == b"host"


@pytest.mark.parametrize("argv_tail,needle", [
    (["missing.onnx"], "missing.onnx"),
    (["--example", "nosuch"], "nosuch"),
    (["--example", "mlp", "--skip-pass", "nosuchpass"], "unknown pass"),
    (["--example", "mlp", "--overwrite-input-shape", "input:99999999999,64"], "--check 0"),
])
def test_bad_input_is_one_line_exit_1_and_writes_nothing(argv_tail, needle, tmp_model_dir, capsys):
    out = tmp_model_dir / "out.onnx"
    code, stdout, err = _run(["optimize", *argv_tail, "-o", str(out)], capsys)
    assert code == 1
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and list(tmp_model_dir.iterdir()) == []


@pytest.mark.parametrize("argv_tail,needle", [
    (["--place", "Gemm=tpu"], "unknown device 'tpu'"),
    # a paradigm's name for its device (trial s30): the error names the device to write
    (["--place", "Gemm=cim"], "'cim' is a paradigm, not a device: its device(s) here: memristor"),
    (["--place", "no-equals-sign"], "PATTERN=DEVICE"),
    (["--check", "-1"], "--check"),
    (["--check-rtol", "nan"], "--check-rtol"),
    (["--overwrite-input-shape", "input:1,64", "--overwrite-input-shape", "input:2,64"], "twice"),
    # a name or rank the model's inputs do not have: a usage error, as --dim's (s35 trial)
    (["--overwrite-input-shape", "nosuch:1,64"],
     "--overwrite-input-shape: the model has no input 'nosuch' (inputs: input)"),
    (["--overwrite-input-shape", "input:1,2,64"],
     "--overwrite-input-shape: input 'input' has rank 2, got 3 dimensions"),
    (["--check", "abc"], "--check: expected an integer, got 'abc'"),
    (["--cim-size", "64x64x2"], "expected ROWSxCOLS"),
    # --cim-size and a flag of its own contradicting it (finding 7: silently 128x64), either order
    (["--cim-rows", "128", "--cim-size", "64x64"],
     "--cim-size sets --cim-rows to 64, but --cim-rows 128 is given too: give one of them"),
    (["--cim-size", "64x64", "--cim-cols", "32"],
     "--cim-size sets --cim-cols to 64, but --cim-cols 32 is given too"),
    (["--lifetime-inferences", "0"], "lifetime_inferences='0': expected number in 1.."),
    (["--cim-rows", "0"], "cim_rows='0': expected integer in 1..65536"),
    (["--upmem-tasklets", "many"], "upmem_tasklets='many': expected integer in 1..24"),
    (["--cim-mode", "fast"], "cim_mode='fast': expected one of ideal, q8"),
    (["--upmem-target", "v1b", "--upmem-tasklets", "20"], "upmem_tasklets=20: a v1b DPU runs 1..16"),
    (["--dim", "batch=-1"], "NAME=SIZE"),
    # values argparse alone takes for options ("expected one argument"): the option's own check
    # speaks instead (join_negative_values)
    (["--check-rtol", "-1e-3"], "argument --check-rtol: must be a number >= 0, got -1e-3"),
    (["--cim-time", "-1h"], "argument --cim-time: a time cannot be negative, got '-1h'"),
    (["--dim", "-1"], "--dim expects NAME=SIZE with a positive integer SIZE, got '-1'"),
    # a repeated --dim took the last one silently
    (["--dim", "batch=1", "--dim", "batch=2"], "--dim given twice for 'batch' (batch=1, batch=2)"),
    (["--host-roofline", "-1,2"], "host_roofline='-1,2': host roofline expects GFLOPS,GBPS"),
    (["--upmem-dpus", "-1"], "upmem_dpus='-1': expected integer in 1..65536"),
    (["--verbose", "-1"], "argument -v/--verbose: ignored explicit argument '-1'"),
    # an op type to_cinm has no rule for lowered nothing, silently (exit 0, "0 cinm ops")
    (["--lower-ops", "conv"], "to_cinm cannot lower op type 'conv'; did you mean Conv?"),
    (["--lower-ops", "Gemm,Foo"], "to_cinm cannot lower op type 'Foo' (known: Abs, Add, "),
])
def test_malformed_options_are_usage_errors(argv_tail, needle, tmp_model_dir, capsys):
    out = tmp_model_dir / "out.onnx"
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--example", "mlp", "-o", str(out), *argv_tail])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err
    # one line, naming the subcommand and where its help is; no internal helper names
    assert err.count("\n") == 1 and err.startswith("onnx-cinm optimize: error: ")
    assert "(see 'onnx-cinm optimize --help')" in err and "_count" not in err
    assert not out.exists()


@pytest.mark.parametrize("argv,expected", [
    (["--times", "-1s"], ["--times=-1s"]),
    (["--check", "-1", "--stuck-at", "-1e-3,0"], ["--check=-1", "--stuck-at=-1e-3,0"]),
    (["--adc-bits", "-.5"], ["--adc-bits=-.5"]),
    # a value that does not start with '-' and a digit, an option already joined, a short option
    (["--dim", "x=-1", "--times=-1s", "-o", "-1.onnx"],
     ["--dim", "x=-1", "--times=-1s", "-o", "-1.onnx"]),
    (["--times", "-x"], ["--times", "-x"]),
    (["optimize", "-1.onnx"], ["optimize", "-1.onnx"]),
    # after '--' every token is a positional, as argparse reads it
    (["--check", "--", "-1"], ["--check", "--", "-1"]),
    (["--", "--times", "-1s"], ["--", "--times", "-1s"]),
    ([], []),
])
def test_join_negative_values(argv, expected):
    from onnx_cinm.cli.args import join_negative_values

    before = list(argv)
    assert join_negative_values(argv) == expected
    assert argv == before


def test_special_output_files_are_not_replaced(tmp_model_dir, capsys):
    import os

    fifo = tmp_model_dir / "pipe.onnx"
    os.mkfifo(fifo)
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(fifo)], capsys)
    assert code == 1 and "not a regular file" in err
    assert fifo.is_fifo()


def test_unused_hint_warns(tmp_model_dir, capsys):
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(tmp_model_dir / "o.onnx"),
                         "--place", "zzz=upmem"], capsys)
    assert code == 0 and "hint zzz=upmem matched no cinm op" in err
    # -q prints nothing but errors, as its help says (a fresh user, s27: it printed warnings)
    assert _run(["optimize", "--example", "mlp", "-o", str(tmp_model_dir / "o.onnx"), "-q",
                 "--place", "zzz=upmem"], capsys) == (0, "", "")


def test_output_equal_to_input_is_refused(tmp_model_dir, capsys):
    src = tmp_model_dir / "m.onnx"
    onnx.save(get_example("mlp"), str(src))
    before = src.read_bytes()
    code, _, err = _run(["optimize", str(src), "-o", str(src)], capsys)
    assert code == 1 and "input" in err
    assert src.read_bytes() == before


def test_not_onnx_file(tmp_model_dir, capsys):
    src = tmp_model_dir / "junk.onnx"
    src.write_bytes(b"\x00\xffnot a model at all" * 10)
    out = tmp_model_dir / "out.onnx"
    code, _, err = _run(["optimize", str(src), "-o", str(out)], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and not out.exists()


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--example", "mlp"])  # no -o
    assert e.value.code == 2
    assert main([]) == 2


def test_console_script_help_and_lists():
    res = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "optimize", "--help"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and "--stop-after" in res.stdout and "--place" in res.stdout
    res = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "optimize", "--list-passes"],
                         capture_output=True, text=True)
    assert res.returncode == 0
    passes, steps = res.stdout.split("\n\n")
    assert [line.split()[0] for line in passes.splitlines()] == [
        "canonicalize_opset", "share_weights", "fold_constants", "normalize", "fold_batchnorm",
        "to_cinm", "placement", "restore_host_ops", "fold_layouts", "cim_tiling", "cnm_mapping", "device_lowering"]
    # the steps optimize times on its 'passes:' line besides the passes (trial: they were missing)
    assert [line.split()[0] for line in steps.splitlines()[1:]] == [
        "imports", "load", "probe_shapes", "if_bodies", "shape_inference", "totals", "check", "check_nan_inf",
        "figures", "save", "report"]
    res = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "devices"], capture_output=True, text=True)
    assert res.returncode == 0 and "memristor (cim)" in res.stdout and "write_latency_s = 3.84e-05" in res.stdout  # the default chip's (pcm-hermes): 256 rows x 150 ns
    # every parameter with its unit, from the parameter class's docstring; the crossbar's
    # meaning column names no chip's figure (it cited OCC's beside HERMES's values): each
    # preset's own figures and sources follow in the preset list
    lines = {ln.split("=")[0].strip(): ln for ln in res.stdout.splitlines() if "=" in ln}
    assert lines["write_latency_s"].endswith("time to program one tile, seconds.")
    assert not any("OCC" in lines[k] for k in ("rows", "crossbars", "write_latency_s",
                                                "mvm_energy_j", "clock_hz", "adc_energy_j"))
    assert "*write_latency_s: 3.84e-05 (ours: 256 rows x 150 ns PCM SET" in res.stdout
    assert "write_latency_s: 2.5e-06 (OCC data (crossbar.md §1.4) 'Write')" in res.stdout
    assert "Hz (350e6" in lines["frequency_hz"] and "bytes (64 MiB" in lines["mram_bytes"]
    # UPMEM shows the parameters its cost model, mapping and code generator read (issue 13: it
    # showed a second class of which only some figures were used)
    assert "cycles/byte: 0.5" in lines["dma_beta"] and lines["dma_max"].startswith("  dma_max = 2048 ")
    assert lines["max_tasklets"].startswith("  max_tasklets = 24 ")
    # the crossbar chip presets with the source of every field (Device.catalog; issue 13's
    # contract once dropped them, the device no longer having a `presets` attribute)
    assert "presets (--cim-preset; fields marked * have no primary source):" in res.stdout
    assert "rows: 128 (ISAAC 128x128 (crossbar.md §2.6))" in res.stdout


def test_run_never_overwrites_its_model_inputs_or_kernels(tmp_path, capsys):
    import numpy as np

    model = tmp_path / "h.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "--placement", "heuristic",
                 "-q"]) == 0
    x = tmp_path / "x.npz"  # .npy data under an .npz name: a valid -o target but for the guard
    with open(x, "wb") as f:
        np.save(f, np.zeros((1, 1, 28, 28), np.float32))
    (tmp_path / "folder.npz").mkdir()
    before = {p: p.read_bytes() for p in [model, x, *sorted((tmp_path / "h.cinm").rglob("*.*"))]}
    for argv, needle in [
        (["-o", str(tmp_path / "h.cinm" / "y.npz")], "would write into the model's kernel folder"),
        (["--profile-out", str(tmp_path / "h.cinm" / "manifest.json")], "kernel folder"),
        (["--profile-out", str(model.with_suffix(".json"))], None),  # fine: a new file
        (["-o", str(tmp_path / "y.npz"), "--profile-out", str(tmp_path / "h.cinm" / "p.csv")],
         "kernel folder"),
        (["-o", str(tmp_path / "nodir" / "y.npz")], "does not exist"),
        (["-o", str(tmp_path / "folder.npz")], "names a folder"),
    ]:
        code, _, err = _run(["run", str(model), "-q", *argv], capsys)
        if needle is None:
            assert code == 0, err
            continue
        assert code == 1 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
    with pytest.raises(SystemExit) as e:  # an output that is no numpy archive: usage error
        main(["run", str(model), "-o", str(model)])
    assert e.value.code == 2
    assert "must end in .npz" in capsys.readouterr().err
    code, _, err = _run(["run", str(model), "--input", f"input={x}", "-o", str(x)], capsys)
    assert code == 1 and "would overwrite input file" in err
    assert all(p.read_bytes() == b for p, b in before.items())  # nothing of them changed


def test_optimize_checks_the_report_folder_before_writing_anything(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for report in (blocker, blocker / "sub"):
        code, _, err = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"),
                             "--report", str(report), "-q"], capsys)
        assert code == 1 and "report" in err, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_no_check_nan_inf_skips_only_the_nan_inf_check(tmp_path, capsys):
    """Trial s28: on DNSMOS the NaN/Inf check took 31 s after the check's 28 s, with no way to
    skip it alone. --no-check-nan-inf keeps the check and says the NaN/Inf one was skipped."""
    from onnx_cinm import optimize

    res = optimize(get_example("lenet"), check_nan_inf=False)
    assert res.check is not None and res.check.ok and res.check_special is None
    assert "check_nan_inf" not in dict(res.timings)
    code, out, _ = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"),
                         "--no-check-nan-inf"], capsys)
    assert code == 0
    assert "\n  NaN/Inf check: skipped (--no-check-nan-inf; Python: check_nan_inf=False)\n" in out
    assert "\n  check: 1 run, 1 output, " in out
    code, out, _ = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx")], capsys)
    assert "\n  NaN/Inf check: 1 run, " in out  # on by default


def test_an_optimized_model_can_be_optimized_again(tmp_path, capsys):
    first = tmp_path / "h.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(first), "--placement", "heuristic",
                 "-q"]) == 0
    # cost placement moves ops the heuristic put on devices; stale kernels must not survive
    capsys.readouterr()
    assert main(["optimize", str(first), "-o", str(tmp_path / "again.onnx"), "--check", "0"]) == 0
    err = capsys.readouterr().err
    # the user is told what the check and the placement start from (nothing under -q)
    assert f"note: {first} was itself written by onnx-cinm optimize" in err, err
    assert main(["optimize", str(first), "-o", str(tmp_path / "again.onnx"), "-q"]) == 0, \
        capsys.readouterr().err
    assert capsys.readouterr().err == ""
    # the first optimize's source is no re-optimization: no such note
    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "x.onnx"), "--check", "0"]) == 0
    assert "was itself written" not in capsys.readouterr().err
    onnx.save(get_example("lenet"), tmp_path / "lenet.onnx")
    assert main(["compare", str(tmp_path / "lenet.onnx"), str(tmp_path / "again.onnx")]) == 0
    again = onnx.load(str(tmp_path / "again.onnx"))
    for n in again.graph.node:
        at = {a.name: a for a in n.attribute}
        if n.domain == "cinm" and "kernel" in at:
            assert at["device"].s != b"host"


def test_optimize_never_deletes_what_is_not_its_own(tmp_path, capsys):
    """The kernel folder is replaced on every optimize: an input, a report or any file that is
    not in its manifest must not be inside it, and a report may not take the output's place."""
    out = tmp_path / "out.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(out), "-q"]) == 0
    mine = tmp_path / "out.cinm" / "orig.onnx"
    onnx.save(get_example("lenet"), mine)
    code, _, err = _run(["optimize", str(mine), "-o", str(out), "-q"], capsys)
    assert code == 1 and "inside the output's kernel folder" in err and mine.exists()
    mine.unlink()
    for report in (tmp_path / "out.cinm", tmp_path / "out.cinm" / "r", out):
        code, _, err = _run(["optimize", "--example", "lenet", "-o", str(out), "-q",
                             "--report", str(report)], capsys)
        assert code == 1 and "must be a folder of its own" in err, report
    assert not (tmp_path / "out.cinm" / "r").exists() and out.is_file()
    (tmp_path / "out.cinm" / "notes").mkdir()
    (tmp_path / "out.cinm" / "notes" / "mine.txt").write_text("keep me")
    code, _, err = _run(["optimize", "--example", "lenet", "-o", str(out), "-q"], capsys)
    assert code == 1 and "also holds files onnx-cinm did not write (notes/mine.txt)" in err
    assert (tmp_path / "out.cinm" / "notes" / "mine.txt").read_text() == "keep me"


def test_unknown_arguments_dims_and_impossible_names_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"), "--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("onnx-cinm optimize: error: unrecognized arguments")
    # every --dim mistake is a usage error (exit 2): a bad size and a name no input has alike
    model = tmp_path / "m.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "-q"]) == 0
    for command in (["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"), "-q"],
                    ["run", str(model), "-q"],
                    ["compare", "--example", "lenet", str(model)],
                    ["sweep", "--example", "lenet", "--set", "cim.crossbars=4", "-q", "-o",
                     str(tmp_path / "sw")]):
        for dim, needle in (("bach=2", "no input has a symbolic dimension named 'bach'"),
                            ("batch=0", "--dim expects NAME=SIZE with a positive integer")):
            with pytest.raises(SystemExit) as e:
                main([*command, "--dim", dim])
            err = capsys.readouterr().err
            assert e.value.code == 2 and needle in err and err.count("\n") == 1, (command, err)
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "sw").exists()
    code, _, err = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / ("n" * 300 + ".onnx")),
                         "-q"], capsys)
    assert code == 1 and "File name too long" in err and "internal error" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.cinm", "m.onnx"]


def test_help_does_not_import_onnx():
    # `onnx-cinm --help` (and every subcommand's) must not pay for importing onnx (~0.2-3 s)
    # nor Jinja (~100 M instructions; the code generators make their environment at their
    # first kernel)
    code = ("import sys\nfrom onnx_cinm import cli\n"
            "for argv in (['--help'], ['optimize', '--help'], ['run', '--help']):\n"
            "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
            "print('onnx' in sys.modules, 'jinja2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_devices_prints_a_shared_description_once(capsys):
    """UPMEM's paired fields (h2d/d2h bandwidths) share one docstring entry, and `devices`
    printed its 700 characters four times over."""
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines if line.startswith("  ") and " = " in line}
    assert rows["d2h_rank_bps"].rstrip().endswith("see h2d_rank_bps")
    for name in ("h2d_host_large_bps", "d2h_host_small_bps", "d2h_host_large_bps"):
        assert rows[name].rstrip().endswith("see h2d_host_small_bps")
    text = "\n".join(lines)
    assert text.count("Loremkang/upmem-sdk-light") == 1
    assert "solved from an UPMEM server" in rows["h2d_rank_bps"]


def test_devices_lists_the_memristor_dtypes_its_supports_accepts(capsys):
    """`devices` showed the memristor's ``dtypes = ('float32',)`` while int32 (quantized) Gemms
    were placed there: the listed types are exactly those a 256x256x256 Gemm with a constant
    weight is accepted in (to_cinm lowers quantized products to int32 Gemms), in one line."""
    import ast

    import numpy as np

    from onnx_cinm.devices import get_device
    from onnx_cinm.graph import OpInfo, TensorInfo

    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("memristor (cim)")
    row = next(line for line in lines[start:] if line.strip().startswith("dtypes = "))
    shown = ast.literal_eval(row.split("=", 1)[1].split(")")[0].strip() + ")")
    assert shown == ("float32", "int32")
    assert "int32" in row.split(")", 1)[1] and "ideal" in row.split(")", 1)[1]
    dev = get_device("memristor")

    def gemm(dt):
        t = lambda n, c=False: TensorInfo(n, np.dtype(dt), (256, 256), c)
        return OpInfo("g", "Gemm", {}, (t("x"), t("w", True)), (t("y"),))

    accepted = {dt for dt in ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")
                if dev.supports(gemm(dt)).ok}
    assert accepted == set(shown)
    # and only under the exact data path: q8 re-quantizes, so the int32 product is refused
    assert not dev.supports_under(gemm("int32"), {"cim_mode": "q8"}).ok
    assert dev.supports_under(gemm("float32"), {"cim_mode": "q8"}).ok


@pytest.mark.parametrize("ops, cinm_ops", [
    # LeNet: conv1, conv2 (each an Im2Col and a Gemm), fc1, fc2 (a Gemm each)
    ("Conv", 4), ("Gemm", 2), ("Gemm,Conv", 6), ("none", 0),
])
def test_lower_ops_lowers_exactly_the_named_op_types(ops, cinm_ops, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    # (restore_host_ops would put back a Conv cheaper on the host: skipped, this is to_cinm's)
    assert main(["optimize", "--example", "lenet", "-o", str(out), "--lower-ops", ops, "-q",
                 "--check", "0", "--skip-pass", "restore_host_ops"]) == 0
    capsys.readouterr()
    assert sum(n.domain == "cinm" for n in onnx.load(out).graph.node) == cinm_ops
def test_compare_runs_once_when_input_gives_every_input(tmp_path, capsys):
    # an .npz giving every input used to print "2 input set(s) (x from --input, the rest
    # random)" and run the same data twice; and "--runs 1" printed "1 runs"
    import numpy as np

    lenet = get_example("lenet")
    onnx.save(lenet, tmp_path / "lenet.onnx")
    assert main(["optimize", str(tmp_path / "lenet.onnx"), "-o", str(tmp_path / "o.onnx"),
                 "-q"]) == 0
    (x,) = lenet.graph.input
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]  # a symbolic batch: 1
    np.savez(tmp_path / "all.npz", **{x.name: np.random.default_rng(0).standard_normal(shape)
                                      .astype(np.float32)})
    capsys.readouterr()
    code, out, err = _run(["compare", str(tmp_path / "lenet.onnx"), str(tmp_path / "o.onnx"),
                           "--input", str(tmp_path / "all.npz")], capsys)
    assert code == 0, err
    assert "1 input set (all inputs from --input)" in out.splitlines()[0]
    assert "golden check: 1 run, " in out
    # the NaN/Inf check draws every input: with --input it does not run, and says so
    assert "NaN/Inf check: skipped (it draws every input, and --input gives some)" in out
    code, out, err = _run(["compare", str(tmp_path / "lenet.onnx"), str(tmp_path / "o.onnx"),
                           "--runs", "1"], capsys)
    assert code == 0, err
    assert "1 input set (random)" in out.splitlines()[0]
    assert "golden check: 1 run, " in out and "1 runs" not in out


def test_compare_on_input_arrays_the_original_rejects_blames_the_arrays(tmp_path, capsys):
    """Trial s28: token ids beyond the vocabulary given with --input for every input ended in
    "...; give real inputs with --input NAME=FILE.npy", which the user had just done. A Gather
    over a 10-row table fed index 99 in onnxruntime fails on the arrays themselves."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    table = np.arange(30, dtype=np.float32).reshape(10, 3)
    g = h.make_graph([h.make_node("Gather", ["t", "ids"], ["e"]), h.make_node("Relu", ["e"], ["y"])],
                     "g", [h.make_tensor_value_info("ids", TP.INT64, [1, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 3])], [nh.from_array(table, "t")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "g.onnx")
    assert main(["optimize", str(tmp_path / "g.onnx"), "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 99, 3]], np.int64))
    code, _, err = _run(["compare", str(tmp_path / "g.onnx"), str(tmp_path / "o.onnx"),
                         "--input", f"ids={tmp_path / 'ids.npy'}"], capsys)
    error = err.strip().splitlines()[-1]  # (after a warning: the tiny model runs on the host)
    assert code == 1 and sum("error" in line for line in err.splitlines()) == 1, err
    assert error.startswith("onnx-cinm: error: the original does not run on the --input arrays: ")
    assert "idx=99" in error
    assert "give real inputs" not in err
    # run names the failing node in onnxruntime's message, not its status-code preamble
    code, _, err = _run(["run", str(tmp_path / "o.onnx"), "--input", f"ids={tmp_path / 'ids.npy'}"],
                        capsys)
    error = err.strip().splitlines()[-1]
    assert code == 1 and error.startswith("onnx-cinm: error: host partition 0 failed: Gather node "), err
    assert "idx=99" in error and "ONNXRuntimeError" not in error and "Non-zero status" not in error


def test_compare_checks_both_files_exist_before_loading_the_original(tmp_path, capsys,
                                                                     monkeypatch):
    """``compare ORIGINAL missing.onnx`` loaded the (possibly large) original before saying the
    second file is missing; now nothing is loaded first."""
    from onnx_cinm import frontend

    onnx.save(get_example("lenet"), tmp_path / "lenet.onnx")
    loaded = []
    real = frontend.load_model
    monkeypatch.setattr(frontend, "load_model", lambda p: loaded.append(p) or real(p))
    for argv, want in (
            ([tmp_path / "lenet.onnx", tmp_path / "missing.onnx"],
             f"no such file: '{tmp_path / 'missing.onnx'}'"),
            ([tmp_path / "gone.onnx", tmp_path / "missing.onnx"],
             f"no such file: '{tmp_path / 'gone.onnx'}'"),
            ([tmp_path / "lenet.onnx", tmp_path],
             f"'{tmp_path}' is a directory, not an ONNX file")):
        code, out, err = _run(["compare", *map(str, argv)], capsys)
        assert code == 1 and out == "" and err.splitlines() == [f"onnx-cinm: error: {want}"]
    assert loaded == []


def test_every_name_on_the_passes_line_is_listed(tmp_model_dir, capsys):
    """What optimize's ``passes:`` line times, --list-passes explains (a model with an If, so
    if_bodies runs too)."""
    import numpy as np
    from onnx import TensorProto, helper

    br = [helper.make_graph([helper.make_node(op, ["x"], [f"{op}_y"])], op, [],
                            [helper.make_tensor_value_info(f"{op}_y", TensorProto.FLOAT, [2, 4])])
          for op in ("Relu", "Neg")]
    g = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=br[0], else_branch=br[1])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.float32(0), "zero")])
    src = tmp_model_dir / "if.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), src)
    t0 = time.perf_counter()
    code, out, err = _run(["optimize", str(src), "-o", str(tmp_model_dir / "o.onnx")], capsys)
    elapsed = time.perf_counter() - t0
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("passes:"))
    timed = [p.split()[0] for p in line.split(":", 1)[1].split(",")]
    assert {"imports", "load", "if_bodies", "shape_inference", "check", "save"} <= set(timed)
    # the figures add up to the command's wall time (s24 trial: the passes listed added up to
    # 12 s of a 17 s run: loading, saving and the kernel files were nowhere)
    seconds = [float(p.split()[1]) for p in line.split(":", 1)[1].split(",")]
    wall = next(ln for ln in out.splitlines() if ln.strip().startswith("wall:"))
    total, startup, passes, steps, other = (float(v) for v in
                                            re.findall(r"(\d+\.\d+) s", wall)[:5])
    assert "start-up" in wall  # from main()'s entry here (a call with arguments)
    # five figures printed to 0.01 s, each off by up to 0.005: the parts' sum within 0.025
    assert startup + passes + steps + other == pytest.approx(total, abs=0.026)
    assert sum(seconds) == pytest.approx(passes + steps, abs=0.005 * len(seconds) + 0.01)
    # the figures are rounded to 0.01 s: each part up to 0.005 over (a flake: 0.09000000000000001
    # summed over parts against a total of 0.09), the total up to 0.005 over the elapsed time
    assert sum(seconds) <= total + 0.005 * len(seconds) + 1e-9
    assert total <= elapsed + 0.005
    assert main(["optimize", "--list-passes"]) == 0
    listed = {ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("steps")}
    assert set(timed) <= listed, set(timed) - listed


def test_the_console_script_ends_with_its_status_output_and_exit_handlers():
    """Run as the console script (no argv), main ends the process itself once the command is
    done: the exit status, everything printed (stdout and stderr) and the atexit handlers are
    all still there."""
    code = ("import atexit, sys\nfrom onnx_cinm.cli import main\n"
            "atexit.register(lambda: print('atexit ran', flush=True))\n"
            "sys.argv = ['onnx-cinm'] + sys.argv[1:]\nsys.exit(main())\nprint('not reached')")
    ok = subprocess.run([sys.executable, "-c", code, "devices"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0].startswith("host (host)") and lines[-1] == "atexit ran"
    assert "not reached" not in ok.stdout
    bad = subprocess.run([sys.executable, "-c", code, "optimize", "/no/such/model.onnx", "-o",
                          "/tmp/never-written.onnx"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout.splitlines() == ["atexit ran"]
    assert bad.stderr.strip() == "onnx-cinm: error: no such file: '/no/such/model.onnx'"


def test_the_console_script_under_a_profiler_returns_so_the_profile_is_written(tmp_path):
    """``python -m cProfile -o FILE -m onnx_cinm.cli ...`` writes FILE after the command returns:
    under a profiler main does not end the process itself."""
    out = tmp_path / "cli.prof"
    run = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "onnx_cinm.cli",
                          "devices"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 0


def test_quiet_optimize_prices_and_tabulates_nothing_it_does_not_print(tmp_path, capsys,
                                                                        monkeypatch):
    """``-q`` prints no summary: optimize no longer prices the written model again for its
    totals (0.1 s on light DenseNet121) nor builds the crossbar table, and writes the same
    model and kernels as a run that prints them."""
    from onnx_cinm import pipeline
    from onnx_cinm.passes import branches

    priced, tables = [], []
    real_totals, real_tables = branches.counted_totals, pipeline.OptimizeResult.device_tables
    monkeypatch.setattr(branches, "counted_totals", lambda *a: priced.append(1) or real_totals(*a))
    monkeypatch.setattr(pipeline.OptimizeResult, "device_tables",
                        lambda self, **kw: tables.append(1) or real_tables(self, **kw))
    for flag in ("-q", "-v"):
        out = tmp_path / f"lenet{flag}.onnx"
        assert main(["optimize", "--example", "lenet", "-o", str(out), "--check", "0", flag]) == 0
    text = capsys.readouterr().out
    assert priced == [1] and tables == [1]  # the -v run's only
    assert "cost placement (energy): modeled" in text and "crossbar kernel" in text
    quiet, loud = (onnx.load(str(tmp_path / f"lenet{f}.onnx")) for f in ("-q", "-v"))
    assert quiet.graph == loud.graph
    manifests = [json.loads((tmp_path / f"lenet{f}.cinm" / "manifest.json").read_text())
                 for f in ("-q", "-v")]
    assert [[x["sha256"] for x in k["files"]] for k in manifests[0]["kernels"]] == \
        [[x["sha256"] for x in k["files"]] for k in manifests[1]["kernels"]]


def test_report_and_run_tell_a_model_optimize_wrote_from_one_it_did_not(tmp_path, capsys):
    """Trial s23: 'report orinet.onnx' (never optimized) succeeded with an empty table, and
    'run tree.onnx' (written by optimize, a TreeEnsemble no device takes) warned 'was it
    written by onnx-cinm optimize?'. Report now refuses a model optimize did not write (one
    line, exit 1, nothing written); run warns only then, and notes the other case."""
    from onnx import TensorProto as TP
    from onnx import helper

    g = helper.make_graph([helper.make_node("Floor", ["x"], ["y"], name="r")], "g",  # no device op
                          [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    raw = tmp_path / "raw.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), raw)
    code, _, err = _run(["report", str(raw), "-o", str(tmp_path / "rep")], capsys)
    assert code == 1 and err.count("\n") == 1 and "was not written by 'onnx-cinm optimize'" in err
    assert not (tmp_path / "rep").exists()
    code, _, err = _run(["run", str(raw)], capsys)
    assert code == 0 and "warning: no op of this model runs on a device" in err
    assert "no record of 'onnx-cinm optimize'" in err

    opt = tmp_path / "opt.onnx"
    code, _, err = _run(["optimize", str(raw), "-o", str(opt), "--check", "0", "-q"], capsys)
    assert code == 0, err
    assert not [n for n in onnx.load(str(opt)).graph.node if n.domain == "cinm"]  # nothing placed
    code, _, err = _run(["run", str(opt)], capsys)
    assert code == 0 and "warning" not in err and "optimize' placed no op" in err
    code, out, _ = _run(["report", str(opt), "-o", str(tmp_path / "rep2")], capsys)
    assert code == 0 and "total:" in out


def test_a_time_after_programming_on_the_exact_data_path_is_warned_about(tmp_path, capsys):
    """--cim-time on crossbar mode 'ideal' records nothing (evaluate refuses the combination):
    a warning, and the kernels carry no time; with mode device no warning, the time recorded."""
    from onnx_cinm.dialects import cinm

    def compiled(*tail):
        out = tmp_path / "m.onnx"
        assert main(["optimize", "--example", "lenet", "-o", str(out), "--check", "0",
                     *tail]) == 0
        times = [cinm.node_attrs(n).get("cim_time_s") for n in onnx.load(str(out)).graph.node
                 if n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device") == "memristor"]
        assert times  # LeNet has crossbar kernels
        return times, capsys.readouterr().err

    times, err = compiled("--cim-time", "1h")
    assert times == [None] * len(times)
    assert err.count("\n") == 1 and err.startswith("onnx-cinm: warning: cim_time_s=3600 s")
    assert "changes nothing on crossbar mode 'ideal'" in err
    times, err = compiled("--cim-time", "1h", "--cim-mode", "device")
    assert times == [3600.0] * len(times) and err == ""


def test_the_wall_line_counts_from_the_process_start(tmp_path):
    """The console script's wall figure starts at the process's start as Linux records it
    (s24 trial #6: 'wall: 0.55 s' for a 0.95 s process): run as a child process, it lies within
    the parent's own clock around the child, and start-up + passes + steps + other make it up
    within rounding."""
    if clock.process_age() is None:
        pytest.skip("the OS does not tell a process's start (/proc)")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "optimize", "--example",
                           "lenet", "-o", str(tmp_path / "l.onnx")], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    elapsed = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr
    wall = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("wall:"))
    total, startup, passes, steps, other = (float(v) for v in
                                            re.findall(r"(\d+\.\d+) s", wall)[:5])
    # five figures printed to 0.01 s, each off by up to 0.005: the parts' sum within 0.025
    assert startup + passes + steps + other == pytest.approx(total, abs=0.026)
    # the interpreter and the imports take time before main(); /proc counts in 10 ms ticks
    assert startup >= 0.05
    assert total <= elapsed + 0.02 and total >= 0.6 * elapsed


def test_the_wall_line_leaves_out_a_shell_that_execs_the_command(tmp_path):
    """A shell that ``exec``s the command hands it its process (a fresh user, s35: 'start-up
    17.93 s' after a pip install in the same ``bash -c``): the wall line counts from the
    package's first line then, not from the shell's start 1.5 s before."""
    if clock.process_age() is None or shutil.which("bash") is None:
        pytest.skip("the OS does not tell a process's start (/proc), or no bash")
    cmd = (f"sleep 1.5 && exec {shlex.quote(sys.executable)} -m onnx_cinm.cli optimize "
           f"--example lenet -o {shlex.quote(str(tmp_path / 'l.onnx'))}")
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert done.returncode == 0, done.stderr
    wall = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("wall:"))
    total, startup = (float(v) for v in re.findall(r"(\d+\.\d+) s", wall)[:2])
    assert 0.0 < startup < 1.0 and total < startup + 1.5, wall


def test_process_age_of_a_fresh_child_is_its_own():
    """clock.process_age() in a child just started is its own age (under the parent's clock
    around it), not the parent's or the machine's uptime."""
    if clock.process_age() is None:
        pytest.skip("the OS does not tell a process's start (/proc)")
    t0 = time.perf_counter()
    code = "from onnx_cinm.cli import clock; print(clock.process_age())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    elapsed = time.perf_counter() - t0
    assert 0.0 <= float(out) <= elapsed + 0.02


def _run_matches_original(model, example, tmp_path, capsys):
    """``onnx-cinm run model`` on fresh data (through its kernels) equals onnxruntime on the
    bundled example it was optimized from."""
    import numpy as np
    import onnxruntime as ort

    original = get_example(example)
    vi = original.graph.input[0]
    shape = [d.dim_value or 2 for d in vi.type.tensor_type.shape.dim]
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = tmp_path / f"res_{model.name}.npz"
    code, _, err = _run(["run", str(model), "--input", f"{vi.name}={tmp_path / 'x.npy'}",
                         "-o", str(res), "-q"], capsys)
    assert code == 0, err
    want = ort.InferenceSession(original.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {vi.name: x})
    with np.load(res) as got:
        np.testing.assert_allclose(got[original.graph.output[0].name], want[0], rtol=1e-4,
                                   atol=1e-5)


def test_outputs_differing_only_in_extension_keep_their_own_kernel_folders(tmp_path, capsys):
    """``lemma.v1`` and ``lemma.v2`` (and ``x.onnx`` and ``x.npz``, ``m.ONNX`` and ``m.onnx``)
    once shared one kernel folder, the second optimize breaking the first model: each now has
    its own, both run."""
    from onnx_cinm import artifacts

    v1, v2 = tmp_path / "lemma.v1", tmp_path / "lemma.v2"
    assert main(["optimize", "--example", "lenet", "-o", str(v1), "-q"]) == 0
    code, out, err = _run(["optimize", "--example", "mlp", "-o", str(v2)], capsys)
    assert code == 0, err
    assert f"in {tmp_path / 'lemma.v2.cinm'}/" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lemma.v1", "lemma.v1.cinm",
                                                         "lemma.v2", "lemma.v2.cinm"]
    for path in (v1, v2):  # each folder is its model's own
        manifest = artifacts.load_manifest(tmp_path / (path.name + ".cinm"))
        assert artifacts.kernel_digest(manifest) == artifacts.recorded_digest(onnx.load(str(path)))
    _run_matches_original(v1, "lenet", tmp_path, capsys)
    _run_matches_original(v2, "mlp", tmp_path, capsys)
    x_onnx, x_npz = tmp_path / "x.onnx", tmp_path / "x.npz"
    assert main(["optimize", "--example", "mlp", "-o", str(x_onnx), "-q"]) == 0
    assert main(["optimize", "--example", "lenet", "-o", str(x_npz), "-q"]) == 0
    assert (tmp_path / "x.cinm").is_dir() and (tmp_path / "x.npz.cinm").is_dir()
    _run_matches_original(x_onnx, "mlp", tmp_path, capsys)
    _run_matches_original(x_npz, "lenet", tmp_path, capsys)
    # m.ONNX and m.onnx are two files (on a case-sensitive file system), so two folders
    upper, lower = tmp_path / "m.ONNX", tmp_path / "m.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(upper), "-q"]) == 0
    assert main(["optimize", "--example", "mlp", "-o", str(lower), "-q"]) == 0
    if upper.read_bytes() != lower.read_bytes():  # else one file: the folders may be one too
        assert (tmp_path / "m.ONNX.cinm").is_dir() and (tmp_path / "m.cinm").is_dir()
        _run_matches_original(upper, "lenet", tmp_path, capsys)
        _run_matches_original(lower, "mlp", tmp_path, capsys)
    # X.onnx and X name one folder: the second is refused while the first and its folder exist
    before = {p: p.read_bytes() for p in [x_onnx, *(tmp_path / "x.cinm").rglob("*")]
              if p.is_file()}
    code, _, err = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / "x"), "-q"],
                        capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"would replace the kernel folder '{tmp_path / 'x.cinm'}' of the existing" in err
    assert not (tmp_path / "x").exists()
    assert all(p.read_bytes() == b for p, b in before.items())
    # report folders follow the same rule: two reports side by side
    for path in (v1, v2):
        assert main(["report", str(path), "-q"]) == 0
    assert (tmp_path / "lemma.v1.report" / "layers.csv").is_file()
    assert (tmp_path / "lemma.v2.report" / "layers.csv").is_file()
    assert not (tmp_path / "lemma.report").exists()


def test_a_model_written_with_the_old_folder_name_still_runs(tmp_path, capsys):
    """Earlier onnx-cinm put ``old.v1``'s kernels in ``old.cinm``: run still finds them there."""
    model = tmp_path / "old.v1"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "-q"]) == 0
    (tmp_path / "old.v1.cinm").rename(tmp_path / "old.cinm")
    _run_matches_original(model, "lenet", tmp_path, capsys)


def test_a_model_copied_without_its_folder_beside_another_models_old_named_one(tmp_path,
                                                                             capsys):
    """``m.v1`` copied without ``m.v1.cinm`` to where ``m.onnx`` and its ``m.cinm`` are: run
    found ``m.cinm`` (the name older onnx-cinm gave ``m.v1``'s folder) and blamed a digest
    mismatch; it says the model's own folder is missing, and where it looked."""
    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "m.v1"), "-q"]) == 0
    moved = tmp_path / "x"
    moved.mkdir()
    assert main(["optimize", "--example", "mlp", "-o", str(moved / "m.onnx"), "-q"]) == 0
    shutil.copy(tmp_path / "m.v1", moved / "m.v1")
    code, out, err = _run(["run", str(moved / "m.v1")], capsys)
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert f"the model's kernel folder '{moved / 'm.v1.cinm'}/' is missing: copy it" in err
    assert f"'{moved / 'm.cinm'}' beside it" in err and "digest" not in err
    # m.onnx still runs with its own folder; m.v1 with its own folder copied along runs too
    assert main(["run", str(moved / "m.onnx"), "-q"]) == 0
    shutil.copytree(tmp_path / "m.v1.cinm", moved / "m.v1.cinm")
    _run_matches_original(moved / "m.v1", "lenet", tmp_path, capsys)


def test_a_damaged_old_named_folder_of_the_model_is_called_damaged_not_anothers(tmp_path,
                                                                                capsys):
    """The model's own folder under the old name (``m.cinm`` of ``m.v1``) with an unreadable
    manifest: run says the manifest is not valid JSON (a reviewer: it blamed "another model's
    kernels" for a folder that is the model's own, only damaged)."""
    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "m.v1"), "-q"]) == 0
    (tmp_path / "m.v1.cinm").rename(tmp_path / "m.cinm")
    (tmp_path / "m.cinm" / "manifest.json").write_text("{bad")
    code, out, err = _run(["run", str(tmp_path / "m.v1")], capsys)
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "manifest.json' is not valid JSON" in err and "another model" not in err, err


def test_a_broken_link_named_like_the_kernel_folder_is_refused_before_work(tmp_path, capsys):
    """``b.cinm`` a symbolic link to a missing folder: a folder cannot be renamed over it, and
    optimize said only "Not a directory" after all its work; now one line names the link."""
    (tmp_path / "b.cinm").symlink_to(tmp_path / "real" / "k.cinm")
    code, out, err = _run(["optimize", "--example", "lenet", "-o", str(tmp_path / "b.onnx"),
                           "-q"], capsys)
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "is a symbolic link to a missing folder" in err and "remove the link" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.cinm"]


@pytest.fixture
def unwritable_dir(tmp_path):
    """A folder no file can be created in, even by root: mode 0o555, plus ``chattr +i`` when
    running as root (root ignores the mode). Skipped where neither works."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    immutable = False
    try:
        (ro / "probe").touch()
    except OSError:
        pass
    else:
        (ro / "probe").unlink()
        immutable = shutil.which("chattr") is not None and subprocess.run(
            ["chattr", "+i", str(ro)], capture_output=True, check=False).returncode == 0
        if not immutable:
            pytest.skip("cannot make a folder unwritable here (root without chattr)")
    yield ro
    if immutable:
        subprocess.run(["chattr", "-i", str(ro)], check=True)
    ro.chmod(0o755)


def test_an_unwritable_output_folder_is_refused_before_any_work(tmp_path, unwritable_dir,
                                                               capsys):
    """Found before loading and optimizing or running, in one line, exit 1, nothing written
    (it used to surface only after the whole check, or after run printed its outputs)."""
    model = tmp_path / "m.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "-q"]) == 0
    for argv in (["optimize", "--example", "lenet", "-o", str(unwritable_dir / "o.onnx")],
                 ["optimize", str(model), "-o", str(tmp_path / "o2.onnx"), "--report",
                  str(unwritable_dir / "rep")],
                 ["run", str(model), "-o", str(unwritable_dir / "res.npz")],
                 ["report", str(model), "-o", str(unwritable_dir / "rep")],
                 ["sweep", "--example", "lenet", "--set", "cim.crossbars=4,8", "-o",
                  str(unwritable_dir / "sw")]):
        code, out, err = _run(argv, capsys)
        assert code == 1 and out == "", (argv, out)
        assert len(err.strip().splitlines()) == 1 and f"'{unwritable_dir}' is not writable" in err, \
            (argv, err)
    assert list(unwritable_dir.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.cinm", "m.onnx", "ro"]


def test_the_nan_inf_line_says_why_a_model_without_float_inputs_has_none(tmp_path, capsys):
    """Token ids in, floats out: the NaN/Inf check has nothing to inject, and the summary used
    to leave its line out without a word."""
    import numpy as np
    from onnx import TensorProto as TP, helper as h, numpy_helper

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("Gather", ["table", "ids"], ["e"]),
                      h.make_node("MatMul", ["e", "w"], ["y"])], "ids",
                     [h.make_tensor_value_info("ids", TP.INT64, [2, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4, 16])], [table, w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "ids.onnx")
    code, out, err = _run(["optimize", str(tmp_path / "ids.onnx"), "-o",
                           str(tmp_path / "o.onnx")], capsys)
    assert code == 0, err
    assert ("NaN/Inf check: skipped (the model has no float input to put NaN or Inf in)"
            in out), out
    code, out, err = _run(["optimize", "--example", "mlp", "-o", str(tmp_path / "m.onnx")],
                          capsys)  # a float input: checked, no skip
    assert code == 0 and "NaN/Inf check: 1 run" in out and "NaN/Inf check: skipped" not in out, out


def test_a_usage_error_wins_over_a_missing_report_folder(tmp_path, capsys):
    """A malformed --dim is a usage error (exit 2) whether or not --report's folder exists; the
    folder is probed after the usage checks, before any work."""
    args = ["optimize", "--example", "lenet", "-o", str(tmp_path / "ok.onnx"),
            "--report", str(tmp_path / "nodir" / "r")]
    with pytest.raises(SystemExit) as e:
        main(args + ["--dim", "bogus"])
    assert e.value.code == 2 and "--dim expects NAME=SIZE" in capsys.readouterr().err
    code, _, err = _run(args, capsys)
    assert code == 1 and "cannot write the report into" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_report_folder_under_a_file_says_it_is_a_file(tmp_path, capsys):
    """``report -o afile/r`` with ``afile`` a regular file: the message said the folder 'does
    not exist'; it says what is in the way."""
    model = tmp_path / "m.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "-q"]) == 0
    (tmp_path / "afile").write_text("x")
    code, _, err = _run(["report", str(model), "-o", str(tmp_path / "afile" / "r")], capsys)
    assert code == 1 and f"'{tmp_path / 'afile'}' is a file, not a folder" in err
    assert (tmp_path / "afile").read_text() == "x"


def test_a_flag_prefix_is_not_taken_for_a_longer_flag(tmp_path, capsys):
    """`sweep --place X=upmem` was taken as --placement and refused as a placement method
    (trial s31, when sweep had no --place): a prefix matches no flag."""
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--example", "lenet", "--objec=latency", "--set", "cim.rows=64",
              "-o", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized arguments: --objec=latency" in err
    with pytest.raises(SystemExit) as e:
        main(["optimize", "--exa", "lenet", "-o", str(tmp_path / "o.onnx")])
    assert e.value.code == 2 and "unrecognized arguments: --exa" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_compare_says_how_many_adc_conversions_saturated(tmp_path, capsys):
    """run --profile and evaluate counted saturated crossbar ADC conversions, compare did not:
    its table showed only the error. Ranges calibrated on the first of three random input
    sets clip the later ones (LeNet's fc2 and fc1 here); under the full-scale rule without
    device effects no current exceeds the range, and nothing is said."""
    model = tmp_path / "le.onnx"
    assert main(["optimize", "--example", "lenet", "-o", str(model), "-q", "--check", "0"]) == 0
    capsys.readouterr()
    base = ["compare", "--example", "lenet", str(model), "--runs", "3",
            "--provider-option", "cim_mode=device"]
    code, out, _ = _run(base + ["--provider-option", "cim_adc_calibration=data"], capsys)
    line = next((x for x in out.splitlines() if x.startswith("ADC: ")), None)
    assert code == 0 and line is not None and "conversions saturated in" in line, out
    assert int(line.split()[1].replace(",", "")) > 0
    # LeNet's 10 class scores: how many of the 3 runs' top-1 answers agree, not only the error
    assert "output: the largest value along the last axis is at the same index as " \
           "onnxruntime's in " in out and " of 3 rows (argmax" in out
    code, out, _ = _run(base + ["--provider-option", "cim_effects=none"], capsys)
    assert code == 0 and "saturated" not in out and "inexact by design" in out


def test_run_prints_each_outputs_range_over_its_finite_values(tmp_path, capsys):
    """run printed an output's mean alone, always 0.5 for a two-class softmax (a trial). It now
    prints min, max and mean over the finite values (numbers of the input given, by hand), and
    how many NaN/Inf it left out."""
    import numpy as np
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "-q", "--check", "0"]) == 0
    np.save(tmp_path / "x.npy", np.array([[-1.0, 2.0, 6.0, np.nan]], np.float32))
    capsys.readouterr()
    code, out, err = _run(["run", str(tmp_path / "o.onnx"), "--input", f"x={tmp_path / 'x.npy'}"],
                          capsys)
    # Relu: 0, 2, 6 and NaN; over the three finite values min 0, max 6, mean 8 / 3
    assert code == 0, err
    assert "output y: float32 [1, 4], min 0, max 6, mean 2.66667 (1 NaN/Inf left out)" in out
