"""torchcond's internals: the operators, their rules and the tracing they share.

Nothing here is public API; ``torchcond/__init__.py`` re-exports what is.
"""
