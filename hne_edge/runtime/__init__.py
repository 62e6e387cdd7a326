"""The edge runtime: anytime inference over an exported bundle (numpy + a backend; no torch needed).

    from hne_edge.runtime import AnytimeRunner, Agreement

    with AnytimeRunner("bundle/") as runner:
        x = runner.preprocess(images)                 # uint8 NHWC -> normalised NCHW float32
        r = runner.run(x, budget_ms=5.0)              # as many leaves as fit in 5 ms
        r.predictions, r.probs, r.leaves, r.uncertainty.vote_entropy

        s = runner.start(x); s.step(); s.result()     # interrupt ...
        s.refine(budget_ms=2.0)                       # ... and resume from the cached activations

    with StreamScheduler(runner, budget_ms=33.0) as streams:   # several cameras, one device (streams.py)
        streams.submit("front", x).result()           # a StreamResult: leaves, logits, met_deadline, stopped_by

TensorRT / torch backends are imported only when chosen.
"""

from __future__ import annotations

from .backends import BACKENDS, Backend, LoadedPlan, Runner, Unit, create_backend
from .cost_model import CostModel, Profile
from .inputs import check_input, preprocess
from .result import Agreement, AnytimeResult, StopRule, Uncertainty, softmax, summarize_frames
from .runner import AnytimeRunner, ConcurrentUseError
from .session import AnytimeSession, NoResultError, NonFiniteResult, RunnerClosedError, SessionCancelled
from .streams import FrameHandle, StreamResult, StreamScheduler

__all__ = [
    "AnytimeRunner",
    "AnytimeSession",
    "AnytimeResult",
    "Uncertainty",
    "Agreement",
    "StopRule",
    "ConcurrentUseError",
    "RunnerClosedError",
    "NoResultError",
    "NonFiniteResult",
    "SessionCancelled",
    "StreamScheduler",
    "StreamResult",
    "FrameHandle",
    "CostModel",
    "Profile",
    "Backend",
    "LoadedPlan",
    "Runner",
    "Unit",
    "BACKENDS",
    "create_backend",
    "check_input",
    "preprocess",
    "softmax",
    "summarize_frames",
]
