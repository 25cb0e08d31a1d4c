"""Stands in for mooncake's TransferEngine (pip mooncake-transfer-engine) so that a
PD prefill server starts on a CPU machine without its RDMA libraries. Requests with
the fake bootstrap host (2.2.2.2) transfer nothing: the engine is only initialized
and handed buffers to register; a transfer fails loudly."""

import socket


class TransferEngine:
    def initialize(self, hostname, metadata_server, protocol, device):
        return 0

    def get_rpc_port(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def register_memory(self, ptr, length):
        return 0

    def unregister_memory(self, ptr):
        return 0

    def batch_register_memory(self, ptrs, lengths):
        return 0

    def batch_unregister_memory(self, ptrs):
        return 0

    def get_engine(self):
        return self

    def __getattr__(self, name):
        raise AssertionError(f"mooncake stand-in: {name}() was called: a request transferred KV")
