"""torchcond's benchmarks: ``python -m benchmarks`` runs every CPU benchmark (see README.md)."""
