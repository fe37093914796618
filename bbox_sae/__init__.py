"""bbox-sae: find where one language model beats another, word by word (BehaviorBox)."""

__version__ = "0.1.0"
