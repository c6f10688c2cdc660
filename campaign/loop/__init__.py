"""The controlled training loop: task contract, loop, stop rules, measurement, checkpoints."""
