"""The demo command (thin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


@click.command()
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path),
              default=Path("campaign-demo"), show_default=True,
              help="Folder for the ledger, the artifacts and the report.")
@click.option("--updates", type=click.IntRange(4), default=None,
              help="Updates per run (smaller for a quicker look)  [default: 200; 300 with "
                   "--llm]")
@click.option("--seeds", type=click.IntRange(1), default=3, show_default=True,
              help="Seeds per variant (3 or more for a 95% interval on each delta).")
@click.option("--workers", type=click.IntRange(1), default=2, show_default=True)
@click.option("--llm", is_flag=True,
              help="The instruction fine-tuning campaign instead (full vs LoRA at ranks 4 and "
                   "16 on a ~1M-parameter Llama-style model; needs campaign[hf]).")
@click.pass_obj
def demo(source: Any, folder: Path, updates: int | None, seeds: int, workers: int,
         llm: bool) -> None:
    """The main job on the embedded SQLite ledger: plan, inspect, pilot, launch, report.

    Plans the three-learning-rate campaign on the built-in digits task plus one
    aggressive variant that diverges, runs the data gate and the pilot, launches on
    local workers, and writes the HTML balance sheet. The demo keeps its own ledger in
    --dir (the --ledger option does not apply). Exit code 0 when every run ended as
    designed (the aggressive variant diverges), 1 otherwise.

    With --llm: the instruction fine-tuning campaign (examples/llm-lora.toml), its data
    and tokenizer made in --dir; exit code 0 when every run completed.

    Example: campaign demo --dir /tmp/demo
    """
    from campaign.demo import run_demo  # the whole stack: imported only when it runs
    from campaign.errors import BadInput

    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".campaign-demo-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise BadInput(f"demo --dir {folder}: cannot write there ({error.strerror})") from None
    if llm:
        import importlib.util

        missing = [n for n in ("transformers", "tokenizers", "peft")
                   if importlib.util.find_spec(n) is None]
        if missing:
            raise BadInput(f"demo --llm needs {', '.join(missing)}: pip install 'campaign[hf]'")
    result = run_demo(folder, updates=updates or (300 if llm else 200), seeds=seeds,
                      workers=workers, llm=llm,
                      say=lambda line: click.echo(f"campaign demo: {line}", err=True))
    counts = result.snapshot.counts
    unexpected = {s: n for s, n in counts.items()
                  if n and s not in ("completed", "diverged", "stopped")}
    if unexpected:
        click.echo(f"campaign demo: unexpected run states: {unexpected}", err=True)
        raise click.exceptions.Exit(1)
