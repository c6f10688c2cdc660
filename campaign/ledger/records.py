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
    start_step: int = 0  # the update its segment starts from (a resume's checkpoint)


@dataclass(frozen=True)
class StopRecord:
    """Why and where a run ended (docs/runs.md (stop causes))."""

    cause: str
    step: int | None = None
    phase: str | None = None
    detail: str | None = None


def run_record(m: Mapping[str, Any]) -> RunRecord:
    """A run row joined with its campaign's and variant's names, as a frozen record."""
    return RunRecord(
        id=m["id"], campaign_id=m["campaign_id"], campaign=m["campaign_name"],
        variant_id=m["variant_id"], variant=m["variant_name"], seed=m["seed"],
        config=m["config"], config_sha256=m["config_sha256"], status=m["status"],
        stop_cause=m["stop_cause"], stop_step=m["stop_step"],
        stop_phase=m["stop_phase"], stop_detail=m["stop_detail"],
        relaunch_of=m["relaunch_of"], relaunch_reason=m["relaunch_reason"],
        worker=m["worker"], created_at=as_utc(m["created_at"]),
        started_at=as_utc(m["started_at"]), ended_at=as_utc(m["ended_at"]),
        heartbeat_at=as_utc(m["heartbeat_at"]),
    )


def campaign_record(m: Mapping[str, Any], run_ids: tuple[str, ...]) -> CampaignRecord:
    """A campaigns row and its run ids, as a frozen record."""
    return CampaignRecord(
        id=m["id"], name=m["name"], question=m["question"], task=m["task"], spec=m["spec"],
        spec_sha256=m["spec_sha256"], created_at=as_utc(m["created_at"]), run_ids=run_ids,
    )
