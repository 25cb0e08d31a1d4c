"""A --forward-hooks factory for the benchmark tests: which decoder layers a pass runs,
and on how many rows (the engine's processes import it from here)."""


def record_rows(config):
    """Appends "<layer_id> <rows>" to config["out"] for each call of a hooked layer."""
    path = config["out"]

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        with open(path, "a") as f:
            f.write(f"{module.layer_id} {hidden.shape[-2]}\n")

    return hook
