"""The names handlers take their collaborators by (Litestar dependencies, provided once per app by web/app.py's
Gateway): a handler's signature says what it touches (`gate: deps.Gate`), and a test overrides one provider."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.backends.router import Router as _Router
from web.config import WebConfig
from web.embeddings.service import Embedder as _Embedder
from web.generation.gate import EngineGate
from web.generation.inflight import InFlight as _InFlight
from web.generation.prompts import Prompts as _Prompts
from web.generation.run import Generations as _Generations
from web.history.service import HistoryService
from web.history.stored import ResponseStore
from web.keys.front_end import FrontEnds as _FrontEnds
from web.keys.limiter import ConcurrencyLimiter
from web.keys.service import KeyService
from web.keys.views import KeyViews
from web.ledger import Ledger as _Ledger
from web.people.accounts import Accounts as _Accounts
from web.people.conversations import Conversations as _Conversations
from web.people.enrol import Enrolment as _Enrolment
from web.people.oidc.service import SingleSignOn as _SingleSignOn
from web.people.personal_keys import PersonalKeys as _PersonalKeys
from web.people.plans import Plans as _Plans
from web.people.sessions import SessionStore
from web.system.admin_auth import AdminAuth
from web.system.metrics import Metrics as _Metrics
from web.system.models import ModelSwitch

Accounts = NamedDependency[_Accounts]
Admin = NamedDependency[AdminAuth]
Enrolment = NamedDependency[_Enrolment]
Config = NamedDependency[WebConfig]
Conversations = NamedDependency[_Conversations]
Embedder = NamedDependency[_Embedder]
FrontEnds = NamedDependency[_FrontEnds]
Gate = NamedDependency[EngineGate]
Generations = NamedDependency[_Generations]
History = NamedDependency[HistoryService]
InFlight = NamedDependency[_InFlight]
Keys = NamedDependency[KeyService]
Ledger = NamedDependency[_Ledger]
Limiter = NamedDependency[ConcurrencyLimiter]
Metrics = NamedDependency[_Metrics]
Models = NamedDependency[ModelSwitch]
PersonalKeys = NamedDependency[_PersonalKeys]
Plans = NamedDependency[_Plans]
Prompts = NamedDependency[_Prompts]
Responses = NamedDependency[ResponseStore]
Router = NamedDependency[_Router]
Sessions = NamedDependency[async_sessionmaker[AsyncSession]]
SingleSignOn = NamedDependency[_SingleSignOn]  # provided (as `sso`) only where a provider is configured
Views = NamedDependency[KeyViews]
WebSessions = NamedDependency[SessionStore]
