"""A user's mistake is a coded error, the torch runtime's code where it has one: bad
weights, bad inputs, bad options, the CLI."""

import numpy as np
import pytest
from jax_support import LLAMA, toy_config
from linnet.jax import load, load_function, load_source, random_weights, save_safetensors
from linnet.lang import LinnetError
from linnet.lang.cli import main


def code(exc: pytest.ExceptionInfo) -> str:
    return exc.value.diagnostics[0].code


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "toy.safetensors"
    save_safetensors(random_weights(LLAMA, toy_config()), str(path))
    return path


@pytest.fixture(scope="module")
def model(weights):
    return load(LLAMA, weights=weights, config="toy")


def test_truncated_and_missing_weights(tmp_path, weights):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(LinnetError) as exc:
        load(LLAMA, weights=cut, config="toy")
    assert code(exc) == "E0650" and "truncated" in str(exc.value)
    with pytest.raises(LinnetError) as exc:
        load(LLAMA, weights=tmp_path / "none.safetensors", config="toy")
    assert code(exc) == "E0651"


def test_weights_that_do_not_fit_the_model(tmp_path):
    w = random_weights(LLAMA, toy_config())
    del w["lm_head.weight"]
    path = tmp_path / "short.safetensors"
    save_safetensors(w, str(path))
    with pytest.raises(LinnetError) as exc:
        load(LLAMA, weights=path, config="toy")
    assert "lm_head.weight" in str(exc.value)


@pytest.mark.parametrize(
    "kwargs,want",
    [
        ({"weights": 3}, "E0741"),
        ({"weights": "w.safetensors", "dtype": "i32"}, "E0742"),
        ({"weights": "w.safetensors", "dtype": "bf16"}, "E0743"),  # the toy config sets T=f32
        ({"weights": "w.safetensors", "numerics": "loose"}, "E0713"),
        ({"weights": "w.safetensors", "device": "tpu:x"}, "E0710"),
        ({"weights": "w.safetensors", "device": "gpu"}, "E0711"),
        ({"weights": "w.safetensors", "device": "cpu:7"}, "E0712"),
        ({"weights": "w.safetensors", "config": 5}, "E0744"),
    ],
)
def test_bad_options(kwargs, want, weights, monkeypatch):
    monkeypatch.chdir(weights.parent)
    kwargs = {"config": "toy", **kwargs}
    with pytest.raises(LinnetError) as exc:
        load(str(LLAMA), **kwargs)
    assert code(exc) == want, str(exc.value)


def test_bad_inputs(model):
    ok = np.array([1], np.int32)
    cases = [
        (lambda: model.decode(ok), "E0720"),
        (lambda: model.decode([1], ok), "E0721"),
        (lambda: model.decode(ok.astype(np.int64), ok), "E0722"),
        (lambda: model.decode(np.array([256], np.int32), ok), "E0780"),
        (lambda: model.decode(ok, np.array([-1], np.int32)), "E0780"),
        (lambda: model.decode(ok, np.array([128], np.int32)), "E0780"),
        (lambda: model.prefill(np.zeros((1, 129), np.int32)), "E0782"),
        (lambda: model.decode(ok, position=ok), "E0783"),
        (lambda: model.decode(ok, token=ok), "E0783"),
        (lambda: model.run("decode", 3), "E0784"),
        (lambda: model.run("generate", [ok]), "E0601"),
    ]
    for call, want in cases:
        with pytest.raises(LinnetError) as exc:
            call()
        assert code(exc) == want, str(exc.value)
    pos = model.decode(ok, ok)  # and the model still works after them
    assert pos.shape == (1, 256)


def test_states_of_the_wrong_shape(weights):
    decode = load_function(LLAMA, "decode", weights=weights, config="toy")
    ins = [np.array([1], np.int32), np.array([0], np.int32)]
    with pytest.raises(LinnetError) as exc:
        decode(decode.params, {}, ins)
    assert code(exc) == "E0731"


