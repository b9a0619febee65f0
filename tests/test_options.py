"""Typed options (issue 13): one schema for every device and pass, checked in one place, from
which the CLI flags, sweep keys, --config files and provider options are generated."""
import onnx
import pytest

from onnx_cinm import sweep
from onnx_cinm.cli import main
from onnx_cinm.errors import CinmError
from onnx_cinm.examples import get_example
from onnx_cinm.options import load_config
from onnx_cinm.passes import PassContext, PassManager, check_options, option_schema
from onnx_cinm.pipeline import optimize


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _attrs(path, *names):
    m = onnx.load(str(path))
    return {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute
                     if a.name in names} for n in m.graph.node if n.domain == "cinm"}


# -- one check: unknown keys and bad values, whichever way they come in ------------------------

def test_unknown_key_in_the_python_api_names_the_option_it_resembles():
    with pytest.raises(CinmError) as e:
        optimize(get_example("mlp"), device_options={"cim_crossbar": 64}, check=0)
    msg = str(e.value)
    assert "unknown option 'cim_crossbar'; did you mean cim_crossbars" in msg
    assert "(known: " in msg and "upmem_tasklets" in msg and "\n" not in msg


def test_unknown_key_and_bad_values_in_the_pass_manager():
    with pytest.raises(CinmError, match="unknown option 'objectve'; did you mean objective"):
        PassManager(pipeline=["placement"]).run(get_example("mlp"),
                                                PassContext(options={"objectve": "edp"}))
    with pytest.raises(CinmError, match=r"option cim_rows='64': expected integer in 1\.\.65536"):
        optimize(get_example("mlp"), device_options={"cim_rows": "64"}, check=0)
    with pytest.raises(CinmError, match="option objective='speed': expected one of latency, "
                                        "energy, edp"):
        optimize(get_example("mlp"), objective="speed", check=0)
    with pytest.raises(CinmError, match=r"option upmem_tasklets=25: expected integer in 1\.\.24"):
        check_options({"upmem_tasklets": 25})
    with pytest.raises(CinmError, match="option upmem_search=1: expected true/false"):
        check_options({"upmem_search": 1})


def test_values_are_normalized_and_an_object_roofline_passes():
    from onnx_cinm.hostmodel import NOMINAL

    got = check_options({"cim_effects": ["prog", "drift"], "cim_mode": "device",
                         "place": ["Gemm=upmem", ("*", "host")], "host_roofline": NOMINAL,
                         "cim_rows": 64.0})
    assert got == {"cim_effects": ("prog", "drift"), "cim_mode": "device",
                   "place": [("Gemm", "upmem"), ("*", "host")], "host_roofline": NOMINAL,
                   "cim_rows": 64}
    assert type(got["cim_rows"]) is int
    with pytest.raises(CinmError, match="option host_roofline='fast': host roofline expects "
                                        "GFLOPS,GBPS"):
        check_options({"host_roofline": "fast"})
    with pytest.raises(CinmError, match="unknown device 'tpu'"):
        check_options({"place": ["Gemm=tpu"]})
    with pytest.raises(CinmError, match="mode 'ideal' takes no effects"):  # a device's own rule
        check_options({"cim_effects": ["prog"]})


# -- one default --------------------------------------------------------------------------------

def test_the_placement_default_is_cost_everywhere(tmp_path, capsys):
    """The placement pass defaulted to the heuristic and optimize() to cost (issue 13): one
    default now, declared once; README: 'Cost placement (the default ...)'."""
    assert option_schema()["placement"].default == "cost"
    assert optimize(get_example("mlp"), check=0).stats["placement"]["strategy"] == "cost"
    ctx = PassContext()
    model = optimize(get_example("mlp"), stop_after="cinm", check=0).model
    PassManager(pipeline=["placement"]).run(model, ctx)
    assert ctx.stats["placement"]["strategy"] == "cost"
    assert sweep.evaluate(model, {})["devices"] == sweep.evaluate(
        model, {"placement": "cost"})["devices"]
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    assert "default cost" in capsys.readouterr().out


