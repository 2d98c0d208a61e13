"""User mistakes at load and run time are coded Linnet errors, never tracebacks."""

import pytest
import torch
from linnet.lang import LinnetError
from linnet.torch import load, random_weights
from safetensors.torch import save_file
from support import LLAMA, toy_config


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


@pytest.fixture(scope="module")
def weights():
    return random_weights(LLAMA, toy_config(), seed=0)


def test_unknown_entry(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.run("decod", [torch.tensor([1], dtype=torch.int32)] * 2)
    assert code_of(err) == "E0601"
    assert "decode" in str(err.value)
    with pytest.raises(AttributeError):
        model.decod  # noqa: B018


def test_wrong_input_dtype(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.decode(torch.tensor([1]), torch.tensor([0]))  # int64, the entry says i32
    assert code_of(err) == "E0722"
    assert "torch.int32" in str(err.value)


def test_wrong_input_rank(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.decode(torch.tensor([[1]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32))
    assert code_of(err) == "E0606"


def test_wrong_number_of_inputs(weights):
    model = load(LLAMA, weights=weights, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.decode(torch.tensor([1], dtype=torch.int32))
    assert code_of(err) == "E0720"


def test_weights_for_a_different_config(weights):
    other = random_weights(LLAMA, toy_config(F=96), seed=0)
    model = load(LLAMA, weights=other, config=toy_config())  # F=128 in the config
    with pytest.raises(LinnetError) as err:
        model.decode(torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32))
    text = str(err.value)
    assert code_of(err) == "E0632"
    assert "mlp.gate_proj.weight" in text and "[96, 64]" in text and "[128, 64]" in text


def test_missing_and_unexpected_weights(weights):
    broken = dict(weights)
    broken.pop("model.norm.weight")
    broken["model.extra.bias"] = torch.zeros(3)
    model = load(LLAMA, weights=broken, config=toy_config())
    with pytest.raises(LinnetError) as err:
        model.decode(torch.tensor([1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32))
    codes = {d.code for d in err.value.diagnostics}
    assert codes == {"E0630", "E0631"}
    assert "model.norm.weight" in str(err.value) and "model.extra.bias" in str(err.value)


def test_cuda_unavailable():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(LinnetError) as err:
        load(LLAMA, config=toy_config(), device="cuda")
    assert code_of(err) == "E0711"


def test_bad_device_name():
    with pytest.raises(LinnetError) as err:
        load(LLAMA, config=toy_config(), device="gpu0")
    assert code_of(err) == "E0710"


def test_truncated_safetensors(tmp_path, weights):
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
    data = path.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=cut, config=toy_config())
    assert code_of(err) == "E0650"
    assert "truncated" in str(err.value)
    assert path.read_bytes() == data  # the user's file is untouched


def test_missing_weights_file(tmp_path):
    with pytest.raises(LinnetError) as err:
        load(LLAMA, weights=tmp_path / "nope.safetensors", config=toy_config())
    assert code_of(err) == "E0651"


def test_bad_numerics():
    with pytest.raises(LinnetError) as err:
        load(LLAMA, config=toy_config(), numerics="fastest")
    assert code_of(err) == "E0713"


def test_cli_run_reports_errors_without_traceback(capsys, tmp_path):
    from linnet.lang.cli import main

    rc = main(["run", str(LLAMA), "--config", "toy", "--weights", str(tmp_path / "x.safetensors")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "error[E0651]" in err and "Traceback" not in err


@pytest.mark.parametrize("bad", [3, ["max-autotune"], "", {1: True}])
def test_bad_compile_value(bad):
    with pytest.raises(LinnetError) as err:
        load(LLAMA, config=toy_config(), compile=bad)
    assert code_of(err) == "E0714"
    assert "inductor options" in str(err.value)
