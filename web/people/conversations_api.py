"""JSON API of a signed-in person's own conversations at /api/conversations (the chat page's, with its session
cookie and, on every state change, the session's CSRF token in X-CSRF-Token); and the admin's purge of a person's
conversations at /admin/api/users/{id}/conversations (HTTP Basic, like the rest of the admin API)."""

from datetime import datetime
from typing import Annotated, Any, Literal

from litestar import Request, Router, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath, JSONBody, Parameter
from litestar.types import Guard
from msgspec import UNSET, Meta, Struct, UnsetType

from web import deps
from web.errors import AuthenticationFailed
from web.people.conversations import ConversationInfo, Message, Settings
from web.people.guard import CSRF_HEADER, SAFE_METHODS, SESSION_COOKIE
from web.people.sessions import SessionStore, tokens_match

Title = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"\S")]
System = Annotated[str, Meta(max_length=20_000)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
MaxTokens = Annotated[int, Meta(ge=1, le=2**31 - 1)]
Role = Literal["user", "assistant"]  # the system prompt is the conversation's own field
Content = Annotated[str, Meta(max_length=500_000)]
DEFAULT_TITLE = "New chat"


class MessageBody(Struct, kw_only=True, forbid_unknown_fields=True):
    role: Role
    content: Content


class MessageView(Struct, kw_only=True):
    role: str
    content: str
    created_at: datetime | None


class ConversationView(Struct, kw_only=True, omit_defaults=True):
    id: str
    title: str
    system: str
    temperature: float
    max_tokens: int | None
    created_at: datetime
    updated_at: datetime
    message_count: int
    messages: list[MessageView] | None = None  # with one conversation, not in a list of them


class ConversationList(Struct, kw_only=True):
    data: list[ConversationView]
    has_more: bool


class ConversationCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    title: Title = DEFAULT_TITLE
    system: System = ""
    temperature: Temperature = 0.7
    max_tokens: MaxTokens | None = None  # none: the person's cap (or the server's default) applies
    messages: list[MessageBody] = []


class ConversationUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out keep their value; max_tokens null asks for no particular length."""

    title: Title | UnsetType = UNSET
    system: System | UnsetType = UNSET
    temperature: Temperature | UnsetType = UNSET
    max_tokens: MaxTokens | UnsetType | None = UNSET

    def given(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__struct_fields__ if getattr(self, f) is not UNSET}


class MessagesReplace(Struct, kw_only=True, forbid_unknown_fields=True):
    messages: list[MessageBody]


class Deleted(Struct, kw_only=True):
    deleted: int


def view(info: ConversationInfo) -> ConversationView:
    s = info.settings
    messages = None
    if info.messages is not None:
        messages = [MessageView(role=m.role, content=m.content, created_at=m.created_at) for m in info.messages]
    return ConversationView(
        id=info.id,
        title=s.title,
        system=s.system,
        temperature=s.temperature,
        max_tokens=s.max_tokens,
        created_at=info.created_at,
        updated_at=info.updated_at,
        message_count=info.message_count,
        messages=messages,
    )


def _messages(bodies: list[MessageBody]) -> list[Message]:
    return [Message(m.role, m.content) for m in bodies]


def person_guard(store: SessionStore) -> Guard:
    """A live session of a person who may chat (401 in the API's shape, never a redirect: fetch calls it), and its
    CSRF token in the header on every state change (a page of another site can send the cookie, never the header).
    Sets connection.state.signed_in."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        session = await store.get(connection.cookies.get(SESSION_COOKIE))
        if session is None or not session.person.may_chat:
            raise AuthenticationFailed("sign in at /login to keep conversations", code="session_expired")
        if connection.scope.get("method", "GET") not in SAFE_METHODS and not tokens_match(
            session.csrf_token, connection.headers.get(CSRF_HEADER)
        ):
            raise AuthenticationFailed(
                "a change by a signed-in session needs the page's CSRF token in X-CSRF-Token",
                code="csrf_token_invalid",
            )
        connection.state.signed_in = session

    return guard


def provide_owner(request: Request[Any, Any, Any]) -> int:
    """The signed-in person whose conversations a request reads and changes (set by the guard)."""
    owner: int = request.state.signed_in.person.id
    return owner


Owner = NamedDependency[int]  # the signed-in person's id (provide_owner)
Id = FromPath[Annotated[str, Parameter(max_length=64)]]
Limit = Annotated[int, Parameter(ge=1, le=200)]
Offset = Annotated[int, Parameter(ge=0, le=2**31 - 1)]
Query = Annotated[str, Parameter(max_length=200)]


@get("/")
async def list_conversations(
    conversations: deps.Conversations, owner: Owner, q: Query = "", limit: Limit = 50, offset: Offset = 0
) -> ConversationList:
    """Newest first; `q` searches titles and message text (case-insensitive)."""
    found = await conversations.search(owner, q.strip(), limit + 1, offset)
    return ConversationList(data=[view(c) for c in found[:limit]], has_more=len(found) > limit)


@post("/", status_code=201)
async def create_conversation(
    conversations: deps.Conversations, owner: Owner, data: JSONBody[ConversationCreate]
) -> ConversationView:
    settings = Settings(data.title, data.system, data.temperature, data.max_tokens)
    return view(await conversations.create(owner, settings, _messages(data.messages)))


@get("/{conversation_id:str}")
async def get_conversation(conversations: deps.Conversations, owner: Owner, conversation_id: Id) -> ConversationView:
    return view(await conversations.get(owner, conversation_id))


@patch("/{conversation_id:str}")
async def update_conversation(
    conversations: deps.Conversations, owner: Owner, conversation_id: Id, data: JSONBody[ConversationUpdate]
) -> ConversationView:
    return view(await conversations.update(owner, conversation_id, **data.given()))


@put("/{conversation_id:str}/messages")
async def replace_messages(
    conversations: deps.Conversations, owner: Owner, conversation_id: Id, data: JSONBody[MessagesReplace]
) -> ConversationView:
    """The whole list of messages, as the page holds it after each turn."""
    return view(await conversations.replace_messages(owner, conversation_id, _messages(data.messages)))


@delete("/{conversation_id:str}", status_code=204)
async def delete_conversation(conversations: deps.Conversations, owner: Owner, conversation_id: Id) -> None:
    await conversations.delete(owner, conversation_id)


@delete("/", status_code=200)
async def delete_all_conversations(conversations: deps.Conversations, owner: Owner) -> Deleted:
    """Every conversation of the signed-in person, none of anyone else's."""
    return Deleted(deleted=await conversations.delete_all(owner))


@delete("/users/{user_id:int}/conversations", status_code=200)
async def purge_conversations(
    accounts: deps.Accounts, conversations: deps.Conversations, user_id: FromPath[int]
) -> Deleted:
    """The admin removes every conversation of a person (404 for no such person)."""
    await accounts.get(user_id)
    return Deleted(deleted=await conversations.delete_all(user_id))


def conversations_api(store: SessionStore, admin_guard: Guard) -> list[Router]:
    own = Router(
        path="/api/conversations",
        route_handlers=[
            list_conversations,
            create_conversation,
            get_conversation,
            update_conversation,
            replace_messages,
            delete_conversation,
            delete_all_conversations,
        ],
        guards=[person_guard(store)],
        dependencies={"owner": Provide(provide_owner, sync_to_thread=False)},
    )
    admin = Router(path="/admin/api", route_handlers=[purge_conversations], guards=[admin_guard])
    return [own, admin]
