"""Build ServerArgs and read what resolution decided, as the release under test does.
Tests of server-argument hooks go through these helpers so they state the same
expectations on every release.
"""

import contextlib
import copy

from release import RELEASE

from sglang.srt.server_args import ServerArgs


def resolve(args: ServerArgs) -> ServerArgs:
    if RELEASE >= (0, 5, 23):
        args.resolve_once()
    return args


def build(**kwargs) -> ServerArgs:
    """ServerArgs as sglang.Engine(**kwargs) builds and resolves them."""
    return resolve(ServerArgs(**kwargs))


def from_cli(parsed) -> ServerArgs:
    """ServerArgs as launch_server builds and resolves them from parsed argv."""
    return resolve(ServerArgs.from_cli_args(parsed))


def resolved(args: ServerArgs, name: str):
    """The value resolution decided for the field ``name``."""
    if RELEASE >= (0, 5, 23):
        from sglang.srt.arg_groups.overrides import resolution_result

        return resolution_result(args, name)
    else:
        return getattr(args, name)


def attention_backends(args: ServerArgs):
    """(prefill, decode) attention backends as resolved."""
    if RELEASE >= (0, 5, 23):
        from sglang.srt.arg_groups.overrides import attention_backends_of, resolved_view

        return attention_backends_of(resolved_view(args))
    else:
        return args._resolved_attention_backends()


def model_config(args: ServerArgs):
    """The ModelConfig that resolution built for ``args`` (what the model gets)."""
    if RELEASE >= (0, 5, 23):
        from sglang.srt.arg_groups.overrides import model_config_of

        return model_config_of(args)
    else:
        return args.get_model_config()


def _copy(args: ServerArgs) -> ServerArgs:
    copied = copy.copy(args)
    if RELEASE >= (0, 5, 23):
        # A Struct's copy has the fields only: bring the resolution's bookkeeping
        # (declarations, raw input, the CUDA graph settings the operator pinned).
        copied.__dict__.update(args.__dict__)
    return copied


def with_model_config(args: ServerArgs, config) -> ServerArgs:
    """A copy of resolved ``args`` that reads ``config`` as its model config."""
    copied = _copy(args)
    if RELEASE >= (0, 5, 23):
        copied._model_config = config
        copied._model_config_built_from = None
    else:
        object.__setattr__(copied, "model_config", config)
    return copied


def with_fields(args: ServerArgs, **fields) -> ServerArgs:
    """A copy of resolved ``args`` with ``fields`` decided, to run a hook again on
    settings that ServerArgs on a CPU-only machine rejects before the hooks."""
    copied = _copy(args)
    if RELEASE >= (0, 5, 23):
        copied._resolved_overrides = list(args._resolved_overrides) + [
            ("test", dict(fields))
        ]
    else:
        copied._resolved_overrides = []  # fields are materialized; start a fresh stash
        object.__setattr__(
            copied, "cuda_graph_config", copy.deepcopy(args.cuda_graph_config)
        )
        copied.override("test", **fields)
    return copied


@contextlib.contextmanager
def published(args: ServerArgs):
    """``args`` as the process's server arguments (what get_exec() and the model
    read), and the previous ones back afterwards."""
    from sglang.srt.runtime_context import get_context

    context = get_context()
    if RELEASE >= (0, 5, 23):
        saved = context.override_server_args()
        saved.install()
        try:
            context.set_server_args(args)
            yield
        finally:
            saved.restore()
    else:
        with context.preserve_config():
            context.set_server_args(args)
            yield
