"""Ledger revisions, named ``NNNN_what_it_does`` so their order reads from the file names."""
