"""Facts about the environment a run executes in: the software stack, provenance and digests of
files, devices and precisions. Below the loop; imports nothing of ours but ``campaign.errors``
(docs/architecture.md, layers)."""
