"""``campaign mirror CAMPAIGN --to mlflow --tracking-uri URI``: a campaign's runs where a team
already looks, copied by MLflow's own client (extra ``mlflow``; docs/cli.md, "Mirrors").

One MLflow experiment per campaign, named as the campaign. In it, a parent run named
as the campaign holds the spec and the report (HTML); under it, one MLflow run per
ledger run, found again by its ``campaign.run_id`` tag. Each run carries:

- tags: variant, seed, control, status, stop cause and step, relaunch lineage, run id;
- the resolved config as params (dotted keys), once;
- every metric at its update step (the latest segment's value where a resume replayed
  steps, as the ledger's readers see it), with its wall time;
- its model card (Markdown) once it has a final artifact.

A ledger status maps to MLflow's own status: planned SCHEDULED, running RUNNING,
completed/stopped/diverged FINISHED, failed/oom FAILED, interrupted/lost/withdrawn
KILLED (the tag keeps the ledger's exact word). Run again, the mirror adds what is new
(runs, points, a changed status, a new report) and leaves what is there: metric
points already mirrored are not sent twice (each run's ``campaign.points_through`` tag says
what is there), params never change. The ledger stays the
truth: nothing is read back from MLflow into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pandas as pd

from campaign.errors import BadInput, CampaignError, ExitCode, first_line
from campaign.ledger.reads import LedgerReader
from campaign.plan.config_keys import flatten

RUN_TAG = "campaign.run_id"
CAMPAIGN_TAG = "campaign.campaign"  # on the parent run
REPORT_TAG = "campaign.report_sha256"
SPEC_TAG = "campaign.spec_sha256"  # on the experiment: which spec it mirrors
IDENTITY_TAG = "campaign.first_run_id"  # and which ledger's campaign: its first run's id
CARD_TAG = "campaign.model_card"
POINTS_TAG = "campaign.points_through"  # per key: the last step mirrored, points up to it
STATUSES = {"planned": "SCHEDULED", "running": "RUNNING", "completed": "FINISHED",
            "stopped": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "oom": "FAILED",
            "interrupted": "KILLED", "lost": "KILLED", "withdrawn": "KILLED"}
BATCH = 1000  # MLflow's most entities (metrics, params, tags) per log_batch call
MAX_TAG_CHARS = 8000  # MLflow's longest tag value
PARAMS_BATCH = 100  # and params
MAX_PARAM_CHARS = 6000
MAX_PARAM_KEY = 250


@dataclass
class Mirrored:
    """What one mirror call sent."""

    runs: int = 0
    new_runs: int = 0
    points: int = 0
    updated: int = 0  # runs whose tags or status changed


class MirrorError(CampaignError):
    """The tracking server refused or could not be reached (one line, the URI named)."""

    exit_code = ExitCode.CHECK_FAILED


def mirror_to_mlflow(reader: LedgerReader, campaign: str, tracking_uri: str) -> Mirrored:
    """Copy what is new of ``campaign`` to the MLflow tracking server at ``tracking_uri``."""
    _reachable(tracking_uri)
    # MLflow's client retries a server that does not answer for minutes: a few tries, then
    # one line (unless the user set their own).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:  # MLflow prints a "View run" link as it ends each run: stdout is the command's own
        with contextlib.redirect_stdout(io.StringIO()):
            return _mirror(client, reader, campaign)
    except MlflowException as error:
        raise MirrorError(_refusal(tracking_uri, first_line(error))) from None


def _refusal(tracking_uri: str, said: str) -> str:
    """One line for what the server said: a web page (the body MLflow quotes) is cut off, and a
    404 says that no tracking API answers under that address (a path, a proxy's page)."""
    said = said.split(" Response body:")[0].rstrip(". ")
    if "error code 404" in said:
        endpoint = said.split("endpoint ")[-1].split(" ")[0] if "endpoint " in said else "its API"
        return (f"MLflow at {tracking_uri}: no tracking server answers there (HTTP 404 for "
                f"{endpoint}); give the address `mlflow server` listens at")
    return f"MLflow at {tracking_uri}: {said}"


def _reachable(tracking_uri: str) -> None:
    """An http(s) server that nothing answers at is one line at once (exit 1); an address that
    is not one is bad input (exit 2)."""
    try:
        parsed = urlparse(tracking_uri)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError as error:
        raise BadInput(f"--tracking-uri {tracking_uri!r}: not an address ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BadInput(f"--tracking-uri {tracking_uri!r}: the address of an MLflow tracking "
                       "server (http://HOST:PORT); a mirror goes to a server a team shares")
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=10).close()
    except OSError as error:
        raise MirrorError(f"no MLflow server answers at {tracking_uri}: {error}") from None


