"""Per-tenant quotas: what an admin sets, what a tenant uses, and the rules between them.

Sans-IO like the rest of the core: plain data and checks, no files, no clocks. The quotas
file (``kvpool master --quotas FILE``, edited with ``kvpool quota``) is read by
``quota_file.py``; ``MasterState`` keeps each tenant's ``TenantUsage`` up to date as objects
come and go (no scans), refuses what would take a tenant over a quota, and uses the
guaranteed shares to keep one tenant's puts from evicting another's objects. The handlers
count each tenant's calls in flight with an ``InflightLimiter``.

The file::

    {"version": 1,
     "default": {"objects": 100000, "dram_bytes": "8GiB"},
     "tenants": {"team-a": {"dram_bytes": "64GiB", "guaranteed_dram_bytes": "16GiB",
                            "inflight": 256}}}

Every field of a quota is optional: a field left out (or null) is unlimited. A tenant not
listed gets ``default``; a listed tenant gets exactly what its entry says (it inherits
nothing from ``default``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kvpool.common.sizes import format_size, parse_size
from kvpool.common.status import Tier
from kvpool.security.identity import tenant_problem

FILE_VERSION = 1
#: Tenants one quotas file may list, at most.
MAX_TENANTS = 100_000
#: The quotas a tenant can be held to, as they are named in the file, the CLI, refusals and
#: metrics (``guaranteed_*`` are shares, not limits: they are never "exceeded").
LIMITS = ("objects", "dram_bytes", "nvme_bytes", "reserved_bytes", "leases", "inflight")
SHARES = ("guaranteed_dram_bytes", "guaranteed_nvme_bytes")
#: The fields that hold bytes (sizes like "10GiB" are read); the others count.
BYTE_FIELDS = frozenset(
    {"dram_bytes", "nvme_bytes", "reserved_bytes", "guaranteed_dram_bytes", "guaranteed_nvme_bytes"}
)
#: What each quota counts, for messages.
_UNITS = {
    "objects": "objects",
    "dram_bytes": "of DRAM",
    "nvme_bytes": "of NVMe",
    "reserved_bytes": "reserved and not yet committed",
    "leases": "objects under read lease",
    "inflight": "calls in flight",
}
#: What a tenant over each quota can do about it.
_REMEDY = {
    "objects": "remove some",
    "dram_bytes": "remove some objects, or put to tier='nvme'",
    "nvme_bytes": "remove some objects",
    "reserved_bytes": "commit or revoke the puts under way first",
    "leases": "release leases (close readers) or wait for them to end",
    "inflight": "wait for the calls under way to be answered",
}


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """What one tenant may hold; None: unlimited. ``guaranteed_*_bytes``: the bytes of a tier
    that other tenants' puts never evict this tenant below."""

    objects: int | None = None
    dram_bytes: int | None = None
    nvme_bytes: int | None = None
    reserved_bytes: int | None = None
    leases: int | None = None
    inflight: int | None = None
    guaranteed_dram_bytes: int | None = None
    guaranteed_nvme_bytes: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"{f.name} must be a whole number, not negative, got {value!r}")
        for tier in ("dram", "nvme"):
            limit = getattr(self, f"{tier}_bytes")
            guaranteed = getattr(self, f"guaranteed_{tier}_bytes")
            if limit is not None and guaranteed is not None and guaranteed > limit:
                raise ValueError(
                    f"guaranteed_{tier}_bytes ({guaranteed}) is above {tier}_bytes ({limit}): "
                    "a tenant cannot be guaranteed more than it may hold"
                )

    def bytes_limit(self, tier: Tier) -> int | None:
        return self.nvme_bytes if tier is Tier.NVME else self.dram_bytes

    def guaranteed(self, tier: Tier) -> int | None:
        return self.guaranteed_nvme_bytes if tier is Tier.NVME else self.guaranteed_dram_bytes

    def to_json(self) -> dict[str, int]:
        """The fields that are set (the file leaves the unlimited ones out)."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    @classmethod
    def from_json(cls, entry: object, where: str) -> TenantQuota:
        """A quota from the file; ValueError naming ``where`` and what is wrong."""
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: a quota is an object, not {type(entry).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a quota has "
                f"{', '.join(LIMITS + SHARES)}"
            )
        values: dict[str, int | None] = {}
        for name, value in entry.items():
            values[name] = _quota_value(name, value, where)
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def _quota_value(name: str, value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}: {name} must be a number, got {value!r}")
    if name in BYTE_FIELDS:
        if not isinstance(value, int | str):
            raise ValueError(
                f"{where}: {name} must be a number of bytes or a size like '10GiB', got {value!r}"
            )
        try:
            return parse_size(value)
        except ValueError as error:
            raise ValueError(f"{where}: {name}: {error}") from None
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {name} must be a whole number, not negative, got {value!r}")
    return value


@dataclass(frozen=True)
class Quotas:
    """Every tenant's quota: those listed, and ``default`` for the rest."""

    tenants: Mapping[str, TenantQuota] = field(default_factory=dict)
    default: TenantQuota = TenantQuota()

    def of(self, tenant: str) -> TenantQuota:
        return self.tenants.get(tenant, self.default)

    def limits_any(self, name: str) -> bool:
        """Whether any tenant is held to quota ``name`` (else its checks are skipped)."""
        if getattr(self.default, name) is not None:
            return True
        return any(getattr(q, name) is not None for q in self.tenants.values())

    def with_tenant(self, tenant: str, quota: TenantQuota) -> Quotas:
        problem = tenant_problem(tenant)
        if problem is not None:
            raise ValueError(problem)
        return Quotas({**self.tenants, tenant: quota}, self.default)

    def without_tenant(self, tenant: str) -> Quotas:
        return Quotas({t: q for t, q in self.tenants.items() if t != tenant}, self.default)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FILE_VERSION,
            "default": self.default.to_json(),
            "tenants": {t: self.tenants[t].to_json() for t in sorted(self.tenants)},
        }

    @classmethod
    def from_json(cls, content: object, where: str = "quotas") -> Quotas:
        """Quotas from the file's JSON; ValueError saying what to fix."""
        if not isinstance(content, dict):
            raise ValueError(f"{where}: not a quotas file (a JSON object with 'version': 1)")
        if content.get("version") != FILE_VERSION:
            raise ValueError(
                f"{where}: version {content.get('version')!r}; this kvpool reads version "
                f"{FILE_VERSION} (a JSON object with 'version': 1)"
            )
        unknown = sorted(set(content) - {"version", "default", "tenants"})
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; the file has "
                "'version', 'default' and 'tenants'"
            )
        default = content.get("default")
        default = TenantQuota.from_json({} if default is None else default, f"{where}: default")
        listed = content.get("tenants")
        listed = {} if listed is None else listed
        if not isinstance(listed, dict):
            raise ValueError(f"{where}: 'tenants' maps tenant names to quotas (an object)")
        if len(listed) > MAX_TENANTS:
            raise ValueError(f"{where}: {len(listed)} tenants; at most {MAX_TENANTS}")
        tenants: dict[str, TenantQuota] = {}
        for tenant, entry in listed.items():
            problem = tenant_problem(tenant)
            if problem is not None:
                raise ValueError(f"{where}: {problem}")
            tenants[tenant] = TenantQuota.from_json(entry, f"{where}: tenant {tenant!r}")
        return cls(tenants, default)


