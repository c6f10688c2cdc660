"""The ledger's tables (docs/ledger.md). Only tables live here.

Table and column names are contract: notebooks and SQL users rely on them.
JSON documents (spec, config, overrides, environment, inputs) are stored as
canonical JSON *text*, so the stored bytes are exactly what was hashed and a
user can verify ``sha256(config) == config_sha256`` from plain SQL.

Immutability (no deletes, frozen run identity, terminal statuses) is enforced
by triggers created in the migrations, not here: they are DDL that differs per
database and must be versioned with the schema.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from campaign.ledger.dialects import utcnow
from campaign.ledger.vocabulary import RUN_STATUSES, STOP_CAUSES

# Stable constraint names: Alembic needs them to alter constraints later
# (SQLite batch mode recreates tables and must know what to recreate).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in_list(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=utcnow(), nullable=False)


class Campaign(Base):
    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    question: Mapped[str] = mapped_column(Text)
    spec: Mapped[str] = mapped_column(Text)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = _now()


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (
        UniqueConstraint("campaign_id", "name"),
        # Exactly one control per campaign, at most one enforced here.
        Index(
            "uq_variants_one_control",
            "campaign_id",
            unique=True,
            sqlite_where="is_control",
            postgresql_where="is_control",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"))
    name: Mapped[str] = mapped_column(String(200))
    is_control: Mapped[bool] = mapped_column(Boolean)
    overrides: Mapped[str] = mapped_column(Text)


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_campaign_id_status", "campaign_id", "status"),
        CheckConstraint(_in_list("status", RUN_STATUSES), name="status"),
        CheckConstraint(
            f"stop_cause IS NULL OR {_in_list('stop_cause', STOP_CAUSES)}", name="stop_cause"
        ),
        # A run that has ended has a stop cause; a planned or running one has none.
        CheckConstraint(
            "(status IN ('planned', 'running', 'withdrawn')) = (stop_cause IS NULL)",
            name="stop_cause_iff_ended",
        ),
        CheckConstraint(
            "relaunch_of IS NULL OR relaunch_reason IS NOT NULL", name="relaunch_has_reason"
        ),
        CheckConstraint("relaunch_of IS NULL OR relaunch_of <> id", name="relaunch_not_self"),
        # One original per (variant, seed) (revision 0006); a duplicate an older ledger held
        # is marked by the migration (``duplicate_of``) and stays out of the index.
        Index(
            "uq_runs_one_original",
            "variant_id",
            "seed",
            unique=True,
            sqlite_where=text("relaunch_of IS NULL AND duplicate_of IS NULL"),
            postgresql_where=text("relaunch_of IS NULL AND duplicate_of IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"))
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"))
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[str] = mapped_column(Text)
    config_sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), server_default="planned")
    stop_cause: Mapped[str | None] = mapped_column(String(32))
    stop_step: Mapped[int | None] = mapped_column(BigInteger)
    stop_phase: Mapped[str | None] = mapped_column(String(32))
    stop_detail: Mapped[str | None] = mapped_column(Text)
    relaunch_of: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), index=True)
    relaunch_reason: Mapped[str | None] = mapped_column(Text)
    environment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The current owner's lease (revision 0002): writes of a segment carry it.
    lease_token: Mapped[str | None] = mapped_column(String(64))
    # The first original of the same (variant, seed), set only by revision 0006 on a run an
    # older ledger held as a second original: it keeps its line and is never counted.
    duplicate_of: Mapped[str | None] = mapped_column(String(32))


class Segment(Base):
    __tablename__ = "segments"
    __table_args__ = (
        UniqueConstraint("run_id", "ordinal"),
        # Target of the metrics' composite foreign key: a metric's run and
        # segment must agree.
        UniqueConstraint("run_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    ordinal: Mapped[int] = mapped_column(Integer)
    start_step: Mapped[int] = mapped_column(BigInteger)
    end_step: Mapped[int | None] = mapped_column(BigInteger)
    worker: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime] = _now()
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    resumed_from: Mapped[int | None] = mapped_column(ForeignKey("artifacts.id"))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    # Seconds in updates and validation; the rest of the segment's wall time is overhead.
    training_s: Mapped[float | None] = mapped_column(Float)


class Metric(Base):
    """The high-volume table.

    The primary key (run_id, key, step, segment_id) is both the read path
    (one run's curve for one key is a contiguous range; on SQLite the table is
    clustered on it, WITHOUT ROWID) and the uniqueness rule of docs/ledger.md:
    since a segment belongs to exactly one run (enforced by the composite
    foreign key), it is unique exactly when (segment_id, key, step) is. One
    index instead of two keeps ingest at raw-driver speed.
    """

    __tablename__ = "metrics"
    __table_args__ = (
        ForeignKeyConstraint(["run_id", "segment_id"], ["segments.run_id", "segments.id"]),
        {"sqlite_with_rowid": False},
    )

    run_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    segment_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)
    examples_seen: Mapped[int | None] = mapped_column(BigInteger)
    wall_time: Mapped[float] = mapped_column(Float)


class Pilot(Base):
    __tablename__ = "pilots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    config_sha256: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str | None] = mapped_column(String(16))
    environment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    # The memory class it gates (campaign/gates/classes.py); None: the whole spec (before 0004).
    gate_class: Mapped[str | None] = mapped_column(String(64))


class PhaseMeasurement(Base):
    __tablename__ = "phase_measurements"
    __table_args__ = (
        CheckConstraint("(run_id IS NULL) <> (pilot_id IS NULL)", name="run_xor_pilot"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), index=True)
    pilot_id: Mapped[int | None] = mapped_column(ForeignKey("pilots.id"), index=True)
    phase: Mapped[str] = mapped_column(String(32))
    device: Mapped[str] = mapped_column(String(64))
    inputs: Mapped[str | None] = mapped_column(Text)
    allocated: Mapped[int | None] = mapped_column(BigInteger)
    allocated_peak: Mapped[int | None] = mapped_column(BigInteger)
    reserved: Mapped[int | None] = mapped_column(BigInteger)
    reserved_peak: Mapped[int | None] = mapped_column(BigInteger)
    baseline_allocated: Mapped[int | None] = mapped_column(BigInteger)
    rss: Mapped[int | None] = mapped_column(BigInteger)
    rss_peak: Mapped[int | None] = mapped_column(BigInteger)
    duration_s: Mapped[float | None] = mapped_column(Float)
    verdict: Mapped[str | None] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = _now()


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()


class Event(Base):
    """Append-only lifecycle log. ``run_id`` is empty for campaign-level events."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_campaign_id_run_id", "campaign_id", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"))
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"), index=True)
    at: Mapped[datetime] = _now()
    kind: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str | None] = mapped_column(Text)


class Note(Base):
    __tablename__ = "notes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id"), index=True)
    at: Mapped[datetime] = _now()
    text: Mapped[str] = mapped_column(Text)
