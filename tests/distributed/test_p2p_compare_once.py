"""A send held until its receiver's side is there is compared with that side twice, by the
live check's watcher (which posts held sends) and by the send's own wait: the two may run
at once, and the mismatch they find is one desync, recorded once, raised the same by both."""

from __future__ import annotations

import threading
import types

import torch.distributed as dist

from tpu_debug.runtime import probes
from tpu_debug.runtime.distributed.c10d.live_check import LiveCheck


class _Desyncs:
    def __init__(self) -> None:
        self.seen = []

    def on_collective_desync(self, info) -> None:
        self.seen.append(info)


def _side(op: str, shape: str, peer: int) -> dict:
    return {"seq": 1, "op": op, "shapes": [shape], "dtype": "float32", "reduce_op": None, "peer": peer,
            "file": "train.py", "line": 7 if op == "send" else 9, "function": "step", "device": "tpu",
            "t": 0, "n": 1, "tag": 0}


def test_a_send_whose_receiver_differs_is_one_desync_whoever_compares():
    check = LiveCheck(dist.HashStore(), 0, [0, 1], 5.0)
    info = types.SimpleNamespace(group="6", ranks=(0, 1), seq=1)
    ticket = {"info": info, "card": _side("send", "[4]", 1), "channel": (0, 1, 0), "n": 1, "peer": 1,
              "theirs": "unused"}
    theirs = _side("recv", "[3]", 0)
    listener = _Desyncs()
    probes.subscribe(listener)
    try:
        errors = []
        threads = [threading.Thread(target=lambda: errors.append(check._compare(ticket, theirs))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors.append(check._compare(ticket, theirs))  # and once more, after both
    finally:
        probes.unsubscribe(listener)
    assert len(listener.seen) == 1 and listener.seen[0].reason == "shapes"
    assert errors[0] is not None and all(e is errors[0] for e in errors)
