"""Exit codes live on the exceptions (campaign/errors.py), and docs/cli.md's table of them is
the classes' own: a class added, moved to another code or removed fails here until the page
says the same."""

from __future__ import annotations

import inspect
from pathlib import Path

from campaign import errors

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def error_classes() -> list[type[errors.CampaignError]]:
    """Every project error, in the order campaign/errors.py defines them."""
    return [c for c in vars(errors).values()
            if inspect.isclass(c) and issubclass(c, errors.CampaignError)
            and c.__module__ == errors.__name__ and c is not errors.CampaignError]


def exit_code_table() -> str:
    """The Markdown table docs/cli.md must hold, generated from the classes."""
    lines = ["| error (`campaign.errors`) | a kind of | exit code |", "|---|---|---|"]
    for kind in error_classes():
        parent = kind.__mro__[1].__name__
        code = ("the original error's" if kind is errors.HostedError
                else str(int(kind.exit_code)))
        lines.append(f"| `{kind.__name__}` | `{parent}` | {code} |")
    return "\n".join(lines)


def test_docs_cli_md_lists_every_error_with_its_code() -> None:
    table = exit_code_table()
    assert table in DOCS.read_text(), f"docs/cli.md must hold this table:\n{table}"


def test_every_code_is_one_of_the_contract() -> None:
    for kind in error_classes():
        if kind is not errors.HostedError:
            assert kind.exit_code in (1, 2, 3), kind


def test_an_error_from_a_child_keeps_its_code() -> None:
    hosted = errors.HostedError("the ledger refused", 3)
    assert errors.exit_code_of(hosted) == errors.ExitCode.LEDGER
    assert errors.exit_code_of(ValueError("not ours")) is None
