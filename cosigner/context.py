"""The typed application context: every collaborator a use case needs, built once.

``create_app(settings)`` (:mod:`cosigner.app`) builds one :class:`AppContext` in its
lifespan and hands it to routes, the web pages and background tasks; domain functions take
it as their first argument (``deps``). Nothing here is created at import time.

Layering: this module sits above ``core``, ``db``, ``keys``, ``policy``, ``identity`` and
``runs`` (whose types it names) and below ``permits``, ``approvals`` and ``decisions`` (which
receive it), so no import climbs back up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cosigner.audit.chain import Event
from cosigner.core.clock import Clock
from cosigner.core.load import Shedding
from cosigner.core.settings import Settings
from cosigner.db.batch import Item
from cosigner.db.database import Database
from cosigner.db.group_commit import GroupCommitter
from cosigner.identity.oidc import OidcClients
from cosigner.identity.principals import KeyAuthenticator
from cosigner.identity.quotas import Quotas
from cosigner.keys.keyring import Keyring
from cosigner.keys.store import KeyStore
from cosigner.policy.store import PolicyStore
from cosigner.runs.contracts import ContractedRuns
from cosigner.webhooks.outbox import Backlog

#: ``(tenant, event, now)`` of one refused redeem to log through :attr:`AppContext.refusals`.
Refusal = tuple[str, Event, datetime]


@dataclass(frozen=True)
class AppContext:
    """Collaborators shared by every request of one app (one process).

    ``log_writer`` is the group committer for decision and redeem writes
    (:func:`cosigner.decisions.pdp.decision_log_writer`); ``refusals`` the one for refused
    redeems (:func:`cosigner.permits.redeem.refusal_writer`); both are started and stopped
    by the app lifespan. ``contracted_runs``: runs this process has seen a contract for
    (their decisions read it before policy; any other decision assumes none and its write
    confirms that). ``quotas``: the rate limits and quotas (per replica); ``shedding``:
    which bounded queue refused work recently (``/readyz``).
    """

    settings: Settings
    clock: Clock
    db: Database
    store: PolicyStore
    keyring: Keyring
    key_store: KeyStore
    authenticator: KeyAuthenticator
    log_writer: GroupCommitter[Item] = field(repr=False)
    refusals: GroupCommitter[Refusal] = field(repr=False)
    quotas: Quotas = field(repr=False)
    shedding: Shedding = field(default_factory=Shedding, repr=False)
    #: Long-polls open per credential (tenant, principal id), bounded by settings.
    long_polls: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    #: Undelivered webhooks per tenant (counted by the delivery worker).
    webhook_backlog: Backlog = field(default_factory=lambda: Backlog(10_000), repr=False)
    contracted_runs: ContractedRuns = field(default_factory=ContractedRuns, repr=False)
    #: Single sign-on: each tenant's OpenID provider discovery and JWKS caches.
    oidc: OidcClients = field(default_factory=OidcClients, repr=False)
