"""The exception tree of chunlian.

Every error the package raises on purpose derives from ``ChunlianError``; the API maps
them to HTTP status codes in ``chunlian.api`` and nowhere else::

    ChunlianError
    ├── InvalidInput          bad user input (422); carries the offending ``field``
    ├── ConfigError           settings that failed validation at start-up
    ├── ModelError            weights missing or incompatible, generation failed
    ├── NotReady              the service is still loading or warming up (503)
    └── EngineError           the engine could not serve the request
        ├── Overloaded        queue full (429); carries ``retry_after_s``
        ├── DeadlineExceeded  the request's deadline passed, queue time included (504)
        ├── Cancelled         the caller went away or cancelled
        └── EngineStopped     the engine is shutting down or has failed (503)
"""

from __future__ import annotations


class ChunlianError(Exception):
    """Root of every error raised on purpose by chunlian."""

    code = "internal"


class InvalidInput(ChunlianError, ValueError):
    """User input that can never be served; ``field`` names the offending field."""

    code = "invalid_input"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class ConfigError(ChunlianError, ValueError):
    """A setting failed validation; the message says what was expected and what came."""

    code = "config_error"


class ModelError(ChunlianError):
    """The model could not be loaded or failed while generating."""

    code = "model_error"


class NotReady(ChunlianError):
    """The service is still loading the model or warming up (503)."""

    code = "not_ready"


class EngineError(ChunlianError):
    """The generation engine could not serve a request."""

    code = "engine_error"


class Overloaded(EngineError):
    """The bounded queue is full; retry after ``retry_after_s`` seconds."""

    code = "overloaded"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(EngineError):
    """The request's deadline (queue time included) passed before it finished."""

    code = "deadline_exceeded"


class Cancelled(EngineError):
    """The request was cancelled (its caller went away)."""

    code = "cancelled"


class EngineStopped(EngineError):
    """The engine is stopped or has failed; pending requests fail with this."""

    code = "engine_stopped"