def test_64_bit_graphs_need_64_bit_jax(tmp_path):
    path = tmp_path / "wide.linnet"
    path.write_text(
        "model M { entry run(x: Tensor[2; f64]) -> Tensor[2; f64] { return x * 2.0 } }\n"
    )
    fn = load_function(path, "run")
    with pytest.raises(LinnetError) as exc:
        fn({}, {}, [np.zeros(2)])
    assert code(exc) == "E0791" and "jax_enable_x64" in str(exc.value)


def test_load_source_checks_what_it_lowers():
    with pytest.raises(LinnetError) as exc:
        load_source(LLAMA, "decode", {"token": [1], "pos": [1]}, config="toy", numerics="loose")
    assert code(exc) == "E0713"
    with pytest.raises(LinnetError) as exc:
        load_source(LLAMA, "generate", {}, config="toy")
    assert code(exc) == "E0601"


def test_cli_run_on_jax_rejects_torch_options(capsys):
    assert main(["run", "--runtime", "jax", "--interpret", "--tokens", "2"]) != 0
    assert "E0790" in capsys.readouterr().err


def test_cli_run_on_jax_rejects_nproc(capsys):
    assert main(["run", "--runtime", "jax", "--nproc", "2", "--tokens", "2"]) != 0
    err = capsys.readouterr().err
    assert "E0790" in err and "`--nproc`" in err


def test_cli_runs_the_demo_on_jax(capsys):
    assert main(["run", "--runtime", "jax", "--tokens", "3", "--prompt", "1,2,3"]) == 0
    out = capsys.readouterr().out
    assert "(jax)" in out and "decoded 3 tokens" in out


@pytest.mark.parametrize("first", ["torch", "jax"])
def test_one_run_command_whichever_registers_first(first, monkeypatch):
    """`linnet run` has `--runtime` in either order of the two registrations, and each
    runtime's run is what runs."""
    import argparse

    import linnet.jax.cli as jax_cli
    import linnet.torch.cli as torch_cli

    ran: list[str] = []
    monkeypatch.setattr(jax_cli, "run_command", lambda args: ran.append("jax") or 0)
    monkeypatch.setattr(torch_cli, "run_command", lambda args: ran.append("torch") or 0)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    order = [torch_cli.register_run, jax_cli.register_run]
    for register in order if first == "torch" else order[::-1]:
        register(sub)
    for argv, want in [
        (["run"], "torch"),
        (["run", "--runtime", "jax"], "jax"),
        (["run", "--runtime", "torch", "--tokens", "2"], "torch"),
    ]:
        args = parser.parse_args(argv)
        assert args.run(args) == 0
        assert ran.pop() == want


def test_an_export_to_a_missing_folder_or_a_folder_is_E0800(model, tmp_path):
    token, pos = np.array([5], np.int32), np.array([0], np.int32)
    for call in (model.export_onnx, model.export_stablehlo):
        with pytest.raises(LinnetError) as err:
            call("decode", [token, pos], tmp_path / "no" / "such" / "m.out")
        assert code(err) == "E0800" and "does not exist" in err.value.diagnostics[0].message
        with pytest.raises(LinnetError) as err:
            call("decode", [token, pos], tmp_path)
        assert code(err) == "E0800" and "is a folder" in err.value.diagnostics[0].message


# ---------------------------------------------------------------- issue 38: items 8, 16, 20
@pytest.fixture(scope="module")
def nan_weights(tmp_path_factory):
    w = random_weights(LLAMA, toy_config())
    w["model.layers.1.mlp.down_proj.weight"][3, 7] = np.nan
    w["lm_head.weight"][0, 5] = np.inf
    path = tmp_path_factory.mktemp("nan") / "model.safetensors"
    save_safetensors(w, str(path))
    return path, w