# -- generated flags ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["optimize", "sweep"])
def test_generated_flags_show_type_range_unit_and_default(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for needle in ("--cim-rows N", "[integer in 1..65536]", "--cim-time-s X", "(s); default 0.0]",
                   "--cim-link-gbps X", "(GB/s)", "--upmem-tasklets N", "[integer in 1..24]",
                   "--upmem-search, --no-upmem-search", "--objective latency|energy|edp",
                   "default energy", "--config FILE.toml", "--config table [cim]",
                   "--max-writes-per-cell X", "(writes)"):
        assert needle in text, needle


def test_old_flag_spellings_still_work(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out), "--placement", "heuristic",
                         "--cim-size", "32x32", "--cim-crossbars", "8", "--cim-loop-order",
                         "naive", "--upmem-dpus", "16", "--per-kernel-crossbars", "-q"], capsys)
    assert code == 0, err
    a = _attrs(out, "cim_rows", "cim_cols", "cim_crossbars", "cim_loop_order", "cnm_dpus")
    assert a["mm1/Gemm"] == {"cim_rows": 32, "cim_cols": 32, "cim_crossbars": 8,
                             "cim_loop_order": b"naive"}
    assert a["add1/Add"] == {"cnm_dpus": 16}


# -- --config FILE.toml -------------------------------------------------------------------------

_CONFIG = """\
[placement]
strategy = "heuristic"

[cim]
rows = 32
cols = 32
crossbars = 8
loop_order = "naive"

[upmem]
dpus = 16
"""


def test_config_file_round_trip(tmp_path, capsys):
    cfg = tmp_path / "opts.toml"
    cfg.write_text(_CONFIG)
    expected = {"placement": "heuristic", "cim_rows": 32, "cim_cols": 32, "cim_crossbars": 8,
                "cim_loop_order": "naive", "upmem_dpus": 16}
    assert load_config(cfg, option_schema()) == expected
    out = tmp_path / "m.onnx"
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out), "--config", str(cfg),
                         "-q"], capsys)
    assert code == 0, err
    a = _attrs(out, "cim_rows", "cim_cols", "cim_crossbars", "cim_loop_order", "cnm_dpus",
               "placement")
    assert {k: v for k, v in a["mm1/Gemm"].items() if k != "placement"} == \
        {"cim_rows": 32, "cim_cols": 32, "cim_crossbars": 8, "cim_loop_order": b"naive"}
    assert a["mm1/Gemm"]["placement"].startswith(b"heuristic")
    assert a["add1/Add"]["cnm_dpus"] == 16
    # flags win over the file
    out2 = tmp_path / "m2.onnx"
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out2), "--config", str(cfg),
                         "--cim-rows", "64", "--upmem-dpus", "8", "-q"], capsys)
    assert code == 0, err
    a = _attrs(out2, "cim_rows", "cim_cols", "cnm_dpus")
    assert a["mm1/Gemm"] == {"cim_rows": 64, "cim_cols": 32} and a["add1/Add"]["cnm_dpus"] == 8


def test_config_file_placement_hints_are_applied(tmp_path, capsys):
    """A fresh user's `[placement] place = ["*Gemm*=host"]` was checked, then erased by the
    empty --place flag list: the hints changed nothing, silently."""
    cfg = tmp_path / "hints.toml"
    cfg.write_text('[placement]\nplace = ["mm1*=host"]\nstrategy = "heuristic"\n')
    out = tmp_path / "m.onnx"
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(out), "--config", str(cfg),
                         "-q"], capsys)
    assert code == 0, err
    a = _attrs(out, "device", "placement")["mm1/Gemm"]
    assert a["device"] == b"host" and a["placement"].startswith(b"hint mm1*=host")