def _mirror(client: Any, reader: LedgerReader, campaign: str) -> Mirrored:
    """The experiment (made, or found and checked to be this campaign's), then each run."""
    record = reader.campaign(campaign)
    provisional = f"{record.spec_sha256}@{record.created_at.isoformat()}"  # before its 1st run
    identity = record.run_ids[0] if record.run_ids else provisional
    experiment = client.get_experiment_by_name(campaign)
    if experiment is None:
        experiment_id = client.create_experiment(campaign, tags={
            "campaign.question": record.question, SPEC_TAG: record.spec_sha256,
            IDENTITY_TAG: identity})
        existing = {}
    else:
        experiment_id = experiment.experiment_id
        existing = _mirrored_runs(client, experiment_id)
        _check_ours(campaign, experiment, existing, record.spec_sha256, identity, provisional,
                    set(record.run_ids))
        if experiment.tags.get(IDENTITY_TAG) != identity:  # mirrored before the tag, or runs
            client.set_experiment_tag(experiment_id, IDENTITY_TAG, identity)
    parent = existing.pop(f"campaign:{campaign}", None) or client.create_run(
        experiment_id, run_name=campaign, tags={CAMPAIGN_TAG: campaign})
    done = Mirrored()
    runs = reader.runs(campaign)
    points = reader.metrics(campaign)
    for row in runs.to_dict("records"):
        done.runs += 1
        mirrored = existing.get(str(row["run_id"]))
        new = mirrored is None
        if mirrored is None:
            mirrored = _create(client, experiment_id, parent.info.run_id, row)
            done.new_runs += 1
        if not new and row["config"] and not mirrored.data.params:  # a mirror cut short
            _params(client, mirrored.info.run_id, row)
        changed = _update_tags(client, mirrored, row)
        done.updated += changed and not new
        mine = points[points["run_id"] == row["run_id"]]
        done.points += _send_points(client, mirrored, mine, new)
        _card(client, reader, mirrored, row)
    _report(client, reader, campaign, parent, record.spec)
    live = set(runs["status"]) & {"planned", "running"}  # the campaign: done once its runs are
    status = "RUNNING" if live or runs.empty else "FINISHED"
    if parent.info.status != status:
        if status == "FINISHED":
            client.set_terminated(parent.info.run_id, status=status)
        else:
            client.update_run(parent.info.run_id, status=status)
    return done


def _check_ours(campaign: str, experiment: Any, existing: dict[str, Any], spec_sha256: str,
                identity: str, provisional: str, run_ids: set[str]) -> None:
    """An experiment of the campaign's name that mirrors something else is left alone: another
    spec, a team's own experiment, or the same spec planned in another ledger (a reproduction,
    a colleague's copy), told apart by the campaign's first run id and by its runs' ids."""
    tags = experiment.tags
    theirs = tags.get(SPEC_TAG)
    if theirs != spec_sha256:
        whose = (f"a campaign with another spec (sha256 {theirs[:12]})" if theirs else
                 "something other than a campaign mirror")
    elif tags.get(IDENTITY_TAG, identity) not in (identity, provisional) or not set(
            existing).issubset(run_ids | {f"campaign:{campaign}"}):
        whose = ("the same spec's campaign from another ledger (its runs' ids are not this "
                 "campaign's)")
    else:
        return
    raise MirrorError(f"MLflow experiment {campaign!r} holds {whose}; this campaign's spec is "
                      f"{spec_sha256[:12]}: nothing mirrored (rename or delete that experiment)")


