"""Who a request acts for, from the identity headers a trusted gateway sets, checked.

The gateway contract: a gateway in front of the agents authenticates the caller, then sets
(overwriting anything the client sent) ``x-kaos-user-id`` to the verified user, and removes it for
callers it does not know. ``x-kaos-session-id`` and ``x-kaos-memory-scope`` may come from the
client. A request without a user id is anonymous: its memory is one session, whose id the server
issues (unguessable, signed with the system's session key, returned in ``x-kaos-session-id``);
an anonymous request naming a session the system did not issue is refused. A repeated identity
header, a reserved user id (``:...`` or ``agent:...``, the agents' own) or a malformed id is a 400;
the one exception is an agent's own identity on its autonomous runs' delegations: ``agent:<name>``
with a session the system issued to that agent (:meth:`SessionIssuer.issue` with ``agent``), which
no client can make without the session key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping, Sequence

from instrumented_agent.config import (
    DELEGATED_BY_HEADER,
    MEMORY_SCOPE_HEADER,
    SESSION_ID_HEADER,
    USER_ID_HEADER,
)
from instrumented_agent.errors import AgentError

__all__ = [
    "ENV_SESSION_KEY",
    "IDENTITY_HEADERS",
    "IdentityError",
    "SessionIssuer",
    "agent_user_id",
    "identity_values",
]

ENV_SESSION_KEY = "KAOS_SESSION_KEY"
"""Key signing anonymous session ids; the same for every agent of a system (random if unset)."""

IDENTITY_HEADERS = (USER_ID_HEADER, SESSION_ID_HEADER, MEMORY_SCOPE_HEADER, DELEGATED_BY_HEADER)
AGENT_USER_PREFIX = "agent:"
"""The user id of an agent's autonomous runs: ``agent:<name>``."""
RESERVED_USER_PREFIXES = (":", AGENT_USER_PREFIX)
"""User ids no gateway may issue: the anonymous key and the agents' own identities."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+=:|/-]{0,127}")


class IdentityError(AgentError):
    """The identity headers are repeated, reserved or malformed."""

    status_code = 400
    error_type = "invalid_identity"


class SessionIssuer:
    """Issues and recognizes anonymous session ids: a random nonce and its HMAC."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SessionIssuer:
        """The issuer of ``KAOS_SESSION_KEY`` (a random key when unset: ids valid in this process)."""
        configured = environ.get(ENV_SESSION_KEY, "")
        return cls(configured.encode() if configured else secrets.token_bytes(32))

    def _mac(self, nonce: str, agent: str | None) -> str:
        message = nonce if agent is None else f"{agent_user_id(agent)}\n{nonce}"  # no nonce has a \n
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self, agent: str | None = None) -> str:
        """A new anonymous session id, or (``agent``) one of that agent's autonomous runs."""
        nonce = secrets.token_hex(16)
        return f"{'anon' if agent is None else 'auto'}-{nonce}-{self._mac(nonce, agent)}"

    def issued(self, session_id: str, agent: str | None = None) -> bool:
        """Whether ``session_id`` is an anonymous one (or, with ``agent``, one of that agent's)
        this system issued."""
        prefix, _, rest = session_id.partition("-")
        nonce, _, mac = rest.partition("-")
        return (
            prefix == ("anon" if agent is None else "auto")
            and len(nonce) == 32
            and mac.isascii()  # compare_digest refuses other text (a header is Latin-1)
            and hmac.compare_digest(mac, self._mac(nonce, agent))
        )


def agent_user_id(agent: str) -> str:
    """The user id of ``agent``'s autonomous runs."""
    return f"{AGENT_USER_PREFIX}{agent}"


def identity_values(
    headers: Sequence[tuple[str, str]], issuer: SessionIssuer | None = None
) -> dict[str, str]:
    """The identity headers of a request (lower-case names), each at most once; checked ids.

    ``agent:<name>`` is accepted only with a session ``issuer`` issued to that agent (an
    autonomous run's delegation); other reserved ids never are."""
    values: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key not in IDENTITY_HEADERS:
            continue
        if key in values:
            raise IdentityError(f"the {key} header is repeated")
        values[key] = value
    user = values.get(USER_ID_HEADER)
    if user is not None and user != "":
        if user.startswith(RESERVED_USER_PREFIXES) and not _agents_own(user, values, issuer):
            raise IdentityError(f"the {USER_ID_HEADER} value is reserved")
        if not _ID.fullmatch(user):
            raise IdentityError(f"the {USER_ID_HEADER} value is malformed")
    session = values.get(SESSION_ID_HEADER)
    if session and not _ID.fullmatch(session):
        raise IdentityError(f"the {SESSION_ID_HEADER} value is malformed")
    return values


def _agents_own(user: str, values: Mapping[str, str], issuer: SessionIssuer | None) -> bool:
    """Whether ``user`` is an agent's identity with a session issued to that agent."""
    agent = user.removeprefix(AGENT_USER_PREFIX)
    session = values.get(SESSION_ID_HEADER, "")
    return issuer is not None and agent != user and issuer.issued(session, agent)
