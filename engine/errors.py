"""The engine's error tree: each failure a caller may need to tell apart has its own type."""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class ConfigError(EngineError, ValueError):
    """An engine setting is invalid; raised once, when the config is built."""


class InvalidRequestError(EngineError, ValueError):
    """A request or its sampling parameters cannot be served as given (bad value, too long)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_tokens does not fit the model's context or the KV pool; `prompt_too_long` when the prompt
    alone leaves no room for one token (a server names its own prompt field then)."""

    def __init__(self, message: str, param: str | None = None, *, prompt_too_long: bool = False) -> None:
        super().__init__(message, param)
        self.prompt_too_long = prompt_too_long


class QueueFullError(EngineError):
    """The waiting queue is at its bound; the caller should retry later (HTTP 503)."""


class EngineDeadError(EngineError):
    """The engine process is gone; requests in flight are lost and new ones fail until it restarts."""


class ModelLoadError(EngineError):
    """The model could not be found, converted or loaded."""