def _mirrored_runs(client: Any, experiment_id: str) -> dict[str, Any]:
    """The experiment's runs by ledger run id (the parent under ``campaign:NAME``)."""
    found: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if RUN_TAG in tags:
                found[tags[RUN_TAG]] = run
            elif CAMPAIGN_TAG in tags:
                found[f"campaign:{tags[CAMPAIGN_TAG]}"] = run
        token = page.token
        if not token:
            return found


def _create(client: Any, experiment_id: str, parent_id: str, row: dict[str, Any]) -> Any:
    """A new MLflow run for a ledger run, under the campaign's parent, with its params."""
    started = _ms(row.get("started_at")) or _ms(row.get("created_at"))
    run = client.create_run(experiment_id, start_time=started,
                            run_name=f"{row['variant']} seed {row['seed']}",
                            tags={RUN_TAG: str(row["run_id"]), "mlflow.parentRunId": parent_id})
    _params(client, run.info.run_id, row)
    return client.get_run(run.info.run_id)


def _params(client: Any, run_id: str, row: dict[str, Any]) -> None:
    """The run's config as params (a key past MLflow's 250 characters cut, kept unique)."""
    from mlflow.entities import Param

    def key_of(key: str) -> str:
        if len(key) <= MAX_PARAM_KEY:
            return key
        return key[:MAX_PARAM_KEY - 13] + "~" + hashlib.sha256(key.encode()).hexdigest()[:12]

    params = [Param(key_of(key), str(value)[:MAX_PARAM_CHARS])
              for key, value in sorted(flatten(row["config"] or {}).items())]
    for start in range(0, len(params), PARAMS_BATCH):
        client.log_batch(run_id, params=params[start:start + PARAMS_BATCH])


def _tags(row: dict[str, Any]) -> dict[str, str]:
    """The ledger's words for a run, as MLflow tags (empty where the ledger has none)."""

    def word(value: Any) -> str:
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(
            value)

    return {"campaign.variant": word(row["variant"]), "campaign.seed": word(row["seed"]),
            "campaign.control": "yes" if row.get("is_control") else "no",
            "campaign.status": word(row["status"]), "campaign.stop_cause": word(row["stop_cause"]),
            "campaign.stop_step": word(row["stop_step"]),
            "campaign.relaunch_of": word(row["relaunch_of"]),
            "campaign.relaunch_reason": word(row.get("relaunch_reason"))}


def _update_tags(client: Any, mirrored: Any, row: dict[str, Any]) -> int:
    """Tags and status as the ledger has them now; 1 when something changed."""
    from mlflow.entities import RunTag

    have = mirrored.data.tags
    changed = [RunTag(k, v) for k, v in _tags(row).items() if have.get(k) != v]
    if changed:
        client.log_batch(mirrored.info.run_id, tags=changed)
    status = STATUSES.get(str(row["status"]), "RUNNING")
    if mirrored.info.status != status:
        if status in ("FINISHED", "FAILED", "KILLED"):
            client.set_terminated(mirrored.info.run_id, status=status,
                                  end_time=_ms(row.get("ended_at")))
        else:
            client.update_run(mirrored.info.run_id, status=status)
        return 1
    return int(bool(changed))


