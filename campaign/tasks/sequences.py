"""Next-token pairs for a prompt -> answer sequence, shared by the built-in sequence tasks.

One place says what "the prompt is out of the loss" and "a cut answer" mean: the
targets are the inputs shifted by one, every target that predicts a prompt token
is ``IGNORE`` (cross-entropy's ``ignore_index``), and truncation to ``max_length``
reports whether it dropped a target the loss would have seen (the data gate
refuses that unless allowed).
"""

from __future__ import annotations

IGNORE = -100  # torch.nn.functional.cross_entropy's default ignore_index


def next_token_pairs(
    prompt: list[int], answer: list[int], max_length: int | None
) -> tuple[list[int], list[int], bool]:
    """(inputs, targets with IGNORE over the prompt, whether max_length cut an answer token)
    for the sequence ``prompt + answer`` (``answer`` ends with its end-of-sequence token)."""
    sequence = prompt + answer
    inputs, targets = sequence[:-1], sequence[1:]
    targets = [IGNORE] * (len(prompt) - 1) + targets[len(prompt) - 1 :]
    cut = False
    if max_length is not None and len(inputs) > max_length:
        cut = any(t != IGNORE for t in targets[max_length:])
        inputs, targets = inputs[:max_length], targets[:max_length]
    return inputs, targets, cut
