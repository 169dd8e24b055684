"""msgspec structs for Ollama's bodies as its clients send them (unknown fields ignored, as Ollama does), and its
answers: chat and generate (whole, or NDJSON lines), embed, and the model listings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from web.generation.decoding import TOP_K_MAX, Name

UNSUPPORTED: dict[str, Any] = {"unsupported": True}
MAX_TOOLS = 128
NoImages = Annotated[list[Any], Meta(max_length=0, extra=UNSUPPORTED, description="this server's model is text-only")]
Format = Literal["", "json"] | dict[str, Any]  # "json": any JSON object; an object: a JSON schema
KeepAlive = float | str  # accepted and ignored: the operator keeps the model loaded
Think = bool | Literal["low", "medium", "high"]


class Options(Struct, kw_only=True):
    """The sampling options this server honours; Ollama's others (num_ctx, num_thread, mirostat...) are runtime
    knobs of its own and are ignored."""

    temperature: Annotated[float, Meta(ge=0)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=TOP_K_MAX)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    num_predict: Annotated[int, Meta(ge=-2)] | None = None  # -1: no limit but the context; -2: fill the context
    stop: Annotated[list[str], Meta(max_length=16)] | None = None
    seed: int | None = None  # negative: random, as Ollama's -1
    repeat_penalty: Annotated[float, Meta(gt=0)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None


class CallFunction(Struct, kw_only=True, omit_defaults=True):
    name: str
    arguments: dict[str, Any] = {}
    index: int | None = None


class ToolCall(Struct, kw_only=True):
    function: CallFunction


class Message(Struct, kw_only=True):
    role: str
    content: str | None = None
    images: NoImages | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=MAX_TOOLS)] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # another model's reasoning, replayed: this model has none to continue


class ToolFunction(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(Struct, kw_only=True):
    function: ToolFunction
    type: Literal["function"] = "function"


class _Generating(Struct, kw_only=True):
    model: Name
    format: Format | None = None
    options: Options | None = None
    stream: bool = True  # Ollama streams unless told not to
    keep_alive: KeepAlive | None = None
    think: Think | None = None


class ChatRequest(_Generating, kw_only=True):
    messages: list[Message] = []
    tools: Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)] | None = None


class GenerateRequest(_Generating, kw_only=True):
    prompt: str = ""
    system: str | None = None
    raw: bool = False  # the prompt as it is, without the chat template
    suffix: Annotated[str, Meta(max_length=0, extra=UNSUPPORTED, description="fill-in-the-middle")] | None = None
    template: Annotated[str, Meta(max_length=0, extra=UNSUPPORTED, description="the model's own")] | None = None
    context: Annotated[list[int], Meta(max_length=0, extra=UNSUPPORTED, description="send the text")] | None = None
    images: NoImages | None = None


class EmbedRequest(Struct, kw_only=True):
    model: Name
    input: str | Annotated[list[str], Meta(min_length=1, max_length=2048)]
    truncate: bool = True  # Ollama's default: an input longer than the model takes is cut
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class LegacyEmbedRequest(Struct, kw_only=True):
    """/api/embeddings, which Ollama keeps for older clients: one prompt, one vector."""

    model: Name
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class ModelRequest(Struct, kw_only=True):
    """/api/show (Ollama's older clients send `name`)."""

    model: Name | None = None
    name: Name | None = None
    verbose: bool = False


# -- answers ---------------------------------------------------------------------------------------------


class Details(Struct):
    format: str
    family: str
    families: list[str]
    parameter_size: str = ""
    quantization_level: str = ""
    parent_model: str = ""


class ListedModel(Struct):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class RunningModel(Struct):
    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int


class Tags(Struct):
    models: list[ListedModel]


class Running(Struct):
    models: list[RunningModel]


class Shown(Struct):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(Struct):
    version: str


class OutMessage(Struct, omit_defaults=True):
    role: str
    content: str
    tool_calls: list[ToolCall] | None = None


class ChatLine(Struct, omit_defaults=True):
    """One NDJSON line of /api/chat (the last has done true and the counts), or its whole answer."""

    model: str
    created_at: str
    message: OutMessage
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class GenerateLine(Struct, omit_defaults=True):
    model: str
    created_at: str
    response: str
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class Embedded(Struct):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class LegacyEmbedded(Struct):
    embedding: list[float]


class Error(Struct):
    error: str
