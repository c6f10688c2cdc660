"""Small builders shared by the tests (real ledger writes, no mocks)."""

from __future__ import annotations

from campaign.ledger import CampaignRecord, Ledger, NewRun, NewVariant

LRS = {"lr-1e-4": 1e-4, "lr-5e-5": 5e-5, "lr-2e-4": 2e-4}


def plan_campaign(
    ledger: Ledger, name: str = "digits-lr", seeds: int = 3, variants: dict | None = None
) -> CampaignRecord:
    """The three-learning-rate campaign of docs/spec.md (or ``variants``) x ``seeds``."""
    variants = variants or LRS
    control = next(iter(variants))
    return ledger.create_campaign(
        name,
        question="Which learning rate gives the best validation accuracy after 200 updates?",
        task="campaign.tasks.digits:build",
        spec={"campaign": {"name": name}, "grid": {"seeds": list(range(seeds))}},
        variants=[NewVariant(v, v == control, {"optimizer.lr": lr}) for v, lr in variants.items()],
        runs=[
            NewRun(v, seed, {"optimizer": {"lr": lr, "name": "adamw"}, "seed": seed})
            for v, lr in variants.items()
            for seed in range(seeds)
        ],
    )
