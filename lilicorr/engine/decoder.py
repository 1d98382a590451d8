"""The step-able batched decoder every job uses: AR or speculative, lossless at any temperature.

Split in two: scheduler.py (requests, slots, admission, waiting queue, deltas and results: the
`Decoder` class) and runner.py (prefill, draft, verify, commit on the model: `ModelRunner`). This
module keeps the historical import path:

    from lilicorr.engine.decoder import Decoder
    dec = Decoder(target, cfg.engine, drafter=..., head=..., stop_ids=[eos])
    dec.add_request(Request(id=0, prompt_ids=[...]))
    while dec.has_work():
        for result in dec.step(): ...          # finished requests (step_deltas(): tokens as they come)
    # or: results = dec.generate([Request(...), ...])
"""

from .requests import Delta, QueueFull, Request, RequestError, Result
from .runner import BlockOut, ModelRunner, SlotSampling
from .scheduler import Decoder

__all__ = ["Decoder", "Delta", "QueueFull", "Request", "RequestError", "Result", "BlockOut", "ModelRunner",
           "SlotSampling"]
