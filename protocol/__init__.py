"""Messages between the web side and workers over the channel layer, each declared once here.

On the wire every message is a plain dict (msgpack-safe for channels-redis); the TypedDicts
below say what each one holds, and `JobParams` declares every sampling default of the request
path. Views and the worker consumer both import this package; it imports neither Django nor torch,
and sits below both (tests/test_architecture.py): model_ref, params, jobs, control, plus
modalities, hub and layer_errors, which both sides ask the same question of.

Web -> worker (on the shared worker channel):   SubmitMessage (its prompts: Prompt, its params: JobParams)
Web -> all workers (group):                     CancelMessage
Worker -> web (on the reply channel), in order: AcceptedMessage, then Started or ErrorMessage,
                                                DeltaMessage (once per step), DoneMessage;
                                                AliveMessage whenever it would be silent for a while
Worker -> worker it passed a job to and back:   SubmitMessage (routed), RouteAckMessage
Model control (web/admin -> a worker's channel, the shared worker channel, or the group):
    ControlMessage (model.load: one worker takes it; model.unload: every worker), SettingsMessage
Worker -> the control request's reply channel:  ControlAccepted, then ProgressMessage until its
                                                ModelEvent is terminal (`is_terminal`)
Engine -> its own worker's catalog bookkeeping: ModelChange; the worker's own: ModelHealthChange
Health (web -> all workers, group), answered on its reply channel: PingMessage -> PongMessage
"""
from __future__ import annotations

from protocol.model_ref import (  # noqa: F401
    DEFAULT_REVISION,
    ModelRef,
    ModelRefDict,
)
from protocol.params import (  # noqa: F401
    Structured,
    JobParams,
    NEUTRAL_SAMPLING,
    MODEL_SAMPLING_KEYS,
    SHARED_REQUEST_FIELDS,
    rest_of_context,
    to_job_params,
)
from protocol.jobs import (  # noqa: F401
    SUBMIT,
    CANCEL,
    ACCEPTED,
    STARTED,
    ERROR,
    DELTA,
    DONE,
    ALIVE,
    ROUTE_ACK,
    MediaPart,
    Conversation,
    TextPrompt,
    TokenIdsPrompt,
    AudioPrompt,
    EmbeddingPrompt,
    PairPrompt,
    Prompt,
    SubmitMessage,
    TeamRef,
    RouteAckMessage,
    AliveMessage,
    CancelMessage,
    AcceptedMessage,
    Started,
    ErrorMessage,
    Logprobs,
    PromptLogprob,
    Word,
    ChoiceDelta,
    Part,
    Usage,
    DeltaMessage,
    DoneMessage,
    submit_message,
    accepted_message,
    alive_message,
    route_ack_message,
    delta_message,
    done_message,
    routed_job,
    claim_key,
    cancel_message,
    error_message,
    shutting_down_message,
    SHUTTING_DOWN,
)
from protocol.control import (  # noqa: F401
    MODEL_LOAD,
    MODEL_UNLOAD,
    MODEL_SETTINGS,
    MODEL_ACCEPTED,
    MODEL_PROGRESS,
    MODEL_LOADING,
    MODEL_LOADED,
    MODEL_LOAD_FAILED,
    MODEL_UNLOADED,
    MODEL_HEALTH,
    PING,
    PONG,
    LOAD_STAGES,
    ModelSettings,
    ControlMessage,
    SettingsMessage,
    ControlAccepted,
    ModelEvent,
    ProgressMessage,
    ModelChange,
    ModelHealthChange,
    model_health_change,
    control_message,
    settings_message,
    control_accepted,
    progress_message,
    is_terminal,
    PingMessage,
    PongMessage,
    ping_message,
    pong_message,
)
