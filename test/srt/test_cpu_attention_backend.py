"""On --device cpu, Gemma-4 and Gemma-3n take the attention backend that runs there
(torch_native, with CUDA graphs off) without being told, and a backend they do not run on
is refused with a message that names the ones they do."""
import pytest

import resolved_server_args as rsa
import tiny_gemma


@pytest.fixture(scope="module", params=["gemma4", "gemma3n"])
def tiny(request, tmp_path_factory):
    make = getattr(tiny_gemma, f"make_tiny_{request.param}")
    return make(str(tmp_path_factory.mktemp(f"tiny_{request.param}")), seed=0)


@pytest.mark.stack("cpu-reference", step="gemma4-torch-native-backend-on-cpu", fails_before=True)
def test_cpu_picks_torch_native_and_turns_cuda_graphs_off(tiny):
    args = rsa.build(model_path=tiny, device="cpu")
    assert rsa.resolved(args, "attention_backend") == "torch_native"
    graphs = rsa.resolved(args, "cuda_graph_config")
    # a prefill graph left on dies in an op with no CPU kernel at the first request
    assert graphs.prefill.backend == "disabled" and graphs.decode.backend == "disabled"


@pytest.mark.stack("cpu-reference", step="gemma4-torch-native-backend-on-cpu", fails_before=True)
def test_cpu_refuses_a_backend_it_does_not_run_naming_torch_native(tiny):
    with pytest.raises(ValueError) as e:
        rsa.build(model_path=tiny, device="cpu", attention_backend="flashinfer")
    msg = str(e.value)
    assert "runs on CPU with the attention backends torch_native" in msg
    assert "prefill=flashinfer, decode=flashinfer" in msg
    assert "--attention-backend" in msg
