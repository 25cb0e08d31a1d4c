"""Which process answers at a prefill server's bootstrap address.

A decode server fetches a prefill server's topology and rank endpoints from its
bootstrap address once and caches them per address; its heartbeat drops the cache only
after ``SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE`` failed probes in a row. A prefill
server restarted on the same address inside that window (an orchestrator restarts a
process in seconds) answers the next probe, so the decode server kept the dead process's
endpoints: its KV registrations went to ports nobody read, and every request through the
pair waited out the bootstrap and waiting timeouts.

The bootstrap server names its process in a response header; the decode server records
the name that came with the info it cached, and a heartbeat answered under another name
counts as the old prefill server lost. Servers without the header are never compared.
"""

from __future__ import annotations

import uuid
from typing import Dict, Mapping, Optional

HEADER = "X-SGLang-Bootstrap-Instance"


def new_instance_headers() -> Dict[str, str]:
    """The headers a bootstrap server sends, naming it (one name a server process)."""
    return {HEADER: uuid.uuid4().hex}


class BootstrapInstances:
    """The decode side's record: bootstrap address -> the instance its cached info came from."""

    def __init__(self) -> None:
        self._cached_from: Dict[str, Optional[str]] = {}

    def fetched(self, bootstrap_addr: str, headers: Mapping[str, str]) -> None:
        """The info of `bootstrap_addr` was fetched (and cached) from this response."""
        self._cached_from[bootstrap_addr] = headers.get(HEADER)

    def replaced(self, bootstrap_addr: str, headers: Mapping[str, str]) -> bool:
        """Whether a probe of `bootstrap_addr` answered from another instance than the
        cached info's. The record is dropped then: the next fetch makes a new one."""
        cached, now = self._cached_from.get(bootstrap_addr), headers.get(HEADER)
        if cached is None or now is None or cached == now:
            return False
        del self._cached_from[bootstrap_addr]
        return True
