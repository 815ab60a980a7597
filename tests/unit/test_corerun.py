"""The engine process's loop with a stub core and pipe: what each turn sends."""

from __future__ import annotations

from collections import deque
from typing import Any

from chunlian.engine.core import CoreOutput
from chunlian.engine.corerun import CoreLoop
from chunlian.engine.messages import Add, Answers, decode_error
from chunlian.engine.stats import EngineStats
from chunlian.errors import Overloaded
from chunlian.types import CoupletRequest


class StubCore:
    """Takes ``room`` requests, refuses the rest as a full queue; a step ends what it took."""

    model_tag = search_tag = "stub"
    idle_wait_s = None

    def __init__(self, room: int) -> None:
        self.room, self.stats = room, EngineStats()
        self.taken: list[int] = []

    def add_step_listener(self, fn: Any) -> None:
        pass

    def add_request(self, creq: Any) -> None:
        if len(self.taken) >= self.room:
            raise Overloaded("queue full", 1.0)
        self.taken.append(creq.req_id)

    def step(self) -> list[CoreOutput]:
        ended, self.taken = self.taken, []
        return [CoreOutput(rid, error=Overloaded("stub end", 1.0)) for rid in ended]


class StubConn:
    def __init__(self, msgs: list[object]) -> None:
        self.inbox = deque(msgs)
        self.sent: list[object] = []

    def poll(self, timeout: float = 0.0) -> bool:
        return bool(self.inbox)

    def recv(self) -> object:
        return self.inbox.popleft()

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def test_adds_refused_under_a_full_queue_go_out_with_the_step_answers_in_one_message() -> None:
    adds = [Add(i, CoupletRequest(upper="春回大地"), 10.0) for i in range(1, 7)]
    conn, core = StubConn(list(adds)), StubCore(room=2)
    loop = CoreLoop(core, conn)
    assert loop._turn()
    answers = [m for m in conn.sent if isinstance(m, Answers)]
    assert len(answers) == 1
    said = {a.req_id: str(decode_error(a.error)) for a in answers[0].answers if a.error is not None}
    assert sorted(said) == [1, 2, 3, 4, 5, 6]  # every add answered: 2 ended, 4 refused
    assert [i for i, msg in said.items() if "queue full" in msg] == [3, 4, 5, 6]
