"""campaign: PyTorch training-experiment campaigns with the discipline of a careful lab.

The notebook entry point is :class:`campaign.Ledger`::

    from campaign import Ledger
    ledger = Ledger.open("sqlite:///campaign.db")
    runs = ledger.runs("digits-lr")
"""

from campaign.ledger import Ledger

__all__ = ["Ledger", "__version__"]
__version__ = "0.1.0"
