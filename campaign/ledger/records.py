"""Plain frozen values returned and accepted by the ledger API (never live ORM rows)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


def as_utc(moment: datetime | None) -> datetime | None:
    """Timestamps read back from SQLite are naive; they were written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class NewVariant:
    """A variant to plan: ``overrides`` are the dotted keys it sets."""

    name: str
    is_control: bool
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NewRun:
    """A run to plan: (variant name, seed) with its fully resolved config."""

    variant: str
    seed: int
    config: Mapping[str, Any]


@dataclass(frozen=True)
class CampaignRecord:
    id: int
    name: str
    question: str
    task: str
    spec: str
    spec_sha256: str
    created_at: datetime
    run_ids: tuple[str, ...] = ()

    @property
    def spec_document(self) -> Any:
        return json.loads(self.spec)


@dataclass(frozen=True)
class RunRecord:
    id: str
    campaign_id: int
    campaign: str
    variant_id: int
    variant: str
    seed: int
    config: str
    config_sha256: str
    status: str
    stop_cause: str | None
    stop_step: int | None
    stop_phase: str | None
    stop_detail: str | None
    relaunch_of: str | None
    relaunch_reason: str | None
    worker: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    heartbeat_at: datetime | None

    @property
    def config_document(self) -> Any:
        return json.loads(self.config)


@dataclass(frozen=True)
class Claim:
    """A run that this worker now owns, with the segment it writes under."""

    run_id: str
    segment_id: int
    ordinal: int
    config: str
    worker: str
    lease: str = ""


@dataclass(frozen=True)
class StopInfo:
    """Why and where a run ended (DESIGN.md §2 stop causes)."""

    cause: str
    step: int | None = None
    phase: str | None = None
    detail: str | None = None
