# Copyright 2023-2024 SGLang Team
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""One request in flight per bootstrap room on a PD server.

Both servers of a PD pair key a request's KV transfer by its ``bootstrap_room``:
its status, its sender or receiver, the peer's registration. Two requests in
flight under one room share all of that: on the prefill server the first to
finish clears the room's status and polling the other's raises ``KeyError`` in
the scheduler, which stops it; on the decode server their transfers mix. The
router draws a random room per request, so only a client that names rooms
itself can collide; its second request is refused with a 400 before anything
is allocated for it.

A room is held while the request that claimed it is in the tokenizer manager's
requests in flight (``rid -> state``). The holders are derived from that map at
each check, so no removal path has to release a room.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Tuple


class BootstrapRoomsInFlight:
    def __init__(self, rid_to_state: Mapping[str, Any]):
        self._rid_to_state = rid_to_state
        self._claims: Dict[int, str] = {}  # room -> rid of its last claim

    def holder(self, room: int) -> Optional[str]:
        """The rid of the request in flight that holds ``room``, if any."""
        rid = self._claims.get(room)
        state = self._rid_to_state.get(rid) if rid is not None else None
        if state is not None and getattr(state.obj, "bootstrap_room", None) == room:
            return rid
        return None

    def claim(self, items: Iterable[Tuple[str, Optional[int]]]) -> None:
        """Claim the rooms of one request's (rid, room) items, all or none.

        Raises ValueError (a 400) naming the room and its holder when one is held
        or named twice."""
        new: Dict[int, str] = {}
        for rid, room in items:
            if room is None:
                continue
            held = new.get(room) or self.holder(room)
            if held is not None:
                raise ValueError(
                    f"bootstrap_room {room} is held by request {held} in flight on "
                    f"this server: each request through a PD pair needs a room of "
                    f"its own. Send it with another bootstrap_room, or through the "
                    f"router, which draws a random one per request."
                )
            new[room] = rid
        # Finished requests' claims go when they outnumber those in flight.
        if len(self._claims) + len(new) > 2 * len(self._rid_to_state) + 1024:
            self._claims = {r: rid for r, rid in self._claims.items() if self.holder(r)}
        self._claims.update(new)
