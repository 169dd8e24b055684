"""Request bodies of every dialect decoded once with msgspec against the limits their schemas declare: a value
beyond what a field marked UNSUPPORTED allows is unsupported_parameter, any other refusal invalid_request_error."""

from __future__ import annotations

import re
from typing import Annotated, Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi
from msgspec import Meta

from web.errors import InvalidRequest, UnsupportedParameter, undecodable_body

T = TypeVar("T")
# model and user are kept in every history row: a longer one is refused, not stored.
Name = Annotated[str, Meta(max_length=256)]
# The engine's range for top_k: a schema-valid value is one the engine takes.
TOP_K_MAX = 2**63 - 1
_PATH = re.compile(r"at `\$\.?(.*)`$")
_INDEX = re.compile(r"\[\d+\]")


def field_marks(t: mi.Type, key: str, path: str = "") -> dict[str, Any]:
    """The dotted paths (no list indexes) of the fields whose Meta(extra=...) has `key`, with its value."""
    if isinstance(t, mi.Metadata):
        extra = t.extra or {}
        return ({path: extra[key]} if key in extra else {}) | field_marks(t.type, key, path)
    if isinstance(t, mi.UnionType):
        return {k: v for u in t.types for k, v in field_marks(u, key, path).items()}
    if isinstance(t, mi.ListType):
        return field_marks(t.item_type, key, path)
    if isinstance(t, mi.StructType):
        return {k: v for f in t.fields for k, v in field_marks(f.type, key, f"{path}.{f.name}".lstrip(".")).items()}
    return {}


class BodyDecoder(Generic[T]):
    """One body type's decoder: msgspec enforces its declared limits; a value beyond what a field marked
    UNSUPPORTED allows is unsupported_parameter, any other refusal invalid_request_error, both naming the field."""

    def __init__(self, body_type: type[T]) -> None:
        self._decoder = msgspec.json.Decoder(body_type)
        info = mi.type_info(body_type)
        self._unsupported = set(field_marks(info, "unsupported"))
        self._reported_as: dict[str, str] = field_marks(info, "reported_as")

    def __call__(self, body: bytes) -> T:
        if not body.strip():
            raise InvalidRequest("the request body is empty; send a JSON object")
        try:
            return self._decoder.decode(body)
        except msgspec.ValidationError as exc:
            text = str(exc)
            match = _PATH.search(text)
            param = match.group(1) if match and match.group(1) else None
            unsupported = self._unsupported_field(param) if param is not None else None
            if unsupported is not None:
                message = f"{unsupported} is not supported by this server: {text}"
                raise UnsupportedParameter(message, param=unsupported) from None
            param = self._reported_as.get(param, param) if param is not None else None
            raise InvalidRequest(f"invalid request body: {text}", param=param) from None
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
        except (RecursionError, UnicodeDecodeError) as exc:
            raise undecodable_body(exc) from None

    def _unsupported_field(self, param: str) -> str | None:
        """The field marked UNSUPPORTED on the way to `param` (as the body spells it, indexes kept), if any."""
        parts = param.split(".")
        for n in range(1, len(parts) + 1):
            if _INDEX.sub("", ".".join(parts[:n])) in self._unsupported:
                return ".".join(parts[:n])
        return None
