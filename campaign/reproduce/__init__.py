"""``campaign reproduce``: a run re-executed from its campaign's archive alone, and compared."""
