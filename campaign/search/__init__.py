"""Searches (docs/search.md): proposals from Optuna's samplers fed from the ledger, successive
halving at rungs with each decision recorded, the audit of pruned variants, and confirmation
on fresh seeds. A search is planned in ``plan/`` (the ``[search]`` section), decided here from
what the ledger holds, and its runs placed by ``launch/`` like any other."""
