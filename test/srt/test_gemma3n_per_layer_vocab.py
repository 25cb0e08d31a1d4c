"""Gemma-3n's per-layer embedding covers fewer ids than its vocabulary (the released
models: 262144 of 262400). A prompt with an id past it is served (its per-layer input is
id 0's, as in Hugging Face's Gemma3nModel) and the engine keeps serving; before, the
text model indexed past the table and the scheduler died (a device assert on CUDA)."""
import pytest

pytestmark = pytest.mark.stack("generic-fixes", step="gemma3n-per-layer-ids-past-their-vocabulary",
                               fails_before=True)


def test_an_id_past_the_per_layer_vocabulary_is_served(tmp_path):
    from cpu_engine import start_engine
    from tiny_gemma import GEMMA3N_TEXT_CONFIG, make_tiny_gemma3n

    per_layer = 448
    model = make_tiny_gemma3n(str(tmp_path / "m"), seed=0,
                              config=dict(GEMMA3N_TEXT_CONFIG, vocab_size_per_layer_input=per_layer))
    engine = start_engine(model)
    try:
        greedy = {"max_new_tokens": 4, "temperature": 0}
        plain = [11, 12, 13, 14, 15]
        before = engine.generate(input_ids=plain, sampling_params=greedy)["output_ids"]
        past = engine.generate(input_ids=[11, per_layer + 7, 13, GEMMA3N_TEXT_CONFIG["vocab_size"] - 1],
                               sampling_params=greedy)
        assert len(past["output_ids"]) == 4
        assert engine.generate(input_ids=plain, sampling_params=greedy)["output_ids"] == before
    finally:
        engine.shutdown()
