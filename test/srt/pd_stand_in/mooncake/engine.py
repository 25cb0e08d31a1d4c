"""Stands in for mooncake's TransferEngine (pip mooncake-transfer-engine) on a CPU machine
without its RDMA libraries. It moves the bytes for real between the servers of a PD pair
on one host: a write to a peer session copies, with Linux's process_vm_writev (same
user), into the process that took that session's rpc port (each engine records its pid
under SGLANG_TEST_PD_STAND_IN_DIR). Requests with the fake bootstrap host (2.2.2.2)
transfer nothing."""

import ctypes
import os
import socket
import tempfile
import time

_DIR = os.environ.get("SGLANG_TEST_PD_STAND_IN_DIR") or os.path.join(tempfile.gettempdir(), "pd-stand-in")


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_writev.restype = ctypes.c_ssize_t
_libc.process_vm_writev.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                    ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]


def _peer_pid(session_id):
    with open(os.path.join(_DIR, session_id.rsplit(":", 1)[1])) as f:
        return int(f.read())


class TransferEngine:
    _port = None

    def initialize(self, hostname, metadata_server, protocol, device):
        return 0

    def get_rpc_port(self):
        if self._port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self._port = s.getsockname()[1]
            os.makedirs(_DIR, exist_ok=True)
            with open(os.path.join(_DIR, str(self._port)), "w") as f:
                f.write(str(os.getpid()))
        return self._port

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

    def send_probe(self, session_id):
        return 0 if os.path.exists(os.path.join(_DIR, session_id.rsplit(":", 1)[1])) else -1

    def transfer_sync_write(self, session_id, buffer, peer_buffer_address, length):
        return self.batch_transfer_sync_write(session_id, [buffer], [peer_buffer_address], [length])

    def batch_transfer_sync_write(self, session_id, buffers, peer_buffer_addresses, lengths):
        # Held in flight while the file SGLANG_TEST_PD_STAND_IN_HOLD names exists (it is
        # marked held in that name + ".held"): a fault test kills a peer during a transfer.
        hold = os.environ.get("SGLANG_TEST_PD_STAND_IN_HOLD")
        if hold and os.path.exists(hold):
            open(hold + ".held", "w").close()
            while os.path.exists(hold):
                time.sleep(0.05)
        pid = _peer_pid(session_id)
        for src, dst, n in zip(buffers, peer_buffer_addresses, lengths):
            local, remote = _IOVec(src, n), _IOVec(dst, n)
            if _libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != n:
                return -1
        return 0

    def __getattr__(self, name):
        raise AssertionError(f"mooncake stand-in: {name}() is not stood in")