@dataclass(slots=True)
class TenantUsage:
    """What a tenant holds now: live objects (any state), the bytes of its reservations
    (each buffer as allocated), the bytes its replicas (and copies in flight) take in each
    tier, its objects under a live read lease, and its reservations."""

    objects: int = 0
    reserved_bytes: int = 0
    dram_bytes: int = 0
    nvme_bytes: int = 0
    leases: int = 0
    reservations: int = 0

    def bytes_in(self, tier: Tier) -> int:
        return self.nvme_bytes if tier is Tier.NVME else self.dram_bytes

    def empty(self) -> bool:
        return not (
            self.objects or self.reserved_bytes or self.dram_bytes or self.nvme_bytes or self.leases
        )

    @property
    def total_bytes(self) -> int:
        return self.dram_bytes + self.nvme_bytes


def refusal(tenant: str, quota: str, limit: int, held: int, asked: int = 1) -> str:
    """The message of a refusal for ``quota``: names it, its limit and the tenant's use."""
    if quota in BYTE_FIELDS:
        shown_limit = f"{format_size(limit)} ({limit} bytes) {_UNITS[quota]}"
        # (in bytes too: a size rounded, 4097 bytes as "4.0 KiB", reads as if it fitted)
        use = f"{_bytes(held)} held, {_bytes(asked)} more asked"
    else:
        shown_limit = f"{limit} {_UNITS[quota]}"
        use = f"{held} held"
    return (
        f"tenant {tenant!r} is at its {quota} quota of {shown_limit} ({use}): "
        f"{_REMEDY[quota]}, or ask an admin for more"
    )


def _bytes(size: int) -> str:
    """``size`` as ``format_size`` gives it, with the exact count where that rounds it."""
    shown = format_size(size)
    return shown if parse_size(shown.replace(" ", "")) == size else f"{shown} ({size} bytes)"


class InflightLimiter:
    """Each tenant's calls not yet answered, held to its ``inflight`` quota. The handlers
    call ``enter`` as a call begins and ``leave`` once it is answered (or refused)."""

    __slots__ = ("counts", "refusals")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        #: tenant -> calls refused.
        self.refusals: Counter[str] = Counter()

    def enter(self, tenant: str, limit: int | None) -> str | None:
        """Counts a call of ``tenant`` in; or, when its quota is reached, counts nothing and
        returns why it is refused."""
        held = self.counts.get(tenant, 0)
        if limit is not None and held >= limit:
            self.refusals[tenant] += 1
            return f"quota exceeded: {refusal(tenant, 'inflight', limit, held)}"
        self.counts[tenant] = held + 1
        return None

    def leave(self, tenant: str) -> None:
        held = self.counts.get(tenant, 0) - 1
        if held > 0:
            self.counts[tenant] = held
        else:
            self.counts.pop(tenant, None)


def default_share(capacity: int, tenants: int) -> int:
    """Each tenant's share of a tier that guarantees none: an equal split among the tenants
    holding something there (max-min fairness: what one leaves unused, others may take)."""
    return capacity // max(tenants, 1)