def test_a_nan_weight_is_E0666_at_load(nan_weights):
    """Item 8: a NaN weight made greedy decoding repeat one token forever."""
    path, w = nan_weights
    want = [
        ("E0666", "weight `lm_head.weight` holds 1 infinite value (the first at [0, 5])"),
        (
            "E0666",
            "weight `model.layers.1.mlp.down_proj.weight` holds 1 NaN value (the first at [3, 7])",
        ),
    ]
    for call in (
        lambda: load(LLAMA, weights=path, config="toy"),
        lambda: load(LLAMA, weights=w, config="toy"),
        lambda: load_function(LLAMA, "decode", weights=path, config="toy"),
    ):
        with pytest.raises(LinnetError) as exc:
            call()
        assert sorted((d.code, d.message) for d in exc.value.diagnostics) == want
    model = load(LLAMA, weights=path, config="toy", check_finite=False)
    assert np.isnan(np.asarray(model.params["model.layers.1.mlp.down_proj.weight"])).sum() == 1
    with pytest.raises(LinnetError) as exc:
        load(LLAMA, weights=path, config="toy", check_finite="no")
    assert code(exc) == "E0667"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_finite_check_by_dtype(dtype):
    """16-bit floats by their exponent bits, wider ones by their sum (f64 where it
    overflows): a NaN or infinity anywhere is found, finite values never flagged."""
    import ml_dtypes
    from linnet.jax.weights import check_finite_weights

    kind = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    big = np.full((3, 5_000_001), 60000.0, np.float32).astype(kind)  # over 4M: two chunks
    check_finite_weights({"w": big})
    for value in (np.nan, np.inf, -np.inf):
        bad = big.copy()
        bad[2, 5_000_000] = value
        with pytest.raises(LinnetError) as exc:
            check_finite_weights({"w": bad})
        assert "[2, 5000000]" in exc.value.diagnostics[0].message


def test_a_float8_checkpoint_is_unsupported_not_corrupt(tmp_path, weights):
    """Item 16: a valid float8 file was E0650 (corrupt); it is E0723 (unsupported)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    tensors["lm_head.weight"] = tensors["lm_head.weight"].to(torch.float8_e4m3fn)
    path = tmp_path / "fp8.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(LinnetError) as exc:
        load(LLAMA, weights=path, config="toy")
    assert code(exc) == "E0723" and "F8_E4M3" in exc.value.diagnostics[0].message


def test_both_runtimes_run_one_demo_checkpoint(capsys, linnet_home):
    """Item 20: `linnet run` and `linnet run --runtime jax` load the same demo file and
    decode the same tokens."""
    pytest.importorskip("linnet.torch")

    def tokens(runtime: str) -> str:
        assert main(["run", "--runtime", runtime, "--tokens", "6", "--prompt", "5,6,7"]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.startswith("decoded"))

    jax_tokens = tokens("jax")
    made = sorted((linnet_home / "demo").iterdir())
    assert tokens("torch") == jax_tokens
    assert sorted((linnet_home / "demo").iterdir()) == made and len(made) == 1


def test_the_jax_model_compiles_through_the_pipeline():
    """Issue 39 item 3: linnet.jax lowers through linnet.lang.compiler.compile_entry (each
    stage verified and shown; ``kernels`` under "fast"), with the options load checked once."""
    from linnet.lang.pipeline import CompileOptions, watch

    for numerics, want in [("exact", ["lower", "hoist"]), ("fast", ["lower", "hoist", "kernels"])]:
        with watch() as seen:
            load_source(
                str(LLAMA), "decode", {"token": [1], "pos": [1]}, config="toy", numerics=numerics
            )
        assert [name for name, g in seen if g.entry == "decode"] == want
    model = load(str(LLAMA), config="toy", numerics="fast", dtype="f32", device="cpu")
    assert model.options == CompileOptions("fast", "cpu", "f32")
    assert model.function("decode").options is model.options