@pytest.mark.parametrize("content,needle", [
    ("[cim]\ncrossbar = 64\n", "[cim] unknown key 'crossbar'; did you mean crossbars"),
    ("[crossbar]\nrows = 64\n", "unknown table 'crossbar' (known: cim, hbm_pim, host, placement, to_cinm, upmem"),
    ("[upmem]\ntasklets = \"many\"\n", "[upmem] option upmem_tasklets='many': expected integer"),
    ("[upmem]\ntasklets = 20\ntarget = \"v1b\"\n", "upmem_tasklets=20: a v1b DPU runs 1..16"),
    ("cim = 3\n", "'cim' must be a table"),
    ("[cim\n", "is not valid TOML"),
])
@pytest.mark.parametrize("command", ["optimize", "sweep"])
def test_bad_config_file_is_one_line_naming_it(command, content, needle, tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    out = tmp_path / "out"
    argv = ["optimize", "--example", "mlp", "-o", str(out / "m.onnx")] if command == "optimize" \
        else ["sweep", "x.onnx", "--set", "upmem.dpus=1", "-o", str(out)]
    code, _, err = _run(argv + ["--config", str(cfg)], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert f"config '{cfg}'" in err and needle in err
    assert not out.exists()


def test_missing_config_file(tmp_path, capsys):
    code, _, err = _run(["optimize", "--example", "mlp", "-o", str(tmp_path / "m.onnx"),
                         "--config", str(tmp_path / "none.toml")], capsys)
    assert code == 1 and "cannot read config" in err and err.count("\n") == 1


# -- sweep keys ---------------------------------------------------------------------------------

def test_sweep_keys_come_from_the_schema_with_the_old_names_as_aliases(tmp_path, capsys):
    sets = sweep.parse_sets(["cim.crossbars=4,8", "upmem.target=v1a,v1b",
                             "cim.effects=prog+drift,none"])
    assert [sweep.options_of(c) for c in sweep.configurations(sets)][:2] == [
        {"cim_crossbars": 4, "upmem_target": "v1a", "cim_effects": ("prog", "drift")},
        {"cim_crossbars": 4, "upmem_target": "v1a", "cim_effects": ()}]
    assert sweep.options_of({"crossbar.count": "8"}) == sweep.options_of({"cim.crossbars": "8"}) \
        == {"cim_crossbars": 8}
    assert sweep.options_of({"placement.strategy": "heuristic"}) == {"placement": "heuristic"}
    assert sweep.options_of({"crossbar.size": "16x32"}) == {"cim_rows": 16, "cim_cols": 32}
    with pytest.raises(CinmError, match="unknown sweep key 'cim.crossbar'; did you mean "
                                        "cim.crossbars"):
        sweep.parse_sets(["cim.crossbar=4"])
    with pytest.raises(CinmError, match=r"option upmem_tasklets='25': expected integer in 1\.\.24"):
        sweep.parse_sets(["upmem.tasklets=25"])
    with pytest.raises(SystemExit) as e:
        main(["sweep", "x.onnx", "--set", "cim.crossbar=4", "-o", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "did you mean cim.crossbars" in err and err.count("\n") == 1


def test_sweep_rows_break_on_a_device_rule_not_the_sweep():
    """A configuration the devices reject (20 tasklets on a v1b DPU) is that row's error."""
    model = optimize(get_example("mlp"), stop_after="cinm", check=0).model
    r = sweep.evaluate(model, {"upmem_tasklets": 20, "upmem_target": "v1b"})
    assert r["violations"] == "error: option upmem_tasklets=20: a v1b DPU runs 1..16 tasklets"


# -- provider options and the device listing ----------------------------------------------------

@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    out = tmp_path_factory.mktemp("opt") / "m.onnx"
    assert main(["optimize", "--example", "mlp", "-o", str(out), "--check", "0", "-q"]) == 0
    return out


@pytest.mark.parametrize("option,needle", [
    ("upmem_mode=bogus", "option upmem_mode='bogus': expected one of model, emulate"),
    ("colour=red", "unknown CinmExecutionProvider option 'colour'"),
    ("blas_threads=-1", "option blas_threads='-1': expected integer in 0.."),
    ("upmem_mode", "KEY=VALUE"),
])
def test_bad_provider_option_is_a_usage_error(option, needle, optimized, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", str(optimized), "--provider-option", option])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and err.count("\n") == 1
    assert err.startswith("onnx-cinm run: error: ")


def test_a_provider_option_given_twice_is_a_usage_error(optimized, capsys):
    """The last of two values silently won."""
    with pytest.raises(SystemExit) as e:
        main(["run", str(optimized), "--provider-option", "upmem_mode=model",
              "--provider-option", "upmem_mode=emulate"])
    assert e.value.code == 2 and "--provider-option upmem_mode given twice" in capsys.readouterr().err


def test_sweep_takes_a_bundled_example(tmp_path, capsys):
    """`sweep --example` was an unrecognized argument, though optimize and compare take it."""
    code, _, err = _run(["sweep", "--example", "lenet", "--set", "cim.rows=32,64", "-o",
                         str(tmp_path / "sw"), "--executor", "serial", "-q"], capsys)
    assert code == 0, err
    rows = (tmp_path / "sw" / "sweep.csv").read_text().splitlines()
    assert len(rows) == 3  # header and the two crossbar sizes


def test_provider_options_are_typed(optimized, capsys):
    code, out, err = _run(["run", str(optimized), "--provider-option", "upmem_mode=emulate",
                           "--provider-option", "blas_threads=2"], capsys)
    assert code == 0, err


def test_provider_options_given_as_text_as_onnxruntime_takes_them():
    """onnxruntime's provider options are strings: {"cim_seed": "0"} was refused as not an
    integer and cim_effects "none" as an unknown effect (a trial's script, s31)."""
    from onnx_cinm.errors import CinmError
    from onnx_cinm.runtime.session import check_provider_options

    got = check_provider_options({"cim_seed": "3", "cim_effects": "none", "blas_threads": "2",
                                  "cim_drift_compensation": "false", "cim_time_s": "3600",
                                  "upmem_mode": "emulate", "cim_adc_bits": 6})
    want = {"cim_seed": 3, "cim_effects": (), "blas_threads": 2,
            "cim_drift_compensation": False, "cim_time_s": 3600.0, "upmem_mode": "emulate",
            "cim_adc_bits": 6}
    assert {k: got[k] for k in want} == want
    assert type(got["cim_seed"]) is int and type(got["cim_time_s"]) is float
    assert check_provider_options({"cim_effects": "prog, drift"})["cim_effects"] == ("prog", "drift")
    with pytest.raises(CinmError, match="option cim_seed='abc': expected integer"):
        check_provider_options({"cim_seed": "abc"})
    with pytest.raises(CinmError, match="unknown CinmExecutionProvider option 'colour'"):
        check_provider_options({"colour": "red"})


def test_devices_lists_each_devices_options(capsys):
    code, out, _ = _run(["devices"], capsys)
    assert code == 0
    lines = out.splitlines()
    line = next(x for x in lines if x.strip().startswith("upmem_tasklets "))
    assert "tasklets per DPU" in line and "[integer in 1..24]" in line
    line = next(x for x in lines if x.strip().startswith("cim_time_s "))
    assert "(s); default 0.0]" in line
    assert any("--config table [cim]" in x for x in lines)
    assert any("run modes (--provider-option upmem_mode=...): model, emulate" in x for x in lines)


# -- aliases an option declares -----------------------------------------------------------------

def test_aliases_resolve_to_flat_keys_and_check_their_values():
    from dataclasses import dataclass

    from onnx_cinm.options import Alias, alias_values, option, parse_pair, specs

    @dataclass(frozen=True)
    class Opts:
        rows: int = option(1, help="rows", low=1, high=100, aliases=(
            Alias(flag="--x-size", sweep="x.size", also=("cols",), parse=parse_pair),))
        cols: int = option(1, help="cols", low=1, high=100)
        on: bool = option(True, help="on", aliases=(Alias(flag="--x-off", const=False),))

    schema = specs(Opts, "x", "x")
    size, = schema["x_rows"].aliases
    assert size.keys == ("x_rows", "x_cols") and size.label == "--x-size"
    assert alias_values(size, schema, "16x32") == {"x_rows": 16, "x_cols": 32}
    # each value is checked as its option's, and a bad form names the alias
    with pytest.raises(CinmError, match=r"option x_cols=200: expected integer in 1\.\.100"):
        alias_values(size, schema, "16x200")
    with pytest.raises(CinmError, match=r"^--x-size: expected ROWSxCOLS such as 64x64, got '16'"):
        alias_values(size, schema, "16")
    assert alias_values(schema["x_on"].aliases[0], schema) == {"x_on": False}

    @dataclass(frozen=True)
    class Bad:
        rows: int = option(1, help="rows", aliases=(Alias(flag="--b", also=("nope",)),))

    with pytest.raises(TypeError, match=r"Bad.rows: an alias .* \(unknown: \['nope'\]\)"):
        specs(Bad, "b", "b")


@pytest.mark.parametrize("text,seconds", [("1", 1.0), ("10s", 10.0), ("2min", 120.0),
                                          ("2m", 120.0), ("1.5h", 5400.0), ("1d", 86400.0),
                                          ("1w", 604800.0), ("1y", 31557600.0), ("1e-6s", 1e-6)])
def test_parse_duration(text, seconds):
    from onnx_cinm.options import parse_duration

    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("text,message", [("-1s", "a time cannot be negative, got '-1s'"),
                                          ("1 fortnight", "expected a time like 10s, 1h"),
                                          ("", "expected a time like")])
def test_parse_duration_errors(text, message):
    from onnx_cinm.options import parse_duration

    with pytest.raises(ValueError, match=message):
        parse_duration(text)