def _send_points(client: Any, mirrored: Any, points: pd.DataFrame, new_run: bool) -> int:
    """The points of the mirrored run not mirrored yet, each batch sent with the run's
    ``campaign.points_through`` tag: per key, the last step sent and how many points up to
    it, written in the same ``log_batch`` (one transaction on the server), so that a mirror
    run again reads what is there from the run it already has, not one metric history per
    key. A key whose ledger count up to that step differs (points that reached the ledger
    late, after an outage) and a run without the tag (an older mirror, or too many keys for
    one tag) are read back from their histories, by step."""
    from mlflow.entities import Metric

    run_id = mirrored.info.run_id
    through = _through(mirrored)
    tagged = dict(through)
    sent: list[Any] = []
    for key, series in points.groupby("key"):
        key, series = str(key), series.sort_values("step")
        steps = series["step"].astype(int)
        mark = through.get(key)
        if mark is not None and int((steps <= mark[0]).sum()) == mark[1]:
            fresh = series[steps > mark[0]]
        else:
            have = set() if new_run else {m.step for m in client.get_metric_history(run_id,
                                                                                   key)}
            fresh = series[~steps.isin(have)]
            through.pop(key, None)  # counted again: what is there, then what is sent
            if have:
                through[key] = (max(have), int(steps.isin(have).sum()))
        sent += [Metric(key, float(point.value), _ms(point.wall_time) or 0, int(point.step))
                 for point in fresh.itertuples()]
    for start in range(0, len(sent), BATCH - 1):  # the tag is the batch's last entity
        chunk = sent[start:start + BATCH - 1]
        for metric in chunk:
            last, count = through.get(metric.key, (-1, 0))
            through[metric.key] = (max(last, metric.step), count + 1)
        client.log_batch(run_id, metrics=chunk, tags=_points_tag(through))
    if not sent and through != tagged:  # read back from histories: next time from the tag
        client.log_batch(run_id, tags=_points_tag(through))
    return len(sent)


def _points_tag(through: dict[str, tuple[int, int]]) -> list[Any]:
    """The ``campaign.points_through`` tag to send (none when too many keys for one tag)."""
    from mlflow.entities import RunTag

    text = json.dumps({k: list(v) for k, v in sorted(through.items())}, separators=(",", ":"))
    return [RunTag(POINTS_TAG, text)] if len(text) <= MAX_TAG_CHARS else []


def _through(mirrored: Any) -> dict[str, tuple[int, int]]:
    """The run's ``campaign.points_through`` tag as {key: (last step, points up to it)}; empty
    when it has none or it does not parse (then every key is read back)."""
    try:
        found = json.loads(mirrored.data.tags.get(POINTS_TAG) or "{}")
        return {str(k): (int(v[0]), int(v[1])) for k, v in found.items()}
    except (ValueError, TypeError, IndexError, AttributeError):
        return {}


def _card(client: Any, reader: LedgerReader, mirrored: Any, row: dict[str, Any]) -> None:
    """The run's model card, once it has a final artifact (what `campaign export` writes)."""
    if mirrored.data.tags.get(CARD_TAG) or row["status"] not in ("completed", "stopped"):
        return
    from campaign.report.model_card import model_card

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model_card.md"
        path.write_text(model_card(reader, str(row["run_id"])), encoding="utf-8")
        client.log_artifact(mirrored.info.run_id, str(path))
    client.set_tag(mirrored.info.run_id, CARD_TAG, "model_card.md")


def _report(client: Any, reader: LedgerReader, campaign: str, parent: Any, spec: str) -> None:
    """The spec and the report (HTML) on the parent run, again only when the report changed."""
    from campaign.report.balance import balance_sheet
    from campaign.report.render import html

    page = html(balance_sheet(reader, campaign))
    digest = hashlib.sha256(page.encode()).hexdigest()
    if parent.data.tags.get(REPORT_TAG) == digest:
        return
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "report.html").write_text(page, encoding="utf-8")
        (Path(folder) / "spec.json").write_text(spec, encoding="utf-8")
        client.log_artifact(parent.info.run_id, str(Path(folder) / "report.html"))
        client.log_artifact(parent.info.run_id, str(Path(folder) / "spec.json"))
    client.set_tag(parent.info.run_id, REPORT_TAG, digest)


def _ms(value: Any) -> int | None:
    """Milliseconds since the epoch of a ledger timestamp (None when there is none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    stamp = pd.Timestamp(value)
    if pd.isna(stamp):
        return None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return int(stamp.timestamp() * 1000)
